"""The main window: its four pages in tabs, the menus, the status bar, hiding to the tray."""

from __future__ import annotations

import pytest
from gui_helpers import emit_from_thread

from slotkeeper.core import events as ev
from slotkeeper.core.views import Activity
from slotkeeper.gui.main_window import MainWindow
from slotkeeper.gui.pages.server_page import ServerPage
from slotkeeper.gui.pages.sessions_page import SessionsPage


@pytest.fixture
def window(qtbot, bridge):
    w = MainWindow(bridge)
    qtbot.addWidget(w)
    w.show()
    return w


def test_tabs_and_initial_state(qtbot, window):
    assert [window.tabs.tabText(i)
            for i in range(window.tabs.count())] == ["Server", "Slots", "History", "Conversations"]
    assert [window.tabs.widget(i) for i in range(window.tabs.count())] == [
        window.server_page, window.slots_page, window.history_page, window.sessions_page]
    server = window.server_page
    assert server.state_label.text() == "Stopped"
    assert not server.start_action.isEnabled()  # no model chosen
    assert not server.stop_action.isEnabled()
    assert "(not running)" in server.address_label.text()
    window.show_tab("sessions")
    assert window.tabs.currentIndex() == 3
    window.show_tab("Server")
    window.show_tab("Conversations")  # its title works too
    assert window.tabs.currentIndex() == 3


def test_the_server_menu_holds_the_server_pages_actions(window):
    menus = {m.title(): m for m in (a.menu() for a in window.menuBar().actions()) if m is not None}
    server = window.server_page
    actions = [a for a in menus["Se&rver"].actions() if not a.isSeparator()]
    assert actions == [server.start_action, server.stop_action, server.restart_action,
                       window.model_menu.menuAction(), window.new_chat_action, server.open_chat_action,
                       server.web_ui_action, server.copy_action]
    assert server.open_chat_action.text() == "Open chat"
    assert not server.web_ui_action.isVisible()  # offered only when llama-server serves one
    with_settings = []
    window.settingsRequested.connect(lambda: with_settings.append(True))
    server.settingsRequested.emit()
    assert with_settings


def test_pages_report_to_the_status_bar(qtbot, window, bridge, engine):
    window.sessions_page.statusMessage.emit("Verifying…")
    assert window.statusBar().currentMessage() == "Verifying…"
    window.server_page.copy_address()
    assert window.statusBar().currentMessage() == "Copied http://127.0.0.1:8789/v1"
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity("saving", "Alpha", done=0, total=2)))
    assert window.activity_label.text() == "Saving (1 of 2): Alpha"
    # hashing counts bytes: a share of the size, never past it (it said "Hashing (98362433 of 98362432)")
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity("hashing", "identifying starter.gguf",
                                                             done=98_362_432, total=98_362_432)))
    assert window.activity_label.text() == "Identifying starter.gguf: 100% of 93.8 MiB"
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity()))
    assert window.activity_label.text() == ""


def test_one_page_per_tab(window):
    assert isinstance(window.server_page, ServerPage) and isinstance(window.sessions_page, SessionsPage)


def test_close_hides_to_tray_when_asked(qtbot, window, bridge):
    assert window.server_page._uptime_timer.isActive()
    window.hide_on_close = True
    window.close()
    assert not window.isVisible()
    assert not window.server_page._uptime_timer.isActive()
    window.bring_forward("history")
    assert window.isVisible()
    assert window.tabs.currentIndex() == 2
    bridge.quitting = True
    window.close()
    assert not window.isVisible()
    assert not window.server_page._uptime_timer.isActive()


def test_notifications_without_a_tray(qtbot, window):
    window.show_notification("Conversations restored", "2 restored", "info")
    assert "2 restored" in window.statusBar().currentMessage()
    window.show_notification("Slotkeeper", "swa warning", "warning")
    assert window.server_page.warning_box.text() == "swa warning"


def test_search_boxes_stay_readable_at_the_smallest_window(qtbot, window):
    """At the window's least size both search boxes of the Server tab collapsed to "S…"."""
    window.resize(window.minimumSizeHint())
    qtbot.waitUntil(lambda: window.size() == window.minimumSizeHint(), timeout=2000)
    assert window.minimumSizeHint().width() <= 900, "still fits a small screen"
    page = window.server_page
    for edit, words in ((page.log_view.search, "Search the log"),
                        (page.activity_view.search, "Search: saved")):
        assert edit.width() >= edit.fontMetrics().horizontalAdvance(words) + 20, (words, edit.width())
    window.show_tab("conversations")
    edit = window.sessions_page.filter_edit
    qtbot.waitUntil(lambda: edit.isVisible(), timeout=2000)
    assert edit.width() >= edit.fontMetrics().horizontalAdvance("Search everything said") + 20
