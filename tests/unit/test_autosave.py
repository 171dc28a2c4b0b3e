"""The autosave policy over the slot board, with a fake clock: turn end, idle delay, deferral while
others generate, back-off. Every request comes through the front door, which marks its slot
changed when it is done (``request_done``); a poll only says when a turn ended and who is busy."""

from slotkeeper.core.engine.slots.autosave import AutosavePolicy
from slotkeeper.core.engine.slots.board import SlotBoard
from slotkeeper.core.events import EventBus
from slotkeeper.core.server.client import SlotInfo


def slot(i, task=None, busy=False):
    return SlotInfo(id=i, n_ctx=1024, is_processing=busy, id_task=task)


def board(idle_save_seconds: float, max_defer_seconds: float | None = None) -> SlotBoard:
    b = SlotBoard(idle_save_seconds, EventBus())
    if max_defer_seconds is not None:
        b.policy = AutosavePolicy(idle_save_seconds, max_defer_seconds)
    return b


def test_idle_slot_is_due_after_the_delay_and_only_once():
    b = board(idle_save_seconds=10)
    b.observe([slot(0)], now=0)
    assert b.due(1) == []  # never used: nothing to save
    b.observe([slot(0, task=1, busy=True)], now=1)
    assert b.due(2) == []  # still generating
    assert b.observe([slot(0, task=1)], now=3) == [0]  # turn ended
    b.request_done(0, now=3)
    assert b.due(12) == []
    assert b.due(13) == [0]
    b.saved(0, "s1", b[0].watch.generation)
    assert b.due(100) == [] and b.in_slots() == {"s1"}


def test_a_whole_request_between_two_polls_is_noticed():
    b = board(idle_save_seconds=0)
    b.observe([slot(0, task=4)], now=0, first=False)
    b.saved(0, "s", b[0].watch.generation)
    assert b.observe([slot(0, task=9)], now=1) == [0]  # task changed, never seen busy: a turn ended


def test_waits_while_another_slot_generates_but_not_forever():
    b = board(idle_save_seconds=5, max_defer_seconds=30)
    b.observe([slot(0, task=1, busy=True), slot(1)], now=0)
    b.observe([slot(0, task=1), slot(1, task=2, busy=True)], now=1)
    b.request_done(0, now=1)
    assert b.due(10) == []  # slot 1 is generating: a save would stall it
    assert b.due(35) == []
    assert b.due(36.5) == [0]  # the bound: idle 5 s + 30 s
    b.observe([slot(0, task=1), slot(1, task=2)], now=37)
    b.request_done(1, now=37)
    assert sorted(b.due(42.5)) == [0, 1]


def test_adopted_server_slots_count_as_changed_and_busy_slots_skip():
    b = board(idle_save_seconds=0)
    b.observe([slot(0, task=3), slot(1)], now=0, first=True)
    assert b.changed_slots() == [0] and b.due(0) == [0]
    b.acting(0, "saving")
    assert b.due(1) == []
    b.restored(1, "r", [1, 2, 3], 3, "works", exact_only=False)
    assert b.in_slots() == {"r"}


def test_a_failed_save_is_retried_with_a_growing_delay_not_every_poll():
    b = board(idle_save_seconds=0)
    b.observe([slot(0, task=1)], now=0, first=True)
    assert b.due(0) == [0]
    assert b.save_failed(0, now=0) == 5.0
    assert b.due(1) == [] and b.due(4.9) == []
    assert b.due(5) == [0]
    assert b.save_failed(0, now=5) == 10.0
    assert b.due(14) == [] and b.due(15) == [0]
    for _ in range(20):
        b.save_failed(0, now=15)
    assert b[0].watch.retry_at == 15 + 300  # capped
    b.saved(0, "s", b[0].watch.generation)
    b.observe([slot(0, task=2)], now=20)
    b.request_done(0, now=20)
    assert b.due(20) == [0], "a good save ends the back-off"


def test_a_change_seen_during_a_save_keeps_the_slot_changed():
    b = board(idle_save_seconds=0)
    b.observe([slot(0, task=1)], now=0, first=True)
    started_at = b[0].watch.generation  # the save begins
    b.request_done(0, now=1)  # the next request ran meanwhile
    b.saved(0, "s", started_at)
    assert b[0].watch.changed, "the newer turn is still unsaved"
    again = b[0].watch.generation
    b.saved(0, "s", again)
    assert not b[0].watch.changed


def test_behind_the_front_door_only_requests_mark_a_slot_changed():
    b = board(idle_save_seconds=0)
    b.observe([slot(0, task=1, busy=True)], now=0)
    b.observe([slot(0, task=1)], now=1)
    assert b.changed_slots() == []  # a late poll of a request already accounted for
    b.request_done(0, now=2)
    assert b.due(2) == [0]
    b.saved(0, "s", b[0].watch.generation)
    b.observe([slot(0, task=7)], now=3)  # the poll after the save sees the task: nothing new
    assert b.due(4) == []
