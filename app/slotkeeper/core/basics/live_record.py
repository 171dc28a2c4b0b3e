"""A small JSON file a running engine keeps for other processes of the same data folder (its
command line), with the engine's pid: what it says holds only while that process runs. Written
atomically (0600), removed when it no longer holds; a failure to write only costs the readers."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import atomic_write_text

log = logging.getLogger(__name__)


def publish_record(path: Path, what: str, **data: Any) -> None:
    """``data`` and this process's pid in ``path`` (``what``: the record, in the warning a failure logs)."""
    try:
        atomic_write_text(path, json.dumps({"engine_pid": os.getpid(), **data}))
    except OSError as exc:
        log.warning("could not record %s: %s", what, exc)


def clear_record(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not remove %s: %s", path.name, exc)


def live_record(path: Path) -> dict[str, Any] | None:
    """The record, while the process that wrote it runs; else None (none, unreadable, or stale)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        pid = int(data["engine_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        import psutil  # here: the command line that lists sessions starts faster without it

        alive = psutil.pid_exists(pid)
    except Exception:
        alive = True
    return data if alive else None
