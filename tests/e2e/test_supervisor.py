"""The supervisor and `slotkeeper serve` against the real llama-server on generated models."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from e2e_helpers import wait_until

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine, EngineError
from slotkeeper.core.events import ServerStateChanged, WarningRaised
from slotkeeper.core.server.restart import RestartPolicy
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import ServerProfile, Settings

pytestmark = pytest.mark.e2e


def make_engine(model, server_bin, port, **profile) -> Engine:
    settings = Settings(
        profile=ServerProfile(model_path=str(model), server_bin=server_bin, port=port, ctx=2048, **profile)
    )
    return Engine(app_paths(), settings)


def test_start_ready_props_and_stop(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port)
    states = []
    engine.events.subscribe(lambda e: states.append(e.state), ServerStateChanged)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert engine.wait_ready(10) is ServerState.READY
        with engine.client() as c:
            props = c.props()
            assert os.path.samefile(props.model_path, llama_model)
            assert props.total_slots == 1 and props.n_ctx_slot == 2048
        # --metrics is on for Slotkeeper: the Prometheus counters answer (and no prompt was processed
        # yet); clients get them only when the user asks for --metrics, as from llama-server.
        url, key = engine.link.upstream()
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert metrics.status_code == 200 and "llamacpp:prompt_tokens_total 0" in metrics.text
        assert httpx.get(f"{engine.base_url}/metrics", timeout=10).status_code == 501
        pid = engine.supervisor.pid
        assert engine.paths.server_state_file.exists()
    finally:
        engine.stop()
    assert states[0] is ServerState.STARTING and ServerState.READY in states
    assert states[-1] is ServerState.STOPPED
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not engine.paths.server_state_file.exists()
    log_text = engine.paths.server_log.read_text()
    assert "listening on http://127.0.0.1:" in log_text
    assert f"127.0.0.1:{port}" not in log_text, \
        "llama-server listens on a private port, the front door on ours"


def test_kill9_is_restarted_then_repeated_crashes_fail_with_log_tail(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port)
    engine.supervisor.policy = RestartPolicy(max_restarts=2, window_seconds=600, backoff_base=0.1)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for round_ in range(2):
            old = engine.supervisor.pid
            os.kill(old, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if engine.supervisor.state is ServerState.READY and engine.supervisor.pid != old:
                    break
                time.sleep(0.05)
            assert engine.supervisor.state is ServerState.READY, f"round {round_}"
            with engine.client() as c:
                assert c.health().ok
        os.kill(engine.supervisor.pid, signal.SIGKILL)
        wait_until(lambda: engine.supervisor.state is ServerState.FAILED, 30, what="the third crash to fail")
        assert "crashed 3 times" in engine.supervisor.message
        assert engine.supervisor.log_tail(), "the failure shows the last log lines"
    finally:
        engine.stop()


def test_port_in_use_is_reported_and_nothing_is_killed(llama_model, server_bin, port):
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        engine = make_engine(llama_model, server_bin, port)
        with pytest.raises(EngineError) as refused:
            engine.start()
        assert f"Port {port}" in str(refused.value) and "already in use" in str(refused.value)
        assert f"by {psutil.Process().name()} (pid {os.getpid()})" in str(refused.value)  # who holds it
        assert engine.supervisor.state is ServerState.STOPPED  # nothing was started
        assert other.poll() is None
        holder.getsockname()  # still ours
    finally:
        holder.close()
        other.kill()


def test_missing_binary_and_non_gguf_model_are_clear_errors(llama_model, tmp_path, port, server_bin):
    engine = make_engine(llama_model, str(tmp_path / "no-such-server"), port)
    engine.start()
    assert engine.wait_ready(10) is ServerState.FAILED
    assert "does not exist" in engine.supervisor.message and "pip install" in engine.supervisor.message
    # the front door says so to clients, in llama-server's error shape
    r = httpx.post(f"{engine.base_url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and "not running" in r.json()["error"]["message"]
    engine.close(save=False)

    bogus = tmp_path / "notes.gguf"
    bogus.write_text("these are my notes, not a model\n")
    engine = make_engine(bogus, server_bin, port)
    engine.start()
    assert engine.wait_ready(10) is ServerState.FAILED
    assert "GGUF" in engine.supervisor.message
    assert "Traceback" not in engine.supervisor.message
    engine.close(save=False)


def abandon(engine) -> None:
    """The app "dies": its supervisor thread and front door are gone but the server it started
    keeps running."""
    engine.supervisor._stop_requested.set()
    engine.supervisor._thread.join(5)
    engine.loop.call(engine.front.stop())


def test_leftover_server_from_a_dead_app_is_adopted(llama_model, server_bin, port):
    first = make_engine(llama_model, server_bin, port)
    first.start()
    assert first.wait_ready(60) is ServerState.READY
    pid = first.supervisor.pid
    abandon(first)
    second = make_engine(llama_model, server_bin, port)
    second.start()
    try:
        assert second.wait_ready(30) is ServerState.READY
        assert second.supervisor.adopted and second.supervisor.pid == pid
    finally:
        second.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_leftover_with_other_settings_is_stopped_cleanly(llama_model, server_bin, port):
    first = make_engine(llama_model, server_bin, port)
    first.start()
    assert first.wait_ready(60) is ServerState.READY
    pid = first.supervisor.pid
    abandon(first)
    second = make_engine(llama_model, server_bin, port, parallel=2)
    second.start()
    try:
        assert second.wait_ready(60) is ServerState.READY
        assert not second.supervisor.adopted and second.supervisor.pid != pid
        proc_gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert proc_gone
    finally:
        second.stop()


def test_serve_prints_ready_and_exits_0_on_sigterm(llama_model, server_bin, port, isolated_home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotkeeper", "serve", "--model", str(llama_model),
         "--server-bin", server_bin, "--port", str(port), "--ctx", "1024", "--data-dir", str(isolated_home)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line == f"ready http://127.0.0.1:{port}"
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        state = (isolated_home / "state" / "server.json").read_text()
        server_pid = int(__import__("json").loads(state)["pid"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)


def test_serve_demo_runs_the_starter_model_and_answers_in_english(server_bin, port, isolated_home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotkeeper", "serve", "--demo", "--server-bin", server_bin,
         "--port", str(port), "--data-dir", str(isolated_home)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().startswith("ready ")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Name three colours."}],
                             "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200
        answer = r.json()["choices"][0]["message"]["content"].lower()
        # a real model, in English
        assert "red" in answer and {"the", "is", "a"} & set(answer.split()), answer
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert "SmolLM2" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.1, 0.3])
def test_stop_while_starting_leaves_no_server_behind(llama_model, server_bin, port, delay):
    engine = make_engine(llama_model, server_bin, port)
    engine.start()
    time.sleep(delay)
    engine.stop()
    time.sleep(0.5)
    marker = str(engine.paths.sessions_dir)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                left.append(p.pid)
        except psutil.Error:
            continue
    assert left == [], "llama-server outlived a stop during start-up"
    assert engine.supervisor.state is ServerState.STOPPED


def test_a_crash_of_an_adopted_server_is_noticed_and_restarted(llama_model, server_bin, port):
    first = make_engine(llama_model, server_bin, port)
    first.start()
    assert first.wait_ready(60) is ServerState.READY
    abandon(first)
    second = make_engine(llama_model, server_bin, port)
    second.supervisor.policy = RestartPolicy(backoff_base=0.1)
    second.start()
    try:
        assert second.wait_ready(30) is ServerState.READY and second.supervisor.adopted
        adopted = second.supervisor.pid
        os.kill(adopted, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if second.supervisor.state is ServerState.READY and second.supervisor.pid != adopted:
                break
            time.sleep(0.05)
        assert second.supervisor.pid != adopted and second.supervisor.state is ServerState.READY
    finally:
        second.stop()


def test_a_second_engine_on_the_same_data_folder_is_refused(llama_model, server_bin, port, isolated_home):
    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--model", str(llama_model), "--server-bin",
           server_bin, "--data-dir", str(isolated_home)]
    first = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().startswith("ready ")
        pid = json.loads((isolated_home / "state" / "server.json").read_text())["pid"]
        from e2e_helpers import free_port

        second = subprocess.run([*cmd, "--port", str(free_port())], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 1
        assert "already running" in second.stderr and "Traceback" not in second.stderr
        assert psutil.pid_exists(pid) and httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        if first.poll() is None:
            first.kill()


def test_a_leftover_with_other_settings_has_its_conversations_saved_before_it_is_stopped(
        llama_model, server_bin, port, isolated_home):
    from e2e_helpers import USER_TURNS, EventLog, converse

    from slotkeeper.core import events as ev

    proc = subprocess.Popen(
        [sys.executable, "-m", "slotkeeper", "serve", "--model", str(llama_model), "--server-bin", server_bin,
         "--port", str(port), "--ctx", "2048", "--data-dir", str(isolated_home), "--idle-save", "3600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split()[1]
        converse(url, USER_TURNS[:2])  # not saved yet: the idle save is an hour away
        leftover = json.loads((isolated_home / "state" / "server.json").read_text())
        assert "--api-key" not in leftover["argv"] and leftover["launch"]["profile"]["ctx"] == 2048
        proc.kill()  # Slotkeeper dies (kill -9); its llama-server keeps running
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert psutil.pid_exists(leftover["pid"])
    # other settings: no adoption
    engine = make_engine(llama_model, server_bin, port, extra_args=("--threads", "2"))
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not engine.supervisor.adopted
        [saved] = [s for s in events.of(ev.SessionSaved) if s.reason == "left running"]
        assert saved.kind == "new" and saved.n_tokens > 50
        entry = engine.sessions.get(saved.id)
        assert entry.sidecar.n_ctx_slot == 2048 and entry.status == "ok"
        assert [r.id for r in events.of(ev.SessionRestored)] == [saved.id], "and it is resumed at once"
    finally:
        engine.stop()
    assert (not psutil.pid_exists(leftover["pid"])
            or psutil.Process(leftover["pid"]).status() == psutil.STATUS_ZOMBIE)


def test_a_server_that_dies_of_an_illegal_instruction_while_loading_is_started_without_repacking(
        llama_model, server_bin, port, tmp_path):
    """Some systems report CPU instructions they do not let programs use (AMX in some virtual
    machines): llama-server's weight repacking then dies of SIGILL while it loads the model. The
    next launch runs with --no-repack, and so does every launch of that binary after it."""
    wrapper = tmp_path / "llama-server"
    wrapper.write_text("#!/bin/sh\n"
                       f'for a in "$@"; do [ "$a" = "--no-repack" ] && exec "{server_bin}" "$@"; done\n'
                       f'case "$1" in --help|--version) exec "{server_bin}" "$@";; esac\n'
                       "kill -ILL $$\n")
    wrapper.chmod(0o755)
    engine = make_engine(llama_model, str(wrapper), port)
    engine.supervisor.policy = RestartPolicy(backoff_base=0.1)
    warnings = []
    engine.events.subscribe(lambda e: warnings.append(e.message), WarningRaised)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert "--no-repack" in engine.supervisor.spec.argv
        assert any("illegal instruction" in w and "--no-repack" in w for w in warnings), warnings
    finally:
        engine.stop()
    again = make_engine(llama_model, str(wrapper), port)
    crashes = []
    again.events.subscribe(lambda e: crashes.append(e) if e.state is ServerState.CRASHED else None,
                           ServerStateChanged)
    again.start()
    try:
        assert again.wait_ready(60) is ServerState.READY and not crashes  # at once, this time
        assert "--no-repack" in again.supervisor.spec.argv
    finally:
        again.stop()
