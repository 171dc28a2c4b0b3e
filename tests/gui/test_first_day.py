"""What a new user met on the first day, offscreen (tests/desktop runs the same path with a real
tray): a start refused before llama-server ran, progress text, where each conversation is,
wording."""

from __future__ import annotations

import logging
import socket

import pytest
from gui_helpers import emit_from_thread
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import ServerState
from slotkeeper.gui.about import AboutDialog
from slotkeeper.gui.application import SlotkeeperApp
from slotkeeper.gui.pages.server_page import ServerPage
from slotkeeper.gui.tray import TrayController


@pytest.fixture
def busy_port():
    """A port another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_in_use_is_a_failure_with_its_reason(qtbot, bridge, engine, busy_port, caplog):
    """The window says Failed and why, the tray icon is red, the activity list has it; nothing on
    stderr but one line (no chained tracebacks)."""
    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL, port=busy_port))
    page = ServerPage(bridge)
    qtbot.addWidget(page)
    tray = TrayController(bridge)
    try:
        with caplog.at_level(logging.INFO):
            bridge.start_server()
            qtbot.waitUntil(lambda: bridge.state is ServerState.FAILED, timeout=10_000)
        assert page.state_label.text() == "Failed"
        assert f"Port {busy_port} on 127.0.0.1 is already in use" in page.state_message.text()
        assert "Choose another port in Settings" in page.state_message.text()
        assert page.log_view.plain_text().splitlines()[-1].startswith(
            # not an old run's log
            f"——— llama-server failed: Port {busy_port} on 127.0.0.1 is already in use")
        assert tray.icon_state == "error"
        assert tray.start_stop_action.text() == "Start server"  # try again once the port is free
        [entry] = [e for e in bridge.journal if e.level == "error"]
        assert entry.kind == "failed" and f"Port {busy_port}" in entry.text
        assert not [r for r in caplog.records if r.exc_info], "no traceback"
        [line] = [r for r in caplog.records if "already in use" in r.getMessage()]
        assert line.levelno == logging.WARNING
    finally:
        tray.dispose()
        tray.deleteLater()


def test_the_terminal_says_the_address_clients_use(qtbot, caplog):
    app = SlotkeeperApp(app_paths().ensure(), Settings(), tray_available=False, first_run=False)
    qtbot.addWidget(app.window)
    try:
        with caplog.at_level(logging.INFO, logger="slotkeeper.gui.application"):
            emit_from_thread(app.engine, ev.EngineReady("http://127.0.0.1:8789"))
            qtbot.waitUntil(lambda: any("clients use" in r.getMessage() for r in caplog.records),
                            timeout=5000)
        [line] = [r.getMessage() for r in caplog.records if "clients use" in r.getMessage()]
        assert line == "ready: clients use http://127.0.0.1:8789 (OpenAI API http://127.0.0.1:8789/v1)"
    finally:
        with qtbot.waitSignal(app.finished, timeout=10_000):
            app.request_quit()
        app.deleteLater()


def test_the_tray_and_the_sessions_tab_agree_on_age_and_slot(qtbot, bridge, engine, sessions_dir):
    """One source: the age is when the conversation last changed (its KV file), whatever a launch
    restore did to "last used" (they said 15 min and 8 min); the slot holds any save of it."""
    import json
    from datetime import datetime, timedelta, timezone

    from gui_helpers import make_session

    from slotkeeper.core.sessions.sidecar import format_utc
    from slotkeeper.core.views import SlotView
    from slotkeeper.gui.pages.sessions_page import SessionsPage
    from slotkeeper.gui.sessions_model import COLUMN

    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Walking", age_hours=0.25)
    sidecar = sessions_dir / "aaaaaaaaaaaa.json"
    data = json.loads(sidecar.read_text())
    data["last_used_at"] = format_utc(datetime.now(timezone.utc) - timedelta(minutes=8))  # restored at launch
    sidecar.write_text(json.dumps(data))
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Boots", age_hours=5, pinned=True)
    make_session(sessions_dir, "cccccccccccc", title="Boots", age_hours=4, pinned=True, parent="bbbbbbbbbbbb",
                 continues=True)  # went on from the pinned snapshot: one conversation
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, session_id="bbbbbbbbbbbb"),)))

    page = SessionsPage(bridge)
    qtbot.addWidget(page)
    tray = TrayController(bridge)
    try:
        qtbot.waitUntil(lambda: page.sessions_proxy.rowCount() == 2, timeout=10_000)
        model = page.sessions_model
        assert model.headerData(COLUMN["last_used"], Qt.Orientation.Horizontal) == "Last changed"

        def cell(sid, key):
            return model.index(model.row_of(sid), COLUMN[key]).data()

        assert cell("aaaaaaaaaaaa", "last_used") == "15 min ago"
        assert cell("cccccccccccc", "in_slot") == "slot 0"
        tray.rebuild_resume_menu()
        labels = {a.data(): a.text() for a in tray.resume_menu.actions()}
        assert labels["aaaaaaaaaaaa"].endswith("(15 min ago)")
        assert labels["cccccccccccc"].endswith("(in slot 0)")
    finally:
        tray.dispose()
        tray.deleteLater()


def test_people_read_conversations_not_sessions(qtbot, bridge):
    """The tab, the tray entry and what a failed action says call them conversations (the code and
    the `slotkeeper sessions` command keep their names)."""
    from slotkeeper.gui.main_window import MainWindow

    window = MainWindow(bridge)
    qtbot.addWidget(window)
    assert window.tabs.tabText(3) == "Conversations"
    tray = TrayController(bridge)
    try:
        assert tray.sessions_action.text() == "Conversations…"
    finally:
        tray.dispose()
        tray.deleteLater()
    with qtbot.waitSignal(bridge.errorOccurred, timeout=10_000) as failed:
        bridge.delete_session("0123456789ab")  # not there
    assert failed.args[0] == "Deleting a conversation"


def test_help_about_says_the_version_and_the_licence_and_opens_the_readme(qtbot, bridge):
    from slotkeeper import __version__
    from slotkeeper.gui.main_window import MainWindow

    window = MainWindow(bridge)
    qtbot.addWidget(window)
    help_menu = [a for a in window.menuBar().actions() if a.text() == "&Help"]
    assert help_menu and [a.text() for a in help_menu[0].menu().actions()] == ["&About Slotkeeper"]
    window.about_action.trigger()
    about = window.about_dialog
    assert about is not None and about.isVisible()
    text = about.label.text()
    assert (f"Slotkeeper {__version__}" in text and "Licence: MIT" in text
            and str(bridge.paths.data_dir) in text)
    about.label.linkActivated.emit("readme")
    assert about.readme is not None and about.readme.isVisible()
    assert "Keeps a local LLM's memory warm" in about.readme.browser.toPlainText()
    about.close()


def test_the_tray_offers_about_without_building_the_window(qtbot, monkeypatch):
    # a tray host shows it
    monkeypatch.setattr(TrayController, "show", lambda self: (self.tray.show(), True)[1])
    app = SlotkeeperApp(app_paths().ensure(),
                        Settings(start_server_on_launch=False).with_profile(model_path=DEMO_MODEL),
                        tray_available=True, first_run=False)
    try:
        assert app._window is None
        assert app.tray.about_action.text() == "About Slotkeeper…"
        app.tray.about_action.trigger()
        assert app.about_dialog is not None and app.about_dialog.isVisible()
        assert "Slotkeeper 0." in app.about_dialog.label.text()
        assert app._window is None
        # Once the window is built, its Help menu's About is the same dialog, not a second one.
        tray_about = app.about_dialog
        app.window.about_action.trigger()
        assert app.about_dialog is tray_about and app.window.about_dialog is None
        assert [w for w in QApplication.topLevelWidgets()
                if isinstance(w, AboutDialog) and w.isVisible()] == [tray_about]
    finally:
        if app._window is not None:
            qtbot.addWidget(app.window)
        with qtbot.waitSignal(app.finished, timeout=10_000):
            app.request_quit()
        app.deleteLater()
