"""Durable file writes shared by settings, sidecars and state files, safe reads of files in a
folder other people's programs also write to (the sessions folder: llama-server writes there), and
the stamp that tells one version of a file from another.

The platform rules for writing files live here, one place each: ``sync_fd`` (macOS's fsync does
not reach the disk), ``replace_file`` / ``remove_file`` (on Windows a file another program holds
open cannot be replaced or deleted for a moment).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# Open for reading without following a symbolic link (the last component) and without blocking
# on a FIFO, where the OS has the flags (Windows has neither: lstat is checked first there).
_SAFE_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class UnsafeFolder(OSError):
    """A folder Slotkeeper must not use as it is: another user's, writable by others, a link."""

    def __str__(self) -> str:
        return str(self.strerror)


def _owner(uid: int) -> str:
    if sys.platform == "win32":  # no pwd module (and no uids to name: only POSIX calls this)
        return f"uid {uid}"
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


# Windows: what lstat calls a directory can be a reparse point. Those whose tag Microsoft marks a
# "name surrogate" stand for another path: an NTFS junction (which any user who can write the parent
# can make, no privilege needed), a directory symbolic link, a mount point; os.path.islink says False
# for a junction (Path.is_junction is 3.12+). They count as links here. Other reparse points (OneDrive
# and other cloud files' placeholders, deduplicated files) are the folder itself, kept elsewhere by a
# driver: refusing them would refuse every folder under OneDrive.
_IO_REPARSE_TAG_MOUNT_POINT = 0xA0000003  # a junction (stat.IO_REPARSE_TAG_* exists only on Windows)
_IO_REPARSE_TAG_SYMLINK = 0xA000000C
_REPARSE_TAG_NAME_SURROGATE = 0x20000000  # IsReparseTagNameSurrogate


def link_kind(st: os.stat_result) -> str | None:
    """What kind of link an ``os.lstat`` result is ("symbolic link", "junction" ...), or None for
    none: a symbolic link anywhere; on Windows also a junction or another reparse point that stands
    for another path."""
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link"
    # getattr: a stat made elsewhere (a test that fakes Windows) has no attributes: no reparse point
    if sys.platform == "win32" and getattr(st, "st_file_attributes", 0) & stat.FILE_ATTRIBUTE_REPARSE_POINT:
        tag = getattr(st, "st_reparse_tag", 0)  # 0: a reparse point of unknown kind counts as a link
        if tag == _IO_REPARSE_TAG_MOUNT_POINT:
            return "junction"
        if tag == _IO_REPARSE_TAG_SYMLINK:
            return "symbolic link"
        if not tag or tag & _REPARSE_TAG_NAME_SURROGATE:
            return f"reparse point (tag {tag:#010x}, a link)"
    return None


def _link_target(path: Path) -> str:
    try:
        return f" (to {os.readlink(path)})"
    except (OSError, ValueError):  # not a kind readlink reads
        return ""


def check_private_folder(path: Path, what: str, *, follow_symlink: bool) -> os.stat_result:
    """Refuse a folder other users could have put files in, with what to do about it.

    A link (``link_kind``: on Windows a junction too) is refused unless ``follow_symlink`` (then its
    target is checked). On POSIX the folder must belong to this user and not be writable by group
    or others; a disk whose format has no permissions (exFAT, FAT) is named as the reason, since
    chmod cannot help there. Windows has no such modes, so there only the link and the folder
    itself are checked.
    """
    path = Path(path)
    st = os.lstat(path)
    kind = link_kind(st)
    if kind is not None:
        if not follow_symlink:
            raise UnsafeFolder(errno.ELOOP, (
                f"the {what} {path} is a {kind}{_link_target(path)}; Slotkeeper only uses a real "
                f"folder there: remove the link, or choose another folder with --data-dir"))
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(errno.ENOTDIR, f"the {what} {path} is a {file_kind(st.st_mode)}, not a folder")
    if not hasattr(os, "geteuid"):
        # Windows: no owner check, deliberately. Who may add files is the folder's ACL, not its owner:
        # the default data folder (%LOCALAPPDATA%) inherits the profile's ACL (you, SYSTEM and
        # Administrators), while a folder made under C:\ can be writable by every signed-in user
        # whoever owns it. And an owner check would refuse good folders: what an elevated process
        # makes is owned by the Administrators group, not by you. Checking the ACL takes the Win32
        # security API and a machine to test it on; --data-dir is trusted to be a folder of your own.
        return st
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafeFolder(errno.EPERM, (
            f"the {what} {path} belongs to {_owner(st.st_uid)}, not to you ({_owner(me)}): another user "
            f"could have put files there. Use a folder of your own (--data-dir or $SLOTKEEPER_HOME)"))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "other users"))
                           if st.st_mode & bit)
        open_mode = f"{stat.S_IMODE(st.st_mode):04o}"
        if not _modes_can_be_set(path, st, follow_symlink):
            raise UnsafeFolder(errno.EPERM, (
                f"the {what} {path} can be written by {who} (mode {open_mode}), and the disk it is on "
                f"cannot keep it from them: its format has no permissions (exFAT or FAT, as USB disks "
                f"and SD cards often are, or a disk mounted without them), so chmod leaves it at "
                f"{open_mode}. Choose a data folder on a disk formatted APFS (macOS) or ext4 (Linux) "
                f"with --data-dir"))
        raise UnsafeFolder(errno.EPERM, (
            f"the {what} {path} can be written by {who} (mode {open_mode}), who could "
            f"have put files there. Fix: chmod 700 '{path}', or choose another folder with --data-dir"))
    return st


def _modes_can_be_set(path: Path, st: os.stat_result, follow_symlink: bool) -> bool:
    """Whether chmod can take write access away from group and others on ``path`` (this user's
    folder, ``st`` its stat): False on a disk without permissions, where chmod succeeds and changes
    nothing (macOS, Linux's vfat with ``quiet``) or fails with EPERM (Linux's vfat, exfat). Only a
    question: the folder is left as it was found. Were it kept 0700, the refusal would be gone on
    the next run, yet files may have been put there while it was open: removing them is the user's
    call."""
    old = stat.S_IMODE(st.st_mode)
    no_follow = {} if follow_symlink else _no_follow()  # the link was refused when not followed
    try:
        os.chmod(path, PRIVATE_DIR_MODE, **no_follow)
    except OSError as exc:
        return exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP)  # else: e.g. read-only
    try:
        now = stat.S_IMODE((os.stat(path) if follow_symlink else os.lstat(path)).st_mode)
    except OSError:
        return True
    if now & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    try:
        os.chmod(path, old, **no_follow)
    except OSError:
        pass  # then it stays 0700: safer, and still refused this time
    return True


def ensure_private_folder(path: Path, what: str) -> None:
    """Create ``path`` 0700 if it is missing, then check it (never a link, see
    ``check_private_folder``); read and search bits for group and others are taken away."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    st = check_private_folder(path, what, follow_symlink=False)
    if hasattr(os, "geteuid") and stat.S_IMODE(st.st_mode) & 0o077:
        # Ours, a real folder, writable by nobody else: only read access is taken away. Not through
        # a link (checked just now; only we can write its parent, the private data folder).
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700, **_no_follow())
        except OSError:
            pass  # e.g. a read-only file system: reading stays possible


def _no_follow() -> dict[str, bool]:
    return {"follow_symlinks": False} if os.chmod in os.supports_follow_symlinks else {}


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


def not_regular_error(path: Path, mode: int) -> NotARegularFile:
    """The error for ``path`` found to be ``mode`` (a stat already taken) where a regular file was
    expected."""
    return _not_regular(Path(path), mode)


def _not_regular(path: Path, mode: int) -> NotARegularFile:
    what = file_kind(mode)
    note = " (not followed)" if what == "symbolic link" else ""
    return NotARegularFile(errno.EINVAL, f"{path.name} is a {what}{note}, not a regular file")


# -- durable writes ----------------------------------------------------------------------------
# Windows: a file another program holds open without FILE_SHARE_DELETE (a virus scanner, the search
# indexer, `slotkeeper sessions verify` hashing it: Python opens files that way) cannot be replaced
# or deleted while it does (PermissionError, a sharing violation). Those programs let go within a
# moment, so the replace or delete is tried again a few times before it counts as failed.
BUSY_RETRIES = 6  # tries after the first
BUSY_FIRST_WAIT_SECONDS = 0.02  # doubled after each try: about 1.3 s in all


class FileInUse(PermissionError):
    """Windows: a file could not be replaced or deleted because another program kept it open."""

    def __str__(self) -> str:
        return str(self.strerror)


def replace_file(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """``os.replace(src, dst)``; on Windows tried again while another program holds ``dst`` (or
    ``src``) open, then FileInUse."""
    _while_in_use(lambda: os.replace(src, dst), f"replace {os.fspath(dst)}", sleep)


def remove_file(path: str | os.PathLike[str], sleep: Callable[[float], None] = time.sleep) -> None:
    """``os.unlink(path)``; on Windows tried again while another program holds it open, then
    FileInUse. FileNotFoundError as os.unlink raises it."""
    _while_in_use(lambda: os.unlink(path), f"remove {os.fspath(path)}", sleep)


def _while_in_use(op: Callable[[], None], what: str, sleep: Callable[[float], None]) -> None:
    if sys.platform != "win32":
        op()
        return
    wait = BUSY_FIRST_WAIT_SECONDS
    waited = 0.0
    for tries_left in range(BUSY_RETRIES, -1, -1):
        try:
            op()
            return
        except PermissionError as exc:
            if tries_left == 0:
                raise FileInUse(exc.errno, (
                    f"could not {what}: another program keeps it open ({exc.strerror or exc}); tried "
                    f"{BUSY_RETRIES + 1} times over {waited:.1f} s"), exc.filename) from exc
        sleep(wait)
        waited += wait
        wait *= 2


def sync_fd(fd: int) -> None:
    """Make what was written to ``fd`` durable. macOS's fsync only hands the data to the drive,
    whose cache can still lose it on power loss; F_FULLFSYNC asks the drive to write it out (as
    SQLite's fullfsync does). A file system without it (some network ones) gets fsync."""
    if sys.platform == "darwin":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
        except OSError:
            pass
    os.fsync(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); Windows cannot open directories, so it is a no-op there."""
    if sys.platform == "win32":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        sync_fd(fd)
    finally:
        os.close(fd)


def fsync_private(path: Path, mode: int = PRIVATE_FILE_MODE) -> None:
    """fsync a regular file and make it ``mode`` (0600: llama-server writes with the umask),
    never through a symbolic link."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(Path(path), st.st_mode)
        if sys.platform != "win32" and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        sync_fd(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str, mode: int = PRIVATE_FILE_MODE) -> None:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_bytes(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """``path`` ends up as the old file or the whole new one: temp file, fsync, rename, fsync dir.
    Private (0600) unless told otherwise; a missing folder is created 0700. A rename that fails
    (FileInUse on Windows after its tries) leaves the old file and no temp file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if sys.platform != "win32":
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            sync_fd(fh.fileno())
        replace_file(tmp, path)
    except BaseException:
        try:
            remove_file(tmp)  # (a virus scanner may be reading it too)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


# -- the file stamp --------------------------------------------------------------------------
# What a cache keyed on a file (model hashes, GGUF facts, --help flags, a verified KV file, the head
# start's note, the API key file) records to know the file is still the one it read:
# - size: a truncation or an append;
# - mtime_ns: any write;
# - ino: another file moved or copied into its place;
# - ctime_ns: the kernel sets it on every write, truncate, chmod and rename, and no program can set
#   it back, so a write that puts the old mtime back (`cp -p`, `touch -d`) still shows.
# On Windows st_ctime is the creation time, so there the inode, size and mtime carry the check.
STAMP_FIELDS = ("size", "mtime_ns", "ino", "ctime_ns")


def stat_stamp(st: os.stat_result) -> dict[str, int]:
    """The stamp of the file ``st`` describes: {size, mtime_ns, ino, ctime_ns} (JSON as it is)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def file_stamp(path: str | os.PathLike[str]) -> tuple[str, dict[str, int]]:
    """(resolved path, ``stat_stamp`` of the file it names): two spellings of one file (a link,
    ``..``) give one path. Raises OSError."""
    resolved = os.path.realpath(path)
    return resolved, stat_stamp(os.stat(resolved))


@contextmanager
def creating(path: Path, flags: int = os.O_WRONLY) -> Iterator[int]:
    """A new private file at ``path`` (0600; never an existing one, FileExistsError), open for the
    block as a descriptor (``flags``: O_WRONLY or O_RDWR); if the block fails, the file is removed
    again, so nothing half-written is ever left that looks like a result."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), PRIVATE_FILE_MODE)
    try:
        yield fd
    except BaseException:
        os.close(fd)
        Path(path).unlink(missing_ok=True)
        raise
    os.close(fd)
