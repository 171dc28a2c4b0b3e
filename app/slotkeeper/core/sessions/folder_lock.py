"""Exclusive use of the sessions folder, across threads and processes, with a time limit.

Every read-modify-write of the folder (commit a save, update a sidecar, delete, sweep) holds it,
so `slotkeeper sessions pin` in another process never writes back a sidecar the app is
replacing. ``filelock`` takes an OS lock (flock / LockFileEx) that dies with its process; a
holder that hangs makes the others give up after ``timeout`` seconds with a clear message
rather than wait forever. Re-entrant within a thread: nested uses share the outermost hold.

A folder that cannot hold the lock file (read-only: a read-only mount, a folder made 0500) is
still readable: ``held(reading=True)`` goes ahead without the lock (nobody can be changing it
through Slotkeeper either), while a write fails with ``FolderReadOnly``. A missing folder is
never created here (filelock would, with the umask's mode): reading it finds nothing.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

log = logging.getLogger(__name__)

LOCK_TIMEOUT_SECONDS = 30.0
LOCK_TIMEOUT_ENV = "SLOTKEEPER_LOCK_TIMEOUT"  # read by the sessions CLI (tests use ~1 s)


class FolderBusy(OSError):
    """Another Slotkeeper (or a stuck one) held the sessions folder for too long."""

    def __str__(self) -> str:
        return str(self.strerror)


class FolderReadOnly(OSError):
    """The sessions folder cannot be written (so not locked either): reading works, writing not."""

    def __str__(self) -> str:
        return str(self.strerror)


class FolderLock:
    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.path = Path(path)
        self.timeout = timeout
        # 0600, as every file Slotkeeper writes (filelock would use 0644, less the umask).
        self._lock = filelock.FileLock(str(path), timeout=timeout, thread_local=True, mode=0o600)

    @property
    def folder(self) -> Path:
        return self.path.parent

    @contextmanager
    def held(self, reading: bool = False) -> Iterator[None]:
        """The lock, for a read-modify-write; with ``reading``, reads go ahead unlocked where the
        folder cannot hold a lock file (read-only, or missing)."""
        locked = self._acquire(reading)
        try:
            yield
        finally:
            if locked:
                self._lock.release()

    def _acquire(self, reading: bool) -> bool:
        if not self.folder.is_dir():
            if reading:
                return False  # nothing to read, nothing to lock; never created here
            raise FileNotFoundError(errno.ENOENT, f"the sessions folder {self.folder} is missing")
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise FolderBusy(errno.EBUSY, (
                f"the sessions folder {self.folder} is locked by another Slotkeeper process; "
                f"gave up after {self.timeout:g} s (is a `slotkeeper sessions` command stuck?)")) from None
        except OSError as exc:
            if not self._read_only(exc):
                raise
            if reading:
                log.debug("reading %s without its lock: %s", self.folder, exc)
                return False
            raise FolderReadOnly(exc.errno, (
                f"the sessions folder {self.folder} is read-only ({exc.strerror}); it can be listed and "
                f"checked, not changed")) from exc
        return True

    def _read_only(self, exc: OSError) -> bool:
        """The lock file cannot be created because the folder is read-only (not any other error)."""
        if exc.errno == errno.EROFS:
            return True
        return exc.errno in (errno.EACCES, errno.EPERM) and not os.access(self.folder, os.W_OK)
