"""Which saved sessions go into which slot when llama-server starts. Pure: no I/O, no clock.

- After a crash, each slot gets back what it held (the sessions it had restored or saved).
- Otherwise the session the user asked to resume goes first, then the most recently used
  sessions that are healthy and compatible with the running server, up to the limit in the
  settings (``restore_on_start``; None = one per slot) and never more than there are slots.
  A resume request is honoured even with a limit of 0; an incompatible one is still tried, so
  the user hears why it was refused.
- llama-server takes requests as soon as it is healthy: a slot a client already used while the
  engine was identifying the model keeps what it holds, and its planned session moves to a
  slot nobody used (or waits for another launch if none is left).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

__all__ = ["LaunchCandidate", "plan_launch_restores"]


@dataclass(frozen=True)
class LaunchCandidate:
    """A saved session as the launch plan sees it."""

    id: str
    last_used_at: float  # unix time; larger = more recent
    usable: bool  # healthy and compatible with the running server


def plan_launch_restores(
    *,
    n_slots: int,
    candidates: Iterable[LaunchCandidate],
    limit: int | None = None,
    resume_id: str | None = None,
    after_crash: Mapping[int, str] | None = None,
    used_slots: AbstractSet[int] = frozenset(),
) -> dict[int, str]:
    """slot -> session id to restore there."""
    if n_slots <= 0:
        return {}
    if after_crash is not None:
        wanted = {slot: sid for slot, sid in after_crash.items() if 0 <= slot < n_slots}
    else:
        wanted = dict(enumerate(_choose(n_slots, candidates, limit, resume_id)))
    kept = {slot: sid for slot, sid in wanted.items() if slot not in used_slots}
    spare = [i for i in range(n_slots) if i not in used_slots and i not in kept]
    moved = [sid for slot, sid in sorted(wanted.items()) if slot in used_slots]
    return {**kept, **dict(zip(spare, moved))}


def _choose(n_slots: int, candidates: Iterable[LaunchCandidate], limit: int | None,
            resume_id: str | None) -> list[str]:
    limit = n_slots if limit is None else max(0, min(limit, n_slots))
    if resume_id:
        limit = max(limit, 1)
    chosen: list[str] = [resume_id] if resume_id else []
    for c in sorted(candidates, key=lambda c: c.last_used_at, reverse=True):
        if len(chosen) >= limit:
            break
        if c.usable and c.id not in chosen:
            chosen.append(c.id)
    return chosen[:limit]
