"""Read the token list out of a llama-server slot save file, without the server.

A slot save (``POST /slots/{id}?action=save``) is written by llama.cpp's
``llama_state_seq_save_file()``. All integers are little-endian (llama.cpp writes
native byte order; every platform we ship on is little-endian)::

    offset  type        field
    0       u32         magic     0x67677371 (LLAMA_STATE_SEQ_MAGIC, 'ggsq').
                                  Written as a LE u32, so the bytes on disk spell b"qsgg".
    4       u32         version   LLAMA_STATE_SEQ_VERSION; we read 4.
    8       u32         n_words   length of the "token" array the server handed to
                                  llama.cpp, counted in 4-byte words.
    12      i32[n_words] word blob
    12+4*n_words        KV state  opaque to us (cell metadata + per-layer K/V tensors).

llama.cpp treats the word blob as plain token ids. Older llama-server builds stored
exactly that (``n_words`` token ids). Current builds store their own serialization of
the slot's tokens in it instead, measured as::

    i32  -1          marker (never a valid token id, so it tells the two layouts apart)
    u32  1           blob version; only 1 is known
    u32  n_tokens
    i32  tokens[n_tokens]   -1 at every position an image or audio clip takes
    u32  n_media     media chunks (images/audio); 0 for text-only slots
    u32  start[n_media]     where each chunk's positions begin in the token list
    per chunk: u32 size, then size bytes (mtmd's own serialization, which names the
                     image by the SHA-256 of its bytes); chunks are not word-aligned
    0-3 zero bytes   padding to a whole word

(tools/server/server-common.cpp ``server_tokens::serialize``, llama.cpp b11434.) Media
positions are returned as a negative pseudo-token derived from the chunk's bytes, the same
for every position of one chunk: no real token id is negative, so a request's tokens never
match into an image, and two saves holding different images never compare equal.

Both layouts are read. Everything is checked against the file size before anything
large is read, so a damaged header cannot make us allocate gigabytes. The file has no
checksum and no model identity: integrity comes from the sidecar's content hash.

All format knowledge lives in ``_parse_word_blob`` and ``read_tokens`` so it is easy to
adjust once it has been checked against more real files.
"""

from __future__ import annotations

import hashlib
import os
import struct
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.fsutil import open_regular
from slotkeeper.core.basics.tokens import TokenArray, from_le_i32

__all__ = [
    "LLAMA_STATE_SEQ_MAGIC",
    "SUPPORTED_VERSIONS",
    "KvFileError",
    "KvFileHeader",
    "is_slot_save_file",
    "read_tokens",
]

LLAMA_STATE_SEQ_MAGIC = 0x67677371  # 'ggsq'; on disk (LE) the bytes read b"qsgg"
# The whole-context session file ('ggsn') is a different format: name it in the error.
LLAMA_SESSION_MAGIC = 0x6767736E
SUPPORTED_VERSIONS = frozenset({4})

_U32 = struct.Struct("<I")
_FILE_HEADER = struct.Struct("<III")  # magic, version, n_words
_WORD = 4
_BLOB_MARKER = -1
_BLOB_FORMATS = frozenset({1})
_BLOB_FIXED_WORDS = 4  # marker, format, n_tokens, n_media
# Any real KV state starts with at least one u32 (stream or cell count); a file that
# ends right after the token list has lost its state.
_MIN_KV_STATE_BYTES = 4
_HIGH_BYTES = bytes(range(0x80, 0x100))  # the top byte of a negative little-endian i32


class KvFileError(ValueError):
    """The file is not a slot save file we can read (bad magic, version, or layout)."""


@dataclass(frozen=True)
class KvFileHeader:
    """What the front of a slot save file says.

    ``header_bytes`` is where the KV state starts; ``kv_state_bytes`` is how much follows.
    ``blob_layout`` is "server" (marker-prefixed blob) or "plain" (bare token ids).
    """

    version: int
    n_tokens: int
    tokens: list[int]
    header_bytes: int
    kv_state_bytes: int = 0
    n_media: int = 0
    blob_layout: str = "server"

    @property
    def text_tokens(self) -> list[int]:
        """The token ids without the media positions (what ``/detokenize`` accepts)."""
        return [t for t in self.tokens if t >= 0]


def is_slot_save_file(path: str | os.PathLike[str]) -> bool:
    """Cheap check: does the file start with the slot-save magic? Never raises."""
    try:
        with open_regular(Path(path)) as f:
            head = f.read(_U32.size)
    except OSError:
        return False
    return len(head) == _U32.size and _U32.unpack(head)[0] == LLAMA_STATE_SEQ_MAGIC


def read_tokens(path: str | os.PathLike[str]) -> KvFileHeader:
    """Read and validate the header and token list of a slot save file.

    Raises ``KvFileError`` naming the file and the problem; ``OSError`` passes through.
    Reads only the header and the token blob, never the KV state.
    """
    path = Path(path)
    with open_regular(path) as f:  # never a link followed, never a FIFO waited on
        file_size = os.fstat(f.fileno()).st_size
        fixed = f.read(_FILE_HEADER.size)
        if len(fixed) < _FILE_HEADER.size:
            raise KvFileError(
                f"{path.name}: truncated header ({file_size} bytes; a slot save file "
                f"starts with {_FILE_HEADER.size})"
            )
        magic, version, n_words = _FILE_HEADER.unpack(fixed)
        _check_magic(path, magic)
        if version not in SUPPORTED_VERSIONS:
            raise KvFileError(
                f"{path.name}: unsupported slot save version {version} "
                f"(this Slotkeeper reads {_describe(SUPPORTED_VERSIONS)})"
            )
        header_bytes = _FILE_HEADER.size + _WORD * n_words
        if header_bytes > file_size:
            raise KvFileError(
                f"{path.name}: token list of {n_words} words needs {header_bytes} bytes "
                f"but the file has {file_size}"
            )
        kv_state_bytes = file_size - header_bytes
        if kv_state_bytes < _MIN_KV_STATE_BYTES:
            raise KvFileError(
                f"{path.name}: file ends after the token list: the KV state is missing"
            )
        raw = f.read(_WORD * n_words)
    if len(raw) != _WORD * n_words:  # file shrank between fstat and read
        raise KvFileError(f"{path.name}: truncated token list")

    tokens, n_media, layout = _parse_word_blob(path.name, raw)
    return KvFileHeader(
        version=version,
        n_tokens=len(tokens),
        tokens=tokens,
        header_bytes=header_bytes,
        kv_state_bytes=kv_state_bytes,
        n_media=n_media,
        blob_layout=layout,
    )


def _check_magic(path: Path, magic: int) -> None:
    if magic == LLAMA_STATE_SEQ_MAGIC:
        return
    if magic == LLAMA_SESSION_MAGIC:
        raise KvFileError(
            f"{path.name}: this is a whole-context session file ('ggsn'), not a slot save"
        )
    raise KvFileError(
        f"{path.name}: not a llama.cpp slot save file (magic {magic:#010x}, "
        f"expected {LLAMA_STATE_SEQ_MAGIC:#010x} 'ggsq')"
    )


def _parse_word_blob(name: str, raw: bytes) -> tuple[list[int], int, str]:
    """Split the word blob (``raw``, little-endian words) into (tokens, n_media, layout). See the
    module docstring."""
    words = from_le_i32(raw)
    if len(words) == 0 or words[0] != _BLOB_MARKER:
        # Older servers: the blob is the token list itself. Token ids are never
        # negative, so a negative word means the blob is damaged or of an unknown kind.
        if _any_negative(raw):
            raise KvFileError(f"{name}: token list holds a negative id {min(words)}")
        return words.tolist(), 0, "plain"

    if len(words) < _BLOB_FIXED_WORDS:
        raise KvFileError(
            f"{name}: token blob of {len(words)} words is shorter than its "
            f"{_BLOB_FIXED_WORDS}-word header"
        )
    blob_format = words[1] & 0xFFFFFFFF  # stored as u32
    if blob_format not in _BLOB_FORMATS:
        raise KvFileError(
            f"{name}: unknown token blob format {blob_format} "
            f"(this Slotkeeper reads {_describe(_BLOB_FORMATS)})"
        )
    n_tokens = words[2] & 0xFFFFFFFF
    # marker + format + n_tokens, then the tokens, then n_media.
    n_media_index = 3 + n_tokens
    if n_media_index >= len(words):
        raise KvFileError(
            f"{name}: token blob claims {n_tokens} tokens but holds only "
            f"{len(words) - _BLOB_FIXED_WORDS}"
        )
    n_media = words[n_media_index] & 0xFFFFFFFF
    trailing_words = len(words) - (n_media_index + 1)
    # Without media the blob must end exactly after n_media; anything else means we
    # misread the layout, and guessing would hand lineage a wrong token list.
    if n_media == 0 and trailing_words:
        raise KvFileError(
            f"{name}: token blob has {trailing_words} unexplained words after the tokens"
        )
    tokens = words[3:n_media_index]
    token_bytes = raw[_WORD * 3:_WORD * n_media_index]
    if n_media == 0:
        if _any_negative(token_bytes):
            raise KvFileError(f"{name}: token list holds a negative id but no media chunks")
        return tokens.tolist(), 0, "server"
    if not trailing_words:
        raise KvFileError(f"{name}: token blob lists {n_media} media chunks but holds no data")
    media = raw[_WORD * (n_media_index + 1):]
    return _with_media_ids(name, tokens, _count_negative(token_bytes), n_media, media), n_media, "server"


def _any_negative(le_words: bytes) -> bool:
    """Whether any of these little-endian i32 words is negative: a set top bit is a byte of
    0x80 or more in every fourth place, which ``isascii`` finds at C speed."""
    return not le_words[_WORD - 1::_WORD].isascii()


def _count_negative(le_words: bytes) -> int:
    top = le_words[_WORD - 1::_WORD]
    return len(top) - len(top.translate(None, _HIGH_BYTES))


def _with_media_ids(name: str, tokens: TokenArray, n_placeholders: int, n_media: int,
                    media: bytes) -> list[int]:
    """The token list with each media chunk's -1 run replaced by that chunk's pseudo-token.

    A media position is any negative word (``n_placeholders`` of them); every one of them
    must lie in the run of a chunk, the run that starts where the chunk says and goes on to the
    next non-negative word or the next chunk's start."""
    if n_media > len(tokens) or len(media) < _WORD * n_media:
        raise KvFileError(f"{name}: token blob lists {n_media} media chunks but has room for fewer")
    starts = struct.unpack_from(f"<{n_media}I", media)
    pos = _WORD * n_media
    chunks: list[bytes] = []
    for _ in range(n_media):
        if pos + _WORD > len(media):
            raise KvFileError(f"{name}: media chunk {len(chunks) + 1} of {n_media} is cut off")
        (size,) = _U32.unpack_from(media, pos)
        if size == 0 or pos + _WORD + size > len(media):
            raise KvFileError(f"{name}: media chunk {len(chunks) + 1} of {n_media} is cut off")
        chunks.append(media[pos + _WORD:pos + _WORD + size])
        pos += _WORD + size
    if len(media) - pos >= _WORD or any(media[pos:]):
        raise KvFileError(f"{name}: token blob has unexplained bytes after its media chunks")

    n = len(tokens)
    out = tokens.tolist()
    covered: dict[int, int] = {}  # run start -> run end; runs of distinct starts never overlap
    bounds = sorted({*starts, n})
    for k in sorted(range(n_media), key=starts.__getitem__):  # stable: equal starts in file order
        start = starts[k]
        if start >= n or tokens[start] >= 0:
            raise KvFileError(f"{name}: media chunk {k + 1} starts at {start}, not at a media position")
        nxt = bounds[bisect_right(bounds, start)]  # the next chunk's start, or the end
        end = start
        while end < nxt and tokens[end] < 0:
            end += 1
        out[start:end] = [_media_token(chunks[k])] * (end - start)
        covered[start] = end
    if sum(end - start for start, end in covered.items()) != n_placeholders:
        raise KvFileError(f"{name}: token list holds media positions no media chunk accounts for")
    return out


def _media_token(chunk: bytes) -> int:
    """A negative pseudo-token naming one media chunk (never -1, never a real token id)."""
    digest = int.from_bytes(hashlib.blake2b(chunk, digest_size=4).digest(), "little")
    return -2 - digest % (2**31 - 2)


def _describe(versions: frozenset[int]) -> str:
    return " or ".join(str(v) for v in sorted(versions))
