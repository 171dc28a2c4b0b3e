"""A session file verified once is trusted while nothing could have changed it.

llama-server restores whatever file it is given (no checksum; a file one byte short aborts it),
so a KV file must match the content hash in its sidecar before its name is sent. Hashing a
1 GiB file from a cold page cache takes about as long as the restore itself, and nothing has
touched the file since it was saved in the common case. So the file's stamp (``fsutil.stat_stamp``:
size, mtime_ns, inode and ctime_ns, each for a reason given there) is recorded when its content is
known to match its hash (when the save hashed it, and after each full check), and a restore
re-hashes the file only when the stamp has changed.

A stamp that differs means "hash it again", not "damaged": a file that was only touched passes
the full check and gets a new stamp. The stamp is taken from the open file before and after the
hash reads it, and kept only when both agree (nothing wrote while it was read).

Limits: media errors under an unchanged stamp are the file system's to report, as for any
file read; on file systems with coarse timestamps a write within the same clock tick as the
stamp would go unseen (nothing writes a session file after llama-server has); on Windows
st_ctime is the creation time, so there the inode, size and mtime carry the check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from slotkeeper.core.basics.fsutil import STAMP_FIELDS, open_regular, stat_stamp

__all__ = ["CONTENT_HASH_PREFIX", "FileStamp", "hash_with_stamp", "same_file_version"]

CONTENT_HASH_PREFIX = "xxh3_128:"
_HASH_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class FileStamp:
    """A file's identity and version when its content matched ``content_hash``."""

    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int
    content_hash: str

    @classmethod
    def of(cls, st: os.stat_result, content_hash: str) -> FileStamp:
        return cls(**stat_stamp(st), content_hash=content_hash)

    def stamp(self) -> dict[str, int]:
        """The file's stamp as ``fsutil.stat_stamp`` gives it."""
        return {k: getattr(self, k) for k in STAMP_FIELDS}

    def matches(self, st: os.stat_result, content_hash: str) -> bool:
        """True when the file ``st`` describes is the one verified, unchanged since, and the hash
        it was verified against is still the one expected."""
        return content_hash == self.content_hash and stat_stamp(st) == self.stamp()

    def to_json(self) -> dict[str, Any]:
        return {**self.stamp(), "content_hash": self.content_hash}

    @classmethod
    def from_json(cls, d: object) -> FileStamp | None:
        """None for anything that is not a well-formed stamp: it only means "hash it again"."""
        if not isinstance(d, Mapping):
            return None
        values = [v for v in (d.get(k) for k in STAMP_FIELDS) if type(v) is int and v >= 0]
        if len(values) != len(STAMP_FIELDS):
            return None
        content_hash = d.get("content_hash")
        if not isinstance(content_hash, str) or not content_hash.startswith(CONTENT_HASH_PREFIX):
            return None
        size, mtime_ns, ino, ctime_ns = values
        return cls(size, mtime_ns, ino, ctime_ns, content_hash)


def same_file_version(a: os.stat_result, b: os.stat_result) -> bool:
    return stat_stamp(a) == stat_stamp(b)


def hash_with_stamp(path: str | os.PathLike[str]) -> tuple[str, os.stat_result | None]:
    """The file's "xxh3_128:<hex>" content hash, and its stat when nothing changed it while it was
    read (else None). Never follows a link nor waits on a FIFO (``fsutil.open_regular``)."""
    hasher = xxhash.xxh3_128()
    with open_regular(Path(path)) as f:
        before = os.fstat(f.fileno())
        while chunk := f.read(_HASH_CHUNK_BYTES):
            hasher.update(chunk)
        after = os.fstat(f.fileno())
    return CONTENT_HASH_PREFIX + hasher.hexdigest(), (after if same_file_version(before, after) else None)


def carried_over(hashed: os.stat_result | None, now: os.stat_result, content_hash: str) -> FileStamp | None:
    """The stamp of a file hashed as ``hashed`` and since only renamed or chmod-ed by us (both change
    its ctime): the same inode, size and mtime (a write would have moved the mtime)."""
    if hashed is None:
        return None
    # Not the whole stamp, on purpose: the rename into place and the chmod to 0600 moved the ctime.
    if (now.st_ino, now.st_size, now.st_mtime_ns) != (hashed.st_ino, hashed.st_size, hashed.st_mtime_ns):
        return None
    return FileStamp.of(now, content_hash)
