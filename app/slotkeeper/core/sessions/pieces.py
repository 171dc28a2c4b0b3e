"""Conversations' KV states kept as shared pieces: each distinct run of KV cells stored once.

llama-server writes a whole state file per save (``statefile`` reads its layout: attention caches
of cells, K and V rows per layer, a recurrent tail). A conversation's save, its restore points, its
branches and another conversation with the same start repeat most of those cells. Here a state is
kept as a *manifest* (``<id>.<gen>.kvm``: the file's own header with its token list, then, per
attention cache, the runs of cells it is made of) over *pieces* (``pieces/<ab>/<id>.kvp``: a run of
up to ``PIECE_CELLS`` consecutive cells of one cache, every layer's K and V for them, and a hash of
each cell's K rows). A piece is named by the hash of its bytes, so the same run is one file however
many states use it, and a damaged piece is known by its name. ``put`` reads a state llama-server
wrote once and writes only the pieces no state already holds; ``assemble`` writes the state file
llama-server restores from.

Cells are matched by their position and their K rows' hash (a cell's K depends on every token up to
it), then compared byte for byte, K and V, before a run of an existing piece is used (a rollback that
recomputed a position gives other bytes: a new piece). The file ``assemble`` writes restores exactly
what was saved; it differs from llama-server's own file only where restoring ignores the bytes: the
sequence id each cell names (restoring sets its own) and which stream of a per-slot cache holds the
cells (restoring reads whichever holds them into its own).

A state whose layout this code does not read keeps its whole KV part as one piece (``tail``).
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import xxhash
import zstandard

from slotkeeper.core.basics.fsutil import creating, fsync_dir, open_regular, sync_fd
from slotkeeper.core.sessions.kvfile import read_tokens
from slotkeeper.core.sessions.statefile import KvStream, StateLayoutError, mapped, parse_layout

__all__ = ["MANIFEST_SUFFIX", "PIECES_DIR", "Manifest", "PieceError", "PutResult", "assemble",
           "check_piece", "collect", "piece_path", "put", "read_manifest"]

PIECES_DIR = "pieces"
PIECE_SUFFIX = ".kvp"
MANIFEST_SUFFIX = ".kvm"
# New cells are cut into pieces at positions that are multiples of this (and never longer): a run that
# two states hold alike becomes the same pieces, and a state that uses part of an older piece keeps
# at most this many cells more alive than it needs.
PIECE_CELLS = 32
PIECE_MAGIC = b"SKVP"
MANIFEST_MAGIC = b"SKVM"
VERSION = 1  # of manifests
PIECE_VERSION = 2  # 2: a piece of 16-bit K and V keeps their high bytes compressed
# magic, version, n_cells, data bytes (as a state holds them), shape key, codec
_PIECE_HEAD = struct.Struct("<4sIIQ16sI")
_MANIFEST_HEAD = struct.Struct("<4sIQI")  # magic, version, state bytes, caches
# How a piece keeps its data after the cells' meta: as it is, or (16-bit K and V: f16, bf16) their
# low bytes as they are (as good as random) and their high bytes (sign, exponent, the top of the
# mantissa: a few values) compressed with zstd: 12% less on disk and written, read back at over
# 1 GB/s a core (bench_disk.py, docs/MEASUREMENTS.md).
CODEC_RAW = 0
CODEC_HIGH_BYTES = 1
_TWO_BYTE_TYPES = frozenset({1, 30})  # GGML_TYPE_F16, GGML_TYPE_BF16
_ZSTD_LEVEL = 1
_DECODED_KEPT = 16  # pieces a reader keeps decoded (put reads a candidate's pieces in order)
_RUN = struct.Struct("<16sII")  # piece id (raw), first cell, end cell
_U32 = struct.Struct("<I")
_DATA_HEAD = struct.Struct("<IIII")
_ROWS_HEAD = struct.Struct("<iQ")
_TRANS_HEAD = struct.Struct("<iII")
MAX_MANIFEST_BYTES = 1 << 30  # token lists are 4 bytes a token: a million tokens are 4 MB


class PieceError(OSError):
    """A piece or a manifest is missing, damaged or not one we wrote (why, in words)."""


@dataclass(frozen=True)
class Shape:
    """What one attention cache's cells look like in a state file (all a piece needs to be read)."""

    n_stream: int
    v_trans: bool
    n_layer: int
    rot_k: int
    rot_v: int
    meta_bytes: int  # per cell: pos, n_seq_id, [ext], seq_id
    k: tuple[tuple[int, int], ...]  # per layer: (ggml type, row bytes)
    v: tuple[tuple[int, int, int], ...]  # per layer: (type, row or element bytes, n_embd if transposed)

    def to_json(self) -> str:
        return json.dumps([self.n_stream, self.v_trans, self.n_layer, self.rot_k, self.rot_v, self.meta_bytes,
                           self.k, self.v], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Shape:
        n_stream, v_trans, n_layer, rot_k, rot_v, meta, k, v = json.loads(text)
        return cls(int(n_stream), bool(v_trans), int(n_layer), int(rot_k), int(rot_v), int(meta),
                   tuple((int(a), int(b)) for a, b in k), tuple((int(a), int(b), int(c)) for a, b, c in v))

    @property
    def key(self) -> bytes:
        return xxhash.xxh3_128_digest(self.to_json().encode())

    def v_bytes(self, layer: int) -> int:
        """V bytes per cell of ``layer``."""
        _typ, size, n_embd = self.v[layer]
        return size * n_embd if n_embd else size


@dataclass(frozen=True)
class Run:
    piece: str  # hex id
    lo: int
    hi: int


@dataclass(frozen=True)
class CacheRuns:
    shape: Shape
    runs: tuple[Run, ...]

    @property
    def n_cells(self) -> int:
        return sum(r.hi - r.lo for r in self.runs)


@dataclass(frozen=True)
class Manifest:
    header: bytes  # the state file's own header and token list
    state_bytes: int  # the size of the file ``assemble`` writes
    caches: tuple[CacheRuns, ...]
    tail: str | None  # a piece holding what follows the caches (a recurrent state), or the whole KV part
    tail_bytes: int

    def piece_ids(self) -> set[str]:
        ids = {r.piece for c in self.caches for r in c.runs}
        if self.tail:
            ids.add(self.tail)
        return ids


@dataclass(frozen=True)
class PutResult:
    manifest: Manifest
    written_bytes: int  # pieces written now (the rest was there)
    new_pieces: tuple[str, ...]


def piece_path(pieces_dir: Path, piece_id: str) -> Path:
    return pieces_dir / piece_id[:2] / (piece_id + PIECE_SUFFIX)


# -- pieces ---------------------------------------------------------------------------------
@dataclass
class _Piece:
    """A piece as read: its cells' K hashes, positions, and its data (meta, then each layer's K,
    then each layer's V: a memory map, or decoded when first asked for, ``_Pieces.data``)."""

    id: str
    n_cells: int
    shape_key: bytes
    khash: Sequence[int]
    meta: memoryview  # the cells' meta (positions), as stored
    body: memoryview  # the rest as stored (codec)
    codec: int
    data_bytes: int
    positions: Sequence[int]
    decoded: memoryview | None = None

    def offsets(self, shape: Shape) -> tuple[int, list[int], list[int]]:
        """Where meta, each K layer and each V layer begin in ``data``."""
        n = self.n_cells
        at = n * shape.meta_bytes
        k_at = []
        for _t, row in shape.k:
            k_at.append(at)
            at += n * row
        v_at = []
        for i in range(len(shape.v)):
            v_at.append(at)
            at += n * shape.v_bytes(i)
        return 0, k_at, v_at


class _Pieces:
    """The pieces a put or an assembly reads, each mapped once; a piece whose bytes do not hash to
    its name is damaged (PieceError)."""

    def __init__(self, pieces_dir: Path, verify: bool = True) -> None:
        self.dir = pieces_dir
        self.verify = verify
        self._open: dict[str, _Piece] = {}
        self._maps: list[tuple[object, mmap.mmap]] = []
        self._decoded: dict[str, None] = {}  # pieces kept decoded, oldest first

    def data(self, piece: _Piece) -> memoryview:
        """The piece's data as a state holds it (decoded once; the last few kept)."""
        if piece.decoded is not None:
            self._decoded.pop(piece.id, None)
            self._decoded[piece.id] = None
            return piece.decoded
        if piece.codec == CODEC_RAW:
            return piece.body  # the map itself: meta and body are one run of bytes
        try:
            out = _decode_high_bytes(piece.meta, piece.body, piece.data_bytes)
        except (zstandard.ZstdError, ValueError) as exc:
            raise PieceError(f"piece {piece.id[:12]}… does not decode: {exc}") from None
        piece.decoded = out
        self._decoded[piece.id] = None
        while len(self._decoded) > _DECODED_KEPT:
            oldest = next(iter(self._decoded))
            del self._decoded[oldest]
            gone = self._open.get(oldest)
            if gone is not None:
                gone.decoded = None
        return out

    def get(self, piece_id: str) -> _Piece:
        got = self._open.get(piece_id)
        if got is not None:
            return got
        path = piece_path(self.dir, piece_id)
        try:
            f = open_regular(path)
        except FileNotFoundError:
            raise PieceError(f"piece {piece_id[:12]}… is missing") from None
        try:
            size = os.fstat(f.fileno()).st_size
            if size < _PIECE_HEAD.size:
                raise PieceError(f"piece {piece_id[:12]}… is cut short")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            f.close()
            raise
        self._maps.append((f, mm))
        view = memoryview(mm)
        if self.verify and xxhash.xxh3_128_hexdigest(view) != piece_id:
            raise PieceError(f"piece {piece_id[:12]}… is damaged (its bytes do not match its name)")
        magic, version, n_cells, data_bytes, shape_key, codec = _PIECE_HEAD.unpack_from(view, 0)
        if magic != PIECE_MAGIC or version != PIECE_VERSION or codec not in (CODEC_RAW, CODEC_HIGH_BYTES):
            raise PieceError(f"piece {piece_id[:12]}… is not one this version reads")
        at = _PIECE_HEAD.size
        khash = view[at:at + 8 * n_cells].cast("Q") if n_cells else ()
        at += 8 * n_cells
        if codec == CODEC_RAW:
            data = view[at:]
            if len(data) != data_bytes:
                raise PieceError(f"piece {piece_id[:12]}… is cut short")
            piece = _Piece(piece_id, n_cells, shape_key, khash, data, data, codec, len(data), ())
        else:
            meta_bytes = _META_LEN.unpack_from(view, at)[0]
            at += _META_LEN.size
            meta, body = view[at:at + meta_bytes], view[at + meta_bytes:]
            piece = _Piece(piece_id, n_cells, shape_key, khash, meta, body, codec, data_bytes, ())
        self._open[piece_id] = piece
        return piece

    def positions(self, piece: _Piece, shape: Shape) -> Sequence[int]:
        if not piece.positions and piece.n_cells:
            mb = shape.meta_bytes
            piece.positions = [struct.unpack_from("<i", piece.meta, i * mb)[0] for i in range(piece.n_cells)]
        return piece.positions

    def close(self) -> None:
        """Unmap the pieces; a map still viewed by a caller's slice is unmapped when that goes."""
        for piece in self._open.values():
            piece.decoded = None
        self._open.clear()
        self._decoded.clear()
        for f, mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass
            f.close()  # type: ignore[attr-defined]
        self._maps.clear()

    def __enter__(self) -> _Pieces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_piece(pieces_dir: Path, piece_id: str) -> str | None:
    """What is wrong with a piece (missing, cut short, damaged: its bytes hashed whole), or None."""
    try:
        with _Pieces(pieces_dir) as known:
            known.get(piece_id)
    except PieceError as exc:
        return str(exc)
    except OSError as exc:
        return f"piece {piece_id[:12]}… cannot be read: {exc}"
    return None


_META_LEN = struct.Struct("<Q")  # codec 1: the bytes of meta kept as they are


def _codec_of(shape: Shape | None) -> int:
    """High bytes compressed where every K and V layer holds 16-bit floats (their rows then have an
    even number of bytes, and meta is whole 4-byte fields)."""
    if shape is None or not shape.k:
        return CODEC_RAW
    types = [t for t, _row in shape.k] + [t for t, _size, _n in shape.v]
    if all(t in _TWO_BYTE_TYPES for t in types):
        return CODEC_HIGH_BYTES
    return CODEC_RAW


def _encode_high_bytes(meta: bytes | memoryview, rest: bytes) -> bytes:
    """Meta's length, meta, the low bytes of ``rest``, then its high bytes compressed."""
    low, high = rest[0::2], rest[1::2]
    packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True).compress(high)
    return b"".join((_META_LEN.pack(len(meta)), meta, low, packed))


def _decode_high_bytes(meta: memoryview, body: memoryview, data_bytes: int) -> memoryview:
    m = len(meta)
    n = data_bytes - m
    if n < 0 or n % 2 or len(body) < n // 2:
        raise ValueError("its sizes do not add up")
    out = bytearray(data_bytes)
    out[:m] = meta
    out[m::2] = body[:n // 2]
    high = zstandard.ZstdDecompressor().decompress(body[n // 2:], max_output_size=n // 2)
    if len(high) != n // 2:
        raise ValueError("its high bytes came out short")
    out[m + 1::2] = high
    return memoryview(out)


# -- reading a state ------------------------------------------------------------------------
def _shape(buf: memoryview, stream: KvStream, n_stream: int) -> Shape:
    _v_trans, _n_layer, rot_k, rot_v = _DATA_HEAD.unpack_from(buf, stream.data_offset)
    return Shape(
        n_stream=n_stream, v_trans=stream.v_trans, n_layer=stream.n_layer, rot_k=rot_k, rot_v=rot_v,
        meta_bytes=stream.meta_bytes // stream.cell_count,
        k=tuple((r.type, r.row_bytes) for r in stream.k),
        v=tuple((r.type, r.row_bytes, r.n_embd) for r in stream.v),
    )


def _cell_hashes(buf: memoryview, s: KvStream) -> list[int]:
    """Each cell's K rows (every layer) hashed: the key a cell is matched by, with its position."""
    out = []
    layers = [(r.offset, r.row_bytes) for r in s.k]
    for i in range(s.cell_count):
        h = xxhash.xxh3_64()
        for off, row in layers:
            h.update(buf[off + i * row:off + (i + 1) * row])
        out.append(h.intdigest())
    return out


def _cells_bytes(buf: memoryview, s: KvStream, shape: Shape, a: int, b: int) -> list[memoryview | bytes]:
    """Cells ``a``..``b`` of a stream as a piece holds them: meta (the sequence id as 0), then each
    layer's K, then each layer's V."""
    n = b - a
    mb = shape.meta_bytes
    meta = bytearray(buf[s.meta_offset + a * mb:s.meta_offset + b * mb])
    for j in range(mb - 4, mb):  # the sequence id, the last 4 bytes of each record
        meta[j::mb] = bytes(n)
    parts: list[memoryview | bytes] = [bytes(meta)]
    for r in s.k:
        parts.append(buf[r.offset + a * r.row_bytes:r.offset + b * r.row_bytes])
    n_all = s.cell_count
    for r in s.v:
        if r.n_embd:
            src = buf[r.offset:r.offset + r.nbytes(n_all)]
            parts.append(_columns(src, r.row_bytes, r.n_embd, n_all, a, b))
        else:
            parts.append(buf[r.offset + a * r.row_bytes:r.offset + b * r.row_bytes])
    return parts


def _columns(src: memoryview, el: int, rows: int, width: int, a: int, b: int) -> bytes:
    """Columns ``a``..``b`` of a ``rows`` x ``width`` matrix of ``el``-byte elements (a transposed
    V layer: a row per element, a column per cell), as a ``rows`` x (b - a) matrix."""
    n = b - a
    if a == 0 and n == width:
        return bytes(src)
    out = bytearray(rows * n * el)
    _copy_block(memoryview(out), n, 0, src, width, a, n, rows, el)
    return bytes(out)


def _copy_block(dst: memoryview, dst_width: int, c0: int, src: memoryview, src_width: int, lo: int, m: int,
                rows: int, el: int) -> None:
    """dst[:, c0:c0+m] = src[:, lo:lo+m] for matrices of ``el``-byte elements: one copy per row,
    or, where a row's part is only a few elements (and there are more rows than columns), one
    strided copy per column (element by element in C, which is slower per byte than a row)."""
    if m * el <= 64 and m < rows:
        code: Literal["H", "I", "B"] = "H" if el == 2 else "I" if el == 4 else "B"
        d = dst.cast(code) if code != "B" else dst
        s = src.cast("B").cast(code) if code != "B" else src
        for t in range(m):
            d[c0 + t::dst_width] = s[lo + t::src_width]
        return
    dw, sw, c, a, w = dst_width * el, src_width * el, c0 * el, lo * el, m * el
    s = src.cast("B") if src.format != "B" else src
    for j in range(rows):
        dst[j * dw + c:j * dw + c + w] = s[j * sw + a:j * sw + a + w]


def _piece_cells_bytes(known: _Pieces, piece: _Piece, shape: Shape, lo: int, hi: int) -> list[memoryview]:
    """Cells ``lo``..``hi`` of a piece, in the order ``_cells_bytes`` gives them."""
    n = piece.n_cells
    data = known.data(piece)
    mb = shape.meta_bytes
    _m, k_at, v_at = piece.offsets(shape)
    parts = [data[lo * mb:hi * mb]]
    for (_t, row), at in zip(shape.k, k_at):
        parts.append(data[at + lo * row:at + hi * row])
    for (_t, size, n_embd), at in zip(shape.v, v_at):
        if n_embd:
            parts.append(memoryview(_columns(data[at:at + n_embd * n * size], size, n_embd, n, lo, hi)))
        else:
            parts.append(data[at + lo * size:at + hi * size])
    return parts


# -- put ------------------------------------------------------------------------------------
def put(staged: Path, pieces_dir: Path, candidates: Iterable[Path] = (),
        manifest_out: Path | None = None, claim: Callable[[str], None] = lambda piece_id: None) -> PutResult:
    """Keep the state llama-server wrote to ``staged``: the pieces no candidate state (manifests of
    states likely to share cells: the conversation's own, its parent's) already holds are written
    (synced), and the manifest is returned (and written, synced, to ``manifest_out`` if given).
    ``claim(piece_id)`` is told of each piece the state names before it is written or used (so that a
    collection spares it until the state is committed)."""
    header = read_tokens(staged)
    pieces_dir.mkdir(mode=0o700, exist_ok=True)
    with mapped(staged) as buf, _Pieces(pieces_dir) as known:
        writer = _Writer(pieces_dir, claim)
        try:
            layout = parse_layout(buf, header.header_bytes)
        except StateLayoutError:
            layout = None
        caches: list[CacheRuns] = []
        tail_from = header.header_bytes if layout is None else layout.tail_offset
        if layout is not None:
            index = _CandidateIndex(known, candidates)
            for cache in layout.caches:
                if not cache.streams:
                    caches.append(CacheRuns(Shape(cache.n_stream, False, 0, 0, 0, 12, (), ()), ()))
                    continue
                s = cache.streams[0]
                shape = _shape(buf, s, cache.n_stream)
                caches.append(CacheRuns(shape, tuple(_runs(buf, s, shape, index, known, writer))))
        tail = None
        tail_bytes = len(buf) - tail_from
        if tail_bytes:
            tail = writer.piece(0, b"\0" * 16, [], [buf[tail_from:]])
        writer.sync()
        manifest = Manifest(bytes(buf[:header.header_bytes]), len(buf), tuple(caches), tail, tail_bytes)
    if manifest_out is not None:
        _write_synced(manifest_out, manifest_bytes(manifest))
    return PutResult(manifest, writer.written, tuple(writer.new))


class _CandidateIndex:
    """(shape, position, K hash) -> (piece, cell) over the candidates' pieces, built on first use."""

    def __init__(self, known: _Pieces, candidates: Iterable[Path]) -> None:
        self.known = known
        self.manifests = []
        for path in candidates:
            try:
                self.manifests.append(read_manifest(path))
            except (PieceError, OSError, ValueError):
                continue
        self._by_shape: dict[bytes, dict[tuple[int, int], tuple[str, int]]] = {}

    def lookup(self, shape: Shape) -> dict[tuple[int, int], tuple[str, int]]:
        key = shape.key
        found = self._by_shape.get(key)
        if found is not None:
            return found
        found = {}
        seen: set[str] = set()
        for m in self.manifests:
            for c in m.caches:
                if c.shape.key != key:
                    continue
                for r in c.runs:
                    if r.piece in seen:
                        continue
                    seen.add(r.piece)
                    try:
                        piece = self.known.get(r.piece)
                    except (PieceError, OSError):
                        continue
                    positions = self.known.positions(piece, shape)
                    for i in range(piece.n_cells):
                        found.setdefault((positions[i], piece.khash[i]), (r.piece, i))
        self._by_shape[key] = found
        return found


def _runs(buf: memoryview, s: KvStream, shape: Shape, index: _CandidateIndex, known: _Pieces,
          writer: _Writer) -> Iterator[Run]:
    """The stream's cells as runs of existing pieces where they hold the same bytes, new pieces
    for the rest."""
    hashes = _cell_hashes(buf, s)
    table = index.lookup(shape) if index.manifests else {}
    positions = s.positions
    n = s.cell_count
    i = 0
    pending = 0  # start of cells not found in any piece
    while i < n:
        hit = table.get((positions[i], hashes[i]))
        if hit is None:
            i += 1
            continue
        piece_id, lo = hit
        piece = known.get(piece_id)
        j = i + 1
        hi = lo + 1
        while (j < n and hi < piece.n_cells and piece.khash[hi] == hashes[j]
               and known.positions(piece, shape)[hi] == positions[j]):
            j += 1
            hi += 1
        # A run that uses less than half of a piece keeps more alive than it uses: its cells are
        # written again (a few), so that the piece goes with the states that use it whole.
        if 2 * (hi - lo) >= piece.n_cells and _same(_cells_bytes(buf, s, shape, i, j),
                                                    _piece_cells_bytes(known, piece, shape, lo, hi)):
            if pending < i:
                yield from writer.cells(buf, s, shape, hashes, pending, i)
            writer.claim(piece_id)
            writer.reused.add(piece_id)
            yield Run(piece_id, lo, hi)
            pending = j
        i = j
    if pending < n:
        yield from writer.cells(buf, s, shape, hashes, pending, n)


def _same(a: Sequence[memoryview | bytes], b: Sequence[memoryview]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)) and b"".join(a) == b"".join(b)


class _Writer:
    """New pieces, written under a temporary name, synced, renamed into place; folders synced at
    the end (``sync``). A piece already there (the same bytes) is not written again."""

    def __init__(self, pieces_dir: Path, claim: Callable[[str], None] = lambda piece_id: None) -> None:
        self.dir = pieces_dir
        self.claim = claim  # told of every piece this state will name, before it is written or used
        self.written = 0
        self.new: list[str] = []
        self.reused: set[str] = set()
        self._dirs: set[Path] = set()

    def cells(self, buf: memoryview, s: KvStream, shape: Shape, hashes: list[int], a: int,
              b: int) -> Iterator[Run]:
        key = shape.key
        positions = s.positions
        start = a
        while start < b:
            end = start + 1  # up to the next position that is a multiple of PIECE_CELLS
            while end < b and end - start < PIECE_CELLS and positions[end] % PIECE_CELLS != 0:
                end += 1
            piece = self.piece(end - start, key, hashes[start:end], _cells_bytes(buf, s, shape, start, end),
                               _codec_of(shape))
            yield Run(piece, 0, end - start)
            start = end

    def piece(self, n_cells: int, shape_key: bytes, hashes: Sequence[int],
              parts: Sequence[memoryview | bytes], codec: int = CODEC_RAW) -> str:
        """The piece of these cells (``parts``: meta, then each layer's K and V), written unless
        the same bytes are there: its id."""
        if codec == CODEC_HIGH_BYTES:
            rest = b"".join(parts[1:])
            data_bytes = len(parts[0]) + len(rest)
            data: bytes | memoryview = _encode_high_bytes(parts[0], rest)
        else:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            data_bytes = len(data)
        size = len(data)
        head = _PIECE_HEAD.pack(PIECE_MAGIC, PIECE_VERSION, n_cells, data_bytes, shape_key, codec)
        khash = struct.pack(f"<{len(hashes)}Q", *hashes)
        h = xxhash.xxh3_128()
        h.update(head)
        h.update(khash)
        h.update(data)
        piece_id = h.hexdigest()
        self.claim(piece_id)
        path = piece_path(self.dir, piece_id)
        try:
            if path.stat().st_size == len(head) + len(khash) + size:
                self.reused.add(piece_id)
                return piece_id  # the same bytes are there already
        except OSError:
            pass
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_name(f".{piece_id}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                out.write(head)
                out.write(khash)
                out.write(data)
                out.flush()
                sync_fd(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, path)
        self._dirs.add(path.parent)
        self.written += len(head) + len(khash) + size
        self.new.append(piece_id)
        return piece_id

    def sync(self) -> None:
        """The new pieces' folders synced; the pieces used again touched, so that a collection
        (which spares recent pieces) never takes one this state is about to name."""
        for d in self._dirs:
            fsync_dir(d)
        if self._dirs:
            fsync_dir(self.dir)
        for piece_id in self.reused:
            try:
                os.utime(piece_path(self.dir, piece_id))
            except OSError:
                pass


# -- manifests ------------------------------------------------------------------------------
def manifest_bytes(m: Manifest) -> bytes:
    out = [m.header, _MANIFEST_HEAD.pack(MANIFEST_MAGIC, VERSION, m.state_bytes, len(m.caches))]
    for c in m.caches:
        shape = c.shape.to_json().encode()
        out.append(_U32.pack(len(shape)))
        out.append(shape)
        out.append(_U32.pack(len(c.runs)))
        out.extend(_RUN.pack(bytes.fromhex(r.piece), r.lo, r.hi) for r in c.runs)
    if m.tail:
        out.append(b"\x01" + bytes.fromhex(m.tail) + struct.pack("<Q", m.tail_bytes))
    else:
        out.append(b"\x00")
    return b"".join(out)


def read_manifest(path: Path) -> Manifest:
    """The manifest at ``path`` (PieceError when it is not one we wrote, or damaged)."""
    header = read_tokens(path)
    with open_regular(path, MAX_MANIFEST_BYTES) as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    return parse_manifest(data, header.header_bytes, path.name)


def parse_manifest(data: bytes, header_bytes: int, name: str = "manifest") -> Manifest:
    try:
        magic, version, state_bytes, n_caches = _MANIFEST_HEAD.unpack_from(data, header_bytes)
        if magic != MANIFEST_MAGIC or version != VERSION:
            raise PieceError(f"{name} is not a manifest this version reads")
        at = header_bytes + _MANIFEST_HEAD.size
        caches = []
        for _ in range(n_caches):
            (length,) = _U32.unpack_from(data, at)
            at += 4
            shape = Shape.from_json(data[at:at + length].decode())
            at += length
            (n_runs,) = _U32.unpack_from(data, at)
            at += 4
            runs = []
            for _ in range(n_runs):
                raw, lo, hi = _RUN.unpack_from(data, at)
                at += _RUN.size
                if hi <= lo:
                    raise PieceError(f"{name} has an empty run")
                runs.append(Run(raw.hex(), lo, hi))
            caches.append(CacheRuns(shape, tuple(runs)))
        tail, tail_bytes = None, 0
        if data[at] == 1:
            tail = data[at + 1:at + 17].hex()
            (tail_bytes,) = struct.unpack_from("<Q", data, at + 17)
            at += 25
        else:
            at += 1
        if at != len(data):
            raise PieceError(f"{name} does not end where its contents do")
    except (struct.error, IndexError, ValueError, TypeError, json.JSONDecodeError) as exc:
        raise PieceError(f"{name} is damaged: {exc}") from None
    return Manifest(data[:header_bytes], state_bytes, tuple(caches), tail, tail_bytes)


def _write_synced(path: Path, data: bytes) -> None:
    with creating(path) as fd, os.fdopen(fd, "wb", closefd=False) as out:
        out.write(data)
        out.flush()
        sync_fd(fd)


# -- assemble -------------------------------------------------------------------------------
def assemble(manifest: Manifest, pieces_dir: Path, out: Path) -> int:
    """Write the state file the manifest describes to ``out`` (created, 0600), each piece checked
    against its name; returns its size. PieceError when a piece is missing or damaged (nothing is
    left at ``out`` then). The file is laid out first, then each piece is read (and decoded) once
    and its cells go where they belong (a transposed V layer takes a column of every run)."""
    size = manifest.state_bytes
    try:
        with creating(out, os.O_RDWR) as fd:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as mm, _Pieces(pieces_dir) as pieces:
                view = memoryview(mm)
                try:
                    at = _put_bytes(view, 0, manifest.header)
                    for c in manifest.caches:
                        at = _assemble_cache(view, at, c, pieces)
                    if manifest.tail:
                        at = _put_bytes(view, at, pieces.data(pieces.get(manifest.tail)))
                    if at != size:
                        raise PieceError(f"the state came out {at} bytes, {size} expected")
                finally:
                    view.release()
    except (ValueError, IndexError, struct.error) as exc:  # a manifest whose sizes do not add up
        raise PieceError(f"the state does not assemble: {exc}") from None
    return size


def _put_bytes(view: memoryview, at: int, data: bytes | memoryview) -> int:
    end = at + len(data)
    if end > len(view):
        raise PieceError(f"the state would come out longer than its {len(view)} bytes")
    view[at:end] = data
    return end


def _assemble_cache(view: memoryview, at: int, c: CacheRuns, pieces: _Pieces) -> int:
    """One attention cache of the state, written into ``view`` from ``at``: returns where it ends."""
    shape = c.shape
    at = _put_bytes(view, at, _U32.pack(shape.n_stream))
    n = c.n_cells
    if n == 0:
        return _put_bytes(view, at, bytes(4 * shape.n_stream))
    at = _put_bytes(view, at, _U32.pack(n))
    mb = shape.meta_bytes
    meta_at, at = at, at + n * mb
    at = _put_bytes(view, at, _DATA_HEAD.pack(int(shape.v_trans), shape.n_layer, shape.rot_k, shape.rot_v))
    k_at = []
    for typ, row in shape.k:
        at = _put_bytes(view, at, _ROWS_HEAD.pack(typ, row))
        k_at.append(at)
        at += n * row
    v_at = []
    for typ, size, n_embd in shape.v:
        head = _TRANS_HEAD.pack(typ, size, n_embd) if n_embd else _ROWS_HEAD.pack(typ, size)
        at = _put_bytes(view, at, head)
        v_at.append(at)
        at += (n_embd or 1) * n * size
    end = _put_bytes(view, at, bytes(4 * (shape.n_stream - 1)))
    c0 = 0  # the first cell of the run being placed
    for r in c.runs:
        piece = pieces.get(r.piece)
        if piece.shape_key != shape.key:
            raise PieceError(f"piece {piece.id[:12]}… is of another cache")
        if not 0 <= r.lo < r.hi <= piece.n_cells:
            raise PieceError(f"piece {piece.id[:12]}… has no cells {r.lo}-{r.hi}")
        data = pieces.data(piece)
        pn, lo, hi, m = piece.n_cells, r.lo, r.hi, r.hi - r.lo
        _m, pk, pv = piece.offsets(shape)
        view[meta_at + c0 * mb:meta_at + (c0 + m) * mb] = data[lo * mb:hi * mb]
        for (_t, row), src, dst in zip(shape.k, pk, k_at):
            view[dst + c0 * row:dst + (c0 + m) * row] = data[src + lo * row:src + hi * row]
        for (_t, size, n_embd), src, dst in zip(shape.v, pv, v_at):
            if n_embd:
                _copy_block(view[dst:dst + n_embd * n * size], n, c0, data[src:src + n_embd * pn * size], pn,
                            lo, m, n_embd, size)
            else:
                view[dst + c0 * size:dst + (c0 + m) * size] = data[src + lo * size:src + hi * size]
        c0 += m
    return end


# -- collecting -----------------------------------------------------------------------------
def collect(pieces_dir: Path, referenced: set[str], older_than: float) -> tuple[int, int]:
    """Remove the pieces no manifest names, written before the unix time ``older_than`` (a save
    writes its pieces before its manifest is committed); returns (pieces, bytes) removed."""
    removed = freed = 0
    try:
        folders = list(os.scandir(pieces_dir))
    except FileNotFoundError:
        return 0, 0
    for folder in folders:
        if not folder.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(folder.path):
            name = entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_mtime >= older_than:
                continue
            if name.endswith(PIECE_SUFFIX) and name[:-len(PIECE_SUFFIX)] in referenced:
                continue
            try:
                os.unlink(entry.path)
            except OSError:
                continue
            removed += 1
            freed += st.st_size
    return removed, freed
