"""Reading token lists out of slot save files (synthetic files in the measured layout)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from slotkeeper.core.sessions.kvfile import (
    LLAMA_STATE_SEQ_MAGIC,
    KvFileError,
    KvFileHeader,
    is_slot_save_file,
    read_tokens,
)

FAKE_KV = b"\x01\x00\x00\x00" + b"kv-state" * 8


def _token_blob(
    tokens: list[int], n_media: int = 0, media_words: list[int] | None = None
) -> list[int]:
    # marker, format 1, n_tokens, tokens, n_media, [media data]
    return [-1, 1, len(tokens), *tokens, n_media, *(media_words or [])]


def _write_fake_save(
    path: Path,
    tokens: list[int],
    kv_payload: bytes = FAKE_KV,
    *,
    magic: int = LLAMA_STATE_SEQ_MAGIC,
    version: int = 4,
    words: list[int] | None = None,
    n_words: int | None = None,
) -> Path:
    """Write a file laid out like llama-server's slot save (see kvfile's docstring).

    ``words`` replaces the server token blob (to build odd layouts); ``n_words``
    overrides the declared blob length (to build lying headers).
    """
    blob = _token_blob(tokens) if words is None else words
    declared = len(blob) if n_words is None else n_words
    header = struct.pack("<III", magic, version, declared)
    path.write_bytes(header + struct.pack(f"<{len(blob)}i", *blob) + kv_payload)
    return path


def test_magic_is_stored_as_little_endian_u32(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1, 2, 3])
    # 'ggsq' written as a LE u32 puts the bytes in reverse on disk.
    assert path.read_bytes()[:4] == b"qsgg"


def test_reads_tokens_and_header_geometry(tmp_path: Path) -> None:
    tokens = [1, 151644, 882, 198, 0, 2**31 - 1]
    path = _write_fake_save(tmp_path / "a.kv", tokens)

    header = read_tokens(path)

    assert header == KvFileHeader(
        version=4,
        n_tokens=len(tokens),
        tokens=tokens,
        header_bytes=12 + 4 * (len(tokens) + 4),
        kv_state_bytes=len(FAKE_KV),
        n_media=0,
        blob_layout="server",
    )
    assert all(type(t) is int for t in header.tokens)
    assert path.read_bytes()[header.header_bytes :] == FAKE_KV


def test_empty_token_list(tmp_path: Path) -> None:
    header = read_tokens(_write_fake_save(tmp_path / "a.kv", []))
    assert header.tokens == [] and header.n_tokens == 0


def test_large_token_list(tmp_path: Path) -> None:
    tokens = list(range(130_000))
    header = read_tokens(_write_fake_save(tmp_path / "a.kv", tokens))
    assert header.tokens == tokens


def test_reads_the_plain_layout_of_older_servers(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[5, 6, 7])
    header = read_tokens(path)
    assert header.tokens == [5, 6, 7]
    assert header.blob_layout == "plain"
    assert header.header_bytes == 12 + 12


def _media_blob(tokens: list[int], chunks: list[tuple[int, bytes]]) -> list[int]:
    """The server layout with media: tokens (-1 at media positions), n_media, the starts,
    then each chunk as u32 size + bytes, padded with zeros to a whole word."""
    raw = struct.pack("<i2I", -1, 1, len(tokens)) + struct.pack(f"<{len(tokens)}i", *tokens)
    raw += struct.pack(f"<{1 + len(chunks)}I", len(chunks), *(start for start, _ in chunks))
    for _, data in chunks:
        raw += struct.pack("<I", len(data)) + data
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def test_media_positions_become_one_pseudo_token_per_chunk(tmp_path: Path) -> None:
    words = _media_blob([10, -1, -1, -1, 11, -1, -1, 12], [(1, b"image A, 3 bytes"), (5, b"image B!")])
    header = read_tokens(_write_fake_save(tmp_path / "a.kv", [], words=words))
    assert header.n_media == 2
    a, b = header.tokens[1], header.tokens[5]
    assert header.tokens == [10, a, a, a, 11, b, b, 12]
    assert a < -1 and b < -1 and a != b  # never a real id, never the bare placeholder
    assert header.text_tokens == [10, 11, 12]


def test_the_same_image_gives_the_same_pseudo_token_and_another_image_another(tmp_path: Path) -> None:
    one = read_tokens(_write_fake_save(tmp_path / "1.kv", [],
                                       words=_media_blob([5, -1, -1], [(1, b"sha-one")])))
    same = read_tokens(_write_fake_save(tmp_path / "2.kv", [],
                                        words=_media_blob([5, -1, -1], [(1, b"sha-one")])))
    other = read_tokens(_write_fake_save(tmp_path / "3.kv", [],
                                         words=_media_blob([5, -1, -1], [(1, b"sha-two")])))
    assert one.tokens == same.tokens
    assert one.tokens != other.tokens


def test_adjacent_media_chunks_are_told_apart(tmp_path: Path) -> None:
    words = _media_blob([-1, -1, -1, -1], [(0, b"first"), (2, b"second")])
    tokens = read_tokens(_write_fake_save(tmp_path / "a.kv", [], words=words)).tokens
    assert tokens[0] == tokens[1] != tokens[2] == tokens[3]


@pytest.mark.parametrize(
    ("tokens", "chunks", "message"),
    [
        ([1, -1, -1], [(0, b"x")], "starts at 0, not at a media position"),
        ([1, -1, 2, -1], [(1, b"x")], "media positions no media chunk accounts for"),
        ([1, -1], [(1, b"x"), (1, b"y"), (1, b"z")], "has room for fewer"),
    ],
)
def test_media_that_does_not_add_up_is_refused(
    tmp_path: Path, tokens: list[int], chunks: list[tuple[int, bytes]], message: str
) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=_media_blob(tokens, chunks))
    with pytest.raises(KvFileError, match=message):
        read_tokens(path)


def test_a_cut_off_media_chunk_is_refused(tmp_path: Path) -> None:
    words = _media_blob([1, -1], [(1, b"a long chunk of media bytes")])
    path = _write_fake_save(tmp_path / "a.kv", [], words=words[:-3])
    with pytest.raises(KvFileError, match="cut off"):
        read_tokens(path)


def test_bytes_after_the_media_chunks_are_refused(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[*_media_blob([1, -1], [(1, b"abcd")]), 7])
    with pytest.raises(KvFileError, match="unexplained bytes after its media"):
        read_tokens(path)


def test_negative_ids_without_media_are_refused(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1, -1, 2])
    with pytest.raises(KvFileError, match="negative id but no media"):
        read_tokens(path)


def test_path_may_be_a_string(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [7])
    assert read_tokens(str(path)).tokens == [7]


@pytest.mark.parametrize(
    ("magic", "message"),
    [
        (0x12345678, "not a llama.cpp slot save file"),
        (0x6767736E, "whole-context session file"),
        (struct.unpack("<I", struct.pack(">I", LLAMA_STATE_SEQ_MAGIC))[0], "not a llama.cpp"),
    ],
)
def test_bad_magic(tmp_path: Path, magic: int, message: str) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1], magic=magic)
    with pytest.raises(KvFileError, match=message):
        read_tokens(path)
    assert not is_slot_save_file(path)


@pytest.mark.parametrize("version", [1, 2, 3, 5])
def test_wrong_version(tmp_path: Path, version: int) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1], version=version)
    with pytest.raises(KvFileError, match=f"unsupported slot save version {version}"):
        read_tokens(path)


@pytest.mark.parametrize("size", [0, 1, 4, 11])
def test_truncated_header(tmp_path: Path, size: int) -> None:
    full = _write_fake_save(tmp_path / "full.kv", [1, 2]).read_bytes()
    path = tmp_path / "a.kv"
    path.write_bytes(full[:size])
    with pytest.raises(KvFileError, match="truncated header"):
        read_tokens(path)


def test_n_words_larger_than_the_file(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1, 2], kv_payload=b"", n_words=0xFFFFFFFF)
    with pytest.raises(KvFileError, match="4294967295 words"):
        read_tokens(path)


def test_file_ending_inside_the_token_list(tmp_path: Path) -> None:
    full = _write_fake_save(tmp_path / "full.kv", list(range(100))).read_bytes()
    path = tmp_path / "a.kv"
    path.write_bytes(full[:200])
    with pytest.raises(KvFileError, match="needs .* bytes but the file has 200"):
        read_tokens(path)


def test_file_ending_right_after_the_token_list(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [1, 2, 3], kv_payload=b"")
    with pytest.raises(KvFileError, match="KV state is missing"):
        read_tokens(path)


def test_n_tokens_beyond_the_blob(tmp_path: Path) -> None:
    words = [-1, 1, 1000, 5, 6, 0]
    path = _write_fake_save(tmp_path / "a.kv", [], words=words)
    with pytest.raises(KvFileError, match="claims 1000 tokens but holds only 2"):
        read_tokens(path)


def test_n_tokens_huge_does_not_allocate(tmp_path: Path) -> None:
    words = [-1, 1, -1, 0]  # n_tokens = 0xFFFFFFFF as u32
    path = _write_fake_save(tmp_path / "a.kv", [], words=words)
    with pytest.raises(KvFileError, match="claims 4294967295 tokens"):
        read_tokens(path)


def test_unknown_blob_format(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[-1, 2, 1, 5, 0])
    with pytest.raises(KvFileError, match="unknown token blob format 2"):
        read_tokens(path)


def test_blob_shorter_than_its_header(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[-1, 1])
    with pytest.raises(KvFileError, match="shorter than its 4-word header"):
        read_tokens(path)


def test_unexplained_words_after_the_tokens(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[*_token_blob([1, 2]), 99])
    with pytest.raises(KvFileError, match="1 unexplained words"):
        read_tokens(path)


def test_media_count_without_media_data(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=_token_blob([1], n_media=2))
    with pytest.raises(KvFileError, match="2 media chunks but holds no data"):
        read_tokens(path)


def test_plain_layout_rejects_negative_ids(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "a.kv", [], words=[5, -7, 6])
    with pytest.raises(KvFileError, match="negative id -7"):
        read_tokens(path)


def test_error_names_the_file(tmp_path: Path) -> None:
    path = _write_fake_save(tmp_path / "my-session.kv", [1], version=9)
    with pytest.raises(KvFileError, match="^my-session.kv: "):
        read_tokens(path)


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_tokens(tmp_path / "nope.kv")


def test_is_slot_save_file(tmp_path: Path) -> None:
    assert is_slot_save_file(_write_fake_save(tmp_path / "a.kv", [1]))
    # Only the magic is checked: a file with a bad version still "looks like" one.
    assert is_slot_save_file(_write_fake_save(tmp_path / "b.kv", [1], version=9))
    (tmp_path / "short").write_bytes(b"qsg")
    assert not is_slot_save_file(tmp_path / "short")
    (tmp_path / "json").write_text("{}")
    assert not is_slot_save_file(tmp_path / "json")
    assert not is_slot_save_file(tmp_path / "missing")
    assert not is_slot_save_file(tmp_path)  # a directory
