"""The front desk on its own, without a server: each rule by name, with the real slot board and
small stand-ins for the parts that talk to llama-server (the slot actions, the saves, the library).

The real thing, against a real llama-server, is in tests/e2e/test_front_door.py and
tests/e2e/test_door_hardening.py; these pin the decisions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from slotkeeper.core.basics.tokens import as_tokens
from slotkeeper.core.engine.desk import frontdesk as fd
from slotkeeper.core.engine.desk.frontdesk import FrontDesk, Outcome, request_shape
from slotkeeper.core.engine.door.shapes import PromptSource
from slotkeeper.core.engine.errors import FrontDeskError
from slotkeeper.core.engine.slots.board import UNKNOWN, SlotBoard
from slotkeeper.core.engine.slots.rates import Rates
from slotkeeper.core.engine.stored.library import SavedPrefix
from slotkeeper.core.events import EventBus, SlotsChanged
from slotkeeper.core.views import RestoreSummary


@dataclass
class Facts:
    restore_mode: str = "works"
    n_ctx_slot: int = 4096
    n_parallel: int = 2
    model_sha256: str = "0" * 64


class Link:
    def __init__(self, facts: Facts | None = None, serving: bool = True) -> None:
        self.facts = facts or Facts()
        self.serving = serving
        self.waits = 0

    def serving_now(self) -> bool:
        return self.serving

    async def wait_serving(self, timeout: float = 600.0) -> None:
        self.waits += 1
        if not self.serving:
            raise FrontDeskError(503, "llama-server is not running")


@dataclass
class Parts:
    """What the desk asked the parts to do, in order."""

    calls: list[tuple] = field(default_factory=list)
    saved_ok: bool = True
    best: tuple[str, int, int] | None = None
    done: list[tuple] = field(default_factory=list)
    slow_lookup: dict[int, float] = field(default_factory=dict)  # first token -> seconds the library takes
    learnt: list = field(default_factory=list)  # what the prompts were asked to tokenize
    learnt_tokens: object = None

    # the saves
    async def save_before_switching(self, slot: int) -> bool:
        self.calls.append(("save", slot))
        return self.saved_ok

    async def await_commits(self, tokens=None, beat: int = 0) -> None:
        self.calls.append(("await_commits", beat))

    # the slot actions
    async def restore_for_request(self, session_id: str, slot: int,
                                  point: str | None = None) -> RestoreSummary | None:
        self.calls.append(("restore", session_id, slot) if point is None
                          else ("restore", session_id, slot, point))
        return RestoreSummary(session_id, slot, 900, 5.0, "t")

    async def recompute(self, slot: int, reason: str) -> None:
        self.calls.append(("erase", slot, reason))

    # the restore points
    async def before_leaving(self, slot: int) -> int:
        return 0  # a full-attention model's conversation owes none

    # the library
    async def saved_prefixes(self, tokens, facts, beat: int = 0):
        await asyncio.sleep(self.slow_lookup.get(int(tokens[0]), 0))
        if self.best is not None:
            sid, shared, n_tokens, *points = self.best
            yield SavedPrefix(sid, shared, n_tokens, tuple(points), 1000)

    # the ledger and the poller
    def ledger_done(self, slot, held, fig) -> None:
        self.done.append((slot, held, fig))

    def wake(self) -> None:
        pass

    def abandoned(self, slot: int) -> None:
        self.calls.append(("abandoned", slot))

    # the prompts: a request that came the fast way is tokenized when a full route needs it
    async def learn(self, what: PromptSource):
        self.learnt.append(what)
        return self.learnt_tokens


class Ledger:
    def __init__(self, parts: Parts) -> None:
        self.done = parts.ledger_done


def make_desk(n_slots: int = 2, facts: Facts | None = None,
              serving: bool = True, events: EventBus | None = None) -> tuple[FrontDesk, SlotBoard, Parts]:
    board = SlotBoard(10.0, events or EventBus())
    board.reset(n_slots, 4096)
    parts = Parts()
    # type: ignore[arg-type]
    desk = FrontDesk(board, Link(facts, serving), actions=parts, points=parts, saves=parts, library=parts,
                     ledger=Ledger(parts), poller=parts, rates=Rates(), prompts=parts)  # type: ignore[arg-type]
    return desk, board, parts


def hold(board: SlotBoard, slot: int, tokens: list[int], changed: bool = False, fragile: int = 0) -> None:
    c = board[slot].content
    c.tokens, c.n_prompt, c.held, c.fragile_until = as_tokens(tokens), len(tokens), len(tokens), fragile
    board[slot].watch.changed = changed


def run(coro):
    return asyncio.run(coro)


def toks(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


async def served(desk: FrontDesk, order: list[str], name: str, tokens: list[int], place=None) -> None:
    """A client: gets a slot, notes its name in ``order``, and is done a moment later."""
    ticket = await desk.admit(as_tokens(tokens), place=place)
    order.append(name)
    await asyncio.sleep(0.01)
    desk.finish(ticket, Outcome(200, True, {"cache_n": 0, "prompt_n": len(tokens), "predicted_n": 1}))


# -- admission --------------------------------------------------------------------------------
def test_admission_waits_for_the_server_and_refuses_when_it_will_not_come():
    desk, _board, _parts = make_desk(serving=False)
    with pytest.raises(FrontDeskError) as err:
        run(desk.admit(as_tokens(toks(10))))
    assert err.value.status == 503


def test_admission_refuses_a_slot_that_does_not_exist():
    desk, _board, _parts = make_desk(n_slots=2)
    with pytest.raises(FrontDeskError, match="id_slot 5 does not exist") as err:
        run(desk.admit(as_tokens(toks(10)), pinned_slot=5))
    assert err.value.status == 400


# -- routing choice ---------------------------------------------------------------------------
def test_a_continuation_goes_to_the_slot_that_holds_it_and_leases_it():
    desk, board, parts = make_desk()
    hold(board, 1, toks(100))
    ticket = run(desk.admit(as_tokens(toks(120))))
    assert ticket.slot == 1 and ticket.expected_prefix == 100 and ticket.source == "slot"
    assert board[1].leased and not parts.calls[1:]  # nothing done to the slot first


def test_another_conversation_takes_an_empty_slot_and_keeps_the_other_warm():
    desk, board, parts = make_desk()
    hold(board, 0, toks(100), changed=True)
    ticket = run(desk.admit(as_tokens(toks(50, start=1000))))
    assert ticket.slot == 1 and ("save", 0) not in parts.calls


# -- save before evict ------------------------------------------------------------------------
def test_a_changed_conversation_is_saved_before_another_takes_its_slot():
    desk, board, parts = make_desk(n_slots=1)
    hold(board, 0, toks(100), changed=True)
    ticket = run(desk.admit(as_tokens(toks(50, start=1000))))
    assert ticket.slot == 0 and ("save", 0) in parts.calls


def test_a_slot_whose_conversation_cannot_be_saved_is_not_replaced():
    desk, board, parts = make_desk(n_slots=1)
    hold(board, 0, toks(100), changed=True)
    parts.saved_ok = False
    with pytest.raises(FrontDeskError, match="could not be saved") as err:
        run(desk.admit(as_tokens(toks(50, start=1000))))
    assert err.value.status == 503 and not board[0].leased  # the lease is given back


# -- restore on demand ------------------------------------------------------------------------
def test_a_saved_conversation_is_restored_when_it_beats_the_slots_by_the_break_even():
    desk, board, parts = make_desk(n_slots=1)
    parts.best = ("abc", 900, 950)
    ticket = run(desk.admit(as_tokens(toks(1000))))
    assert ("restore", "abc", 0) in parts.calls and ticket.source == "restored"
    assert ("await_commits", desk.break_even_tokens(0)) in parts.calls  # a commit could be the best


def test_a_saved_conversation_is_not_restored_for_less_than_the_break_even():
    desk, board, parts = make_desk(n_slots=1)
    hold(board, 0, toks(895))
    parts.best = ("abc", 900, 950)
    assert desk.break_even_tokens(1000) > 900 - 895  # five more tokens are not worth a restore
    ticket = run(desk.admit(as_tokens(toks(1000))))
    assert not [c for c in parts.calls if c[0] == "restore"] and ticket.expected_prefix == 895


# -- recompute --------------------------------------------------------------------------------
def test_a_rollback_inside_fragile_restored_state_is_recomputed():
    desk, board, parts = make_desk(n_slots=1, facts=Facts(restore_mode="exact"))
    hold(board, 0, toks(900), fragile=900)
    ticket = run(desk.admit(as_tokens(toks(600) + toks(100, start=5000))))
    assert ticket.source == "recomputed" and any(c[0] == "erase" for c in parts.calls)


def test_a_request_whose_tokens_are_not_known_never_rolls_back_into_fragile_state():
    desk, board, parts = make_desk(n_slots=1, facts=Facts(restore_mode="exact"))
    hold(board, 0, toks(900), fragile=900)
    ticket = run(desk.admit(None))
    assert ticket.source == "recomputed" and any(c[0] == "erase" for c in parts.calls)
    desk.finish(ticket, Outcome(200, True, {"cache_n": 0, "prompt_n": 300, "predicted_n": 5}))
    c = board[0].content
    assert c.fragile_until == 0 and c.n_prompt == 300 and c.held == 304  # known by its size only


def test_a_cut_short_request_of_unknown_tokens_leaves_a_slot_saved_before_it_is_replaced():
    desk, board, parts = make_desk(n_slots=1)
    ticket = run(desk.admit(None))
    desk.finish(ticket, Outcome(200, True, None))  # the client went away: no timings
    assert board[0].content.held >= UNKNOWN
    board[0].watch.changed = True
    run(desk.admit(as_tokens(toks(10))))
    assert ("save", 0) in parts.calls


# -- the queue --------------------------------------------------------------------------------
def test_past_the_queue_bound_a_request_goes_to_llama_servers_own_queue(monkeypatch):
    monkeypatch.setattr(fd, "MAX_WAITING", 0)
    desk, board, _parts = make_desk(n_slots=1)
    board.lease(0)
    ticket = run(desk.admit(as_tokens(toks(10))))
    assert ticket.slot is None  # no slot named: llama-server queues it


def test_a_request_waits_for_a_slot_to_be_freed(monkeypatch):
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 0.05)
    desk, board, _parts = make_desk(n_slots=1)

    async def scenario():
        first = await desk.admit(as_tokens(toks(10)))
        second = asyncio.ensure_future(desk.admit(as_tokens(toks(10, start=500))))
        await asyncio.sleep(0.2)
        assert not second.done()  # queued while the only slot is busy
        desk.finish(first, Outcome(200, True, {"cache_n": 0, "prompt_n": 10, "predicted_n": 1}))
        return await asyncio.wait_for(second, 5)

    assert run(scenario()).slot == 0


def test_the_faces_hear_once_that_a_request_waits_and_once_that_it_got_its_slot(monkeypatch):
    """The waiting count goes up when a request first waits and down when it leaves the line: its
    looks again every step change nothing the faces see."""
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 0.02)
    bus = EventBus()
    said: list[int] = []
    bus.subscribe(lambda e: said.append(e.waiting), SlotsChanged)
    desk, board, _parts = make_desk(n_slots=1, events=bus)

    async def scenario():
        first = await desk.admit(as_tokens(toks(10)))
        second = asyncio.ensure_future(desk.admit(as_tokens(toks(10, start=500))))
        await asyncio.sleep(0.3)  # many steps of looking again
        assert board.waiting == 1
        desk.finish(first, Outcome(200, True, {"cache_n": 0, "prompt_n": 10, "predicted_n": 1}))
        return await asyncio.wait_for(second, 5)

    run(scenario())
    counts = [n for i, n in enumerate(said) if i == 0 or n != said[i - 1]]
    assert counts[-2:] == [1, 0] and counts.count(1) == 1 and board.waiting == 0


# -- the fast way in and lagging tokens --------------------------------------------------------
def test_the_next_turn_of_a_slots_conversation_goes_straight_to_it_and_its_tokens_are_learnt_later():
    desk, board, _parts = make_desk()
    first = request_shape("chat", {"messages": [{"role": "user", "content": "hi"}]})
    nxt = request_shape("chat", {"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"},
                                              {"role": "user", "content": "more"}]})
    ticket = run(desk.admit(as_tokens(toks(30))))
    ticket.shape = first
    desk.finish(ticket, Outcome(200, True, {"cache_n": 0, "prompt_n": 30, "predicted_n": 5}))
    fast = desk.admit_continuation(nxt)
    assert fast is not None and fast.slot == ticket.slot and fast.tokens is None
    _parts.learnt_tokens = as_tokens(toks(60))
    learn = PromptSource("chat", {"messages": list(nxt.growing)})
    desk.finish(fast, Outcome(200, True, {"cache_n": 30, "prompt_n": 30, "predicted_n": 5}), learn=learn)
    assert board[ticket.slot].content.n_prompt == 60 and not _parts.learnt  # not tokenized on the way
    run(desk.admit(as_tokens(toks(10, start=7000))))  # a full route compares slots: it learns them now
    assert _parts.learnt == [learn] and list(board[ticket.slot].content.tokens) == toks(60)


def test_restored_state_that_cannot_roll_back_never_takes_the_fast_way():
    desk, board, _parts = make_desk(facts=Facts(restore_mode="exact"))
    shape = request_shape("text", {"prompt": "abc"})
    hold(board, 0, toks(50), fragile=50)
    board[0].content.shape = shape
    assert desk.admit_continuation(request_shape("text", {"prompt": "abcdef"})) is None


# -- what a request did -----------------------------------------------------------------------
def test_the_figures_say_where_the_cache_came_from():
    desk, board, parts = make_desk()
    ticket = run(desk.admit(as_tokens(toks(100))))
    desk.finish(ticket,
                Outcome(200, True, {"cache_n": 80, "prompt_n": 20, "prompt_ms": 10.0, "predicted_n": 3}))
    (_slot, held, fig), = parts.done
    assert fig.source == "ram" and held == 102  # llama-server found it in its own prompt cache
    assert not board[ticket.slot].leased


def test_a_request_refused_before_its_prompt_was_touched_changes_nothing():
    desk, board, parts = make_desk()
    hold(board, 0, toks(40))
    ticket = run(desk.admit(as_tokens(toks(50))))
    desk.finish(ticket, Outcome(400, False))
    assert list(board[0].content.tokens) == toks(40) and not parts.done


@pytest.mark.parametrize("slow", [{}, {1000: 0.25, 2000: 0.25}], ids=["quick-lookups", "slow-lookups"])
def test_waiting_requests_get_a_freed_slot_first_come_first_served(slow, monkeypatch):
    """A, B and C queue for the only slot, in that order. With slow lookups (a busy disk) C arrives
    while A's and B's first looks at the saved conversations still run, and keeps its place after
    them. A request arriving as the slot is freed comes after all that waited."""
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 5.0)  # no timer: only a freed slot wakes anyone
    desk, board, parts = make_desk(n_slots=1)
    parts.slow_lookup.update(slow)
    order: list[str] = []

    def client(name: str, start: int):
        return served(desk, order, name, toks(20, start=start))

    async def scenario():
        first = await desk.admit(as_tokens(toks(20)))  # the only slot is busy
        tasks = []
        for i, name in enumerate("ABC"):
            tasks.append(asyncio.ensure_future(client(name, 1000 * (i + 1))))
            await asyncio.sleep(0.1)  # A, then B, then C arrive
        await asyncio.sleep(0.4 if slow else 0)  # every lookup done: all three wait
        desk.finish(first, Outcome(200, True, {"cache_n": 0, "prompt_n": 20, "predicted_n": 1}))
        # Arriving as the slot is freed: the requests that waited come first.
        tasks.append(asyncio.ensure_future(client("late", 9000)))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    run(scenario())
    assert order == ["A", "B", "C", "late"]


def test_the_line_starts_when_a_request_arrives_not_when_its_prompt_is_tokenized(monkeypatch):
    """The door takes A's place in line before tokenizing A's prompt; B, arriving while A's prompt
    is tokenized, comes after A. A place given up (the tokenizing failed) holds nobody up."""
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 5.0)  # no timer: only a freed slot wakes anyone
    desk, board, _parts = make_desk(n_slots=1)
    order = []

    def client(name: str, start: int, place=None):
        return served(desk, order, name, toks(20, start=start), place)

    async def scenario():
        first = await desk.admit(as_tokens(toks(20)))  # the only slot is busy
        gone = desk.arrive()  # its prompt could not be tokenized: it leaves below
        a = desk.arrive()
        b = asyncio.ensure_future(client("B", 2000))
        await asyncio.sleep(0.1)  # A's prompt is being tokenized
        desk.leave(gone)
        tasks = [asyncio.ensure_future(client("A", 1000, a)), b]
        await asyncio.sleep(0.05)
        desk.finish(first, Outcome(200, True, {"cache_n": 0, "prompt_n": 20, "predicted_n": 1}))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    run(scenario())
    assert order == ["A", "B"]


def test_a_freed_slot_goes_to_the_request_given_the_turn_not_to_a_later_one_looking_on_its_timer(monkeypatch):
    """B waits for its own slot (it holds B's conversation); C, a new conversation, came later and
    looks again on its timer. The slot freed is B's turn: while B decides (a slow lookup), C's
    timer finds the slot free, and must leave it to B."""
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 0.02)
    desk, board, parts = make_desk(n_slots=1)
    order = []

    async def scenario():
        first = await desk.admit(as_tokens(toks(20)))
        hold(board, 0, toks(20))  # the slot holds B's conversation, busy with its last turn
        b = asyncio.ensure_future(served(desk, order, "B", toks(30)))
        await asyncio.sleep(0.05)
        c = asyncio.ensure_future(served(desk, order, "C", toks(20, start=5000)))
        await asyncio.sleep(0.1)
        parts.slow_lookup[1] = 0.3  # B's next look at the saved conversations is slow
        desk.finish(first, Outcome(200, True, {"cache_n": 0, "prompt_n": 20, "predicted_n": 1}))
        await asyncio.wait_for(asyncio.gather(b, c), 5)

    run(scenario())
    assert order == ["B", "C"]


def test_requests_arriving_together_at_free_slots_are_not_held_up(monkeypatch):
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 5.0)  # a wait on the timer would fail the bound below
    desk, _board, parts = make_desk(n_slots=2)
    parts.slow_lookup[1000] = 0.1

    async def scenario():
        a, b = await asyncio.wait_for(asyncio.gather(desk.admit(as_tokens(toks(20, start=1000))),
                                                     desk.admit(as_tokens(toks(20, start=2000)))), 1.0)
        return {a.slot, b.slot}

    assert run(scenario()) == {0, 1}


def test_the_saved_option_is_asked_again_after_every_wait():
    """A next turn that arrived while its conversation was leaving its slot finds it saved when
    it gets a slot, and has it restored instead of re-reading it."""
    desk, board, parts = make_desk(n_slots=1)

    async def scenario():
        other = await desk.admit(as_tokens(toks(50, start=5000)))  # another conversation takes the slot
        hold(board, 0, toks(900))  # ...which held this one's tokens until the other's reply
        waiting = asyncio.ensure_future(desk.admit(as_tokens(toks(1000))))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # its own slot is busy: it waits for it
        parts.best = ("abc", 900, 950)  # meanwhile its conversation was saved as it left the slot
        hold(board, 0, toks(60, start=5000))
        desk.finish(other, Outcome(200, True, {"cache_n": 0, "prompt_n": 50, "predicted_n": 10}))
        return await asyncio.wait_for(waiting, 5)

    ticket = run(scenario())
    assert ("restore", "abc", 0) in parts.calls and ticket.source == "restored"


def test_a_conversation_leaving_a_busy_slot_takes_the_first_slot_freed_not_that_one(monkeypatch):
    """Its slot was given to another conversation (its own saved first): its next turn waits for
    any slot, as llama-server's queue would, instead of for the slot it left, and is restored into
    the first one freed."""
    monkeypatch.setattr(fd, "WAIT_STEP_SECONDS", 5.0)  # no timer: only a freed slot wakes anyone
    desk, board, parts = make_desk(n_slots=2)
    hold(board, 0, toks(900), changed=True)  # conversation A, least recently used
    hold(board, 1, toks(300, start=3000), changed=True)  # conversation C
    board[0].content.last_used, board[1].content.last_used = 1.0, 2.0

    async def scenario():
        c_turn = await desk.admit(as_tokens(toks(320, start=3000)))  # C's next turn, on its slot
        b = await desk.admit(as_tokens(toks(50, start=5000)))  # B takes A's slot, A saved first
        assert (c_turn.slot, b.slot) == (1, 0) and ("save", 0) in parts.calls
        parts.best = ("a", 900, 950)  # A, saved as it left
        a_turn = asyncio.ensure_future(desk.admit(as_tokens(toks(1000))))
        await asyncio.sleep(0.05)
        assert not a_turn.done()  # every slot busy
        desk.finish(c_turn, Outcome(200, True, {"cache_n": 300, "prompt_n": 20, "predicted_n": 5}))
        ticket = await asyncio.wait_for(a_turn, 2)  # B still runs on slot 0
        assert board[0].leased
        return ticket

    ticket = run(scenario())
    assert ticket.slot == 1 and ticket.source == "restored" and ("restore", "a", 1) in parts.calls


def test_a_saved_session_offers_itself_or_its_longest_point_the_request_strictly_extends():
    from slotkeeper.core.sessions.sidecar import POINT_PROMPT, POINT_USER, RestorePoint

    def pt(n, kind):
        return RestorePoint(f"abcdefabcdef.{n:08x}.kv", n, "0" * 16, n * 10, "xxh3_128:" + "0" * 32, kind,
                            "2026-01-01T00:00:00Z")

    hit = SavedPrefix("abcdefabcdef", shared=905, n_tokens=950,
                      points=(pt(899, POINT_PROMPT), pt(600, POINT_USER)), size_bytes=9500)
    # a model whose restores roll back: all it shares
    assert fd.session_option(hit, 1200, exact=False).prefix == 905
    # exact-only: the longest point it strictly extends, its size what the restore reads
    o = fd.session_option(hit, 1200, exact=True)
    assert (o.prefix, o.point, o.size_bytes) == (899, "abcdefabcdef.00000383.kv", 8990)
    edited = SavedPrefix("abcdefabcdef", 640, 950, hit.points, 9500)
    assert fd.session_option(edited, 700, exact=True).prefix == 600
    assert fd.session_option(SavedPrefix("abcdefabcdef", 500, 950, hit.points, 9500), 700, exact=True) is None
    whole = SavedPrefix("abcdefabcdef", 950, 950, hit.points, 9500)
    assert fd.session_option(whole, 1200, exact=True).point is None  # the save itself, extended
