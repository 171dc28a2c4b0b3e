"""The tray controller's menu and tooltip (no system tray offscreen: nothing is shown)."""

from __future__ import annotations

import sys

import pytest
from gui_helpers import OTHER_SHA, base_sidecar, emit_from_thread, facts_for, make_session
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSystemTrayIcon

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import Activity, SlotView
from slotkeeper.gui.tray import RESUME_ITEMS, TrayController, api_address


@pytest.fixture
def tray(qtbot, bridge):
    t = TrayController(bridge)
    yield t
    t.dispose()
    t.deleteLater()


def listed(qtbot, bridge):
    """A listing made after this call (the tray lists the folder once itself when it starts)."""
    bridge.refresh_sessions()
    qtbot.waitUntil(lambda: bridge.listing is not None and not bridge.feeds._listing_running, timeout=5000)


def test_resume_lists_the_saved_conversations_from_launch(qtbot, bridge, engine, sessions_dir):
    """After a relaunch, with the server stopped and the window never opened, Resume lists what
    was saved (nothing else lists the folder then)."""
    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Walking in the hills", age_hours=1)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Boots for the rain", age_hours=2)
    tray = TrayController(bridge)
    try:
        tray.rebuild_resume_menu()  # opened at once: says it is reading, then fills in
        assert [a.text() for a in tray.resume_menu.actions()] == ["Reading the saved conversations…"]
        tray.resume_menu.popup(tray.resume_menu.pos())
        qtbot.waitUntil(lambda: len(tray.resume_menu.actions()) == 2, timeout=5000)
        texts = [a.text() for a in tray.resume_menu.actions()]
        assert texts[0].startswith("Walking in the hills") and texts[1].startswith("Boots for the rain")
        assert "Saved: 2 conversations" in tray.tooltip()
        tray.resume_menu.hide()
    finally:
        tray.dispose()
        tray.deleteLater()


def test_no_tray_offscreen_and_menu_still_works(qtbot, tray, bridge):
    assert tray.show() is False
    texts = [a.text() for a in tray.menu.actions() if a.text()]
    assert texts[1] == "Choose a model to start…"  # no model yet
    assert texts[2] == "Model"
    assert "Resume" in texts
    assert "New chat" in texts and "Open chat" in texts
    assert not tray.web_ui_action.isVisible()  # offered only when llama-server serves its own page
    assert any(t.startswith("Copy API address") for t in texts)
    assert "Conversations…" in texts and "Settings…" in texts and texts[-1] == "Quit Slotkeeper"
    assert tray.open_chat_action.isEnabled()
    assert tray.icon_state == "stopped"


def test_tooltip_and_icon_follow_the_engine(qtbot, tray, bridge, engine, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", size=2048)
    listed(qtbot, bridge)
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING))
    assert tray.icon_state == "starting"
    assert tray.start_stop_action.text().startswith("Stop server")
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, state="busy", running=True), SlotView(1))))
    tip = tray.tooltip()
    assert "Slotkeeper: starting" in tip
    assert "Address: http://127.0.0.1:8789" in tip
    assert "Slots busy: 1 of 2" in tip
    assert "Saved: 1 conversation, 2.0 KiB" in tip
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity("downloading", "downloading the starter model",
                                                             49_000_000, 98_362_432)))
    assert "Downloading the starter model: 49% of 93.8 MiB" in tray.tooltip().splitlines()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity()))
    assert "Downloading" not in tray.tooltip()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.FAILED, "boom"))
    assert tray.icon_state == "error"


def test_resume_menu_lists_the_ten_most_recent(qtbot, tray, bridge, engine, sessions_dir):
    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
    for i in range(12):
        make_session(sessions_dir, f"{i:012x}", title=f"Chat number {i}", age_hours=i + 1)
    listed(qtbot, bridge)
    tray.rebuild_resume_menu()
    actions = tray.resume_menu.actions()
    assert len(actions) == RESUME_ITEMS
    assert actions[0].text().startswith("Chat number 0")
    # server stopped: choosing one starts the server and resumes it
    assert all(a.isEnabled() for a in actions)
    assert "Starts the server" in actions[0].toolTip()


def test_incompatible_sessions_are_disabled_with_the_reason(qtbot, tray, bridge, engine, sessions_dir,
                                                            monkeypatch):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Same model", age_hours=1)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Other model", age_hours=2, model_sha256=OTHER_SHA)
    make_session(sessions_dir, "cccccccccccc", title="Other cache", age_hours=3,
                 cache_type_v="f16")
    listed(qtbot, bridge)
    facts = facts_for(base_sidecar())
    monkeypatch.setattr(type(bridge), "facts", property(lambda self: facts))
    bridge.state = ServerState.READY
    tray.rebuild_resume_menu()
    same, other, cache = tray.resume_menu.actions()
    assert same.isEnabled() and "restores into a free slot" in same.toolTip()
    assert not cache.isEnabled()
    assert "V cache type f16" in cache.toolTip()
    # another model's conversation is one action: switch to its model and resume it
    assert other.isEnabled() and other.text().endswith("— switch to Qwen3-8B-Q4_K_M.gguf to resume")

    # a conversation opens in the chat window; its slot is restored when a message is sent
    calls = []
    monkeypatch.setattr(engine, "restore_async", lambda sid, slot=None: calls.append(sid))
    with qtbot.waitSignal(tray.chatRequested) as opened:
        same.trigger()
    assert opened.args == ["aaaaaaaaaaaa"] and calls == []


def test_empty_resume_menu(qtbot, tray, bridge):
    listed(qtbot, bridge)
    tray.rebuild_resume_menu()
    (only,) = tray.resume_menu.actions()
    assert not only.isEnabled() and only.text() == "No saved conversations yet"


def test_copy_address_and_start(qtbot, tray, bridge, engine, monkeypatch):
    tray.copy_address()
    assert QGuiApplication.clipboard().text() == api_address(engine.base_url) == "http://127.0.0.1:8789/v1"
    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
    tray.refresh()
    assert tray.start_stop_action.isEnabled()
    started = []
    monkeypatch.setattr(bridge, "start_server", lambda resume_id=None: started.append(resume_id))
    tray.start_stop_action.trigger()
    assert started == [None]


def test_the_tooltip_says_how_much_time_the_cache_saved(qtbot, tray, bridge, engine):
    from gui_helpers import emit_from_thread

    assert "Time saved" not in tray.tooltip()
    with qtbot.waitSignal(bridge.historyLoaded):
        emit_from_thread(engine, ev.RequestDone(0, 0, 5000, 4900, 100, 80.0, 1.0, "restored", 125_000.0))
    assert "Time saved by the cache: 2 min 5 s" in tray.tooltip()


@pytest.mark.parametrize("platform, opens", [("linux", True), ("win32", True), ("darwin", False)])
def test_a_click_on_the_icon_opens_the_window_except_where_it_opens_the_menu(qtbot, tray, monkeypatch,
                                                                             platform, opens):
    """macOS reports the click that opens the menu-bar menu as a Trigger too: there only the menu opens."""
    monkeypatch.setattr(sys, "platform", platform)
    asked: list[str] = []
    tray.showWindowRequested.connect(asked.append)
    tray.tray.activated.emit(QSystemTrayIcon.ActivationReason.Trigger)
    assert asked == ([""] if opens else [])
    tray.tray.activated.emit(QSystemTrayIcon.ActivationReason.DoubleClick)
    assert asked[-1:] == [""]
