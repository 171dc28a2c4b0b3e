"""The server's output: a log file the child writes to directly, rotated, and tailed by a thread.

The child appends to the file itself (never to a pipe), so a server that outlives a crashed app
keeps running instead of dying on a broken pipe, and the log survives either way.

Rotation is copy-then-truncate, also while the child runs (the tailer rotates a log grown past
LOG_MAX_BYTES): safe because the child's writes always land at the file's end, so its next write
after a truncate lands at offset 0. On POSIX that is O_APPEND. On Windows O_APPEND is only the C
runtime seeking to the end before its own writes; a child writes through the inherited HANDLE at
that handle's offset, and after a truncate its next write would land at the old offset, the bytes
before it zeros. So there the child's handle is opened with FILE_APPEND_DATA and not
FILE_WRITE_DATA (``_append_only_fd``), which the system documents as writes to the end only, any
offset ignored: the kernel's own append, as Git for Windows opens its append-mode files. Before a
child opens it the log is rotated by renaming on Windows (``rotate``): a server left running by a
crashed app may hold it with a handle of its own.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3
TAIL_LINES = 400
POLL_SECONDS = 0.05  # after new output: lines show up at once while the server talks
IDLE_POLL_SECONDS = 0.5  # the interval doubles up to this while the file does not grow

log = logging.getLogger(__name__)


def rotate(path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS,
           force: bool = False, live: bool = False) -> None:
    """llama-server.log -> .1 -> .2 ..., before a child opens it or (``live``) under our running
    child. On POSIX, and live everywhere, the file is copied and truncated, not replaced (a server
    appends to it); before a start on Windows it is renamed (see the module's docstring), and left as
    it is while another program holds it open."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if not force and size < max_bytes:
        return
    if sys.platform == "win32" and not live:
        try:
            _shift_backups(path, backups)
            os.replace(path, path.with_name(f"{path.name}.1"))
        except PermissionError as exc:  # e.g. a server still writing it: it keeps its file, unrotated
            log.info("not rotating %s: %s", path, exc)
        return
    _shift_backups(path, backups)
    backup = path.with_name(f"{path.name}.1")
    shutil.copyfile(path, backup)
    os.chmod(backup, 0o600)
    with open(path, "r+b") as fh:
        fh.truncate(0)


def _shift_backups(path: Path, backups: int) -> None:
    """.2 -> .3, .1 -> .2 ... (the oldest replaced), so .1 is free for the live file's copy."""
    for i in range(backups - 1, 0, -1):
        src = path.with_name(f"{path.name}.{i}")
        if src.exists():
            os.replace(src, path.with_name(f"{path.name}.{i + 1}"))


def open_for_child(path: Path):
    """A binary append-only handle to pass as the child's stdout/stderr (0600: a log can quote
    conversations; on Windows the kernel's append, see the module's docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if sys.platform == "win32":
        fd = _append_only_fd(path)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # a log an earlier version wrote with the umask's mode
    # "ab" puts the handle at the end as well.
    return os.fdopen(fd, "ab", buffering=0)


# CreateFileW's values (winnt.h, fileapi.h)
FILE_APPEND_DATA = 0x0004
FILE_WRITE_DATA = 0x0002
SYNCHRONIZE = 0x0010_0000
FILE_SHARE_ALL = 0x1 | 0x2 | 0x4  # read, write, delete: the tailer reads, rotation renames
OPEN_ALWAYS = 4
FILE_ATTRIBUTE_NORMAL = 0x80
# INVALID_HANDLE_VALUE is (HANDLE)-1: a HANDLE restype (c_void_p) gives it back unsigned.
INVALID_HANDLE_VALUES = frozenset({-1, 2**32 - 1, 2**64 - 1})


def _append_only_fd(path: Path) -> int:
    """Windows: a C runtime fd over a handle with FILE_APPEND_DATA and not FILE_WRITE_DATA, made
    if missing. Popen duplicates the handle into the child with its access, so every write of the
    child goes to the end."""
    kernel32, msvcrt = _windows_kernel32(), importlib.import_module("msvcrt")
    handle = kernel32.CreateFileW(str(path), FILE_APPEND_DATA | SYNCHRONIZE, FILE_SHARE_ALL, None,
                                  OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, None)
    if handle is None or handle in INVALID_HANDLE_VALUES:  # (NULL never comes back; None is safe)
        code = kernel32.last_error()
        raise OSError(code, f"cannot open the server log for appending (Windows error {code})", str(path))
    return int(msvcrt.open_osfhandle(handle, os.O_WRONLY | os.O_APPEND))


def _windows_kernel32() -> Any:
    """CreateFileW typed for 64-bit handles, and the error of the last call (``last_error``)."""
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
    create = kernel32.CreateFileW
    create.restype = wintypes.HANDLE
    create.argtypes = (wintypes.LPCWSTR, wintypes.DWORD, wintypes.DWORD, wintypes.LPVOID,
                       wintypes.DWORD, wintypes.DWORD, wintypes.HANDLE)

    class Kernel32:
        CreateFileW = create

        @staticmethod
        def last_error() -> int:
            return int(ctypes.get_last_error())  # type: ignore[attr-defined,unused-ignore]

    return Kernel32()


class LogTailer:
    """Follows the log file from a position and hands each complete line to the listeners."""

    def __init__(self, path: Path, start_at_end: bool = True) -> None:
        self.path = path
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pos = path.stat().st_size if (start_at_end and path.exists()) else 0
        self._thread: threading.Thread | None = None
        self._partial = b""

    def add_listener(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llama-log-tail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.poll()  # pick up whatever the process wrote last

    def lines(self, n: int = 30) -> list[str]:
        with self._lock:
            return list(self.tail)[-n:]

    def _run(self) -> None:
        delay = POLL_SECONDS
        while not self._stop.wait(delay):
            grew = self.poll()
            self._rotate_if_big()
            # Quick while the server writes, a few looks a second while it is quiet.
            delay = POLL_SECONDS if grew else min(delay * 2, IDLE_POLL_SECONDS)

    def _rotate_if_big(self) -> None:
        """Rotate under the lock right after reading everything, so listeners miss (almost) nothing:
        only lines the server writes between the copy and the truncate are lost to them."""
        with self._lock:
            try:
                if self.path.stat().st_size <= LOG_MAX_BYTES:
                    return
            except OSError:
                return
        self.poll()
        with self._lock:
            try:
                rotate(self.path, force=True, live=True)
            except OSError:
                return
            self._pos = 0
            self._partial = b""

    def poll(self) -> bool:
        """Hand the lines written since the last look to the listeners; True if the file grew."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return False
            if size < self._pos:  # truncated by rotation
                self._pos = 0
            if size == self._pos:
                return False
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read(size - self._pos)
            self._pos += len(chunk)
            data = self._partial + chunk
            *complete, self._partial = data.split(b"\n")
            lines = [c.decode("utf-8", "replace").rstrip("\r") for c in complete]
            self.tail.extend(lines)
            listeners = list(self._listeners)
        for line in lines:
            for fn in listeners:
                try:
                    fn(line)
                except Exception:  # a broken listener must not stop the tail
                    log.exception("log listener failed")
        return True
