"""Crashes at every step of a save, a server killed mid-save, and a full disk: never a partial session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from e2e_helpers import USER_TURNS, EventLog, chat, converse, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.saving import FAULT_ENV
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e


def _serve_cmd(home, model, server_bin, port):
    return [sys.executable, "-m", "slotkeeper", "serve", "--model", str(model), "--server-bin", server_bin,
            "--port", str(port), "--ctx", "2048", "--data-dir", str(home), "--idle-save", "0.2"]


def _start(cmd, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline().strip()
    assert line.startswith("ready "), proc.stderr.read()
    return proc, line.split(" ", 1)[1]


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.mark.parametrize("step", ["after_server_write", "after_pieces", "after_hash", "after_rename",
                                  "after_sidecar"])
def test_engine_killed_at_each_save_step_leaves_a_whole_session(llama_model, server_bin, port, isolated_home,
                                                                step):
    cmd = _serve_cmd(isolated_home, llama_model, server_bin, port)
    store = SessionStore(isolated_home / "sessions")
    proc, url = _start(cmd)
    try:
        history, _ = converse(url, USER_TURNS[:2])
        wait_until(lambda: store.sessions(), what="first save")
    finally:
        _stop(proc)
    [v1] = store.sessions()

    proc, url = _start(cmd, env={FAULT_ENV: step})
    try:
        chat(url, history + [{"role": "user", "content": USER_TURNS[2]}], max_tokens=24)
        assert proc.wait(30) == 86, "the engine died at the fault point"
    finally:
        if proc.poll() is None:
            proc.kill()
    listed = store.sessions()
    assert len(listed) == 1 and listed[0].status == "ok", [e.to_json() for e in listed]
    if step == "after_sidecar":
        assert listed[0].sidecar.n_tokens > v1.sidecar.n_tokens  # the new version was complete
    else:
        assert listed[0].sidecar.kv_file == v1.sidecar.kv_file  # the previous version, untouched

    # The relaunch sweeps leftovers, deals with the orphaned server, and restores.
    proc, url = _start(cmd)
    try:
        names = os.listdir(isolated_home / "sessions")
        assert not [n for n in names if n.startswith("incoming-")]
        assert len([n for n in names if n.endswith(".kvm")]) == 1, names
        try:
            r = chat(url, history + [{"role": "user", "content": "one more"}])
        except Exception as exc:  # what serve said is the diagnosis
            proc.kill()
            raise AssertionError(f"{exc}\n{proc.stderr.read()[-6000:]}") from exc
        assert r["timings"]["cache_n"] > 0.9 * v1.sidecar.n_tokens - 30
    finally:
        if proc.poll() is None:
            _stop(proc)


def test_server_killed_mid_save_keeps_the_previous_version(server_bin, port, models_dir):
    from slotkeeper.core.model.modelgen import write_model

    bench = models_dir / "bench.gguf"
    if not bench.exists():
        write_model(bench, "bench")
    engine = make_engine(bench, server_bin, port, idle_save=3600, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(120) is ServerState.READY
        long_text = " ".join(["the walkers went up the hill and came down again"] * 60)
        converse(engine.base_url, [long_text], max_tokens=4)
        first = engine.save_slot(0)
        assert first and first.kind == "new"
        converse(engine.base_url, [long_text, "and again " + long_text], max_tokens=4)

        sessions_dir = engine.paths.sessions_dir
        staging = engine.link.staging  # where llama-server writes its slot files
        killed = threading.Event()

        def killer():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not killed.is_set():
                if any(n.startswith("incoming-") for n in os.listdir(staging)):
                    os.kill(engine.supervisor.pid, signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.0005)

        t = threading.Thread(target=killer)
        t.start()
        assert engine.save_slot(0) is None
        t.join()
        assert killed.is_set()
        assert events.of(ev.SaveFailed)
        [entry] = engine.library.store.sessions()
        assert entry.id == first.id and entry.status == "ok"
        assert engine.library.store.verify(entry.id).status == "ok"
        # The supervisor restarts the server and restores what was in the slot.
        wait_until(lambda: len(events.of(ev.SessionRestored)) >= 1, timeout=120,
                   what="restore after the crash")
        # The file llama-server was writing when it died is gone now, not at the next start.
        assert not [n for n in os.listdir(staging) if n.startswith("incoming-")]
        assert not [n for n in os.listdir(sessions_dir) if n.startswith("incoming-")]
        # What llama-server writes is private, like everything Slotkeeper writes (its umask).
        for name in os.listdir(sessions_dir):
            assert os.stat(sessions_dir / name).st_mode & 0o077 == 0, name
        for piece in (sessions_dir / "pieces").rglob("*"):
            assert piece.stat().st_mode & 0o077 == 0, piece.name
        assert staging.stat().st_mode & 0o077 == 0
        for log in engine.paths.server_log.parent.iterdir():
            assert log.stat().st_mode & 0o077 == 0, log.name
    finally:
        engine.stop(save=False)


def test_full_disk_gives_a_clear_error_and_keeps_the_previous_version(llama_model, server_bin, port, tmp_path,
                                                                      monkeypatch):
    small = tmp_path / "small"
    small.mkdir()
    # mode=0700: a tmpfs root is 1777 by default, and a data folder others can write to is refused.
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k,mode=0700", "tmpfs", str(small)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        monkeypatch.setenv("SLOTKEEPER_HOME", str(small))
        engine = make_engine(llama_model, server_bin, port, idle_save=3600)
        events = EventLog(engine)
        engine.start()
        try:
            assert engine.wait_ready(60) is ServerState.READY
            history, _ = converse(engine.base_url, USER_TURNS[:1], max_tokens=8)
            first = engine.save_slot(0)
            assert first is not None
            filler = small / "filler"
            free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
            filler.write_bytes(b"\0" * max(0, free - first.size_bytes // 2))
            converse(engine.base_url, USER_TURNS[:3], max_tokens=24)
            assert engine.save_slot(0) is None
            [failure] = events.of(ev.SaveFailed)
            assert "The disk is full" in failure.message
            assert "Traceback" not in failure.message
            [entry] = engine.library.store.sessions()
            assert entry.id == first.id and engine.library.store.verify(entry.id).status == "ok"
            assert not [n for n in os.listdir(engine.paths.sessions_dir) if n.startswith("incoming-")]
            with engine.client() as c:
                assert c.health().ok
        finally:
            engine.stop(save=False)
    finally:
        subprocess.run(["umount", "-l", str(small)])


def _relaunch_answers_from_the_cache(cmd, history, home, n_saved):
    """Relaunched: nothing an interrupted step left looks valid, and the conversation is served from
    its save (or a point of it)."""
    proc, url = _start(cmd)
    try:
        names = os.listdir(home / "sessions")
        assert not [n for n in names if n.startswith("incoming-")]
        store = SessionStore(home / "sessions")
        for entry in store.sessions():
            claimed = {entry.sidecar.kv_file, *(p.kv_file for p in entry.sidecar.points)}
            assert {n for n in names if n.startswith(entry.id) and n.endswith(".kvm")} == claimed, names
            assert store.verify(entry.id).status == "ok"
        try:
            r = chat(url, history + [{"role": "user", "content": "one more"}])
        except Exception as exc:  # what serve said is the diagnosis
            proc.kill()
            raise AssertionError(f"{exc}\n{proc.stderr.read()[-6000:]}") from exc
        assert r["timings"]["cache_n"] > 0.9 * n_saved - 30
    finally:
        if proc.poll() is None:
            _stop(proc)


@pytest.mark.parametrize("step", ["point_after_server_write", "point_after_pieces", "point_after_hash",
                                  "point_after_rename", "point_after_sidecar"])
def test_engine_killed_at_each_step_of_a_restore_point_keeps_the_conversation(models_dir, server_bin, port,
                                                                               isolated_home, step):
    """A hybrid's conversation gets restore points after its save; the engine dies at each step of
    making the first one: the save stays whole, the point is there whole or not at all."""
    from slotkeeper.core.model.modelgen import write_model

    model = models_dir / "tiny-qwen35.gguf"
    if not model.exists():
        write_model(model, "qwen35")
    cmd = _serve_cmd(isolated_home, model, server_bin, port)
    store = SessionStore(isolated_home / "sessions")
    proc, url = _start(cmd, env={FAULT_ENV: step})
    try:
        history, _ = converse(url, USER_TURNS[:2])
        assert proc.wait(60) == 86, "the engine died making the point"
    finally:
        if proc.poll() is None:
            proc.kill()
    [saved] = store.sessions()
    assert saved.status == "ok"
    if step == "point_after_sidecar":
        assert saved.sidecar.points, "the point was committed before the engine died"
    else:
        assert not saved.sidecar.points
    _relaunch_answers_from_the_cache(cmd, history, isolated_home, saved.sidecar.n_tokens)


@pytest.mark.parametrize("step", ["delete_after_sidecar", "delete_after_files"])
def test_engine_killed_while_a_prune_deletes_leaves_no_half_conversation(llama_model, server_bin, port,
                                                                         isolated_home, step):
    """Over a tiny budget, the conversation a second one pushed out of the slot is pruned after the
    second one's save; the engine dies in the middle of deleting it: after a relaunch it is gone
    (nothing of it lists), the other is whole and served from its save."""
    cmd = [*_serve_cmd(isolated_home, llama_model, server_bin, port), "--budget", "1K"]
    store = SessionStore(isolated_home / "sessions")
    proc, url = _start(cmd, env={FAULT_ENV: step})
    try:
        converse(url, USER_TURNS[:2])
        wait_until(lambda: store.sessions(), what="the first conversation's save")
        [first] = store.sessions()
        other, _ = converse(url, ["A different matter: " + t for t in USER_TURNS[2:4]])
        assert proc.wait(60) == 86, "the engine died deleting the first conversation"
    finally:
        if proc.poll() is None:
            proc.kill()
    left = store.sessions()
    assert first.id not in [e.id for e in left]  # its sidecar went first: it no longer exists
    assert [e.status for e in left] == ["ok"]
    _relaunch_answers_from_the_cache(cmd, other, isolated_home, left[0].sidecar.n_tokens)
    assert not [n for n in os.listdir(isolated_home / "sessions") if n.startswith(first.id)]
