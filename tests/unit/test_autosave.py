"""The autosave policy with a fake clock: turn end, idle delay, deferral while others generate."""

from slotkeeper.core.engine.autosave import AutosavePolicy
from slotkeeper.core.server.client import SlotInfo


def slot(i, task=None, busy=False):
    return SlotInfo(id=i, n_ctx=1024, is_processing=busy, id_task=task)


def test_idle_slot_is_due_after_the_delay_and_only_once():
    p = AutosavePolicy(idle_save_seconds=10)
    p.observe([slot(0)], now=0)
    assert p.due(1) == []  # never used: nothing to save
    p.observe([slot(0, task=1, busy=True)], now=1)
    assert p.due(2) == []  # still generating
    assert p.observe([slot(0, task=1)], now=3) == [0]  # turn ended
    assert p.due(12) == []
    assert p.due(13) == [0]
    p.mark_saved(0, "s1")
    assert p.due(100) == [] and p.in_slots() == {"s1"}


def test_a_whole_request_between_two_polls_is_noticed():
    p = AutosavePolicy(idle_save_seconds=0)
    p.observe([slot(0, task=4)], now=0, first=False)
    p.mark_saved(0, "s")
    p.observe([slot(0, task=9)], now=1)  # task changed, never seen busy
    assert p.due(1) == [0]


def test_waits_while_another_slot_generates_but_not_forever():
    p = AutosavePolicy(idle_save_seconds=5, max_defer_seconds=30)
    p.observe([slot(0, task=1, busy=True), slot(1)], now=0)
    p.observe([slot(0, task=1), slot(1, task=2, busy=True)], now=1)
    assert p.due(10) == []  # slot 1 is generating: a save would stall it
    assert p.due(35) == []
    assert p.due(36.5) == [0]  # the bound: idle 5 s + 30 s
    p.observe([slot(0, task=1), slot(1, task=2)], now=37)
    assert sorted(p.due(42.5)) == [0, 1]


def test_adopted_server_slots_count_as_changed_and_busy_slots_skip():
    p = AutosavePolicy(idle_save_seconds=0)
    p.observe([slot(0, task=3), slot(1)], now=0, first=True)
    assert p.changed_slots() == [0] and p.due(0) == [0]
    p.watch(0).busy_with = "saving"
    assert p.due(1) == []
    p.mark_restored(1, "r")
    assert p.in_slots() == {"r"}


def test_a_failed_save_is_retried_with_a_growing_delay_not_every_poll():
    p = AutosavePolicy(idle_save_seconds=0)
    p.observe([slot(0, task=1)], now=0, first=True)
    assert p.due(0) == [0]
    assert p.save_failed(0, now=0) == 5.0
    assert p.due(1) == [] and p.due(4.9) == []
    assert p.due(5) == [0]
    assert p.save_failed(0, now=5) == 10.0
    assert p.due(14) == [] and p.due(15) == [0]
    for _ in range(20):
        p.save_failed(0, now=15)
    assert p.watch(0).retry_at == 15 + 300  # capped
    p.mark_saved(0, "s")
    p.observe([slot(0, task=2)], now=20)
    assert p.due(20) == [0], "a good save ends the back-off"


def test_a_change_seen_during_a_save_keeps_the_slot_changed():
    p = AutosavePolicy(idle_save_seconds=0)
    p.observe([slot(0, task=1)], now=0, first=True)
    started_at = p.watch(0).generation  # the save begins
    p.observe([slot(0, task=2, busy=True)], now=1)  # the next request starts meanwhile
    p.mark_saved(0, "s", started_at)
    assert p.watch(0).changed, "the newer turn is still unsaved"
    p.observe([slot(0, task=2)], now=2)
    again = p.watch(0).generation
    p.mark_saved(0, "s", again)
    assert not p.watch(0).changed


def test_behind_the_front_door_only_requests_mark_a_slot_changed():
    p = AutosavePolicy(idle_save_seconds=0, changes_from_polls=False)
    p.observe([slot(0, task=1, busy=True)], now=0)
    p.observe([slot(0, task=1)], now=1)
    assert p.changed_slots() == []  # a late poll of a request already accounted for
    p.request_done(0, now=2)
    assert p.due(2) == [0]
    p.mark_saved(0, "s", p.watch(0).generation)
    p.observe([slot(0, task=7)], now=3)  # the poll after the save sees the task: nothing new
    assert p.due(4) == []
