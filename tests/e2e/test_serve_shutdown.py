"""`slotkeeper serve` at shutdown: a conversation that could not be saved is an error exit, and a
second SIGTERM stops at once instead of waiting for the saves."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from e2e_helpers import USER_TURNS, converse

from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e


def serve(home, model, server_bin, port, ctx=2048):
    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--model", str(model), "--server-bin", server_bin,
           "--port", str(port), "--ctx", str(ctx), "--data-dir", str(home), "--idle-save", "3600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        proc.kill()
        raise AssertionError(f"serve did not get ready: {line!r}\n{proc.stderr.read()}")
    return proc, line.split()[1]


def llama_server_of(proc) -> psutil.Process:
    [child] = [c for c in psutil.Process(proc.pid).children(recursive=True) if "llama" in c.name()]
    return child


def test_a_shutdown_save_that_fails_is_an_error_exit(llama_model, server_bin, port, isolated_home):
    proc, url = serve(isolated_home, llama_model, server_bin, port)
    try:
        converse(url, USER_TURNS[:2])  # a conversation only the shutdown save would keep
        sessions = isolated_home / "sessions"
        shutil.rmtree(sessions)
        sessions.write_text("not a folder")  # llama-server cannot write the save anywhere
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1, err
    assert "could not be saved" in err and "Traceback" not in err


def test_a_second_sigterm_stops_without_waiting_for_the_saves(llama_model, server_bin, port, isolated_home):
    proc, url = serve(isolated_home, llama_model, server_bin, port)
    server = llama_server_of(proc)
    try:
        converse(url, USER_TURNS[:1])
        server.suspend()  # a server that hangs: the shutdown save would wait for its time limit (120 s)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None, "still saving after the first SIGTERM"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - t0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            server.kill()
        except psutil.Error:
            pass
    assert code == 1 and took < 30, (code, took, err)
    assert "again" in err and "stopped without saving" in err
    assert (not psutil.pid_exists(server.pid)
            or server.status() == psutil.STATUS_ZOMBIE), "llama-server outlived serve"
    assert os.path.exists(isolated_home)


def test_a_stop_does_not_wait_for_requests_in_flight(llama_model, server_bin, port, isolated_home):
    """llama-server stops at once, whatever it is answering; so does its front door: a request in
    flight is cut after a moment, and the conversation it ran on is saved as the server stops."""
    import threading

    import httpx

    proc, url = serve(isolated_home, llama_model, server_bin, port, ctx=8192)
    try:
        def long_answer() -> None:
            try:
                httpx.post(f"{url}/completion", json={"prompt": "Once upon a time", "n_predict": 7000,
                                                      "ignore_eos": True}, timeout=120)
            except httpx.HTTPError:
                pass  # cut by the stop, as expected

        t = threading.Thread(target=long_answer)
        t.start()
        def generating() -> bool:
            try:
                return any(s.get("is_processing") for s in httpx.get(f"{url}/slots", timeout=5).json())
            except (httpx.HTTPError, ValueError):
                return False

        deadline = time.monotonic() + 60
        while not generating():  # it is generating
            assert time.monotonic() < deadline and t.is_alive(), "the answer never began"
            time.sleep(0.05)
        time.sleep(0.3)  # a few tokens generated
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - began
        t.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0 and took < 10, (code, took)  # not the ~15 s the answer had left to run
    [saved] = SessionStore(isolated_home / "sessions").sessions()
    # the prompt and what was generated before the stop
    assert saved.sidecar is not None and 4 < saved.sidecar.n_tokens < 7000, saved  # cut short
