"""The pure-Python GGUF header reader against gguf-py's GGUFReader, and against damaged files.

The tests may import gguf and numpy (to write models and to read them the stock way); the app's
reader must not, which the subprocess test at the end checks.
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import slotkeeper
from projgen import write_projector
from slotkeeper.core.model import gguf_header
from slotkeeper.core.model.gguf_header import SKIP_ARRAY_LEN, read_header
from slotkeeper.core.model.gguf_info import ModelFileError, read_architecture, read_model_info
from slotkeeper.core.model.modelgen import MODEL_KINDS, write_model

# -- helpers ----------------------------------------------------------------------------


def stock_fields(path: Path) -> dict[str, Any]:
    """What GGUFReader reads, with the long arrays our reader skips turned into empty lists."""
    reader = gguf.GGUFReader(path)
    out = {}
    for key, fld in reader.fields.items():
        value = fld.contents()
        out[key] = [] if isinstance(value, list) and len(value) > SKIP_ARRAY_LEN else value
    return out


def assert_same_values(ours: Any, stock: Any, where: str = "") -> None:
    """Equal, and of the same Python types all the way down (True == 1, but a bool is no int)."""
    assert type(ours) is type(stock), f"{where}: {type(ours).__name__} != {type(stock).__name__}"
    if isinstance(stock, list):
        assert len(ours) == len(stock), where
        for i, (a, b) in enumerate(zip(ours, stock)):
            assert_same_values(a, b, f"{where}[{i}]")
    else:
        assert ours == stock, where


def assert_matches_stock_reader(path: Path) -> None:
    header = read_header(path)
    stock = stock_fields(path)
    assert list(header.fields) == list(stock)
    for key, value in stock.items():
        assert_same_values(header.fields[key], value, key)
    reader = gguf.GGUFReader(path)
    assert header.data_offset == reader.data_offset
    assert header.alignment == reader.alignment
    assert len(header.tensors) == len(reader.tensors)
    for ours, theirs in zip(header.tensors, reader.tensors):
        assert ours.name == theirs.name
        assert list(ours.dims) == [int(d) for d in theirs.shape]
        assert ours.ggml_type == int(theirs.tensor_type)
        assert header.data_offset + ours.offset == theirs.data_offset
        assert ours.n_bytes == theirs.n_bytes


def write_gguf(path: Path, fill: Callable[[gguf.GGUFWriter], None], arch: str = "llama",
               **kwargs: Any) -> Path:
    writer = gguf.GGUFWriter(path, arch, **kwargs)
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Hand-built headers, for what no writer produces.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gstr(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def arr(itype: int, count: int, payload: bytes) -> bytes:
    return struct.pack("<IQ", itype, count) + payload


def tensor(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def raw_gguf(path: Path, kvs: list[bytes], tensors: list[bytes] = (), data: bytes = b"",
             n_kv: int | None = None, n_tensors: int | None = None) -> Path:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    path.write_bytes(body + data)
    return path


ARCH = kv("general.architecture", STR, gstr("llama"))


def modelgen_file(tmp_path: Path, kind: str = "llama") -> Path:
    return write_model(tmp_path / f"{kind}.gguf", kind)


@functools.lru_cache(maxsize=8)
def offsets_of(path: Path) -> dict[str, int]:
    """Where things are in a GGUFReader's view of the file: each field's start, tensor infos, data."""
    reader = gguf.GGUFReader(path)
    out = {key: fld.offset for key, fld in reader.fields.items()}
    out["<tensor infos>"] = reader.tensors[0].field.offset
    out["<data>"] = reader.data_offset
    return out


def expect_error(path: Path, word: str | tuple[str, ...], seconds: float = 2.0) -> str:
    start = time.perf_counter()
    with pytest.raises(ModelFileError) as err:
        read_model_info(path)
    assert time.perf_counter() - start < seconds
    message = str(err.value)
    assert path.name in message
    words = (word,) if isinstance(word, str) else word
    assert any(w in message for w in words), message
    return message


# -- the same values as GGUFReader ------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    folder = tmp_path_factory.mktemp("kinds")
    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = write_model(folder / f"{kind}.gguf", kind)
        return cache[kind]

    return get


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_generated_model_reads_as_the_stock_reader_reads_it(generated, kind: str) -> None:
    assert_matches_stock_reader(generated(kind))


def test_a_projector_reads_as_the_stock_reader_reads_it(tmp_path: Path) -> None:
    path = write_projector(tmp_path / "mmproj.gguf", 128)
    assert_matches_stock_reader(path)
    assert read_architecture(path) == "clip"


def every_value_type(writer: gguf.GGUFWriter) -> None:
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)  # comes back as float32's 0.1, as numpy gives it
    writer.add_uint64("t.u64", 2**64 - 1)
    writer.add_int64("t.i64", -(2**63))
    writer.add_float64("t.f64", 1e300)
    writer.add_bool("t.true", True)
    writer.add_bool("t.false", False)
    writer.add_string("t.str", "héllo ▁wörld")
    writer.add_string("t.empty_str", "")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.floats", [0.5, 0.25, 1e-3])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strs", ["a", "", "ü"])
    writer.add_array("t.nested", [[1, 2], [3, 4, 5]])  # the stock reader flattens nested arrays
    writer.add_array("t.nested_strs", [["a", "b"], ["c"]])
    writer.add_array("t.empty", [])
    writer.add_array("t.at_limit", list(range(SKIP_ARRAY_LEN)))
    writer.add_array("t.long_ints", list(range(SKIP_ARRAY_LEN + 1)))
    writer.add_array("t.long_floats", [0.5] * 1000)
    writer.add_array("t.long_strs", [f"s{i}" for i in range(1000)])
    writer.add_array("t.long_nested", [[i, i] for i in range(SKIP_ARRAY_LEN + 1)])
    writer.add_uint32("general.alignment", 64)
    writer.add_tensor("a", np.zeros((3, 5), dtype=np.float32))
    writer.add_tensor("b", np.zeros(7, dtype=np.float16))
    writer.add_tensor("q", np.zeros((2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def test_every_value_type_reads_as_the_stock_reader_reads_it(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "types.gguf", every_value_type)
    assert_matches_stock_reader(path)
    header = read_header(path)
    assert header.alignment == 64 and header.data_offset % 64 == 0
    assert header.fields["t.at_limit"] == list(range(SKIP_ARRAY_LEN))  # parsed
    assert header.fields["t.long_ints"] == [] and header.fields["t.long_strs"] == []  # skipped
    assert header.fields["t.long_nested"] == []
    assert header.fields["t.nested"] == [1, 2, 3, 4, 5]
    assert [t.n_bytes for t in header.tensors] == [60, 14, 68]


def test_a_big_endian_file_reads_as_the_stock_reader_reads_it(tmp_path: Path) -> None:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_block_count(2)
        writer.add_embedding_length(64)
        writer.add_head_count(4)
        writer.add_array("llama.attention.head_count_kv", [2, 1])
        writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        writer.add_token_list([f"t{i}" for i in range(600)])
        writer.add_tensor("a", np.zeros((4, 32), dtype=np.float32))

    path = write_gguf(tmp_path / "be.gguf", fill, endianess=gguf.GGUFEndian.BIG)
    assert read_header(path).big_endian
    assert_matches_stock_reader(path)
    info = read_model_info(path)
    assert (info.n_layers, info.n_embd, info.n_head_kv_per_layer) == (2, 64, (2, 1))


# -- damaged files ----------------------------------------------------------------------


def places(path: Path) -> dict[str, int]:
    """Byte positions to cut a generated model at, each inside a different part of the file."""
    at = offsets_of(path)
    size = path.stat().st_size
    return {
        "in the first key": 24 + 5,
        "in general.name's value": at["general.name"] + 30,
        "in the vocabulary": at["tokenizer.ggml.tokens"] + 2000,
        "in the scores": at["tokenizer.ggml.scores"] + 100,
        "in the tensor infos": at["<tensor infos>"] + 50,
        "at the data": at["<data>"],
        "in the data": (at["<data>"] + size) // 2,
        "one byte short": size - 1,
    }


@pytest.mark.parametrize("where", ["in the first key", "in general.name's value", "in the vocabulary",
                                   "in the scores", "in the tensor infos", "at the data", "in the data",
                                   "one byte short"])
def test_truncated_anywhere_is_truncated(tmp_path: Path, generated, where: str) -> None:
    source = generated("llama")
    cut = places(source)[where]
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:cut])
    message = expect_error(path, "is truncated")
    assert "Download the model again" in message


def patched(tmp_path: Path, source: Path, at: int, fmt: str, value: int, name: str = "bad.gguf") -> Path:
    data = bytearray(source.read_bytes())
    struct.pack_into(fmt, data, at, value)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("count", [2**64 - 1, 2**63, 2**32, 1 << 17, 10_000])
@pytest.mark.parametrize("which", ["tensor", "kv"])
def test_a_garbage_count_fails_fast(tmp_path: Path, generated, which: str, count: int) -> None:
    path = patched(tmp_path, generated("llama"), 8 if which == "tensor" else 16, "<Q", count)
    expect_error(path, ("is truncated", "is corrupt"), seconds=1.0)


@pytest.mark.parametrize("which", ["tensor", "kv"])
def test_a_count_one_too_many_fails(tmp_path: Path, generated, which: str) -> None:
    source = generated("llama")
    real = struct.unpack_from("<Q", source.read_bytes(), 8 if which == "tensor" else 16)[0]
    path = patched(tmp_path, source, 8 if which == "tensor" else 16, "<Q", real + 1)
    expect_error(path, ("is truncated", "is corrupt"))


@pytest.mark.parametrize("length", [2**64 - 1, 2**40, SKIP_ARRAY_LEN + 1, SKIP_ARRAY_LEN])
@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.scores"])
def test_a_huge_array_length_fails_fast(tmp_path: Path, generated, key: str, length: int) -> None:
    source = generated("llama")
    start = offsets_of(source)[key]
    count_at = start + 8 + len(key) + 4 + 4  # key, value type ARRAY, item type
    real = struct.unpack_from("<Q", source.read_bytes(), count_at)[0]
    assert real > SKIP_ARRAY_LEN
    path = patched(tmp_path, source, count_at, "<Q", length)
    if length >= 2**40:
        expect_error(path, "is truncated", seconds=1.0)
    else:  # shorter than it says: what follows is read as keys, and makes no sense
        expect_error(path, ("is truncated", "is corrupt"), seconds=1.0)


@pytest.mark.parametrize("extra", [1, 1000, 2**40, 2**64])
def test_a_string_length_beyond_the_file_is_truncated(tmp_path: Path, generated, extra: int) -> None:
    source = generated("llama")
    name_at = offsets_of(source)["general.name"]
    length_at = name_at + 8 + len("general.name") + 4
    length = min(source.stat().st_size - length_at + extra, 2**64 - 1)
    path = patched(tmp_path, source, length_at, "<Q", length)
    expect_error(path, "is truncated", seconds=1.0)


def test_a_key_length_beyond_the_file_is_truncated(tmp_path: Path, generated) -> None:
    path = patched(tmp_path, generated("llama"), 24, "<Q", 2**62)
    expect_error(path, "is truncated", seconds=1.0)


def test_a_header_that_cannot_be_sized_is_corrupt(tmp_path: Path) -> None:
    cases = {
        "unknown value type": [ARCH, kv("x", 13, b"\0" * 8)],
        "unknown item type in a long array": [ARCH, kv("x", ARR, arr(77, 600, b"\0" * 8))],
        "duplicate key": [ARCH, kv("x", U8, b"\1"), kv("x", U8, b"\2")],
        "duplicate of GGUF.version": [ARCH, kv("GGUF.version", U32, b"\3\0\0\0")],
        "alignment not a uint32": [ARCH, kv("general.alignment", U64, struct.pack("<Q", 32))],
        "alignment not a power of two": [ARCH, kv("general.alignment", U32, struct.pack("<I", 48))],
        "key not UTF-8": [ARCH, kv(b"\xff\xfe", U8, b"\1")],
        "arrays nested too deep": [ARCH, kv("x", ARR, arr(ARR, 1, arr(ARR, 1, arr(ARR, 1, arr(ARR, 1, arr(
            ARR, 1, arr(ARR, 1, arr(ARR, 1, arr(ARR, 1, arr(U8, 1, b"\1"))))))))))],
    }
    for what, kvs in cases.items():
        path = raw_gguf(tmp_path / "bad.gguf", kvs, data=b"\0" * 64)
        assert "is corrupt: its GGUF header could not be parsed" in expect_error(path, "is corrupt"), what


def test_a_tensor_that_cannot_be_sized_is_corrupt(tmp_path: Path) -> None:
    cases = {
        "unknown ggml type": [tensor("a", (4,), 42, 0)],  # Q2_0: newer than gguf-py 0.19's table
        "five dimensions": [tensor("a", (1, 1, 1, 1, 1), 0, 0)],
        "rows not whole blocks": [tensor("a", (33, 1), 8, 0)],  # Q8_0 blocks hold 32
        "duplicate name": [tensor("a", (4,), 0, 0), tensor("a", (4,), 0, 32)],
    }
    for what, tensors in cases.items():
        path = raw_gguf(tmp_path / "bad.gguf", [ARCH], tensors, data=b"\0" * 256)
        assert "is corrupt" in expect_error(path, "is corrupt"), what


def test_tensor_data_past_the_end_is_truncated(tmp_path: Path) -> None:
    ok = raw_gguf(tmp_path / "ok.gguf", [ARCH], [tensor("a", (8, 4), 0, 0)], data=b"\0" * 128)
    assert read_header(ok).tensors[0].n_bytes == 128
    short = raw_gguf(tmp_path / "short.gguf", [ARCH], [tensor("a", (8, 4), 0, 0)], data=b"\0" * 127)
    expect_error(short, "is truncated")
    far = raw_gguf(tmp_path / "far.gguf", [ARCH], [tensor("a", (2**62, 2**62), 0, 2**63)], data=b"\0" * 128)
    expect_error(far, "is truncated")


def test_an_undecodable_value_spoils_only_its_key(tmp_path: Path) -> None:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_name("Xname")
        writer.add_string("general.description", "Ydesc")
        writer.add_block_count(1)
        writer.add_embedding_length(64)
        writer.add_head_count(2)

    source = write_gguf(tmp_path / "src.gguf", fill)
    data = source.read_bytes()
    other = tmp_path / "other.gguf"
    other.write_bytes(data.replace(b"Ydesc", b"\xffdesc"))
    assert read_header(other).fields["general.description"] is gguf_header.UNREADABLE
    assert read_model_info(other).name == "Xname"  # the file still opens
    named = tmp_path / "named.gguf"
    named.write_bytes(data.replace(b"Xname", b"\xffname"))
    expect_error(named, "metadata key general.name is unreadable")


def test_caps_bound_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real caps need files of hundreds of MB to reach; smaller ones show that they hold.
    path = write_gguf(tmp_path / "vocab.gguf", lambda w: w.add_token_list([f"t{i}" for i in range(3000)]))
    assert read_header(path).fields["tokenizer.ggml.tokens"] == []
    monkeypatch.setattr(gguf_header, "_MAX_WALK", 2000)
    with pytest.raises(gguf_header.CorruptHeader, match="too many"):
        read_header(path)
    monkeypatch.setattr(gguf_header, "_MAX_VALUES", 10)
    many = raw_gguf(tmp_path / "many.gguf",
                    [ARCH] + [kv(f"k{i}", ARR, arr(U8, 4, b"\1" * 4)) for i in range(3)])
    with pytest.raises(gguf_header.CorruptHeader, match="too many"):
        read_header(many)
    # A value past the text budget is stepped over (the key reads as unreadable); a name is not.
    monkeypatch.setattr(gguf_header, "_MAX_TEXT", 4)
    long_value = raw_gguf(tmp_path / "long.gguf", [kv("a", STR, gstr("llama")), kv("b", U8, b"\1")])
    assert read_header(long_value).fields == {"GGUF.version": 3, "GGUF.tensor_count": 0, "GGUF.kv_count": 2,
                                              "a": gguf_header.UNREADABLE, "b": 1}
    with pytest.raises(gguf_header.CorruptHeader, match="bytes of text"):
        read_header(many)
    monkeypatch.setattr(gguf_header, "_MAX_KV", 1)
    with pytest.raises(gguf_header.CorruptHeader, match="2 metadata keys"):
        read_header(long_value)


def test_zeros_after_a_valid_start_fail_fast(tmp_path: Path) -> None:
    # A file whose header was zeroed (a sparse file, a failed copy): empty keys repeat.
    path = tmp_path / "zeros.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 5, 1000) + b"\0" * (1 << 20))
    expect_error(path, "is corrupt", seconds=1.0)
    with pytest.raises(gguf_header.CorruptHeader, match="duplicate metadata key"):
        read_header(path)


# -- no gguf, no numpy ------------------------------------------------------------------


def test_reading_model_facts_imports_neither_gguf_nor_numpy(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m.gguf", "gemma3")
    projector = write_projector(tmp_path / "p.gguf", 128)
    code = (
        "import sys\n"
        "import slotkeeper.core.model.gguf_info as g\n"
        f"info = g.read_model_info({str(model)!r})\n"
        "assert info.n_swa_layers == 5, info\n"
        f"assert g.read_architecture({str(projector)!r}) == 'clip'\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('gguf', 'numpy'))\n"
        "print(' '.join(heavy))\n"
    )
    app_dir = Path(slotkeeper.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"


def test_only_writing_the_demo_model_imports_gguf() -> None:
    # modelgen (gguf + numpy) is imported where the demo model is written, not to name it.
    modules = ["slotkeeper.core.engine", "slotkeeper.cli.commands", "slotkeeper.cli.run"]
    try:
        import PySide6  # noqa: F401
    except ImportError:  # a core-only install: no GUI to check
        pass
    else:
        modules += ["slotkeeper.gui.bridge", "slotkeeper.gui.first_run", "slotkeeper.gui.model_switch",
                    "slotkeeper.gui.settings.server_tab"]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'gguf' in sys.modules or 'slotkeeper.core.model.modelgen' in sys.modules:\n"
        "        print(name)\n"
        "        break\n"
    )
    app_dir = Path(slotkeeper.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")]),
           "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing {out.stdout.strip()} imported gguf"
