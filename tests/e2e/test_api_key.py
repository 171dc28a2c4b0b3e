"""The user's API key: llama-server demands it, Slotkeeper's own calls send it, and it never shows
in a process list or a state file, whichever way it is given (--api-key, --api-key-file, $LLAMA_API_KEY).
Slotkeeper does not listen beyond this machine without a key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from e2e_helpers import USER_TURNS

from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e

KEY = "k3y-only-the-user-knows"


def serve(home, model, server_bin, port, *extra, env=None, host=None):
    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--model", str(model), "--server-bin", server_bin,
           "--port", str(port), "--ctx", "2048", "--data-dir", str(home), "--idle-save", "0.2",
           *(["--host", host] if host else []), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        proc.kill()
        raise AssertionError(f"serve did not get ready: {line!r}\n{proc.stderr.read()}")
    return proc, line


def stop(proc) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, proc.stderr.read()


@pytest.mark.parametrize("how", ["arg", "file", "env"])
def test_the_key_protects_the_server_and_never_shows(how, llama_model, server_bin, port, isolated_home,
                                                     tmp_path):
    keyfile = tmp_path / "key.txt"
    keyfile.write_text(KEY + "\n")
    extra, env = {"arg": (["--", "--api-key", KEY], None),
                  "file": (["--", "--api-key-file", str(keyfile)], None),
                  "env": ([], {"LLAMA_API_KEY": KEY})}[how]
    proc, line = serve(isolated_home, llama_model, server_bin, port, *extra, env=env)
    url = line.split()[1]
    try:
        assert httpx.get(f"{url}/slots", timeout=10).status_code == 401, "the key is demanded"
        headers = {"Authorization": f"Bearer {KEY}"}
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=60,
                       json={"messages": [{"role": "user", "content": USER_TURNS[0]}], "max_tokens": 8})
        assert r.status_code == 200
        deadline = time.monotonic() + 30
        while not SessionStore(isolated_home / "sessions").sessions() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert SessionStore(isolated_home / "sessions").sessions(), "Slotkeeper's own calls carry the key"
        [server] = [c for c in psutil.Process(proc.pid).children(recursive=True) if "llama" in c.name()]
        assert KEY not in " ".join(server.cmdline())
        assert KEY not in (isolated_home / "state" / "server.json").read_text()
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert KEY not in (isolated_home / "logs" / "llama-server.log").read_text(errors="replace")
    if how == "arg":
        assert "visible to other users" in err, "a key on our own command line is worth a warning"


def test_listening_beyond_this_machine_needs_a_key(llama_model, server_bin, port, isolated_home, tmp_path):
    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--model", str(llama_model),
           "--server-bin", server_bin, "--port", str(port), "--ctx", "2048", "--data-dir", str(isolated_home),
           "--host", "0.0.0.0"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"})
    assert refused.returncode != 0 and "without an API key" in refused.stderr, refused.stderr
    assert not refused.stdout.startswith("ready")
    keyfile = tmp_path / "key.txt"
    keyfile.write_text(KEY + "\n")
    proc, line = serve(isolated_home, llama_model, server_bin, port, "--", "--api-key-file", str(keyfile),
                       host="0.0.0.0")
    try:
        assert "listening on 0.0.0.0" in line and "other machines" in line
        url = line.split()[1]
        assert httpx.get(f"{url}/props", timeout=10).status_code == 401
        keyed = httpx.get(f"{url}/props", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert keyed.status_code == 200
    finally:
        code, err = stop(proc)
    assert code == 0
