"""What the user is told, from core events."""

from __future__ import annotations

import pytest
from gui_helpers import emit_from_thread

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import RestoreSummary
from slotkeeper.gui.notifications import ERROR, INFO, WARNING, Notifier


@pytest.fixture
def said(qtbot, bridge):
    notifier = Notifier(bridge)
    messages: list[tuple[str, str, str]] = []
    notifier.notify.connect(lambda t, m, lvl: messages.append((t, m, lvl)))
    yield messages
    notifier.deleteLater()


def test_restores_at_launch(qtbot, bridge, engine, said):
    restored = (RestoreSummary("a", 0, 5000, 800.0, "Rust chat"), RestoreSummary("b", 1, 1200, 400.0, "Poem"))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.EngineReady("http://127.0.0.1:8789", restored))
    title, message, level = said[-1]
    assert level == INFO
    assert "2 conversations (6,200 tokens) restored in 1.2 s" in message
    assert "“Rust chat”" in message


def test_quiet_ready_without_restores(qtbot, bridge, engine, said):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.EngineReady("http://x"))
    assert said == []


def test_ineffective_restore_says_why(qtbot, bridge, engine, said):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.RestoreReused(slot=0, id="zz", cache_n=0, n_prompt=900, n_restored=5000,
                                                  effective=False,
                                                  reason="sliding-window model without --swa-full"))
    title, message, level = said[-1]
    assert level == WARNING
    assert "reused 0 of its 5,000" in message and "--swa-full" in message
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine,
                         ev.RestoreReused(slot=0, id="zz", cache_n=5000, n_prompt=5100, n_restored=5000,
                                          effective=True, reason=None))
    assert len(said) == 1


def test_crash_and_automatic_restart(qtbot, bridge, engine, said):
    for state, message in ((ServerState.CRASHED, "llama-server exited (code -9)"),
                           (ServerState.RESTARTING, "restart 1 of 3, in 1 s")):
        with qtbot.waitSignal(bridge.eventArrived):
            emit_from_thread(engine, ev.ServerStateChanged(state, message))
    title, message, level = said[-1]
    assert title == "llama-server crashed"
    assert "code -9" in message and "restart 1 of 3" in message
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.EngineReady("http://x"))
    assert said[-1][0] == "llama-server restarted"


def test_failure_is_an_error_unless_quitting(qtbot, bridge, engine, said):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.FAILED, "port 8789 in use"))
    assert said[-1] == ("llama-server could not start", "port 8789 in use", ERROR)
    for state, message in ((ServerState.CRASHED, "llama-server exited (code -9)"),
                           (ServerState.RESTARTING, "restart 3 of 3, in 4 s"),
                           (ServerState.FAILED, "it crashed 3 times in 10 minutes")):
        with qtbot.waitSignal(bridge.eventArrived):
            emit_from_thread(engine, ev.ServerStateChanged(state, message))
    assert said[-1] == ("llama-server stopped", "it crashed 3 times in 10 minutes", ERROR)
    del said[1:]
    bridge.quitting = True
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.FAILED, "again"))
    assert len(said) == 1


def test_pruning(qtbot, bridge, engine, said):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SessionsPruned(("a", "b", "c"), 3 * 1024**3))
    assert "3 saved conversations deleted" in said[-1][1]
    assert "3.0 GiB freed" in said[-1][1]


def test_warnings_are_said_once(qtbot, bridge, engine, said):
    for _ in range(3):
        with qtbot.waitSignal(bridge.eventArrived):
            emit_from_thread(engine, ev.WarningRaised("restores will not help"))
    assert len(said) == 1


def test_errors_are_said(qtbot, bridge, said):
    bridge.errorOccurred.emit("Deleting a conversation", "permission denied")
    assert said[-1] == ("Deleting a conversation failed", "permission denied", ERROR)
