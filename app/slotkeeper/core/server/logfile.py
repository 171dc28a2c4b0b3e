"""The server's output: a log file the child writes to directly, rotated, and tailed by a thread.

The child appends to the file itself (never to a pipe), so a server that outlives a crashed app
keeps running instead of dying on a broken pipe, and the log survives either way.

Rotation on POSIX is copy-then-truncate, also while the child runs (the tailer rotates a log grown
past LOG_MAX_BYTES): safe because the child's file is opened with O_APPEND, so its next write
lands at the new end, offset 0. Windows gives a child no append-mode writes: O_APPEND is the
parent's C runtime seeking to the end before each of its own writes, and the child writes through
the inherited HANDLE at that handle's own offset. Truncating the file under it would make its next
write land at the old offset, the bytes before it zeros. So on Windows the live file is never
truncated: it is rotated by renaming it, only before a child opens it (``rotate``, which
``spawn.spawn_server`` calls first), and a running server's log grows until the next start
(``rotate_live`` does nothing there).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3
TAIL_LINES = 400
POLL_SECONDS = 0.05  # after new output: lines show up at once while the server talks
IDLE_POLL_SECONDS = 0.5  # the interval doubles up to this while the file does not grow

log = logging.getLogger(__name__)


def rotate(path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS,
           force: bool = False) -> None:
    """llama-server.log -> .1 -> .2 ..., before a child opens it. On POSIX the file is truncated,
    not replaced (a server left running by a crashed app may still append to it); on Windows it is
    renamed (see the module's docstring), and left as it is while another program holds it open."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if not force and size < max_bytes:
        return
    if sys.platform == "win32":
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


def rotate_live(path: Path) -> bool:
    """Rotate the log of a running child (``rotate``, forced) where that is safe: True when
    rotated. Never on Windows (see the module's docstring)."""
    if sys.platform == "win32":
        return False
    rotate(path, force=True)
    return True


def open_for_child(path: Path):
    """A binary append-mode handle to pass as the child's stdout/stderr (0600: a log can quote
    conversations)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    if sys.platform != "win32":
        os.fchmod(fd, 0o600)  # a log an earlier version wrote with the umask's mode
    # "ab" puts the handle at the end: a Windows child writes at its handle's offset (see the
    # module's docstring), so a log left unrotated is written after, not over.
    return os.fdopen(fd, "ab", buffering=0)


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
        only lines the server writes between the copy and the truncate are lost to them. Never on
        Windows (``rotate_live``)."""
        with self._lock:
            try:
                if self.path.stat().st_size <= LOG_MAX_BYTES:
                    return
            except OSError:
                return
        self.poll()
        with self._lock:
            try:
                if not rotate_live(self.path):
                    return
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
