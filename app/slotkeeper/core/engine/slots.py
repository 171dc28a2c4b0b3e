"""The engine's picture of its slots, and whether a restore paid off. Loop-owned; values out.

``SlotTable`` holds one immutable ``SlotView`` per slot and replaces it on every change, so the
tuple it hands out (``views()``) can go to any thread. ``judge_reuse`` is the rule for the first
request after a restore.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from slotkeeper.core.client import SlotInfo
from slotkeeper.core.views import SlotView

# A restore is "effective" when the next request reused at least this share of it.
EFFECTIVE_REUSE_SHARE = 0.5


@dataclass(frozen=True)
class PendingReuse:
    """A restore whose first request has not been seen yet."""

    session_id: str
    n_restored: int
    swa: bool
    swa_full: bool


@dataclass(frozen=True)
class ReuseVerdict:
    effective: bool
    reason: str | None  # why it did not help, or why the reply may be off
    warn: bool  # worth telling the user now, not just recording


def judge_reuse(pending: PendingReuse, cache_n: int) -> ReuseVerdict:
    effective = cache_n >= EFFECTIVE_REUSE_SHARE * pending.n_restored
    if not effective:
        if pending.swa and not pending.swa_full:
            reason = ("sliding-window model without --swa-full: llama-server keeps only the last "
                      "window of those layers, so it re-read the whole conversation")
        else:
            reason = (f"the next request reused {cache_n} of {pending.n_restored} restored tokens "
                      "(a different conversation, or the server discarded the cache)")
        return ReuseVerdict(False, reason, False)
    if pending.swa and pending.swa_full and cache_n < pending.n_restored:
        # Rolling back inside restored SWA state gives results that differ from a cold run.
        reason = (f"this request rolled back inside the restored conversation ({cache_n} of "
                  f"{pending.n_restored} tokens reused): with sliding-window layers the reply may be wrong; "
                  "regenerate it if it looks off")
        return ReuseVerdict(True, reason, True)
    return ReuseVerdict(True, None, False)


class SlotTable:
    def __init__(self) -> None:
        self._views: dict[int, SlotView] = {}
        self.pending: dict[int, PendingReuse] = {}

    def reset(self, n_slots: int, n_ctx: int) -> None:
        self._views = {i: SlotView(i, n_ctx=n_ctx) for i in range(n_slots)}
        self.pending = {}

    def clear(self) -> None:
        self._views = {}
        self.pending = {}

    def view(self, slot: int) -> SlotView:
        return self._views.get(slot) or SlotView(slot)

    def set(self, slot: int, **changes: Any) -> SlotView:
        view = replace(self.view(slot), **changes)
        self._views[slot] = view
        return view

    def views(self) -> tuple[SlotView, ...]:
        return tuple(v for _, v in sorted(self._views.items()))

    def observe(self, slots: list[SlotInfo]) -> None:
        """A /slots poll: state and, while a request runs, its live prompt figures."""
        for info in slots:
            v = self.view(info.id)
            changes: dict[str, Any] = {"n_ctx": info.n_ctx}
            if v.state not in ("saving", "restoring"):
                changes["state"] = "busy" if info.is_processing else "idle"
                if info.is_processing:
                    changes["running"] = True
                    if info.n_prompt_tokens:
                        changes.update(n_prompt=info.n_prompt_tokens, cache_n=info.n_prompt_tokens_cache,
                                       prompt_n=info.n_prompt_tokens_processed)
            self.set(info.id, **changes)
