"""The core loop against the real llama-server: save -> stop -> relaunch -> restore -> cache hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from e2e_helpers import USER_TURNS, EventLog, chat, converse, make_engine, wait_until

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.history import RequestHistory
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e


def serve(home, model, server_bin, port, *extra, env=None):
    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--model", str(model), "--server-bin", server_bin,
           "--port", str(port), "--ctx", "2048", "--data-dir", str(home), "--idle-save", "0.2", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        proc.kill()
        raise AssertionError(f"serve did not get ready: {line!r}\n{proc.stderr.read()}")
    return proc, line.split(" ", 1)[1]


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def sessions(home):
    return SessionStore(home / "sessions").sessions()


def test_full_loop_restores_and_continues_like_an_in_process_cache(llama_model, server_bin, port,
                                                                   isolated_home):
    proc, url = serve(isolated_home, llama_model, server_bin, port)
    try:
        history, _ = converse(url, USER_TURNS[:3])
        saved = wait_until(lambda: [s for s in sessions(isolated_home) if s.sidecar.n_tokens > 100],
                           what="the idle save")
        n_saved = saved[0].sidecar.n_tokens
        follow = history + [{"role": "user", "content": USER_TURNS[3]}]
        chat(url, follow, max_tokens=24)
        cached_run = chat(url, follow, max_tokens=24)  # an in-process cache hit of the same prompt
        assert cached_run["timings"]["cache_n"] > 0
    finally:
        stop(proc)
    [entry] = sessions(isolated_home)
    assert entry.sidecar.id == saved[0].sidecar.id, "the same conversation is updated in place"
    assert entry.sidecar.n_tokens > n_saved
    assert "weather in the mountains" in entry.sidecar.title

    proc, url = serve(isolated_home, llama_model, server_bin, port)
    try:
        restored_run = chat(url, follow, max_tokens=24)
    finally:
        stop(proc)
    t = restored_run["timings"]
    assert t["cache_n"] >= 0.95 * n_saved
    assert restored_run["choices"][0]["message"]["content"] == cached_run["choices"][0]["message"]["content"]
    rec = sessions(isolated_home)[0].sidecar.last_restore
    assert rec is not None and rec.effective is True and rec.cache_n == t["cache_n"]
    # Both launches are kept for the History's markers (any face's), the second with its restore.
    launches = RequestHistory(app_paths(isolated_home).history_file).launches()
    assert [launch.restored_slots for launch in launches] == [(), (0,)]
    assert launches[0].at < launches[1].at


def test_restore_reuse_is_measured_per_slot_with_two_slots_busy(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, parallel=2, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        a, _ = converse(url, USER_TURNS[:2])
        wait_until(lambda: len(engine.library.store.sessions()) == 1, what="first save")
        b, _ = converse(url, ["A different chat entirely, about cooking pasta at home tonight.",
                              "Which sauce goes best with it, do you think?"])
        wait_until(lambda: len(engine.library.store.sessions()) == 2, what="second save")
    finally:
        engine.stop()
    engine2 = make_engine(llama_model, server_bin, port, parallel=2, ctx=4096)
    events2 = EventLog(engine2)
    engine2.start()
    try:
        assert engine2.wait_ready(60) is ServerState.READY
        assert len(events2.of(ev.SessionRestored)) == 2
        import threading

        results = {}
        ta = threading.Thread(target=lambda: results.__setitem__(
            "a", chat(engine2.base_url, a + [{"role": "user", "content": "more?"}])))
        tb = threading.Thread(target=lambda: results.__setitem__(
            "b", chat(engine2.base_url, b + [{"role": "user", "content": "more?"}])))
        ta.start(); tb.start(); ta.join(); tb.join()
        reuse = wait_until(lambda: len(events2.of(ev.RestoreReused)) == 2 and events2.of(ev.RestoreReused),
                           what="reuse figures")
        by_id = {r.id: r for r in reuse}
        for key in ("a", "b"):
            t = results[key]["timings"]
            match = [r for r in by_id.values() if r.cache_n == t["cache_n"]]
            assert match and match[0].effective, (key, t, reuse)
        done = events2.of(ev.RequestDone)
        assert {d.slot for d in done} == {0, 1}
    finally:
        engine2.stop()
    assert not events.of(ev.SaveFailed)


def test_gemma2_without_swa_full_is_not_saved_and_says_why(gemma2_model, server_bin, port):
    """Restore mode "never": a restored sliding-window state without --swa-full is re-read from the
    start, so the engine does not keep saving conversations that cannot help; it says so once."""
    engine = make_engine(gemma2_model, server_bin, port)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        warned = [w.message for w in events.of(ev.WarningRaised)]
        assert len([w for w in warned if "--swa-full" in w]) == 1, warned
        [note] = [w for w in warned if "--swa-full" in w]
        assert "does not save" in note and "more KV memory" in note
        converse(engine.base_url, [" ".join(USER_TURNS * 12), USER_TURNS[1]])
        time.sleep(1.0)  # five idle-save periods
        assert engine.library.store.sessions() == []
    finally:
        engine.stop()  # nor at shutdown
    assert engine.library.store.sessions() == []
    assert not events.of(ev.SaveFailed)
    assert len([w for w in events.of(ev.WarningRaised) if "--swa-full" in w.message]) == 1


def test_gemma2_swa_full_restore_is_effective(gemma2_model, server_bin, port):
    engine = make_engine(gemma2_model, server_bin, port, swa_full=True)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not [w.message for w in events.of(ev.WarningRaised)]
        # Longer than the sliding layers' cache (window 128 + ubatch 512, rounded to 768 cells),
        # so the saved file lacks the early cells of those layers.
        long_turn = " ".join(USER_TURNS * 12)
        history, _ = converse(engine.base_url, [long_turn, USER_TURNS[1]])
        [saved] = wait_until(lambda: engine.library.store.sessions(), what="save")
        assert saved.sidecar.n_tokens > 900 and saved.sidecar.swa and saved.sidecar.swa_full
        assert saved.sidecar.restore_mode == "exact"
    finally:
        engine.stop()
    engine = make_engine(gemma2_model, server_bin, port, swa_full=True)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert events.of(ev.SessionRestored)
        nxt = history + [{"role": "user", "content": "and then?"}]
        chat(engine.base_url, nxt)
        [reuse] = wait_until(lambda: events.of(ev.RestoreReused), what="reuse judgement")
    finally:
        engine.stop()
    rec = engine.library.store.sessions()[0].sidecar.last_restore
    assert reuse.effective and rec.effective is True


def test_resume_restores_the_chosen_session_into_slot_0(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, ["First chat: about apples and pears in the orchard."], max_tokens=8)
        older = engine.save_slot(0).id
        converse(engine.base_url, ["Second chat: about trains and stations."], max_tokens=8)
        newer = engine.save_slot(0).id
    finally:
        engine.stop(save=False)
    assert older != newer
    engine = make_engine(llama_model, server_bin, port)
    events = EventLog(engine)
    engine.start(resume_id=older)
    try:
        assert engine.wait_ready(60) is ServerState.READY
        [restored] = events.of(ev.SessionRestored)
        assert restored.id == older and restored.slot == 0
    finally:
        engine.stop(save=False)


def test_swa_full_rollback_inside_restored_tokens_is_recomputed(gemma2_model, server_bin, port):
    engine = make_engine(gemma2_model, server_bin, port, swa_full=True, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, _ = converse(engine.base_url, [" ".join(USER_TURNS * 12), USER_TURNS[1]], max_tokens=24)
        assert engine.save_slot(0).kind == "new"  # saved after generating the reply
    finally:
        engine.stop(save=False)
    engine = make_engine(gemma2_model, server_bin, port, swa_full=True)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        # An edited last message: the prompt diverges inside the restored tokens.
        edited = history[:-2] + [{"role": "user", "content": "Something else entirely, please."}]
        r = chat(engine.base_url, edited)
        # Reusing the restored state would give another answer than a cold server: it is erased.
        assert r["timings"]["cache_n"] == 0
        [recomputed] = events.of(ev.SlotRecomputed)
        assert recomputed.slot == 0 and "rolls back inside restored state" in recomputed.reason
        [reuse] = wait_until(lambda: events.of(ev.RestoreReused), what="reuse judgement")
        # Not the restore's failure: "not judged", and why.
        assert reuse.effective is None and reuse.reason.startswith("not judged: recomputed")
    finally:
        engine.stop(save=False)


def test_an_edited_earlier_message_forks_a_new_session_with_its_parent(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, _ = converse(engine.base_url, USER_TURNS[:3])
        original = engine.save_slot(0)
        converse(engine.base_url, USER_TURNS[:4])  # the same conversation, one turn longer
        longer = engine.save_slot(0)
        edited = [USER_TURNS[0], "Actually, tell me about the sea instead of the hills.", USER_TURNS[2]]
        converse(engine.base_url, edited)
        fork = engine.save_slot(0)
    finally:
        engine.stop(save=False)
    assert longer.kind == "update" and longer.id == original.id
    assert fork.kind == "fork" and fork.id != original.id
    sessions = {e.id: e.sidecar for e in engine.library.store.sessions()}
    assert sessions[fork.id].parent == original.id
    assert len(sessions) == 2


def test_resuming_a_conversation_already_in_a_slot_keeps_its_newer_turns(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, _ = converse(engine.base_url, USER_TURNS[:2])
        saved = engine.save_slot(0)
        converse(engine.base_url, USER_TURNS[:3])  # newer turns, not saved yet
        out = engine.restore(saved.id)
        assert out.already_loaded and out.slot == 0
        with engine.client() as c:
            held = c.slots()[0].n_prompt_tokens
        assert held > saved.n_tokens  # the slot was not rolled back to the saved state
    finally:
        engine.stop(save=False)


def test_settings_edited_without_a_restart_do_not_lose_the_running_servers_slots(llama_model, server_bin,
                                                                                 port):
    from e2e_helpers import free_port

    engine = make_engine(llama_model, server_bin, port, idle_save=3600, flash_attn=False)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, USER_TURNS[:2])
        # Settings saved with another port and flash attention, no restart yet.
        update_settings(engine, engine.settings.with_profile(port=free_port(), flash_attn=True))
        assert engine.base_url.endswith(f":{port}")
    finally:
        engine.stop()
    [entry] = engine.library.store.sessions()
    assert entry.sidecar.flash_attn is False  # recorded as the server really ran


def test_a_request_served_while_the_engine_is_still_getting_ready_is_saved(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=0.2)
    real_compute = engine.hashes.compute
    gate = threading.Event()

    def slow_compute(path, progress=None):  # a first-seen multi-GB model takes a while to hash
        gate.wait(30)
        return real_compute(path, progress)

    engine.hashes.compute = slow_compute
    engine.start()
    try:
        wait_until(lambda: engine.supervisor.state is ServerState.READY, what="the server")
        converse(engine.base_url, USER_TURNS[:1])  # served before Slotkeeper is ready
        gate.set()
        assert engine.wait_ready(60) is ServerState.READY
        [entry] = wait_until(lambda: engine.library.store.sessions(), what="the idle save")
        assert entry.sidecar.n_tokens > 10
    finally:
        gate.set()
        engine.stop()


def test_a_resume_clears_the_previous_conversations_prompt_figures(llama_model, server_bin, port):
    # What the Prompt bar shows comes from the slot view: after a Resume the slot holds another
    # conversation that has had no request yet, so the previous request's figures must not stay.
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, ["First chat: about apples and pears in the orchard."], max_tokens=8)
        older = engine.save_slot(0).id
        converse(engine.base_url, ["Second chat: about trains and stations, and a long ride north."],
                 max_tokens=8)
        wait_until(lambda: engine.snapshot.slots[0].n_prompt > 0, what="the second chat's figures")
        summary = engine.restore(older, 0)
        assert summary is not None and summary.n_restored > 0
        view = engine.snapshot.slots[0]
        assert (view.session_id, view.n_prompt, view.cache_n, view.prompt_n) == (older, 0, 0, 0)
        assert view.n_tokens == summary.n_restored
    finally:
        engine.stop(save=False)
