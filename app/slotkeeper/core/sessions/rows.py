"""The folder as one look sees it, and the `sessions list --json` rows kept for that look.

A listing's JSON rows are a function of the sessions folder's entries and their lstat: sidecars
are read again only when their stat changes (the trust the sessions index puts in it, see
``index``), and sizes come from the stat. So the rows printed are kept with a digest of every
entry's name and stat (``rows_key``), and the next listing whose look gives the same digest prints
them again: `sessions list --json` does this before importing the store at all
(``cli.sessions``). Light on purpose: standard library, xxhash, fsutil and naming only.
"""

from __future__ import annotations

import os
import time
from array import array
from itertools import chain, filterfalse
from pathlib import Path

import xxhash

from slotkeeper.core.basics.fsutil import atomic_write_bytes
from slotkeeper.core.sessions.naming import is_scratch

# An entry's lstat as the folder's look keeps it: fsutil.stat_stamp's fields with the file's type in
# front, on purpose a tuple of ints (a look at 10,000 entries makes one per entry, rows_key packs
# them into an array for the digest, the index keeps them a line per session) and of the entry
# itself (a link is a link here, never followed).
Stamp = tuple[int, int, int, int, int]  # st_mode, st_size, st_mtime_ns, st_ino, st_ctime_ns
RACY_NS = 2_000_000_000  # a file changed this recently may change again without its stat changing
# What the rows are made of: bump it when a row changes for the same files (a new sidecar schema,
# a new index layout, a new row shape). tests/unit/test_index.py checks it names the current ones.
ROWS_FORMAT = "rows-1/index-5/sidecar-3"
_I64 = 1 << 63


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def scan(folder: Path) -> dict[str, Stamp]:
    """Every entry of the folder with its lstat (never followed): one look, no file read."""
    files: dict[str, Stamp] = {}
    try:
        it = os.scandir(folder)
    except FileNotFoundError:
        return files
    with it:
        for e in it:
            try:
                files[e.name] = stamp_of(e.stat(follow_symlinks=False))
            except OSError:  # gone since the directory was read
                continue
    return files


def rows_key(files: dict[str, Stamp], folder: Path, now_ns: int | None = None) -> str | None:
    """The digest that names this look at the folder, or None when an entry changed too recently
    to trust its stat (within RACY_NS: it may change again without its stat changing). Hidden and
    ``incoming-`` files are left out, as a listing leaves them out."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    names = sorted(filterfalse(is_scratch, files))
    try:
        stamps = array("q", chain.from_iterable(map(files.__getitem__, names)))
    # an inode number beyond 63 bits: its hash stands in (ints hash the same everywhere)
    except OverflowError:
        stamps = array("q", [v if -_I64 <= v < _I64 else hash(v) for name in names for v in files[name]])
    if names and now_ns - max(stamps[2::5]) < RACY_NS:
        return None
    h = xxhash.xxh3_128(f"{ROWS_FORMAT}/{folder}".encode("utf-8", "surrogateescape"))
    h.update("\0".join(names).encode("utf-8", "surrogateescape"))
    h.update(stamps)
    return h.hexdigest()


def kept(folder: Path, index_file: Path,
         files: dict[str, Stamp] | None = None) -> tuple[str | None, bytes | None]:
    """This look at the folder (``files``, or a new ``scan``): its key, and the rows kept for it, a
    line each (None: none kept for this look, or the look is too recent to keep rows at all)."""
    key = rows_key(scan(folder) if files is None else files, folder)
    return key, None if key is None else _kept_body(rows_file(index_file), key)


def split_rows(body: bytes) -> list[bytes]:
    """The rows of a kept body."""
    return body[:-1].split(b"\n") if body else []


def _kept_body(path: Path, key: str) -> bytes | None:
    """The kept rows, a line each, or None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head, _, body = data.partition(b"\n")
    if head != key.encode() or (body and not body.endswith(b"\n")):
        return None
    return body


def write_rows(path: Path, key: str, rows: list[bytes]) -> None:
    """Keep ``rows`` for ``key`` (each one line: orjson never writes a raw newline)."""
    atomic_write_bytes(path, key.encode() + b"\n" + b"".join(r + b"\n" for r in rows))


def rows_file(index_file: Path) -> Path:
    """Where the rows are kept: beside the index file."""
    return index_file.with_suffix(".rows")


def kept_listing(folder: Path, index_file: Path) -> bytes | None:
    """The last listing's JSON array (a session per line, as ``cli.output.list_json`` makes it)
    when the folder looks as it did then, else None."""
    _, body = kept(folder, index_file)
    if body is None:
        return None
    return b"[\n" + body[:-1].replace(b"\n", b",\n") + b"\n]" if body else b"[]"
