"""The Sessions page: the table, disk usage, and resume / pin / delete / verify."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gui_helpers import make_session
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox

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
        return page.sessions_model.index(row, COLUMN["in_slot"]).data()

    assert page.sessions_model.headerData(COLUMN["in_slot"], Qt.Orientation.Horizontal) == "In slot"
    assert where("aaaaaaaaaaaa") == ""
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, session_id="bbbbbbbbbbbb"), SlotView(1))))
    assert where("bbbbbbbbbbbb") == "slot 0" and where("aaaaaaaaaaaa") == ""
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED))
    assert where("bbbbbbbbbbbb") == ""


def test_a_page_built_later_says_where_each_conversation_is_now(qtbot, bridge, engine, sessions_dir):
    """The window is built when first opened: a conversation that replaced another in slot 0 before
    then is "slot 0" at once, as the Slots tab and the tray say."""
    from gui_helpers import emit_from_thread

    from slotkeeper.core import events as ev
    from slotkeeper.core.views import SlotView
    from slotkeeper.gui.sessions_model import COLUMN

    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", age_hours=2)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="Beta", age_hours=1)
    for sid in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):  # Beta replaced Alpha in slot 0
        with qtbot.waitSignal(bridge.eventArrived):
            emit_from_thread(engine, ev.SlotsChanged((SlotView(0, session_id=sid),)))
    page = SessionsPage(bridge)
    qtbot.addWidget(page)
    page.show()
    wait_rows(qtbot, page, 2)

    def where(sid):
        return page.sessions_model.index(page.sessions_model.row_of(sid), COLUMN["in_slot"]).data()

    assert where("bbbbbbbbbbbb") == "slot 0" and where("aaaaaaaaaaaa") == ""


def test_a_pinned_conversation_that_went_on_is_one_row_with_its_pin(qtbot, page, bridge, sessions_dir,
                                                                    monkeypatch):
    """The snapshot pinned at 5,012 tokens and the conversation that went on from it: one row,
    pinned, titled and timed by the newest save; Unpin and Delete act on both files."""
    make_session(sessions_dir, "aaaaaaaaaaaa", title="The river", age_hours=5, pinned=True)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="The river", age_hours=0.001, pinned=True,
                 parent="aaaaaaaaaaaa", continues=True, n_tokens=6000)
    make_session(sessions_dir, "cccccccccccc", title="The river, take two", age_hours=1,
                 parent="aaaaaaaaaaaa")  # a fork: an edited turn
    wait_rows(qtbot, page, 1)
    from slotkeeper.gui.sessions_model import COLUMN

    model = page.sessions_model
    top = model.index(0, 0)
    assert model.rowCount(top) == 1, "the fork shows under the conversation it left"
    assert model.index(0, COLUMN["tokens"]).data() == "6,000"
    assert model.index(0, COLUMN["last_used"]).data() == "just now"
    assert model.index(0, COLUMN["pinned"]).data() == "pinned"
    tooltip = model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "2 saves of this conversation (pinned at 5,012 tokens" in tooltip
    assert model.index(0, 0, top).data() == "The river, take two"
    assert page.sessions_count.text() == "1 saved conversation"

    assert page.select_session("aaaaaaaaaaaa")
    assert page.current_entry().id == "bbbbbbbbbbbb", "Resume brings back the conversation as it is now"
    assert page.pin_button.text() == "Unpin"
    pinned = []
    monkeypatch.setattr(bridge, "set_pinned", lambda sid, on: pinned.append((sid, on)))
    page.toggle_pin_selected()
    assert sorted(pinned) == [("aaaaaaaaaaaa", False), ("bbbbbbbbbbbb", False)]

    deleted = []
    monkeypatch.setattr(bridge, "delete_session", deleted.append)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    page.delete_selected()
    assert deleted == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"], "the branch is its own conversation and stays"

    assert page.select_session("cccccccccccc")
    assert page.table.isExpanded(page.sessions_proxy.index(0, 0)), "selecting a branch opens its parent"
    assert page.current_entry().id == "cccccccccccc"


def test_the_context_menu_has_every_action_and_copies_the_id(qtbot, page, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    wait_rows(qtbot, page, 1)
    page.select_session("aaaaaaaaaaaa")
    menu = page.build_context_menu()
    texts = [a.text() for a in menu.actions()]
    assert texts[0].endswith("resume") or texts[0] == "Resume"
    for wanted in ("Pin", "Verify", "Show file", "Copy id", "Delete…"):
        assert wanted in texts
    next(a for a in menu.actions() if a.text() == "Copy id").trigger()
    assert QApplication.clipboard().text() == "aaaaaaaaaaaa"


def test_columns_are_plain_words_with_tooltips_and_the_model_is_not_cut(qtbot, page, sessions_dir):
    long_name = "/models/Qwen3-30B-A3B-Instruct-2507-UD-Q4_K_XL-a-very-long-file-name.gguf"
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha", model_path=long_name)
    wait_rows(qtbot, page, 1)
    model = page.sessions_model
    headers = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert "Attention" not in headers and "FA / cache" not in headers
    for c in range(model.columnCount()):
        assert model.headerData(c, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole)
    from slotkeeper.gui.sessions_model import COLUMN

    tip = model.index(0, COLUMN["model"]).data(Qt.ItemDataRole.ToolTipRole)
    assert "flash attention" in tip and "full attention" in tip
    page.resize(700, 400)
    qtbot.waitUntil(lambda: page.table.isVisible())
    text_width = page.table.fontMetrics().horizontalAdvance(long_name.rsplit("/", 1)[1])
    assert page.table.columnWidth(COLUMN["model"]) >= text_width, "the model's file name is shown whole"


def test_an_empty_folder_says_what_to_do(qtbot, page, bridge, sessions_dir):
    qtbot.waitUntil(lambda: bridge.listing is not None, timeout=10_000)
    assert page.empty_label.isVisible() and not page.table.isVisible()
    assert "No saved conversations yet" in page.empty_label.text()
    assert bridge.base_url in page.empty_label.text()
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    wait_rows(qtbot, page, 1)
    assert page.table.isVisible() and not page.empty_label.isVisible()
    page.filter_edit.setText("zebra")
    assert page.empty_label.isVisible() and "No saved conversation matches “zebra”" in page.empty_label.text()
    qtbot.keyClick(page.filter_edit, Qt.Key.Key_Escape)
    assert page.filter_edit.text() == "" and page.table.isVisible()


def test_keyboard_enter_resumes_and_delete_deletes(qtbot, page, bridge, sessions_dir, monkeypatch):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    wait_rows(qtbot, page, 1)
    page.select_session("aaaaaaaaaaaa")
    page.table.setFocus()
    resumed, asked = [], []
    monkeypatch.setattr(page, "resume_selected", lambda: resumed.append(1))
    monkeypatch.setattr(page, "confirm_delete", lambda *a: asked.append(1) or False)
    page.table.activated.disconnect()
    page.table.activated.connect(lambda _: page.resume_selected())
    qtbot.keyClick(page.table, Qt.Key.Key_Return)
    assert resumed
    qtbot.keyClick(page.table, Qt.Key.Key_Delete)
    assert asked
    qtbot.keyClick(page.table, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert page.filter_edit.hasFocus()
