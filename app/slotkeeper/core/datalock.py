"""One engine per data folder: an exclusive lock held for the life of the process.

Two engines on one folder would fight over the server state file (one would stop the other's
llama-server as a "leftover"), sweep each other's saves in progress and race on sidecars. A
POSIX record lock (or msvcrt's on Windows) is released by the OS when the process dies, so a
crashed app never leaves the folder locked.
"""

from __future__ import annotations

import os
from pathlib import Path

_held: dict[str, int] = {}  # lock file -> fd, kept open for the life of the process


class DataDirBusy(Exception):
    pass


def _try_lock(fd: int) -> bool:
    try:
        if os.name == "nt":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def acquire(lock_file: Path, what: str) -> None:
    """Lock ``lock_file`` for this process (a no-op if it already holds it)."""
    key = str(lock_file.resolve())
    if key in _held:
        return
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    if not _try_lock(fd):
        try:
            other = os.read(fd, 32).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise DataDirBusy(
            f"another Slotkeeper (pid {other}) is already running with {what}; "
            "quit it first, or use another folder with --data-dir"
        )
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[key] = fd
