"""A GGUF file's header (metadata and tensor index), read in pure Python.

The values come back as gguf-py's ``GGUFReader`` gives them through ``ReaderField.contents()``
(str, int, float and bool scalars; lists for arrays, nested arrays flattened), but without
importing gguf and numpy: together they cost ~22 MB of memory and ~0.3 s of start-up in every
process that only wants to know a model's shape.

The file is memory-mapped and only the header is parsed: tensor data is never touched, so a
20 GB model costs a few page faults. The tensor index is read anyway, because a file whose
tensor data ends before what the index describes is a half-finished download.

Every count and length is checked against the end of the file before it is used, and a few
caps bound the work and memory a hostile or garbage header can cause (see ``_MAX_*``): a bad
header fails fast with ``TruncatedHeader`` or ``CorruptHeader``, never loops for long.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_ALIGNMENT",
    "SKIP_ARRAY_LEN",
    "SUPPORTED_VERSIONS",
    "UNREADABLE",
    "CorruptHeader",
    "GGUFHeader",
    "HeaderError",
    "TensorInfo",
    "TruncatedHeader",
    "UnsupportedVersion",
    "read_header",
]

GGUF_MAGIC = b"GGUF"
# gguf-py's READER_SUPPORTED_VERSIONS ([2, GGUF_VERSION], GGUF_VERSION = 3), hard-coded so that
# reading a header does not import gguf. Version 1 used 32-bit counts and lengths.
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT, used when general.alignment is absent
HEADER_MIN = 24  # magic, version, tensor count, kv count

# Arrays longer than this are skipped, not parsed, and read back as empty lists: they are the
# tokenizer's vocabulary and merges (150k-260k strings), which nothing here needs. Per-layer
# arrays are never longer than llama.cpp's LLAMA_MAX_LAYERS (512).
SKIP_ARRAY_LEN = 512

# Bounds on what a header may make us do. Real models stay far below each; a header beyond
# one is garbage or hostile, and failing at once beats minutes of parsing or gigabytes of RAM.
_MAX_KV = 1 << 16  # metadata keys (real models: under 100)
_MAX_TENSORS = 1 << 18  # tensor infos (real models: a few thousand, ~50k for unmerged MoE experts)
_MAX_TEXT = 1 << 26  # bytes of strings decoded over the whole header; a value past it is skipped
_MAX_VALUES = 1 << 20  # array elements turned into Python objects, over the whole header
_MAX_WALK = 1 << 22  # items stepped over one by one in skipped string / nested arrays (~0.5 s)
_MAX_DEPTH = 8  # nested arrays (llama.cpp refuses any nesting; gguf-py flattens it)
_MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor with more dimensions

# GGUF value types (gguf-py GGUFValueType) -> struct format of the scalar ones.
_STRING = 8
_ARRAY = 9
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_UINT32 = 4

# ggml tensor type -> (elements per block, bytes per block), copied from gguf-py 0.19.0
# gguf/constants.py GGML_QUANT_SIZES (the table GGUFReader sizes tensors with). A type that
# is not here (including llama.cpp b11434's Q2_0 = 42, which gguf 0.19.0 does not know) is a
# header this reader cannot size, so it is refused as corrupt, as GGUFReader refused it.
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
    40: (64, 36),  # NVFP4
    41: (128, 18),  # Q1_0
}


class HeaderError(Exception):
    """The header cannot be read; ``offset`` is where the reader gave up."""

    def __init__(self, what: str, offset: int) -> None:
        super().__init__(f"{what} (at byte {offset})")
        self.offset = offset


class TruncatedHeader(HeaderError):
    """The file ends before the header, or the tensor data it describes, does."""


class CorruptHeader(HeaderError):
    """The header holds something no GGUF writer produces."""


class UnsupportedVersion(HeaderError):
    def __init__(self, version: int) -> None:
        super().__init__(f"GGUF version {version}", 4)
        self.version = version


class _Unreadable:
    """Stands for a value that was not decoded: invalid UTF-8, or a string over the cap."""

    def __repr__(self) -> str:
        return "UNREADABLE"


# The value of a key that could not be decoded: the file still opens (GGUFReader decoded values
# only when asked for them), and whoever asks for that key learns it is unreadable.
UNREADABLE: Any = _Unreadable()


class TensorInfo(NamedTuple):
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    ggml_type: int
    offset: int  # from the start of the data section
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    big_endian: bool
    fields: dict[str, Any]  # key -> value, plus GGUF.version, GGUF.tensor_count, GGUF.kv_count
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int  # where tensor data starts (header end, aligned)
    file_size: int


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse ``path``'s GGUF header. OSError when the file cannot be opened; HeaderError when
    it is not a readable GGUF header (TruncatedHeader, CorruptHeader, UnsupportedVersion)."""
    with open(Path(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < HEADER_MIN:  # mmap refuses an empty file; a short one cannot hold a header
            raise TruncatedHeader("no room for a GGUF header", size)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            # Only bytes and ints leave the parser, never a view, so the map closes cleanly.
            return _Parser(buf).parse()


# A tensor info as read: name, dims, ggml type, offset in the data section, where the info starts.
_RawTensor = tuple[str, tuple[int, ...], int, int, int]


class _Parser:
    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf = buf
        self.end = len(buf)
        self.values_left = _MAX_VALUES
        self.walk_left = _MAX_WALK
        self.text_left = _MAX_TEXT
        self.set_order("<")

    def set_order(self, order: str) -> None:
        self.order = order
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")
        self._scalars = {vtype: struct.Struct(order + fmt) for vtype, fmt in _SCALAR_FORMATS.items()}

    # -- primitives -----------------------------------------------------------------------

    def need(self, pos: int, n: int) -> None:
        if pos + n > self.end:
            raise TruncatedHeader("the file ends inside the header", pos)

    def u32(self, pos: int) -> int:
        self.need(pos, 4)
        return self._u32.unpack_from(self.buf, pos)[0]

    def u64(self, pos: int) -> int:
        self.need(pos, 8)
        return self._u64.unpack_from(self.buf, pos)[0]

    def raw_string(self, pos: int) -> tuple[bytes | None, int]:
        """(the string's bytes, or None past the _MAX_TEXT budget; the position after it)."""
        n = self.u64(pos)
        pos += 8
        self.need(pos, n)
        if n > self.text_left:
            return None, pos + n
        self.text_left -= n
        return self.buf[pos:pos + n], pos + n

    def name(self, pos: int, what: str) -> tuple[str, int]:
        """A key or tensor name: it must decode, or nothing after it can be trusted."""
        raw, end = self.raw_string(pos)
        if raw is None:
            raise CorruptHeader(f"a {what} past {_MAX_TEXT} bytes of text", pos)
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError:
            raise CorruptHeader(f"a {what} that is not UTF-8", pos) from None

    # -- values ---------------------------------------------------------------------------

    def value(self, pos: int, vtype: int, depth: int = 0) -> tuple[Any, int]:
        """(the value of type ``vtype`` at ``pos`` as ReaderField.contents() gives it, next pos)."""
        scalar = self._scalars.get(vtype)
        if scalar is not None:
            self.need(pos, scalar.size)
            return scalar.unpack_from(self.buf, pos)[0], pos + scalar.size
        if vtype == _STRING:
            raw, end = self.raw_string(pos)
            if raw is None:
                return UNREADABLE, end
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                return UNREADABLE, end
        if vtype == _ARRAY:
            return self.array(pos, depth)
        raise CorruptHeader(f"unknown value type {vtype}", pos)

    def array(self, pos: int, depth: int) -> tuple[Any, int]:
        if depth >= _MAX_DEPTH:
            raise CorruptHeader("arrays nested too deep", pos)
        itype = self.u32(pos)
        count = self.u64(pos + 4)
        pos += 12
        if count > SKIP_ARRAY_LEN:
            return [], self.skip(pos, itype, count, depth + 1)
        self.values_left -= count
        if self.values_left < 0:
            raise CorruptHeader("too many array elements", pos)
        fmt = _SCALAR_FORMATS.get(itype)
        if fmt is not None:  # the common case: one unpack for the whole array
            size = struct.calcsize(fmt) * count
            self.need(pos, size)
            return list(struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, pos)), pos + size
        items: list[Any] = []
        unreadable = False
        for _ in range(count):
            item, pos = self.value(pos, itype, depth + 1)
            if item is UNREADABLE:
                unreadable = True
            elif itype == _ARRAY:
                items.extend(item)  # contents() flattens nested arrays
            else:
                items.append(item)
        return (UNREADABLE if unreadable else items), pos

    def skip(self, pos: int, itype: int, count: int, depth: int) -> int:
        """The position after ``count`` items of ``itype`` at ``pos``, without building them."""
        fmt = _SCALAR_FORMATS.get(itype)
        if fmt is not None:
            size = struct.calcsize(fmt) * count
            self.need(pos, size)
            return pos + size
        if itype not in (_STRING, _ARRAY):
            raise CorruptHeader(f"unknown array item type {itype}", pos)
        # Each string takes at least its 8-byte length, each nested array 12 bytes of type and
        # count: a garbage count fails here, before any loop.
        self.need(pos, count * (8 if itype == _STRING else 12))
        self.walk_left -= count
        if self.walk_left < 0:
            raise CorruptHeader("too many array items to step over", pos)
        end = self.end
        if itype == _STRING:
            # The hot loop of a real model (a 262k-token vocabulary): no bounds check of our own,
            # unpack_from refuses to read past the buffer (struct.error, OverflowError past 2**63).
            unpack = self._u64.unpack_from
            buf = self.buf
            try:
                for _ in range(count):
                    pos += 8 + unpack(buf, pos)[0]
            except (struct.error, OverflowError):
                raise TruncatedHeader("the file ends inside a skipped string array", min(pos, end)) from None
            if pos > end:
                raise TruncatedHeader("the file ends inside a skipped string array", end)
            return pos
        if depth >= _MAX_DEPTH:
            raise CorruptHeader("arrays nested too deep", pos)
        for _ in range(count):
            sub_type = self.u32(pos)
            sub_count = self.u64(pos + 4)
            pos = self.skip(pos + 12, sub_type, sub_count, depth + 1)
        return pos

    # -- the header -----------------------------------------------------------------------

    def parse(self) -> GGUFHeader:
        buf = self.buf
        if self.end < HEADER_MIN:
            raise TruncatedHeader("no room for a GGUF header", self.end)
        if buf[:4] != GGUF_MAGIC:
            raise CorruptHeader("no GGUF magic", 0)
        version = struct.unpack_from("<I", buf, 4)[0]
        if version & 0xFFFF == 0:  # written on a big-endian machine (as GGUFReader decides)
            self.set_order(">")
            version = struct.unpack_from(">I", buf, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersion(version)
        tensor_count = self.u64(8)
        kv_count = self.u64(16)
        # GGUFReader lists these as fields too, so a key by one of these names is a duplicate.
        fields: dict[str, Any] = {
            "GGUF.version": version,
            "GGUF.tensor_count": tensor_count,
            "GGUF.kv_count": kv_count,
        }
        pos = HEADER_MIN
        pos = self.read_fields(pos, kv_count, fields)
        pos, raw_tensors = self.read_tensor_infos(pos, tensor_count)
        alignment = self.alignment(fields)
        data_offset = -(-pos // alignment) * alignment
        return GGUFHeader(
            version=version,
            big_endian=self.order == ">",
            fields=fields,
            tensors=self.size_tensors(raw_tensors, data_offset),
            alignment=alignment,
            data_offset=data_offset,
            file_size=self.end,
        )

    def read_fields(self, pos: int, count: int, fields: dict[str, Any]) -> int:
        if count > _MAX_KV:
            raise CorruptHeader(f"{count} metadata keys", 16)
        self.need(pos, count * 13)  # key length, value type, and at least one byte of value
        for _ in range(count):
            start = pos
            key, pos = self.name(pos, "metadata key")
            vtype = self.u32(pos)
            if key == "general.alignment" and vtype != _UINT32:
                raise CorruptHeader("general.alignment is not a uint32", start)
            value, pos = self.value(pos + 4, vtype)
            if key in fields:
                raise CorruptHeader(f"duplicate metadata key {key}", start)
            fields[key] = value
        return pos

    def read_tensor_infos(self, pos: int, count: int) -> tuple[int, list[_RawTensor]]:
        if count > _MAX_TENSORS:
            raise CorruptHeader(f"{count} tensors", 8)
        self.need(pos, count * 24)  # name length, n_dims, type, offset
        infos: list[_RawTensor] = []
        for _ in range(count):
            start = pos
            name, pos = self.name(pos, "tensor name")
            n_dims = self.u32(pos)
            if n_dims > _MAX_DIMS:
                raise CorruptHeader(f"tensor {name} has {n_dims} dimensions", pos)
            self.need(pos + 4, 8 * n_dims)
            dims = struct.unpack_from(f"{self.order}{n_dims}Q", self.buf, pos + 4)
            pos += 4 + 8 * n_dims
            ggml_type = self.u32(pos)
            offset = self.u64(pos + 4)
            pos += 12
            infos.append((name, dims, ggml_type, offset, start))
        return pos, infos

    def alignment(self, fields: dict[str, Any]) -> int:
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if alignment == 0 or alignment & (alignment - 1):
            raise CorruptHeader(f"alignment {alignment} is not a power of two", 0)
        return alignment

    def size_tensors(self, raw: list[_RawTensor], data_offset: int) -> list[TensorInfo]:
        """Each tensor's byte size, checked to end within the file."""
        tensors = []
        names: set[str] = set()
        for name, dims, ggml_type, offset, start in raw:
            if name in names:
                raise CorruptHeader(f"duplicate tensor {name}", start)
            names.add(name)
            sizes = GGML_TYPE_SIZES.get(ggml_type)
            if sizes is None:
                raise CorruptHeader(f"tensor {name} has unknown type {ggml_type}", start)
            block, block_bytes = sizes
            if dims and dims[0] % block:  # rows are whole blocks (GGUFReader and llama.cpp both refuse)
                raise CorruptHeader(f"tensor {name}'s rows are not whole blocks", start)
            n_elements = 1
            for d in dims:
                n_elements *= d
            n_bytes = n_elements * block_bytes // block
            if n_bytes and data_offset + offset + n_bytes > self.end:
                raise TruncatedHeader(f"tensor {name}'s data runs past the end of the file", start)
            tensors.append(TensorInfo(name, dims, ggml_type, offset, n_bytes))
        return tensors
