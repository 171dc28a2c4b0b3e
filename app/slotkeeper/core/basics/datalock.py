"""One engine per data folder: an exclusive lock held for the life of the process.

Two engines on one folder would fight over the server state file (one would stop the other's
llama-server as a "leftover"), sweep each other's saves in progress and race on sidecars. A
POSIX record lock (or msvcrt's on Windows) is released by the OS when the process dies, so a
crashed app never leaves the folder locked.

The lock file holds the pid of the process that has it, read by the next one to say who is
running. Windows's locks are mandatory (another process cannot even read a locked byte), so there
the lock is on one byte far past the pid (Windows lets a lock lie beyond the end of a file).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from slotkeeper.core.basics.folder_identity import folder_key

_held: dict[str, int] = {}  # lock file -> fd, kept open for the life of the process

# Windows: where the locked byte is, well past the pid at the start of the file.
WINDOWS_LOCK_OFFSET = 1 << 30
PID_MAX_BYTES = 32


class DataDirBusy(Exception):
    pass


def _try_lock(fd: int) -> bool:
    try:
        if sys.platform == "win32":
            import msvcrt

            # msvcrt locks from the file position; the file is empty or holds a pid, and nothing
            # is ever written there.
            os.lseek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            finally:
                os.lseek(fd, 0, os.SEEK_SET)
        else:
            import fcntl

            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def acquire(lock_file: Path, what: str) -> None:
    """Lock ``lock_file`` for this process (a no-op if it already holds it), and the data folder
    ``what`` by its path as well (``path_lock_file``): deleting the folder while an engine runs
    deletes its lock file, and a second engine must still find the folder in use."""
    key = str(lock_file.resolve())
    if key in _held:
        return
    by_path = path_lock_file(what)
    _lock(by_path, what) if by_path is not None else None
    try:
        _lock(lock_file, what)
    except BaseException:
        if by_path is not None:
            os.close(_held.pop(str(by_path)))
        raise
    _held[key] = _held.pop(str(lock_file))


def path_lock_file(data_dir: str) -> Path | None:
    """A lock file for the data folder's path, outside it: in the user's runtime folder
    (``$XDG_RUNTIME_DIR`` on Linux, private to the user). None when there is none to use."""
    try:
        import hashlib

        import platformdirs

        folder = Path(platformdirs.user_runtime_dir("slotkeeper"))
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if sys.platform != "win32" and (folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077):
            return None  # not private to us: not a lock another user could hold for us
        digest = hashlib.sha256(folder_key(data_dir).encode("utf-8", "surrogateescape"))
        return folder / f"data-{digest.hexdigest()[:24]}.lock"
    except OSError:
        return None


def _lock(lock_file: Path, what: str) -> None:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    if not _try_lock(fd):
        try:
            other = os.read(fd, PID_MAX_BYTES).decode(errors="replace").strip() or "?"
        except OSError:  # e.g. a lock file an older version locked at byte 0, on Windows
            other = "?"
        finally:
            os.close(fd)
        raise DataDirBusy(
            f"another Slotkeeper (pid {other}) is already running with {what}; "
            "quit it first, or use another folder with --data-dir"
        )
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[str(lock_file)] = fd
