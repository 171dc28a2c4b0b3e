"""The Sessions page: the table, disk usage, and resume / pin / delete / verify."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gui_helpers import make_session
from PySide6.QtWidgets import QMessageBox

from slotkeeper.gui.pages.sessions_page import SessionsPage


@pytest.fixture
def page(qtbot, bridge):
    p = SessionsPage(bridge)
    qtbot.addWidget(p)
    p.show()
    return p


def wait_rows(qtbot, page, n):
    qtbot.waitUntil(lambda: page.sessions_proxy.rowCount() == n, timeout=10_000)


def test_sessions_table_and_usage(qtbot, page, bridge, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", age_hours=1, size=4096)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Beta", age_hours=2, size=4096, pinned=True)
    wait_rows(qtbot, page, 2)
    assert page.sessions_count.text() == "2 saved conversations"
    assert "8.0 KiB of 20.0 GiB budget" in page.usage_bar.format()
    page.filter_edit.setText("beta")
    assert page.sessions_proxy.rowCount() == 1
    page.filter_edit.clear()

    assert page.select_session("bbbbbbbbbbbb")
    assert page.pin_button.text() == "Unpin"
    assert page.delete_button.isEnabled()
    # server stopped and no model chosen: resuming runs the model the conversation was made with
    assert page.resume_button.isEnabled()
    assert page.resume_button.text() == "Switch to Qwen3-8B-Q4_K_M.gguf to resume"
    assert page.select_session("aaaaaaaaaaaa")
    assert page.pin_button.text() == "Pin"


def test_nothing_selected_nothing_to_do(qtbot, page, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    wait_rows(qtbot, page, 1)
    for button in (page.resume_button, page.pin_button, page.delete_button, page.verify_button,
                   page.reveal_button):
        assert not button.isEnabled()
    assert page.resume_button.toolTip() == "Select a conversation"


def test_over_budget_is_said(qtbot, page, bridge, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", size=8192, pinned=True)  # never pruned
    wait_rows(qtbot, page, 1)
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        bridge.apply_settings(replace(bridge.settings, budget_bytes=4096), persist=False)
    qtbot.waitUntil(lambda: "over budget" in page.usage_label.text(), timeout=10_000)
    assert "of 4.0 KiB budget" in page.usage_bar.format()


def test_delete_asks_first(qtbot, page, bridge, sessions_dir, monkeypatch):
    make_session(sessions_dir, "cccccccccccc", title="Gamma")
    wait_rows(qtbot, page, 1)
    page.select_session("cccccccccccc")
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    page.delete_selected()
    assert (sessions_dir / "cccccccccccc.json").exists()
    asked = []

    def yes(*args, **kwargs):
        asked.append(args[2])
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", yes)
    page.delete_selected()
    assert "“Gamma”" in asked[0]
    wait_rows(qtbot, page, 0)
    assert not (sessions_dir / "cccccccccccc.json").exists()


def test_pin_from_the_page(qtbot, page, bridge, engine, sessions_dir):
    make_session(sessions_dir, "dddddddddddd", title="Delta")
    wait_rows(qtbot, page, 1)
    page.select_session("dddddddddddd")
    page.toggle_pin_selected()
    qtbot.waitUntil(lambda: engine.sessions.get("dddddddddddd").sidecar.pinned)
    qtbot.waitUntil(lambda: page.pin_button.text() == "Unpin", timeout=10_000)


def test_verify_reports_on_the_status_line(qtbot, page, bridge, sessions_dir):
    make_session(sessions_dir, "eeeeeeeeeeee", title="Epsilon")
    wait_rows(qtbot, page, 1)
    page.select_session("eeeeeeeeeeee")
    messages = []
    page.statusMessage.connect(messages.append)
    page.verify_selected()
    assert messages == ["Verifying…"]
    qtbot.waitUntil(lambda: len(messages) == 2, timeout=10_000)
    assert messages[1] == "“Epsilon” verified: size and content hash match"


def test_files_that_are_not_slotkeepers_are_shown_but_not_counted(qtbot, page, bridge, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", size=4096)
    (sessions_dir / "junk1.bin").write_bytes(b"\0" * 10_000_000)  # e.g. written through llama-server's API
    qtbot.waitUntil(lambda: "not counted" in page.usage_label.text(), timeout=10_000)
    assert "1 other file(s), 9.5 MiB" in page.usage_label.text()
    assert "4.0 KiB of 20.0 GiB budget" in page.usage_bar.format(), "the budget counts conversations only"


def test_the_table_says_where_each_conversation_is(qtbot, page, bridge, engine, sessions_dir):
    from gui_helpers import emit_from_thread

    from slotkeeper.core import events as ev
    from slotkeeper.core.server.state import ServerState
    from slotkeeper.core.views import SlotView
    from slotkeeper.gui.sessions_model import COLUMN

    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Beta")
    wait_rows(qtbot, page, 2)

    def where(sid):
        row = page.sessions_model.row_of(sid)
        return page.sessions_model.index(row, COLUMN["where"]).data()

    assert where("aaaaaaaaaaaa") == "on disk"
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, session_id="bbbbbbbbbbbb"), SlotView(1))))
    assert where("bbbbbbbbbbbb") == "slot 0" and where("aaaaaaaaaaaa") == "on disk"
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED))
    assert where("bbbbbbbbbbbb") == "on disk"
