"""The engine's slots: one record per slot, changed through the board's methods, published once
per change. Loop-owned; values out.

A ``Slot`` holds all the engine knows of one llama-server slot:

- ``content``: what it holds (its tokens, when known, or only their number), how much of it is
  restored state that must not be rolled back into, and the last request's shape (the fast way in);
- ``watch``: what autosave decides by (``autosave.SlotWatch``: changed since saved, idle since,
  a request or a save running on it);
- ``view``: what the faces see (an immutable ``SlotView``, replaced on change), which names the
  saved session the slot was last saved or restored as (``Slot.session_id`` reads it there, the
  one place it is kept);
- ``pending``: a restore whose first request has not been seen yet (``judge_reuse`` decides then
  whether it paid off);
- ``lock``: slot actions (save, restore, erase) on it run one at a time.

``SlotBoard`` keeps the slots (one map of ``Slot`` records) and changes a slot's facts together
(a failed restore empties the slot for routing, autosave and the faces in one call), then
publishes the slots once: a ``SlotsChanged`` event when what the faces see changed (the engine
listens to it for its snapshot and the in-slots file). The pure rules (``routing``, ``autosave``,
``judge_reuse``) read these records; the other parts change them only through the board's methods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from slotkeeper.core.basics.tokens import TokenArray, as_tokens, common_prefix_len, no_tokens
from slotkeeper.core.engine.slots.autosave import AutosavePolicy, SlotWatch
from slotkeeper.core.events import EventBus, SlotsChanged
from slotkeeper.core.model import families
from slotkeeper.core.views import SlotView

if TYPE_CHECKING:
    from slotkeeper.core.engine.door.shapes import PromptSource, RequestShape
    from slotkeeper.core.server.client import SlotInfo
    from slotkeeper.core.sessions.transcripts import Transcript

log = logging.getLogger(__name__)

# A restore is "effective" when the next request reused at least this share of it.
EFFECTIVE_REUSE_SHARE = 0.5
UNKNOWN = 1 << 30  # a slot's length when what it holds is not known


@dataclass(frozen=True)
class PendingReuse:
    """A restore whose first request has not been seen yet."""

    session_id: str
    n_restored: int
    mode: str = families.RESTORE_WORKS  # the restore mode of the session (core.model.families)


@dataclass(frozen=True)
class ReuseVerdict:
    effective: bool | None  # None: not judged (the request did not continue the restored conversation)
    reason: str | None  # why it did not help, why it was not judged, or why the reply may be off
    warn: bool  # worth telling the user now, not just recording


def reuse_allowed(mode: str, n_restored: int, shared: int | None) -> int:
    """Restored tokens the next request could reuse under the restore mode: ``shared`` is how
    many of them its prompt starts with (None: not known, so all of them)."""
    if mode == families.RESTORE_NEVER:
        return 0
    if shared is None:
        return n_restored
    if mode in families.EXACT_ONLY_MODES:
        return n_restored if shared >= n_restored else 0
    return min(shared, n_restored)


def judge_reuse(pending: PendingReuse, cache_n: int, shared: int | None = None) -> ReuseVerdict:
    """Was the restore worth it, judged against what the restore mode allows: a next request that
    is another conversation (or rolls back where the model cannot) is not the restore's fault."""
    n = pending.n_restored
    if pending.mode == families.RESTORE_NEVER:
        if cache_n >= EFFECTIVE_REUSE_SHARE * n:
            return ReuseVerdict(True, None, False)
        return ReuseVerdict(False, "sliding-window model without --swa-full: llama-server keeps only the "
                                   "last window of those layers, so it re-read the whole conversation", False)
    allowed = reuse_allowed(pending.mode, n, shared)
    if allowed < EFFECTIVE_REUSE_SHARE * n:
        if pending.mode in families.EXACT_ONLY_MODES and shared is not None and shared > 0:
            why = (f"not judged: the next request rolled back inside the restored conversation ({shared:,} "
                   f"of {n:,} "
                   "tokens in common), which this model cannot do, so it was computed from scratch")
        else:
            why = (f"not judged: the next request was another conversation ({shared or 0:,} of {n:,} "
                   "restored tokens in common)")
        return ReuseVerdict(None, why, False)
    if cache_n < EFFECTIVE_REUSE_SHARE * allowed:
        return ReuseVerdict(False, f"the next request reused {cache_n:,} of the {allowed:,} restored tokens "
                                   "it could have (the server discarded the cache)", False)
    if pending.mode in families.EXACT_ONLY_MODES and cache_n < n and shared is None:
        # Rolled back inside a restored state that cannot roll back: the reply may differ from a cold run.
        return ReuseVerdict(True,
                            (f"this request rolled back inside the restored conversation ({cache_n:,} of "
                             f"{n:,} "
                             "tokens reused): this model cannot do that correctly, so the reply may be off; "
                             "regenerate it if it looks wrong"), True)
    return ReuseVerdict(True, None, False)


@dataclass
class SlotContent:
    """What a slot holds, as far as the engine knows."""

    tokens: TokenArray = field(default_factory=no_tokens)
    n_prompt: int = 0  # the last request's prompt (its reply follows it in the slot)
    held: int = 0  # tokens the slot holds in all
    fragile_until: int = 0  # restored tokens that must not be rolled back into (exact-only models)
    last_used: float = 0.0
    shape: RequestShape | None = None  # the last request, while the slot holds its prompt and nothing else
    # ``tokens`` may lag one fast request behind: ``learn`` asks for the real ones when routing needs them
    learn: PromptSource | None = None
    learning: asyncio.Future[TokenArray | None] | None = None
    transcript: Transcript | None = None  # the conversation it holds, as its last request and reply read
    # The last request's rendering fields while the slot holds what it left (restore points ask
    # where its last user message starts); None after a restore or an erase.
    request: PromptSource | None = None

    def forget(self) -> None:
        """What it holds now comes from elsewhere (a restore, an erase): no lagging tokens."""
        self.shape, self.learn, self.learning, self.request = None, None, None, None

    def hold(self, tokens: TokenArray, fragile: int = 0, transcript: Transcript | None = None) -> None:
        """It holds exactly ``tokens`` now (restored, or nothing), which ``transcript`` says in words."""
        self.tokens, self.n_prompt, self.held, self.fragile_until = tokens, len(tokens), len(tokens), fragile
        self.transcript = transcript
        self.forget()


@dataclass(frozen=True)
class Ran:
    """What a request through the front door left in its slot."""

    tokens: TokenArray | None  # its prompt's tokens (None: not known, or not yet: see ``learn``)
    n_prompt: int | None  # its prompt's length as llama-server reported it (None: cut short, not known)
    predicted: int  # tokens generated after it
    recomputed: bool = False  # the slot was erased first
    learn: PromptSource | None = None  # how to learn them later (the fast way in)
    shape: RequestShape | None = None
    transcript: Transcript | None = None  # the conversation it holds now, in words (None: cannot be read)
    request: PromptSource | None = None  # what rendered its prompt (a chat's messages ...), when known


class Slot:
    """One llama-server slot as the engine knows it (see the module's docstring)."""

    def __init__(self, slot_id: int, lock: asyncio.Lock, n_ctx: int = 0, unknown: bool = False) -> None:
        self.id = slot_id
        self.watch = SlotWatch(slot_id)
        self.lock = lock
        self.view = SlotView(slot_id, n_ctx=n_ctx)
        self.content = SlotContent(n_prompt=UNKNOWN, held=UNKNOWN) if unknown else SlotContent()
        self.pending: PendingReuse | None = None
        # A request waits for it while Slotkeeper acts on it (restore points stop early for it)
        self.wanted = False
        # A request runs on it that replaces what it held (saved first): the request's tokens,
        # which routing compares instead, so that no one waits for a conversation that is leaving.
        self.replacing: TokenArray | None = None

    @property
    def busy(self) -> bool:
        """A request runs on it, or Slotkeeper is saving or restoring it."""
        return self.watch.leased or self.watch.acting is not None

    @property
    def leased(self) -> bool:
        """A request through the front door runs on it."""
        return self.watch.leased

    @property
    def session_id(self) -> str | None:
        """The saved session it was last saved or restored as (see ARCHITECTURE: detached views)."""
        return self.view.session_id


class SlotBoard:
    """Every slot's record (on the engine loop), published through ``events``."""

    def __init__(self, idle_save_seconds: float, events: EventBus) -> None:
        self.policy = AutosavePolicy(idle_save_seconds)
        self._events = events
        self._slots: dict[int, Slot] = {}  # the slots llama-server has now
        self._gone: dict[int, Slot] = {}  # slots of a server that went: their locks outlive them
        self._published: tuple[tuple[SlotView, ...], int] | None = None
        self.waiting = 0  # requests waiting for a slot (the front desk's line), published with the views

    # -- reading --------------------------------------------------------------------------
    def __getitem__(self, slot_id: int) -> Slot:
        found = self._slots.get(slot_id)
        if found is None:
            old = self._gone.pop(slot_id, None)
            found = self._slots[slot_id] = Slot(slot_id, old.lock if old else asyncio.Lock())
        return found

    def __iter__(self) -> Iterator[Slot]:
        return iter([s for _, s in sorted(self._slots.items())])

    def __len__(self) -> int:
        return len(self._slots)

    def lock(self, slot_id: int) -> asyncio.Lock:
        """Actions on the slot (save, restore, erase) take it one at a time; it outlives a restart."""
        s = self._slots.get(slot_id) or self._gone.get(slot_id)
        if s is None:
            s = self._gone[slot_id] = Slot(slot_id, asyncio.Lock())
        return s.lock

    def locks(self) -> list[asyncio.Lock]:
        every = {**self._gone, **self._slots}
        return [every[i].lock for i in sorted(every)]

    def views(self) -> tuple[SlotView, ...]:
        return tuple(s.view for s in self)

    def in_slots(self) -> frozenset[str]:
        """The saved sessions a slot holds now: the in-slot guard keeps them from being deleted. A
        slot that went on with another conversation (its view detached) no longer holds its old
        session, which may then be deleted (to free a full disk, say); its next save names what
        it holds."""
        return frozenset(s.session_id for s in self if s.session_id and not s.view.detached)

    def holder(self, session_id: str) -> int | None:
        """The slot last saved or restored as ``session_id``."""
        return next((s.id for s in self if s.session_id == session_id), None)

    def changed_slots(self) -> list[int]:
        """Slots holding something not saved yet."""
        return [s.id for s in self if s.watch.changed]

    def due(self, now: float) -> list[int]:
        """Slots whose conversation went idle and is due to be saved now (``autosave``)."""
        return self.policy.due((s.watch for s in self), now)

    # -- the whole board ------------------------------------------------------------------
    def reset(self, n_slots: int, n_ctx: int, idle_save_seconds: float | None = None,
              unknown: bool = False) -> None:
        """New slots: empty, or (``unknown``, a server an earlier run left) holding something whose
        tokens are not known, which another conversation saves before taking it. With
        ``idle_save_seconds`` autosave starts over as well (a launch that is not a crash's restart)."""
        if idle_save_seconds is not None:
            self.set_idle_save(idle_save_seconds)
        before = {**self._gone, **self._slots}
        self._slots = {i: Slot(i, before[i].lock if i in before else asyncio.Lock(), n_ctx, unknown)
                       for i in range(n_slots)}
        self._gone = {i: s for i, s in before.items() if i not in self._slots}
        self._changed()

    def clear(self) -> None:
        """The server is gone: no slots to show."""
        self._gone.update(self._slots)
        self._slots = {}
        self._changed()

    def set_idle_save(self, seconds: float) -> None:
        self.policy.idle_save_seconds = max(0.0, float(seconds))

    def forget_published(self) -> None:
        """A new launch: the next change is published even if the slots look as before."""
        self._published = None

    # -- one slot's facts, together ---------------------------------------------------------
    def show(self, slot_id: int, **changes: Any) -> None:
        """Change what the faces see of a slot."""
        s = self[slot_id]
        s.view = replace(s.view, **changes)
        self._changed()

    def acting(self, slot_id: int, what: str | None) -> None:
        """Slotkeeper saves or restores the slot (``what``), or has finished (None)."""
        s = self[slot_id]
        s.watch.acting = what
        s.view = replace(s.view, state=what or "idle")
        self._changed()

    def lease(self, slot_id: int) -> None:
        """A request through the front door takes the slot (autosave leaves it alone)."""
        s = self[slot_id]
        s.watch.leased = True
        s.wanted = False

    def want(self, slot_id: int) -> None:
        """A request waits for the slot, which is busy: work Slotkeeper does on it that can wait
        (restore points) stops at its next step."""
        self[slot_id].wanted = True

    def release(self, slot_id: int) -> None:
        s = self[slot_id]
        s.watch.leased = False
        s.replacing = None
        s.content.last_used = time.monotonic()

    def replaced_by(self, slot_id: int, tokens: TokenArray) -> None:
        """A request runs on the slot that replaces what it held (saved first)."""
        self[slot_id].replacing = tokens

    def restored(self, slot_id: int, session_id: str, tokens: Sequence[int] | TokenArray, n_restored: int,
                 mode: str, exact_only: bool, transcript: Transcript | None = None) -> None:
        """A session was restored into the slot: it holds exactly its tokens, saved as they are."""
        s = self[slot_id]
        arr = as_tokens(tokens)
        s.content.hold(arr, len(arr) if exact_only else 0, transcript)
        s.watch.restored()
        s.pending = PendingReuse(session_id, n_restored, mode)
        # The prompt figures were the previous conversation's: a restored slot has had no request yet.
        s.view = replace(s.view, session_id=session_id, n_tokens=n_restored, warning=None, detached=False,
                         n_prompt=0, cache_n=0, prompt_n=0)
        self._changed()

    def rewound(self, slot_id: int, tokens: TokenArray, restored: bool) -> None:
        """Restore points were made from the slot's conversation (``RestorePoints.after_idle_save``): it
        holds ``tokens`` now, the saved conversation restored again (``restored``: its state cannot
        be rolled back, as any restore's) or the last point made (live, when that restore failed).
        Nothing in it is unsaved, and its view is unchanged."""
        c = self[slot_id].content
        c.hold(tokens, len(tokens) if restored else 0, c.transcript)

    def emptied(self, slot_id: int) -> None:
        """llama-server refused a restore, which leaves the slot empty: nothing to save, no session."""
        s = self[slot_id]
        s.watch.changed = False
        s.content.hold(no_tokens())
        s.view = replace(s.view, session_id=None, n_tokens=0, detached=False)
        self._changed()

    def erased(self, slot_id: int) -> PendingReuse | None:
        """The slot was erased so a request is computed from scratch; returns the restore that will
        now never be judged (on purpose, not the restore's failure)."""
        s = self[slot_id]
        s.content.hold(no_tokens())
        pending, s.pending = s.pending, None
        return pending

    def ran(self, slot_id: int, r: Ran) -> tuple[int, int, int | None]:
        """A request ran on the slot: what it holds now. Returns the prompt's length, the tokens
        held in all, and how many prompt tokens it had in common with what the slot held before
        (None: not known)."""
        c = self[slot_id].content
        shared: int | None = None
        if r.tokens is None and r.learn is not None and r.n_prompt is not None:
            # The fast way in: the tokens are learnt when a full route needs them.
            c.n_prompt = r.n_prompt
            c.learn, c.learning = r.learn, None
        elif r.tokens is None:
            # Not known (a prompt shape the front door cannot tokenize): the slot holds a prompt of
            # the size llama-server reports, which a next conversation saves before replacing it.
            # Restored state that cannot be rolled back was erased first (routing), so none is left.
            c.tokens, c.n_prompt, c.fragile_until = (no_tokens(), r.n_prompt if r.n_prompt is not None
                                                     else UNKNOWN, 0)
            c.learn = c.learning = None
        else:
            tokens = r.tokens
            if not r.recomputed:
                shared = common_prefix_len(tokens, c.tokens)
                if shared < len(c.tokens) and c.tokens[shared] < 0:
                    # An image or audio clip (a media pseudo-token, see kvfile) where the two part:
                    # the request's rendering of it cannot be compared here; llama-server can.
                    shared = None
            if c.fragile_until and common_prefix_len(tokens, c.tokens) < c.fragile_until:
                c.fragile_until = 0  # recomputed from scratch: nothing restored is left in it
            c.tokens, c.n_prompt = tokens, len(tokens)
            c.learn = c.learning = None
        c.held = c.n_prompt + max(r.predicted - 1, 0)
        c.shape = r.shape if r.n_prompt is not None and c.n_prompt else None
        c.transcript = r.transcript
        c.request = r.request if r.n_prompt is not None else None
        return c.n_prompt, c.held, shared

    def take_pending(self, slot_id: int) -> PendingReuse | None:
        """The restore awaiting its first request's verdict, which is given now."""
        s = self[slot_id]
        pending, s.pending = s.pending, None
        return pending

    def saved(self, slot_id: int, session_id: str | None, generation: int) -> None:
        """The slot was saved as ``session_id`` (None: nothing worth keeping) as of ``generation``."""
        s = self[slot_id]
        s.watch.saved(generation)
        s.view = replace(s.view, session_id=session_id, detached=False)
        self._changed()

    def save_failed(self, slot_id: int, now: float) -> float:
        """A save of the slot failed: the seconds until autosave tries again."""
        return self[slot_id].watch.save_failed(now)

    def left(self, slot_id: int, generation: int) -> None:
        """Saved before another conversation takes the slot: it names no session until a restore
        names one (the old one is committing elsewhere), so its view and the sessions in slots agree."""
        s = self[slot_id]
        s.watch.saved(generation)
        s.view = replace(s.view, session_id=None, detached=False)
        self._changed()

    def observe(self, infos: list[SlotInfo], now: float, first: bool = False) -> list[int]:
        """A /slots poll: autosave's turn ends, and the views' state and live prompt figures.
        Returns the slots whose turn just ended."""
        ended = []
        for info in infos:
            s = self[info.id]
            if s.watch.observe(info, now, first=first):
                ended.append(info.id)
            changes: dict[str, Any] = {"n_ctx": info.n_ctx}
            if s.view.state not in ("saving", "restoring"):
                changes["state"] = "busy" if info.is_processing else "idle"
                if info.is_processing:
                    changes["running"] = True
                    if info.n_prompt_tokens:
                        changes.update(n_prompt=info.n_prompt_tokens, cache_n=info.n_prompt_tokens_cache,
                                       prompt_n=info.n_prompt_tokens_processed)
            s.view = replace(s.view, **changes)
        self._changed()
        return ended

    def settled(self, restored: set[int], now: float) -> None:
        """After the launch restores: what was restored (or an empty slot) is the baseline, and
        anything else a slot holds is news to save."""
        for s in self:
            w = s.watch
            w.changed = s.id not in restored and w.last_task is not None
            if w.changed and w.idle_since is None and not w.processing:
                w.idle_since = now

    def request_done(self, slot_id: int, now: float) -> None:
        """A request through the front door finished on the slot: its turn ended now."""
        self[slot_id].watch.request_done(now)

    def set_waiting(self, n: int) -> None:
        """How many requests wait for a slot now (the front desk's line)."""
        if n != self.waiting:
            self.waiting = n
            self._changed()

    def _changed(self) -> None:
        views = self.views()
        if (views, self.waiting) != self._published:  # a poll that changed nothing wakes no one
            self._published = (views, self.waiting)
            self._events.emit(SlotsChanged(views, self.waiting))

    # -- tokens that lag ------------------------------------------------------------------
    async def learn_lagging(self, tokenize: Callable[[PromptSource], Awaitable[TokenArray | None]]) -> None:
        """Bring every slot's tokens up to date (a full route compares them): ``tokenize`` asks
        llama-server (``prompts.PromptTokens.learn``)."""
        waits = []
        for s in self:
            c = s.content
            if c.learn is not None:
                if c.learning is None:
                    c.learning = asyncio.ensure_future(tokenize(c.learn))
                waits.append((c, c.learning))
        for c, fut in waits:
            try:
                tokens = await asyncio.shield(fut)
            except Exception as exc:  # noqa: BLE001 - not knowing them only costs a reuse
                log.debug("could not learn a slot's tokens: %s", exc)
                tokens = None
            if c.learning is fut:  # not replaced by a newer request meanwhile
                c.tokens = tokens if tokens is not None else no_tokens()
                c.learn = c.learning = None
