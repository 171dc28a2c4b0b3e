"""EngineBridge: core events become Qt signals on the GUI thread; actions run as jobs."""

from __future__ import annotations

import json
import threading  # noqa: F401

from gui_helpers import emit_from_thread, make_session
from PySide6.QtCore import QThread
from PySide6.QtWidgets import QApplication

from slotkeeper.core import events as ev
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import load_settings
from slotkeeper.core.views import Activity, SlotView


def test_server_state_event_reaches_handlers_on_the_gui_thread(qtbot, bridge, engine):
    threads, seen = [], []

    def on_state(event: ev.ServerStateChanged) -> None:
        threads.append(QThread.currentThread() is QApplication.instance().thread())
        seen.append(event)

    bridge.on(ev.ServerStateChanged, on_state)
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "launching"))
    assert [(e.state, e.message) for e in seen] == [(ServerState.STARTING, "launching")]
    assert bridge.state is ServerState.STARTING
    assert bridge.running
    assert threads == [True]
    assert bridge.launched_profile == engine.settings.profile


def test_handlers_get_only_their_event_types(qtbot, bridge, engine):
    warnings, everything = [], []
    bridge.on(ev.WarningRaised, warnings.append)
    bridge.on(ev.Event, everything.append)
    for event in (ev.NoticeRaised("demo"), ev.WarningRaised("swa"), ev.SaveFailed(1, "disk full")):
        with qtbot.waitSignal(bridge.eventArrived):
            emit_from_thread(engine, event)
    assert [w.message for w in warnings] == ["swa"]
    assert [type(e).__name__ for e in everything] == ["NoticeRaised", "WarningRaised", "SaveFailed"]


def test_an_event_type_must_be_an_event_class(bridge):
    import pytest

    with pytest.raises(TypeError):
        bridge.on("engine.warning", print)  # the old string kinds are gone: a typo cannot pass silently


def test_a_deleted_widget_is_no_longer_called(qtbot, bridge, engine):
    from PySide6.QtWidgets import QLabel

    calls = []

    class Listener(QLabel):
        def on_warning(self, event) -> None:
            calls.append(event.message)

    listener = Listener()
    bridge.on(ev.WarningRaised, listener.on_warning)
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.WarningRaised("first"))
    listener.deleteLater()
    qtbot.waitUntil(lambda: not __import__("shiboken6").isValid(listener))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.WarningRaised("second"))
    assert calls == ["first"]


def test_slots_and_activity_events_are_cached(qtbot, bridge, engine):
    views = (SlotView(0, n_ctx=4096, state="busy", n_prompt=900, cache_n=800, prompt_n=50, running=True),
             SlotView(1, n_ctx=4096))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views))
    assert [v.id for v in bridge.slots] == [0, 1]
    assert bridge.slots[0].cache_n == 800
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity("saving", "slot 0", 0, 2)))
    assert bridge.activity.activity == "saving"


def test_stopping_clears_the_slots(qtbot, bridge, engine):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0),)))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED, "stopped"))
    assert bridge.slots == ()
    assert bridge.launched_profile is None


def test_engine_ready_re_announces_the_listing(qtbot, bridge, engine, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa")
    with qtbot.waitSignal(bridge.sessionsListed):
        bridge.refresh_sessions()
    with qtbot.waitSignals([bridge.eventArrived, bridge.sessionsListed]):
        emit_from_thread(engine, ev.EngineReady("http://127.0.0.1:1"))


def test_request_done_is_recorded_in_the_history(qtbot, bridge, engine):
    from slotkeeper.core.engine.desk.ledger import Figures
    from slotkeeper.core.history import RequestHistory

    # The engine records the request (from the response, on its loop) and emits RequestDone.
    fig = Figures(n_prompt=1000, cache_n=900, prompt_n=100, prompt_ms=12.5, source="slot", saved_ms=300.0)
    with qtbot.waitSignal(bridge.historyLoaded) as blocker:
        engine.loop.call_soon(engine.ledger.done, 0, 1010, fig)
    assert blocker.args[0][-1].cache_n == 900
    path = engine.paths.history_file
    qtbot.waitUntil(lambda: len(RequestHistory(path).load()) == 1)
    rec = RequestHistory(path).load()[0]
    assert (rec.n_prompt, rec.cache_n, rec.prompt_n) == (1000, 900, 100)

    bridge.history = []
    with qtbot.waitSignal(bridge.historyLoaded) as blocker:
        bridge.load_history()
    assert len(blocker.args[0]) == 1


def test_log_lines_arrive_in_batches(qtbot, bridge):
    got = []
    bridge.logLines.connect(got.extend)

    def feed():
        for i in range(50):
            bridge._on_log_line(f"line {i}")

    t = threading.Thread(target=feed)
    t.start()
    t.join()
    qtbot.waitUntil(lambda: len(got) == 50)
    assert got[0] == "line 0" and got[-1] == "line 49"


def test_sessions_written_by_someone_else_show_up(qtbot, bridge, sessions_dir):
    with qtbot.waitSignal(bridge.sessionsListed):
        bridge.refresh_sessions()
    assert bridge.listing.sessions == []
    with qtbot.waitSignals([bridge.sessionsChanged, bridge.sessionsListed], timeout=10_000):
        make_session(sessions_dir, "bbbbbbbbbbbb", title="From the CLI")
    qtbot.waitUntil(lambda: [e.id for e in bridge.listing.sessions] == ["bbbbbbbbbbbb"], timeout=10_000)

    with qtbot.waitSignal(bridge.sessionsChanged, timeout=10_000):
        (sessions_dir / "bbbbbbbbbbbb.json").unlink()
    qtbot.waitUntil(lambda: bridge.listing.sessions == [], timeout=10_000)


def test_pin_delete_and_verify(qtbot, bridge, engine, sessions_dir):
    make_session(sessions_dir, "cccccccccccc", title="keep me")
    make_session(sessions_dir, "dddddddddddd", title="damaged", real_hash=False)

    pinned = lambda listing, _facts: any(  # noqa: E731
        e.id == "cccccccccccc" and e.sidecar.pinned for e in listing.sessions)
    with qtbot.waitSignal(bridge.sessionsListed, check_params_cb=pinned):
        bridge.set_pinned("cccccccccccc", True)
    assert engine.sessions.get("cccccccccccc").sidecar.pinned

    with qtbot.waitSignal(bridge.sessionVerified) as blocker:
        bridge.verify_session("dddddddddddd")
    entry = blocker.args[0]
    assert entry.status == "corrupt"
    assert any("hash" in p for p in entry.problems)

    with qtbot.waitSignal(bridge.sessionVerified) as blocker:
        bridge.verify_session("cccccccccccc")
    assert blocker.args[0].problems == []

    gone = lambda listing, _facts: "dddddddddddd" not in [e.id for e in listing.sessions]  # noqa: E731
    with qtbot.waitSignal(bridge.sessionsListed, check_params_cb=gone):
        bridge.delete_session("dddddddddddd")
    assert not (sessions_dir / "dddddddddddd.json").exists()
    assert not (sessions_dir / "dddddddddddd.0000abcd.kv").exists()


def test_failed_action_is_reported(qtbot, bridge):
    with qtbot.waitSignal(bridge.errorOccurred) as blocker:
        bridge.set_pinned("nosuchsession", True)
    assert "nosuchsession" in blocker.args[1]


def test_prune_preview_deletes_nothing(qtbot, bridge, engine, sessions_dir):
    make_session(sessions_dir, "eeeeeeeeeeee", age_hours=5, size=8192)
    make_session(sessions_dir, "ffffffffffff", age_hours=1, size=8192)
    make_session(sessions_dir, "111111111111", age_hours=9, size=8192, pinned=True)
    plans = []
    bridge.preview_prune(17_000, plans.append)
    qtbot.waitUntil(lambda: bool(plans))
    assert [c.id for c in plans[0].delete] == ["eeeeeeeeeeee"]
    assert len(engine.sessions.listing().sessions) == 3


def test_apply_settings_persists_and_updates_the_engine(qtbot, bridge, engine):
    new = engine.settings.with_profile(model_path=DEMO_MODEL, ctx=4096)
    with qtbot.waitSignal(bridge.settingsChanged):
        bridge.apply_settings(new)
    assert engine.settings.profile.ctx == 4096
    assert load_settings(engine.paths.settings_file).profile.model_path == DEMO_MODEL
    saved = json.loads(engine.paths.settings_file.read_text())
    assert saved["schema_version"] >= 1


def test_needs_restart_compares_with_the_launched_profile(qtbot, bridge, engine):
    changed = engine.settings.with_profile(ctx=2048)
    assert not bridge.needs_restart(changed)  # nothing running
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING))
    assert bridge.needs_restart(changed)
    assert not bridge.needs_restart(engine.settings)


def test_start_without_a_model_says_why(qtbot, bridge):
    with qtbot.waitSignal(bridge.errorOccurred) as blocker:
        bridge.start_server()
    assert "model" in blocker.args[1].lower()


def test_close_stops_everything_and_silences_events(qtbot, engine):
    from slotkeeper.gui.bridge import EngineBridge

    b = EngineBridge(engine)
    observer = b._observer
    assert observer is not None and observer.is_alive()
    b.close()
    assert not observer.is_alive()
    assert not b._debounce.isActive()
    with qtbot.assertNotEmitted(b.eventArrived, wait=100):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING))
        b._on_log_line("late line")
    b.close()  # twice is fine
    b.deleteLater()


def test_pin_delete_and_verify_show_what_they_changed_without_listing_the_folder(qtbot, bridge, engine,
                                                                                sessions_dir):
    """A use case returns what it changed (SessionChanges); the listing shown is updated from that,
    and the folder events its own change caused do not list the folder again. A change made
    behind the app's back (another process on the same folder) still does."""
    from slotkeeper.core.services.sessions import SessionsService
    from slotkeeper.core.sessions.store import SessionStore

    for sid, title in (("aaaaaaaaaaaa", "first"), ("bbbbbbbbbbbb", "second"), ("cccccccccccc", "third")):
        make_session(sessions_dir, sid, title=title)
    with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000):
        bridge.refresh_sessions()
    qtbot.wait(600)  # the watchdog's events of the files made above have settled
    listed: list[int] = []
    real = engine.sessions.listing
    engine.sessions.listing = lambda: listed.append(1) or real()
    try:
        order = [e.id for e in bridge.listing.sessions]
        with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000) as shown:
            bridge.set_pinned("bbbbbbbbbbbb", True)
        listing = shown.args[0]
        assert [e.id for e in listing.sessions] == order  # a pin moves nothing
        assert next(e for e in listing.sessions if e.id == "bbbbbbbbbbbb").sidecar.pinned
        with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000) as shown:
            bridge.delete_session("cccccccccccc")
        assert [e.id for e in shown.args[0].sessions] == [i for i in order if i != "cccccccccccc"]
        with qtbot.waitSignal(bridge.sessionVerified, timeout=10_000):
            bridge.verify_session("aaaaaaaaaaaa")
        qtbot.wait(1200)  # longer than the watchdog's debounce: its events came and went
        assert listed == [], "the app's own changes listed the folder again"

        # Another process pins a conversation: the folder is listed again, and shows it.
        def pinned(got, _facts) -> bool:
            return next(e for e in got.sessions if e.id == "aaaaaaaaaaaa").sidecar.pinned

        other = SessionsService(SessionStore(sessions_dir), in_slots=frozenset, budget=lambda: 1 << 40)
        with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000, check_params_cb=pinned):
            other.set_pinned("aaaaaaaaaaaa", True)
        assert listed
    finally:
        engine.sessions.listing = real
