"""The Slots page (gauges) and the History page (plot and summary), fed by the bridge."""

from __future__ import annotations

from gui_helpers import emit_from_thread, keep_screenshot, make_session

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import SlotView
from slotkeeper.gui.pages.history_page import HistoryPage
from slotkeeper.gui.pages.slots_page import SlotsPage


def test_slot_gauges_follow_the_slots_signal(qtbot, bridge, engine):
    page = SlotsPage(bridge)
    qtbot.addWidget(page)
    views = (SlotView(0, n_ctx=4096, n_prompt=100, cache_n=90, prompt_n=10), SlotView(1, n_ctx=4096))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views))
    assert len(page.slots_panel.gauges) == 2
    assert page.slots_panel.gauges[0].figures.cache_n == 90
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED))
    assert len(page.slots_panel.gauges) == 0  # a stopped server has no slots


def test_the_slots_page_says_how_many_requests_wait_for_a_slot(qtbot, bridge, engine):
    page = SlotsPage(bridge)
    qtbot.addWidget(page)
    page.resize(640, 320)
    page.show()
    views = (SlotView(0, n_ctx=4096, n_prompt=3000, cache_n=2900, prompt_n=100, running=True),)
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views, waiting=2))
    assert page.waiting_label.isVisible()
    assert page.waiting_label.text().startswith("2 requests waiting for a slot")
    qtbot.waitUntil(lambda: page.slots_panel.gauges[0].isVisible())
    qtbot.wait(100)  # laid out and painted
    keep_screenshot(page, "slots-waiting.png")
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views, waiting=1))
    assert page.waiting_label.text().startswith("1 request waiting for a slot")
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views))
    assert not page.waiting_label.isVisible()  # nobody waits: nothing said
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged(views, waiting=3))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED))
    assert not page.waiting_label.isVisible()  # a stopped server has no line


def test_a_slot_shows_the_title_of_its_conversation(qtbot, bridge, engine, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    page = SlotsPage(bridge)
    qtbot.addWidget(page)
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, n_ctx=4096, session_id="aaaaaaaaaaaa"),)))
    bridge.refresh_sessions()
    qtbot.waitUntil(lambda: page.slots_panel.gauges[0].title == "Alpha", timeout=10_000)


def test_history_tab(qtbot, bridge, engine):
    page = HistoryPage(bridge)
    qtbot.addWidget(page)
    with qtbot.waitSignal(bridge.historyLoaded):
        emit_from_thread(engine, ev.RequestDone(slot=0, task=1, n_prompt=1000, cache_n=750,
                                                prompt_n=250, prompt_ms=30.0, at=1_700_000_000.0))
    assert "1 requests, 1,000 prompt tokens, 75% served from cache" == page.history_summary.text()


def test_history_keeps_the_launches_of_earlier_runs(qtbot, bridge, engine):
    """After a relaunch the earlier runs' launch markers stay (they were this run's only), and a
    request served by a launch's restore says so."""
    from slotkeeper.core.history import LaunchRecord, RequestRecord

    engine.history.append(LaunchRecord(1_790_000_000.0, (0,)))
    engine.history.append(RequestRecord(1_790_000_005.0, 0, 100, 90, 10, 1.0, "slot"))
    page = HistoryPage(bridge)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: 1_790_000_000.0 in page.history_plot.launches, timeout=5000)
    qtbot.waitUntil(lambda: [p.source for p in page.history_plot.points] == ["launch"], timeout=5000)
