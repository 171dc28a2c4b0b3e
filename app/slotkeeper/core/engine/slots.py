"""The engine's picture of its slots, and whether a restore paid off. Loop-owned; values out.

``SlotTable`` holds one immutable ``SlotView`` per slot and replaces it on every change, so the
tuple it hands out (``views()``) can go to any thread. ``judge_reuse`` is the rule for the first
request after a restore, measured against what the session's restore mode allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from slotkeeper.core import families
from slotkeeper.core.client import SlotInfo
from slotkeeper.core.views import SlotView

# A restore is "effective" when the next request reused at least this share of it.
EFFECTIVE_REUSE_SHARE = 0.5


@dataclass(frozen=True)
class PendingReuse:
    """A restore whose first request has not been seen yet."""

    session_id: str
    n_restored: int
    mode: str = families.RESTORE_WORKS  # the restore mode of the session (core.families)


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
        return ReuseVerdict(False, "sliding-window model without --swa-full: llama-server keeps only the last "
                                   "window of those layers, so it re-read the whole conversation", False)
    allowed = reuse_allowed(pending.mode, n, shared)
    if allowed < EFFECTIVE_REUSE_SHARE * n:
        if pending.mode in families.EXACT_ONLY_MODES and shared is not None and shared > 0:
            why = (f"not judged: the next request rolled back inside the restored conversation ({shared:,} of {n:,} "
                   "tokens in common), which this model cannot do, so it was computed from scratch")
        else:
            why = (f"not judged: the next request was another conversation ({shared or 0:,} of {n:,} restored "
                   "tokens in common)")
        return ReuseVerdict(None, why, False)
    if cache_n < EFFECTIVE_REUSE_SHARE * allowed:
        return ReuseVerdict(False, f"the next request reused {cache_n:,} of the {allowed:,} restored tokens it "
                                   "could have (the server discarded the cache)", False)
    if pending.mode in families.EXACT_ONLY_MODES and cache_n < n and shared is None:
        # Rolled back inside a restored state that cannot roll back: the reply may differ from a cold run.
        return ReuseVerdict(True, (f"this request rolled back inside the restored conversation ({cache_n:,} of {n:,} "
                                   "tokens reused): this model cannot do that correctly, so the reply may be off; "
                                   "regenerate it if it looks wrong"), True)
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
