"""The sessions service: list, pin, delete, prune and verify, with one set of rules for every face.

The desktop app (through the engine), `slotkeeper serve` and `slotkeeper sessions ...` all use
this, so "never delete a session loaded in a slot" and "prune least recently used first, never a
pinned one" are written once. Only saved sessions count towards the budget, sized by their KV
files on disk; files in the folder that are not Slotkeeper's are reported, never counted.
``in_slots`` says which sessions a running engine holds right now: the engine passes its own
live set, the CLI reads the set a running engine published.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from slotkeeper.core.sessions import pruner
from slotkeeper.core.sessions.entries import Listing, SessionEntry, UnmanagedFile
from slotkeeper.core.sessions.naming import validate_session_id
from slotkeeper.core.sessions.sidecar import Sidecar
from slotkeeper.core.sessions.store import SessionStore

__all__ = ["PruneOutcome", "SessionInUse", "SessionsService"]


class SessionInUse(Exception):
    """The session is loaded in a slot of a running server; its next save needs it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id} is loaded in a slot of the running server; it can be deleted "
                         "once another conversation replaces it")
        self.session_id = session_id


@dataclass(frozen=True)
class PruneOutcome:
    plan: pruner.PrunePlan
    result: pruner.PruneResult | None  # None for a dry run
    # Files in the folder that are not Slotkeeper's: shown, never counted, never deleted.
    unmanaged: tuple[UnmanagedFile, ...] = ()


class SessionsService:
    def __init__(self, store: SessionStore, in_slots: Callable[[], AbstractSet[str]],
                 budget: Callable[[], int], on_deleted: Callable[[str], None] | None = None) -> None:
        """``on_deleted(id)`` is told of every session this service deletes (the engine keeps its
        sessions index with it)."""
        self.store = store
        self._in_slots = in_slots
        self._budget = budget
        self._on_deleted = on_deleted

    def listing(self) -> Listing:
        return self.store.listing()

    def listing_json(self) -> list[dict[str, Any]]:
        """What `sessions list --json` prints: ``e.to_json()`` of each listed session."""
        return self.store.listing_rows()

    def get(self, session_id: str) -> SessionEntry:
        return self.store.get(session_id)

    def in_slots(self) -> frozenset[str]:
        return frozenset(self._in_slots())

    def set_pinned(self, session_id: str, pinned: bool) -> Sidecar:
        return self.store.set_pinned(session_id, pinned)

    def delete(self, session_id: str) -> None:
        """Delete a saved session, unless a slot holds it right now. Raises SessionInUse, and
        InvalidSessionId for anything that is not an id (``./ID`` must not slip past the check)."""
        validate_session_id(session_id)
        if session_id in self.in_slots():
            raise SessionInUse(session_id)
        self._delete(session_id)

    def verify(self, session_id: str) -> SessionEntry:
        return self.store.verify(session_id)

    def plan_prune(self, budget: int | None = None) -> pruner.PrunePlan:
        """What a prune to ``budget`` (default: the setting) would delete; nothing is deleted."""
        return self._plan(budget)[0]

    def _plan(self, budget: int | None) -> tuple[pruner.PrunePlan, Listing]:
        # Managed sessions only, sized on disk: files that are not ours never cause a prune.
        listing = self.store.listing()
        cands = [pruner.PruneCandidate.from_entry(e) for e in listing.sessions if e.sidecar]
        plan = pruner.plan(cands, self._budget() if budget is None else budget,
                           protected_ids=self.in_slots(), unmanaged_bytes=listing.unmanaged_bytes)
        return plan, listing

    def prune(self, budget: int | None = None, dry_run: bool = False, quick: bool = False) -> PruneOutcome:
        """Delete the least recently used sessions until the rest fit the budget. ``quick`` (after
        a save): when the sessions index says they fit already, nothing else is looked at; only
        a prune that has something to do lists the folder (so it never acts on a stale index)."""
        if quick and not dry_run:
            limit = self._budget() if budget is None else budget
            usage = self.store.usage_bytes()
            if usage <= limit:
                return PruneOutcome(pruner.PrunePlan([], 0, usage, usage, limit, False), pruner.PruneResult())
        plan, listing = self._plan(budget)
        unmanaged = tuple(listing.unmanaged)
        if dry_run or not plan.delete:
            return PruneOutcome(plan, None if dry_run else pruner.PruneResult(), unmanaged)
        in_slots = self.in_slots()

        def delete(session_id: str) -> None:
            # The slots may have changed since the plan: check again right before each delete.
            if session_id in in_slots or session_id in self.in_slots():
                raise SessionInUse(session_id)
            self._delete(session_id)

        return PruneOutcome(plan, pruner.apply(plan, delete), unmanaged)

    def _delete(self, session_id: str) -> None:
        self.store.delete(session_id)
        if self._on_deleted is not None:
            self._on_deleted(session_id)
