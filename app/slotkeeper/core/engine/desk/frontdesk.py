"""Requests through the front door, on the engine loop: which slot, what must happen to it first
(save, restore, erase), and what the request did.

``admit`` routes a request (``routing.route``) with what the parts it is given know: the tokens
every slot holds (the slot board), the sessions index (the library), whether a slot's restored
state may be rolled back (the server's facts), and the measured prefill and restore rates (the
break-even of a restore). It leases the slot until ``finish``, which records what the slot holds
now, the per-request figures (from the response's ``timings``) and where the cache came from.
It runs on the engine loop and never calls back into the engine (an import contract says so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slotkeeper.core.basics.tokens import TokenArray, common_prefix_len, no_tokens
from slotkeeper.core.engine.desk.ledger import Figures
from slotkeeper.core.engine.desk.routing import Route, SessionOption, SlotOption, Wait, route, usable_prefix
from slotkeeper.core.engine.door.shapes import RequestShape, request_shape
from slotkeeper.core.engine.errors import FrontDeskError
from slotkeeper.core.engine.slots.board import UNKNOWN, Ran
from slotkeeper.core.model import families
from slotkeeper.core.server.client import ServerUnavailable
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.points import best_point
from slotkeeper.core.sessions.transcripts import Transcript

if TYPE_CHECKING:
    from slotkeeper.core.engine.desk.ledger import RequestLedger
    from slotkeeper.core.engine.door.prompts import PromptTokens
    from slotkeeper.core.engine.door.shapes import PromptSource
    from slotkeeper.core.engine.lifecycle.server_link import ServerLink
    from slotkeeper.core.engine.slots.actions import SlotActions
    from slotkeeper.core.engine.slots.board import SlotBoard, SlotContent
    from slotkeeper.core.engine.slots.points import RestorePoints
    from slotkeeper.core.engine.slots.polling import SlotPoller
    from slotkeeper.core.engine.slots.rates import Rates
    from slotkeeper.core.engine.slots.saves import SlotSaves
    from slotkeeper.core.engine.stored.library import Library, SavedPrefix

__all__ = ["FrontDesk", "FrontDeskError", "Outcome", "RequestShape", "Ticket", "request_shape"]

log = logging.getLogger(__name__)

MAX_WAITING = 64  # requests queued for a slot; beyond, llama-server's own queue takes them
WAIT_STEP_SECONDS = 2.0  # a waiting request looks again at least this often
def restore_mode(facts: ServerFacts | None) -> str:
    """How a restored state of the running model behaves (``core.families``): "works" (any
    rollback is correct: full attention, MLA), "exact" continuation only (hybrid and recurrent
    models, whose save holds no checkpoints; sliding-window layers with --swa-full, which keep
    only a window of old cells), "never" useful (sliding window without --swa-full), or
    "unknown" (treated as exact). From the model's facts, recorded in ``ServerFacts``."""
    if facts is None:
        return families.RESTORE_WORKS
    return facts.restore_mode


def exact_only(mode: str) -> bool:
    return mode in families.EXACT_ONLY_MODES


def session_option(hit: SavedPrefix, n_request: int, exact: bool) -> SessionOption | None:
    """What a saved session offers a request of ``n_request`` tokens: all it shares with it, or,
    for a model whose restored state cannot be rolled back (``exact``), itself when the request
    strictly extends it, else its longest restore point the request strictly extends (None: none)."""
    if not exact:
        return SessionOption(hit.session_id, hit.shared, hit.n_tokens, False, size_bytes=hit.size_bytes)
    if hit.shared == hit.n_tokens and n_request > hit.n_tokens:
        return SessionOption(hit.session_id, hit.n_tokens, hit.n_tokens, True, size_bytes=hit.size_bytes)
    point = best_point(hit.points, hit.shared, n_request)
    if point is None:
        return None
    return SessionOption(hit.session_id, point.n_tokens, point.n_tokens, True, point=point.kv_file,
                         size_bytes=point.state_bytes or point.size_bytes)


@dataclass
class Place:
    """A request's place in the line for a slot, taken when it arrives."""

    turn: asyncio.Event  # set when it may try to get a slot
    behind: bool = False  # requests that came first were waiting or deciding when it arrived
    blocked: bool = True  # deciding, or every slot was busy (not only its own): later ones queue behind
    deciding: bool = True  # arrived or woken, and not yet routed or waiting again
    waiting: bool = False  # it had to wait for a slot (counted in the board's ``waiting`` until it leaves)


@dataclass
class Ticket:
    slot: int | None  # None: llama-server picks (our queue is full)
    tokens: TokenArray | None  # the request's prompt tokens, when known
    expected_prefix: int = 0
    source: str = "none"  # where the cache is expected to come from
    started: float = field(default_factory=time.monotonic)
    shape: RequestShape | None = None


@dataclass
class Outcome:
    """What came back: ``processed`` once llama-server worked on the prompt; ``transcript``: the
    conversation the slot holds now, when the request and its reply could be read as one."""

    status: int
    processed: bool
    timings: dict[str, Any] | None = None
    transcript: Transcript | None = None
    request: PromptSource | None = None  # what rendered the prompt (kept with the slot for restore points)


class FrontDesk:
    def __init__(self, board: SlotBoard, link: ServerLink, actions: SlotActions, points: RestorePoints,
                 saves: SlotSaves, library: Library, ledger: RequestLedger, poller: SlotPoller, rates: Rates,
                 prompts: PromptTokens) -> None:
        self.board = board
        self.link = link
        self.actions = actions
        self.points = points
        self.saves = saves
        self.library = library
        self.ledger = ledger
        self.poller = poller
        self._route_lock = asyncio.Lock()
        self._waiters: list[Place] = []  # requests waiting for a slot, first come first
        self.rates = rates
        self.prompts = prompts

    # -- what the slots hold --------------------------------------------------------------
    def content(self, slot: int) -> SlotContent:
        return self.board[slot].content

    def break_even_tokens(self, size_bytes: int) -> int:
        """Prefill tokens that take as long as restoring a file of ``size_bytes`` (``Rates``)."""
        return self.rates.break_even_tokens(size_bytes)

    def abandoned(self, slot: int) -> None:
        """The client of a request on ``slot`` went away before its reply began."""
        self.poller.abandoned(slot)

    # -- admitting a request --------------------------------------------------------------
    async def until_serving(self) -> None:
        """Until llama-server takes requests (FrontDeskError when it will not, or is restarting)."""
        await self.link.wait_serving()

    def arrive(self) -> Place | None:
        """A request takes its place in the line as it arrives, before its prompt is tokenized or
        any saved conversation looked up, so one that comes later is never served first because
        this one's lookups took longer. None: the line is full (it will try once, then go to
        llama-server's own queue). Hand the place to ``admit``, or to ``leave`` if it never gets there."""
        if len(self._waiters) >= MAX_WAITING:
            return None
        me = Place(asyncio.Event(), behind=any(w.blocked for w in self._waiters))
        self._waiters.append(me)
        return me

    def leave(self, me: Place | None) -> None:
        """Out of the line (routed, refused or gone): the next one tries."""
        if me is not None and me in self._waiters:
            self._pass_turn(me)
            self._waiters.remove(me)
            if me.waiting:
                self._count_waiting()

    async def admit(self, tokens: TokenArray | None, pinned_slot: int | None = None,
                    place: Place | None = None) -> Ticket:
        """Route a request and prepare its slot; the slot is leased until ``finish``. ``place``: its
        place in the line from ``arrive`` (taken now when not given); the line is left either way."""
        me = place if place is not None else self.arrive()
        try:
            await self.link.wait_serving()
            n_slots = len(self.board)
            if n_slots == 0:
                raise FrontDeskError(503, "llama-server has no slots ready yet; try again shortly")
            if pinned_slot is not None and not (0 <= pinned_slot < n_slots):
                raise FrontDeskError(400,
                                     f"id_slot {pinned_slot} does not exist (the server has {n_slots} slots)")
            await self.board.learn_lagging(self.prompts.learn)
            if me is not None and me.behind:
                await self._wait_turn(me)  # requests that came first are still deciding or waiting
            while True:
                # Asked again after every wait: the conversation may have left its slot meanwhile
                # (saved as another took the slot, or committing now).
                session = await self._saved_option(tokens, pinned_slot)
                async with self._route_lock:
                    size = session.size_bytes if session is not None else 0
                    decision = route(len(tokens) if tokens is not None else 0,
                                     self._slot_options(tokens, pinned_slot), session,
                                     self.break_even_tokens(size), known=tokens is not None)
                    if isinstance(decision, Route) and not self._earlier_trying(me):
                        self._lease(decision.slot)
                        break
                    if isinstance(decision, Wait):
                        self.board.want(decision.slot)
                    if me is None:
                        return Ticket(None, tokens)  # llama-server queues it: its usual behaviour
                    # Waits: every slot busy, or its own slot busy, or a free slot is due to a
                    # request that came first (then it still wants any slot, like that one).
                    me.blocked = decision is None or isinstance(decision, Route)
                    me.deciding = False
                self._pass_turn(me)
                await self._wait_turn(me)
                me.deciding = True
                await self.link.wait_serving()
        finally:
            self.leave(me)
        try:
            return await self._prepare(decision, tokens)
        except BaseException:
            self._release(decision.slot)
            raise

    def admit_continuation(self, shape: RequestShape | None, pinned_slot: int | None = None) -> Ticket | None:
        """The fast way in, without the prompt's tokens: a request that continues the last request
        of an idle slot (the next turn of the conversation that slot holds) goes straight to it.

        Nothing needs doing first there (no save, no restore) and no other slot or saved session
        holds more of that conversation than the slot it last ran on. Slots with restored tokens
        of an exact-only model are left to the full route, which checks for a rollback. None:
        take the full route (``admit``); the caller learns the tokens later (``finish``)."""
        if shape is None or not self.link.serving_now() or self._route_lock.locked():
            return None
        best = None
        for s in self.board:
            c = s.content
            if c.shape is None or s.busy or c.fragile_until or c.held >= UNKNOWN:
                continue
            if pinned_slot is not None and s.id != pinned_slot:
                continue
            if not shape.continues(c.shape):
                continue
            if best is None or c.shape.length > best.content.shape.length:  # type: ignore[union-attr]
                best = s
        if best is None:
            return None
        self._lease(best.id)
        log.debug("request -> slot %s: continues its last request", best.id)
        return Ticket(best.id, None, best.content.held, "slot", shape=shape)

    async def _prepare(self, r: Route, tokens: TokenArray | None) -> Ticket:
        try:
            return await self._prepare_slot(r, tokens)
        except ServerUnavailable as exc:  # llama-server went away while its slot was being prepared
            raise FrontDeskError(503, f"llama-server stopped while Slotkeeper prepared slot {r.slot} for "
                                      f"this request ({exc}); try again shortly", retry_after=1.0) from exc

    async def _prepare_slot(self, r: Route, tokens: TokenArray | None) -> Ticket:
        ticket = Ticket(r.slot, tokens, r.expected_prefix, "slot" if r.expected_prefix else "none")
        async with self.board.lock(r.slot):
            if r.save_first or r.restore or r.erase_first:
                # The conversation it holds leaves: its restore points first, while llama-server
                # still holds what they are made from (saved first, whole, when it changed).
                await self.points.before_leaving(r.slot)
            unsaved = r.save_first and self.board[r.slot].watch.changed
            if unsaved and not await self.saves.save_before_switching(r.slot):
                raise FrontDeskError(503, f"slot {r.slot} holds a conversation that could not be saved, so "
                                          "it was not replaced (see Slotkeeper's messages)")
            if r.restore:
                summary = await self.actions.restore_for_request(r.restore, r.slot, r.restore_point)
                if summary is None:
                    ticket.expected_prefix, ticket.source = 0, "none"
                    if self.content(r.slot).fragile_until:  # it still holds what the request rolls back in
                        await self.actions.recompute(r.slot, "the restore it needed was refused")
                        ticket.source = "recomputed"
                else:
                    ticket.source = "restored"
            if r.erase_first:
                await self.actions.recompute(r.slot, r.reason)
                ticket.source = "recomputed"
        c = self.content(r.slot)
        if r.restore or r.erase_first or r.expected_prefix < c.n_prompt:
            # What the slot held is saved (or was already) and is being replaced: a request for
            # that conversation no longer waits for this slot, it takes the first one freed.
            self.board.replaced_by(r.slot, tokens if tokens is not None else no_tokens())
            self._wake_first()
        log.debug("request -> slot %s: %s", r.slot, r.reason)
        return ticket

    def _slot_options(self, tokens: TokenArray | None, pinned: int | None) -> list[SlotOption]:
        out = []
        for s in self.board:
            if pinned is not None and s.id != pinned:
                continue
            c = s.content
            if tokens is None:
                prefix = 0
            elif s.busy and s.replacing is not None:
                prefix = common_prefix_len(tokens, s.replacing)
            else:
                prefix = common_prefix_len(tokens, c.tokens) if c.held else 0
            out.append(SlotOption(s.id, prefix, c.held, c.n_prompt, s.busy, s.watch.changed, c.last_used,
                                  c.fragile_until))
        return out

    async def _session_option(self, tokens: TokenArray, beat: int) -> SessionOption | None:
        mode = restore_mode(self.link.facts)
        if mode == families.RESTORE_NEVER:
            return None
        exact = exact_only(mode)
        best: SessionOption | None = None
        async for hit in self.library.saved_prefixes(tokens, self.link.facts, beat):
            option = session_option(hit, len(tokens), exact)
            if option is not None and (best is None or option.prefix > best.prefix):
                best = option
            if option is not None and option.prefix == hit.shared:
                break  # all it shares is usable: no session further down shares more
        return best

    def _lease(self, slot: int) -> None:
        self.board.lease(slot)
        self.poller.wake()

    def _release(self, slot: int) -> None:
        self.board.release(slot)
        self._wake_first()

    # -- the queue: first come, first served -----------------------------------------------
    def _earlier_trying(self, me: Place | None) -> bool:
        """Whether a request ahead of ``me`` in line is deciding now or has been given its turn: a
        slot freed is theirs to take first, even when ``me`` looked again on its timer."""
        for w in self._waiters:
            if w is me:
                return False
            if w.deciding or w.turn.is_set():
                return True
        return False

    def _wake_first(self) -> None:
        """A slot may be free: the request waiting longest tries first, then each after it in turn."""
        if self._waiters:
            self._waiters[0].turn.set()

    def _pass_turn(self, me: Place) -> None:
        i = self._waiters.index(me)
        if i + 1 < len(self._waiters):
            self._waiters[i + 1].turn.set()

    async def _wait_turn(self, me: Place) -> None:
        if not me.waiting:  # counted once, from its first wait until it leaves the line
            me.waiting = True
            self._count_waiting()
        try:
            await asyncio.wait_for(me.turn.wait(), WAIT_STEP_SECONDS)
        except asyncio.TimeoutError:
            pass  # looked at again now and then: a state change that frees no slot wakes nobody
        me.turn.clear()

    def _count_waiting(self) -> None:
        """The faces see how many requests wait for a slot (the Slots page says so)."""
        self.board.set_waiting(sum(1 for w in self._waiters if w.waiting))

    async def _saved_option(self, tokens: TokenArray | None, pinned_slot: int | None) -> SessionOption | None:
        """The saved conversation routing could restore for this request, asked now."""
        if tokens is None or pinned_slot is not None:
            return None
        # Only a session that beats every idle slot by the break-even could be chosen.
        beat = max((usable_prefix(o, len(tokens)) for o in self._slot_options(tokens, None) if not o.busy),
                   default=0)
        beat += self.break_even_tokens(0)
        # A conversation saved as it left its slot may still be committing: it could be the best.
        await self.saves.await_commits(tokens, beat)
        return await self._session_option(tokens, beat)

    # -- when it is done ------------------------------------------------------------------
    def finish(self, ticket: Ticket, outcome: Outcome, learn: PromptSource | None = None) -> None:
        """Record what the request did (called once, also when the client went away).

        A request that came in the fast way has no tokens yet: ``learn`` finds them when a full
        route needs them (a conversation that keeps to its slot never needs them); its figures
        come from the response's ``timings``."""
        if ticket.slot is None:
            return
        slot = ticket.slot
        self._release(slot)
        if not outcome.processed:
            return  # refused before the prompt was touched: the slot holds what it held
        t = outcome.timings or {}
        predicted = int(t.get("predicted_n") or 0)
        cache_n, prompt_n = int(t.get("cache_n") or 0), int(t.get("prompt_n") or 0)
        ran = Ran(ticket.tokens, cache_n + prompt_n if outcome.timings else None, predicted,
                  recomputed=ticket.source == "recomputed", learn=learn,
                  shape=ticket.shape, transcript=outcome.transcript, request=outcome.request)
        n_prompt, held, shared = self.board.ran(slot, ran)
        if outcome.timings is None:  # cut short (the client went away): what it did is not known
            self.ledger.done(slot, held, None)
            return
        prompt_ms = float(t.get("prompt_ms") or 0.0)
        self.rates.prefill_measured(prompt_ms, prompt_n)
        source = ticket.source
        if cache_n == 0 and source in ("slot", "restored"):
            source = "none"
        elif cache_n > 0 and source in ("none", "recomputed"):
            source = "ram"  # llama-server found it in its own prompt cache
        self.ledger.done(slot, held, Figures(n_prompt, cache_n, prompt_n, prompt_ms, source,
                                             self.rates.saved_ms(cache_n), shared))
