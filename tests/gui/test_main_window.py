"""The main window: tabs fed by the bridge, session actions, hiding to the tray."""

from __future__ import annotations

import pytest
from gui_helpers import emit_from_thread, make_session
from PySide6.QtWidgets import QMessageBox

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import SlotView
from slotkeeper.gui.main_window import MainWindow, describe_flags, format_duration


@pytest.fixture
def window(qtbot, bridge):
    w = MainWindow(bridge)
    qtbot.addWidget(w)
    w.show()
    return w


def wait_rows(qtbot, window, n):
    qtbot.waitUntil(lambda: window.sessions_proxy.rowCount() == n, timeout=10_000)


def test_tabs_and_initial_state(qtbot, window):
    assert [window.tabs.tabText(i) for i in range(window.tabs.count())] == ["Server", "Slots", "History", "Sessions"]
    assert window.state_label.text() == "Stopped"
    assert not window.start_action.isEnabled()  # no model chosen
    assert not window.stop_action.isEnabled()
    assert "(not running)" in window.address_label.text()
    window.show_tab("sessions")
    assert window.tabs.currentIndex() == 3


def test_state_changes_update_the_server_tab(qtbot, window, bridge, engine):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "loading model"))
    assert window.state_label.text() == "Starting"
    assert window.stop_action.isEnabled()
    assert "http://127.0.0.1:8789" in window.address_label.text()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerLoading(3.2, "llama_model_load: ..."))
    assert "Loading the model… 3 s" in window.state_message.text()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.WarningRaised("restores will not help"))
    assert window.warning_box.isVisible()


def test_slot_gauges_follow_the_slots_signal(qtbot, window, bridge, engine):
    views = (SlotView(0, n_ctx=4096, n_prompt=100, cache_n=90, prompt_n=10), SlotView(1, n_ctx=4096))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views))
    assert len(window.slots_panel.gauges) == 2
    assert window.slots_panel.gauges[0].figures.cache_n == 90


def test_log_lines_reach_the_log_view(qtbot, window, bridge):
    with qtbot.waitSignal(bridge.logLines):
        bridge._on_log_line("main: server is listening on http://127.0.0.1:8789")
    assert "server is listening" in window.log_view.plain_text()


def test_sessions_table_and_usage(qtbot, window, bridge, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", age_hours=1, size=4096)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Beta", age_hours=2, size=4096, pinned=True)
    wait_rows(qtbot, window, 2)
    assert window.sessions_count.text() == "2 saved conversations"
    assert "8.0 KiB of 20.0 GiB budget" in window.usage_bar.format()
    window.filter_edit.setText("beta")
    assert window.sessions_proxy.rowCount() == 1
    window.filter_edit.clear()

    assert window.select_session("bbbbbbbbbbbb")
    assert window.pin_button.text() == "Unpin"
    assert window.delete_button.isEnabled()
    # server stopped and no model chosen: cannot resume
    assert not window.resume_button.isEnabled()
    assert window.select_session("aaaaaaaaaaaa")
    assert window.pin_button.text() == "Pin"


def test_delete_asks_first(qtbot, window, bridge, sessions_dir, monkeypatch):
    make_session(sessions_dir, "cccccccccccc", title="Gamma")
    wait_rows(qtbot, window, 1)
    window.select_session("cccccccccccc")
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    window.delete_selected()
    assert (sessions_dir / "cccccccccccc.json").exists()
    asked = []

    def yes(*args, **kwargs):
        asked.append(args[2])
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", yes)
    window.delete_selected()
    assert "“Gamma”" in asked[0]
    wait_rows(qtbot, window, 0)
    assert not (sessions_dir / "cccccccccccc.json").exists()


def test_pin_from_the_window(qtbot, window, bridge, engine, sessions_dir):
    make_session(sessions_dir, "dddddddddddd", title="Delta")
    wait_rows(qtbot, window, 1)
    window.select_session("dddddddddddd")
    window.toggle_pin_selected()
    qtbot.waitUntil(lambda: engine.sessions.get("dddddddddddd").sidecar.pinned)
    qtbot.waitUntil(lambda: window.pin_button.text() == "Unpin", timeout=10_000)


def test_history_tab(qtbot, window, bridge, engine):
    with qtbot.waitSignal(bridge.historyLoaded):
        emit_from_thread(engine, ev.RequestDone(slot=0, task=1, n_prompt=1000, cache_n=750,
                                                prompt_n=250, prompt_ms=30.0, at=1_700_000_000.0))
    assert "1 requests, 1,000 prompt tokens, 75% served from cache" == window.history_summary.text()


def test_close_hides_to_tray_when_asked(qtbot, window, bridge):
    window.hide_on_close = True
    window.close()
    assert not window.isVisible()
    window.bring_forward("history")
    assert window.isVisible()
    assert window.tabs.currentIndex() == 2
    bridge.quitting = True
    window.close()
    assert not window.isVisible()
    assert not window._uptime_timer.isActive()


def test_notifications_without_a_tray(qtbot, window):
    window.show_notification("Conversations restored", "2 restored", "info")
    assert "2 restored" in window.statusBar().currentMessage()
    window.show_notification("Slotkeeper", "swa warning", "warning")
    assert window.warning_box.text() == "swa warning"


def test_helpers(engine):
    assert format_duration(59) == "59 s"
    assert format_duration(3_725) == "1 h 2 min"
    assert format_duration(90_000) == "1 d 1 h 0 min"
    text = describe_flags(engine.settings.profile.__class__(ctx=8192, parallel=2, flash_attn=True,
                                                             swa_full=True, extra_args=("-t", "8")))
    assert text == ("context 8,192 (4,096 per slot), 2 slots, flash attention on, K f16 / V f16, "
                    "--swa-full, -t 8")
