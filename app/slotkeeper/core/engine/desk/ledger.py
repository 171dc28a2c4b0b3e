"""What each request through the front door did, recorded once it is over: the slot's record and
view, the request history, the faces' events, and the verdict on a restore's first request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.slots.board import SlotBoard, judge_reuse
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import EventBus, RequestDone, WarningRaised
from slotkeeper.core.history import RequestHistory, RequestRecord


@dataclass(frozen=True)
class Figures:
    """One request's prompt processing, from llama-server's ``timings``."""

    n_prompt: int
    cache_n: int
    prompt_n: int
    prompt_ms: float
    source: str  # slot, restored, ram, recomputed, none
    saved_ms: float  # prefill time the cached tokens saved
    shared: int | None = None  # prompt tokens in common with what the slot held before (None: not known)


class RequestLedger:
    def __init__(self, board: SlotBoard, history: RequestHistory, library: Library, loop: EngineLoop,
                 events: EventBus) -> None:
        self.board = board
        self.history = history
        self.library = library
        self.loop = loop
        self.events = events

    def done(self, slot: int, held: int, fig: Figures | None) -> None:
        """A request through the front door finished on ``slot``, which holds ``held`` tokens now
        (``fig``: its figures; None when it was cut short and what it did is not known)."""
        now = time.monotonic()
        self.board.request_done(slot, now)
        if fig is None:
            self.board.show(slot, running=False, n_tokens=held)
            return
        at = time.time()
        s = self.board[slot]
        shown: dict[str, Any] = {}
        if s.view.session_id and 2 * fig.cache_n < s.view.n_tokens:
            # Another conversation (or a rollback far back, which may be the same one sent again from
            # its start) in this slot: its old title no longer describes it, and the old badge goes
            # with it; the session stays the slot's own (a save, a Resume and the in-slot guard still
            # treat it so) until the next save names what it holds now.
            shown = {"detached": True, "warning": None}
        self.board.show(slot, running=False, n_prompt=fig.n_prompt, cache_n=fig.cache_n,
                        prompt_n=fig.prompt_n, n_tokens=held, **shown)
        record = RequestRecord(at=at, slot=slot, n_prompt=fig.n_prompt, cache_n=fig.cache_n,
                               prompt_n=fig.prompt_n, prompt_ms=fig.prompt_ms, source=fig.source,
                               saved_ms=fig.saved_ms)
        self.loop.in_background(self.history.append, record, what="recording the request history")
        self.events.emit(RequestDone(slot, 0, fig.n_prompt, fig.cache_n, fig.prompt_n, fig.prompt_ms, at,
                                     fig.source, fig.saved_ms))
        pending = self.board.take_pending(slot)
        if pending is not None:
            verdict = judge_reuse(pending, fig.cache_n, fig.shared)
            if verdict.reason and (verdict.effective is False or verdict.warn):
                self.board.show(slot, warning=verdict.reason)  # not judged (another conversation): no badge
            if verdict.warn:
                self.events.emit(WarningRaised(verdict.reason or ""))
            self.library.reuse_judged(slot, pending, fig.cache_n, fig.n_prompt, verdict.effective,
                                      verdict.reason)
