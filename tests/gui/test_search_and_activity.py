"""The Sessions tab's search by content and the Server tab's activity list.

The sessions are real files and the index is the engine's real one (filled as a save fills it);
the events come from other threads, as the engine's do."""

from __future__ import annotations

import pytest
from gui_helpers import emit_from_thread, keep_screenshot, make_session
from PySide6.QtCore import Qt

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.server.supervisor import describe_exit
from slotkeeper.core.views import RestoreSummary, SaveSummary
from slotkeeper.gui.main_window import MainWindow

CONVERSATIONS = [
    ("3c4d5e6f7a8b", "Which birds nest on river banks?",
     "Which birds nest on river banks?\nSand martins dig tunnels in the soft bank, and the kingfisher digs a "
     "burrow up to a metre long.\nLook for a flash of blue low over the water."),
    ("a1b2c3d4e5f6", "Planning a sailing trip along the coast",
     "Planning a sailing trip along the coast next summer.\nWe could stop at the harbour where the "
     "kingfisher nests under the old stone quay.\nTake dry biscuits, apples and plenty of water."),
    ("0f1e2d3c4b5a", "Baking bread at home for the first time",
     "I want to bake bread at home this weekend.\nMy neighbour gave me a sourdough starter in a jam jar.\n"
     "Let it rest overnight in a cool place."),
    ("99aa88bb77cc", "Finding the north star",
     "How do I find the north star?\nWe saw the great nebula in Orion through binoculars from the hill.\n"
     "Follow the two pointer stars of the Plough."),
]
HOSTILE = ("5566778899aa", "Notes <b>not bold</b> & friends",
           "A conversation quoting markup: <i>kingfisher</i> and <script>alert(1)</script> & ampersands.")


@pytest.fixture
def window(qtbot, bridge):
    w = MainWindow(bridge)
    qtbot.addWidget(w)
    w.resize(1180, 720)
    w.show()
    return w


def fill(engine, sessions_dir, conversations=CONVERSATIONS):
    for i, (sid, title, text) in enumerate(conversations):
        sc = make_session(sessions_dir, sid, title=title, age_hours=i + 1, size=4096 * (i + 1))
        engine.library.search.put(sid, sc.kv_file, sc.model_sha256, title, text)  # as a save puts it in


def search(qtbot, bridge, page, text):
    with qtbot.waitSignal(bridge.sessionsFound, timeout=10_000, check_params_cb=lambda r: r.query == text):
        page.filter_edit.clear()
        qtbot.keyClicks(page.filter_edit, text)


def test_the_search_box_finds_conversations_by_what_was_said(qtbot, window, bridge, engine, sessions_dir):
    page = window.sessions_page
    window.show_tab("sessions")
    fill(engine, sessions_dir)
    qtbot.waitUntil(lambda: page.sessions_proxy.rowCount() == 4, timeout=10_000)

    search(qtbot, bridge, page, "nebula")  # said in the middle of one conversation, not in its title
    results = page.search_results
    assert results.isVisible() and results.ids == ("99aa88bb77cc",)
    assert results.summary.text().startswith("Said in 1 conversation")
    label = results.list.itemWidget(results.list.item(0))
    assert "<b>nebula</b>" in label.text() and "Orion" in label.text()
    assert page.sessions_proxy.rowCount() == 1, "the table keeps the conversation found by content"
    results.list.setCurrentRow(0)
    assert [e.id for e in page.selected_entries()] == ["99aa88bb77cc"], "a result selects its row"
    assert page.resume_button.toolTip() or page.resume_button.isEnabled() is not None

    search(qtbot, bridge, page, "kingfisher")
    assert set(results.ids) == {"a1b2c3d4e5f6", "3c4d5e6f7a8b"}
    results.list.setCurrentRow(0)
    keep_screenshot(window, "main-window-search.png")

    fill(engine, sessions_dir, [HOSTILE])
    search(qtbot, bridge, page, "kingfisher")
    assert set(results.ids) == {"a1b2c3d4e5f6", "3c4d5e6f7a8b", "5566778899aa"}
    texts = [results.list.itemWidget(results.list.item(i)).text() for i in range(results.list.count())]
    hostile = next(t for t in texts if "Notes" in t)
    assert ("&lt;b&gt;not bold&lt;/b&gt;" in hostile
            and "&lt;script&gt;" in hostile), "text is shown, never run"

    search(qtbot, bridge, page, "zeppelin")
    assert results.ids == () and "Nothing said" in results.summary.text()
    assert page.sessions_proxy.rowCount() == 0
    page.filter_edit.clear()
    qtbot.waitUntil(lambda: not results.isVisible())
    qtbot.waitUntil(lambda: page.sessions_proxy.rowCount() == 5, timeout=10_000)


def test_a_session_deleted_from_the_tab_leaves_the_search(qtbot, window, bridge, engine, sessions_dir):
    page = window.sessions_page
    fill(engine, sessions_dir)
    qtbot.waitUntil(lambda: page.sessions_proxy.rowCount() == 4, timeout=10_000)
    with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000):
        bridge.delete_session("99aa88bb77cc")
    search(qtbot, bridge, page, "nebula")
    assert page.search_results.ids == ()


def test_a_search_answer_older_than_the_typing_is_dropped(qtbot, window, bridge, engine, sessions_dir):
    page = window.sessions_page
    fill(engine, sessions_dir)
    found = []
    bridge.sessionsFound.connect(found.append)
    bridge.search_sessions("sourdough")
    bridge.search_sessions("orion")
    qtbot.waitUntil(lambda: bool(found), timeout=10_000)
    qtbot.wait(200)
    assert [r.query for r in found] == ["orion"]
    assert page is not None


ACTIVITY = [
    ev.ServerStateChanged(ServerState.STARTING, "loading the model"),
    ev.FolderTidied(("incoming-3f9a2b.kv",)),
    ev.SessionRestored(RestoreSummary("a1b2c3d4e5f6", 0, 1843, 21.0,
                                      "Planning a sailing trip along the coast")),
    ev.EngineReady("http://127.0.0.1:8080", (RestoreSummary("a1b2c3d4e5f6", 0, 1843, 21.0, "Sailing"),)),
    ev.RestoreReused(0, "a1b2c3d4e5f6", 1843, 1900, 1843, True),
    ev.SessionSaved(SaveSummary(0, "update", "a1b2c3d4e5f6", "idle", 1960, 38.0, 31_457_280,
                                "Planning a sailing trip along the coast")),
    ev.SessionRefused("0f1e2d3c4b5a", 1, ("made with flash attention on; this server runs with it off",)),
    ev.SessionsPruned(("99aa88bb77cc",), 2_147_483_648),
    # as the supervisor says it
    ev.ServerStateChanged(ServerState.CRASHED, f"llama-server {describe_exit(-9)}"),
    ev.ServerStateChanged(ServerState.RESTARTING, "restart 1 of 5", delay=1.0),
    ev.SearchIndexRepaired(completed=3),
    ev.SlotsChanged(()),  # not an action: not listed
]


def test_the_activity_list_shows_and_searches_slotkeepers_actions(qtbot, window, bridge, engine):
    page = window.server_page
    view = page.activity_view
    assert view.empty.isVisible() and "Nothing yet" in view.empty.text()
    for event in ACTIVITY[:3]:
        emit_from_thread(engine, event)
    qtbot.waitUntil(lambda: view.model.rowCount() == 3, timeout=5000)
    for event in ACTIVITY[3:]:
        emit_from_thread(engine, event)
    qtbot.waitUntil(lambda: view.model.rowCount() == len(ACTIVITY) - 1, timeout=5000)
    texts = view.visible_texts()
    assert texts[0].startswith("repaired the search index"), "newest first"
    assert any(t.startswith("restored session a1b2c3d4e5f6") for t in texts)
    assert any(t.startswith("refused to restore session 0f1e2d3c4b5a into slot 1: made with flash")
               for t in texts)
    assert any(t.startswith("llama-server crashed") for t in texts)
    assert not view.empty.isVisible()
    keep_screenshot(window, "main-window-activity.png")

    qtbot.keyClicks(view.search, "refused")
    assert view.visible_texts() == [t for t in texts if t.startswith("refused")]
    view.search.clear()
    qtbot.keyClicks(view.search, "a1b2c3d4e5f6")
    assert len(view.visible_texts()) == 3  # restored, reused, saved
    view.search.clear()
    view.problems.setChecked(True)
    kinds = {view.proxy.index(r, 1).data() for r in range(view.proxy.rowCount())}
    assert kinds == {"refused", "crashed", "restarted"}
    colour = view.proxy.index(0, 2).data(Qt.ItemDataRole.ForegroundRole)
    assert colour is not None, "problems stand out"
    qtbot.keyClicks(view.search, "zeppelin")
    assert view.empty.isVisible() and view.empty.text() == "Nothing matches the search."


def test_actions_before_the_window_opened_are_listed(qtbot, bridge, engine):
    for event in ACTIVITY[5:8]:
        emit_from_thread(engine, event)
    qtbot.waitUntil(lambda: len(bridge.journal) == 3, timeout=5000)
    w = MainWindow(bridge)
    qtbot.addWidget(w)
    assert w.server_page.activity_view.model.rowCount() == 3
    assert w.server_page.log_splitter.count() == 2, "the activity beside llama-server's log"
