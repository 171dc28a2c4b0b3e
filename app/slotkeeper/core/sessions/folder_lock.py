"""Exclusive use of the sessions folder, across threads and processes, with a time limit.

Every read-modify-write of the folder (commit a save, update a sidecar, delete, sweep) holds it,
so `slotkeeper sessions pin` in another process never writes back a sidecar the app is
replacing. ``filelock`` takes an OS lock (flock / LockFileEx) that dies with its process; a
holder that hangs makes the others give up after ``timeout`` seconds with a clear message
rather than wait forever. Re-entrant within a thread: nested uses share the outermost hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

LOCK_TIMEOUT_SECONDS = 30.0


class FolderBusy(OSError):
    """Another Slotkeeper (or a stuck one) held the sessions folder for too long."""


class FolderLock:
    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = filelock.FileLock(str(path), timeout=timeout, thread_local=True)

    @contextmanager
    def held(self) -> Iterator[None]:
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise FolderBusy(
                f"the sessions folder {self.path.parent} is locked by another Slotkeeper process; "
                f"gave up after {self.timeout:.0f} s (is a `slotkeeper sessions` command stuck?)"
            ) from None
        try:
            yield
        finally:
            self._lock.release()
