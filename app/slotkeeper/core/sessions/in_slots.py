"""Which sessions a running engine holds in its slots, for other processes (the sessions CLI).

A session loaded in a slot must not be pruned or deleted: its next save replaces its file. The
engine knows this set in memory; it also writes it to ``state/in-slots.json`` with its pid, so a
`slotkeeper sessions prune` beside the running app keeps those sessions too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from slotkeeper.core.basics.live_record import clear_record, live_record, publish_record


def read_in_slots(path: Path) -> frozenset[str]:
    """The sessions a live engine recorded; empty when none runs (or its file is stale)."""
    data = live_record(path)
    try:
        return frozenset(str(s) for s in data["sessions"]) if data is not None else frozenset()
    except (KeyError, TypeError):
        return frozenset()


def publish_in_slots(path: Path, sessions: Iterable[str]) -> None:
    publish_record(path, "the sessions in slots", sessions=sorted(sessions))


def clear_in_slots(path: Path) -> None:
    clear_record(path)
