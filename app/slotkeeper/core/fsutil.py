"""Durable file writes shared by settings, sidecars and state files, and safe reads of files in a
folder other people's programs also write to (the sessions folder: llama-server writes there)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

# Open for reading without following a symbolic link (the last component) and without blocking
# on a FIFO, where the OS has the flags (Windows has neither: lstat is checked first there).
_SAFE_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class UnsafeFile(OSError):
    """A file Slotkeeper will not read as it is (its message needs no errno in front)."""

    def __str__(self) -> str:
        return str(self.strerror)


class NotARegularFile(UnsafeFile):
    """A symbolic link, FIFO, directory, device or socket where a regular file was expected."""


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words: "file", "symbolic link", "directory", "FIFO" ..."""
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def regular_size(path: Path) -> int:
    """The size of a regular file, by lstat (never following a link); NotARegularFile otherwise,
    FileNotFoundError when it is missing."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(Path(path), st.st_mode)
    return st.st_size


def open_regular(path: Path, max_bytes: int | None = None) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file (of at most ``max_bytes``).

    Never follows a symbolic link and never blocks (a FIFO is refused, not waited on): opened with
    O_NOFOLLOW | O_NONBLOCK, then fstat says what was really opened. Raises NotARegularFile, or
    UnsafeFile (EFBIG) for a file over ``max_bytes``.
    """
    path = Path(path)
    if not hasattr(os, "O_NOFOLLOW"):
        regular_size(path)  # no O_NOFOLLOW (Windows): look first
    try:
        fd = os.open(path, _SAFE_READ_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):  # EMLINK: BSDs
            raise _not_regular(path, stat.S_IFLNK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(errno.EFBIG, f"{path.name} is {st.st_size} bytes; at most {max_bytes} expected")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _not_regular(path: Path, mode: int) -> NotARegularFile:
    what = file_kind(mode)
    note = " (not followed)" if what == "symbolic link" else ""
    return NotARegularFile(errno.EINVAL, f"{path.name} is a {what}{note}, not a regular file")


def fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); Windows cannot open directories, so it is a no-op there."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """``path`` ends up as the old file or the whole new one: temp file, fsync, rename, fsync dir."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
