"""The KV state inside a llama-server slot save file, read as llama.cpp lays it out.

``kvfile`` reads the header and the token list; after them comes what llama.cpp's
``llama_state_seq_save_file`` wrote of the slot's memory (src/llama-kv-cache.cpp ``state_write``,
llama.cpp b11434). Each attention cache (one, or two for a sliding-window model: the full layers'
then the sliding layers') is::

    u32 n_stream
    per stream: u32 cell_count; if cell_count:
        per cell: i32 pos, u32 n_seq_id, [i32 x, i32 y, i32 tok: M-RoPE / PLE models], i32 seq_id[n_seq_id]
        u32 v_trans, u32 n_layer, u32 n_rot_k, u32 n_rot_v
        per layer: i32 k_type, u64 k_row_bytes, cell_count rows
        per layer with V, v_trans 0: i32 v_type, u64 v_row_bytes, cell_count rows (a row per cell)
                          v_trans 1: i32 v_type, u32 v_el_bytes, u32 n_embd_v, n_embd_v runs of
                                     cell_count elements (the V cache stored transposed)

and after the attention caches, a recurrent model's state (kept as it is: ``tail``). ``v_trans``
is 1 when the server runs without flash attention: that is why flash attention is "baked into" a
save file. The V values are the same either way; ``convert_v_layout`` rewrites a file from one
layout into the other, exactly (a transposition), so a conversation saved under one choice restores
into a server running the other.

The layout is not written anywhere in the file: it is found by reading it strictly (every cell of
a one-sequence save names that one sequence, every size adds up to the file's length), so a file
this code does not understand is never half-read as something else: ``StateLayoutError``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slotkeeper.core.basics.fsutil import open_regular, sync_fd
from slotkeeper.core.sessions.kvfile import read_tokens

__all__ = ["KvCache", "KvStream", "LayerRows", "StateLayout", "StateLayoutError", "convert_v_layout",
           "mapped", "read_layout", "v_layout_convertible"]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_DATA_HEAD = struct.Struct("<IIII")  # v_trans, n_layer, n_rot_k, n_rot_v
_ROWS_HEAD = struct.Struct("<iQ")  # type, row bytes
_TRANS_HEAD = struct.Struct("<iII")  # type, element bytes, n_embd_v
_EXT_BYTES = 12  # llama_kv_cell_ext: x, y, tok

MAX_STREAMS = 1024
MAX_LAYERS = 4096
GGML_TYPE_COUNT = 64  # ggml_type ids are below this
# Types whose elements are stored whole (no blocks), so a transposed V is possible: f32, f16, bf16.
ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}


class StateLayoutError(ValueError):
    """The KV state is not laid out as this code reads it."""


@dataclass(frozen=True)
class LayerRows:
    """One layer's K or V data of a stream. ``offset`` is where its data begins (after the entry's
    own header of ``head_bytes``); rows of ``row_bytes`` per cell, or, transposed, ``n_embd`` runs of
    the cells' elements of ``row_bytes`` each."""

    type: int
    offset: int
    row_bytes: int
    n_embd: int = 0  # transposed V only
    head_bytes: int = _ROWS_HEAD.size

    def nbytes(self, cells: int) -> int:
        return cells * self.row_bytes * (self.n_embd or 1)


@dataclass(frozen=True)
class KvStream:
    """The cells one stream of an attention cache holds, and where each part of them lies."""

    cell_count: int
    meta_offset: int
    meta_bytes: int
    positions: tuple[int, ...]
    data_offset: int  # the data part's head (v_trans, n_layer, n_rot_k, n_rot_v)
    v_trans: bool
    n_layer: int
    k: tuple[LayerRows, ...]
    v: tuple[LayerRows, ...]
    end: int


@dataclass(frozen=True)
class KvCache:
    """One attention cache as saved: its streams with cells (a one-sequence save has one)."""

    offset: int
    n_stream: int
    streams: tuple[KvStream, ...]
    end: int


@dataclass(frozen=True)
class StateLayout:
    header_bytes: int  # where the KV state begins (after the token list)
    caches: tuple[KvCache, ...]
    tail_offset: int  # a recurrent state, kept as it is, from here to ``size``
    size: int

    @property
    def v_trans(self) -> bool | None:
        """The V layout the file holds (None when it holds no V at all)."""
        found = {s.v_trans for c in self.caches for s in c.streams if s.v}
        return found.pop() if len(found) == 1 else None


@contextlib.contextmanager
def mapped(path: str | os.PathLike[str]) -> Iterator[memoryview]:
    """The file at ``path`` mapped read-only, as a memoryview. Unmapped on leaving, unless a slice
    of it is still held somewhere (a traceback's frame): then when that goes."""
    with open_regular(Path(path)) as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(mm)
        try:
            yield view
        finally:
            try:
                view.release()
                mm.close()
            except BufferError:
                pass


def read_layout(path: str | os.PathLike[str]) -> StateLayout:
    """The layout of the slot save file at ``path`` (StateLayoutError, KvFileError, OSError)."""
    header = read_tokens(path)
    with mapped(path) as buf:
        if not len(buf):
            raise StateLayoutError("empty file")
        return parse_layout(buf, header.header_bytes)


def parse_layout(buf: memoryview | bytes, header_bytes: int) -> StateLayout:
    """The layout of a whole slot save file in ``buf`` whose KV state begins at ``header_bytes``."""
    size = len(buf)
    caches: list[KvCache] = []
    at = header_bytes
    while at < size:
        cache = _try_cache(buf, at, size)
        if cache is None:
            break
        caches.append(cache)
        at = cache.end
    if not caches:
        raise StateLayoutError("no attention cache found after the token list")
    return StateLayout(header_bytes, tuple(caches), at, size)


def _try_cache(buf, at: int, size: int) -> KvCache | None:
    """An attention cache read strictly at ``at``, or None where something else (or nothing) is."""
    try:
        return _read_cache(buf, at, size)
    except (StateLayoutError, struct.error, IndexError, ValueError):
        return None


def _u32(buf, at: int) -> int:
    return _U32.unpack_from(buf, at)[0]


def _read_cache(buf, at: int, size: int) -> KvCache:
    start = at
    n_stream = _u32(buf, at)
    at += 4
    if not 1 <= n_stream <= MAX_STREAMS:
        raise StateLayoutError(f"{n_stream} streams")
    streams = []
    for _ in range(n_stream):
        cells = _u32(buf, at)
        at += 4
        if cells == 0:
            continue
        if cells > size:
            raise StateLayoutError("more cells than bytes")
        stream = None
        for ext in (False, True):
            try:
                stream = _read_stream(buf, at, size, cells, ext)
                break
            except (StateLayoutError, struct.error):
                continue
        if stream is None:
            raise StateLayoutError("cells not as a one-sequence save writes them")
        streams.append(stream)
        at = stream.end
    if len(streams) > 1:
        raise StateLayoutError("cells in more than one stream")
    return KvCache(start, n_stream, tuple(streams), at)


def _read_stream(buf, at: int, size: int, cells: int, ext: bool) -> KvStream:
    meta_offset = at
    positions = []
    seq = None
    for _ in range(cells):
        pos, n_seq = struct.unpack_from("<iI", buf, at)
        at += 8 + (_EXT_BYTES if ext else 0)
        if n_seq != 1 or pos < 0:
            raise StateLayoutError("a cell of more or fewer than one sequence")
        sid = _I32.unpack_from(buf, at)[0]
        at += 4
        if seq is None:
            seq = sid
        elif sid != seq:
            raise StateLayoutError("cells of several sequences")
        positions.append(pos)
    meta_bytes = at - meta_offset
    data_offset = at
    v_trans, n_layer, _rot_k, _rot_v = _DATA_HEAD.unpack_from(buf, at)
    at += _DATA_HEAD.size
    if v_trans > 1 or not 1 <= n_layer <= MAX_LAYERS:
        raise StateLayoutError("not a data part")
    k: list[LayerRows] = []
    for _ in range(n_layer):
        rows = _rows(buf, at, size, cells)
        k.append(rows)
        at = rows.offset + rows.nbytes(cells)
    v: list[LayerRows] = []
    while len(v) < n_layer and at < size:
        try:
            rows = _trans(buf, at, size, cells) if v_trans else _rows(buf, at, size, cells)
        except StateLayoutError:
            break
        # The next cache's start reads as a V entry only by accident: a V row is as wide as K's
        # for every model with V (MLA models store none); a mismatch ends the list.
        if rows.nbytes(cells) != k[len(v)].nbytes(cells) and not _plausible_v(rows, k[len(v)]):
            break
        v.append(rows)
        at = rows.offset + rows.nbytes(cells)
    if v and len(v) != n_layer:
        raise StateLayoutError(f"{len(v)} V layers for {n_layer} K layers")
    return KvStream(cells, meta_offset, meta_bytes, tuple(positions), data_offset, bool(v_trans), n_layer,
                    tuple(k), tuple(v), at)


def _plausible_v(v: LayerRows, k: LayerRows) -> bool:
    """A V layer narrower or wider than its K layer (models whose V head differs from K's)."""
    return v.type == k.type and 0 < v.row_bytes * (v.n_embd or 1) <= 8 * k.row_bytes


def _rows(buf, at: int, size: int, cells: int) -> LayerRows:
    typ, row = _ROWS_HEAD.unpack_from(buf, at)
    if not 0 <= typ < GGML_TYPE_COUNT or row == 0 or row > size:
        raise StateLayoutError("not a rows entry")
    rows = LayerRows(typ, at + _ROWS_HEAD.size, row)
    if rows.offset + rows.nbytes(cells) > size:
        raise StateLayoutError("rows past the end")
    return rows


def _trans(buf, at: int, size: int, cells: int) -> LayerRows:
    typ, el, n_embd = _TRANS_HEAD.unpack_from(buf, at)
    if ELEMENT_BYTES.get(typ) != el or n_embd == 0:
        raise StateLayoutError("not a transposed V entry")
    rows = LayerRows(typ, at + _TRANS_HEAD.size, el, n_embd, _TRANS_HEAD.size)
    if rows.offset + rows.nbytes(cells) > size:
        raise StateLayoutError("V past the end")
    return rows


def v_layout_convertible(layout: StateLayout) -> bool:
    """Whether the V cache can be rewritten into the other layout (its values stored element by
    element: f32, f16, bf16; a quantized V exists only with flash attention, untransposed)."""
    return all(all(r.type in ELEMENT_BYTES and (r.n_embd or r.row_bytes % ELEMENT_BYTES[r.type] == 0)
                   for r in s.v) for c in layout.caches for s in c.streams)


def convert_v_layout(src: str | os.PathLike[str], dst: str | os.PathLike[str], v_trans: bool) -> int:
    """Write to ``dst`` (created, synced) the file ``src`` with its V cache laid out as a server
    with flash attention off (``v_trans``) or on reads it: the same values, transposed; every other
    byte as it was. Returns the bytes written. StateLayoutError when the file cannot be converted."""
    with mapped(src) as buf:
        layout = parse_layout(buf, read_tokens(src).header_bytes)
        if not v_layout_convertible(layout):
            raise StateLayoutError("its V cache is quantized: it has one layout only")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        fd = os.open(dst, flags, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                _write_converted(buf, layout, v_trans, out)
                out.flush()
                sync_fd(fd)
                written = out.tell()
        except BaseException:
            os.close(fd)
            os.unlink(dst)  # never a half-written file left behind
            raise
        os.close(fd)
    return written


def _write_converted(buf: memoryview, layout: StateLayout, v_trans: bool, out) -> None:
    at = 0
    for cache in layout.caches:
        for s in cache.streams:
            if not s.v or s.v_trans == v_trans:
                continue
            out.write(buf[at:s.data_offset])
            out.write(_U32.pack(int(v_trans)))
            at = s.data_offset + 4
            v_start = s.v[0].offset - s.v[0].head_bytes
            out.write(buf[at:v_start])  # the rest of the data head and every K layer, as they were
            for rows in s.v:
                out.write(_converted_v(buf, rows, s.cell_count, v_trans))
            at = s.end
    out.write(buf[at:layout.size])


def _converted_v(buf: memoryview, rows: LayerRows, cells: int, v_trans: bool) -> bytes:
    """One layer's V entry (header and data) in the other layout."""
    el = ELEMENT_BYTES[rows.type]
    code: Literal["I", "H"] = "I" if el == 4 else "H"
    data = buf[rows.offset:rows.offset + rows.nbytes(cells)].cast("B").cast(code)
    if v_trans:  # a row per cell -> a run per element
        n_embd = rows.row_bytes // el
        out = bytearray(cells * rows.row_bytes)
        view = memoryview(out).cast(code)
        for j in range(n_embd):
            view[j * cells:(j + 1) * cells] = data[j::n_embd]
        return _TRANS_HEAD.pack(rows.type, el, n_embd) + bytes(out)
    n_embd = rows.n_embd
    out = bytearray(cells * n_embd * el)
    view = memoryview(out).cast(code)
    for j in range(n_embd):
        view[j::n_embd] = data[j * cells:(j + 1) * cells]
    return _ROWS_HEAD.pack(rows.type, n_embd * el) + bytes(out)
