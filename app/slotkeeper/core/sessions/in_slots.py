"""Which sessions a running engine holds in its slots, for other processes (the sessions CLI).

A session loaded in a slot must not be pruned or deleted: its next save replaces its file. The
engine knows this set in memory; it also writes it to ``state/in-slots.json`` with its pid, so a
`slotkeeper sessions prune` beside the running app keeps those sessions too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from slotkeeper.core.basics.fsutil import atomic_write_text

log = logging.getLogger(__name__)


def read_in_slots(path: Path) -> frozenset[str]:
    """The sessions a live engine recorded; empty when none runs (or its file is stale)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        pid = int(data["engine_pid"])
        sessions = frozenset(str(s) for s in data["sessions"])
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()
    try:
        import psutil  # here: the CLI that lists sessions starts faster without it

        alive = psutil.pid_exists(pid)
    except Exception:
        alive = True
    return sessions if alive else frozenset()


def publish_in_slots(path: Path, sessions: Iterable[str]) -> None:
    data = {"engine_pid": os.getpid(), "sessions": sorted(sessions)}
    try:
        atomic_write_text(path, json.dumps(data))
    except OSError as exc:
        log.warning("could not record the sessions in slots: %s", exc)


def clear_in_slots(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
