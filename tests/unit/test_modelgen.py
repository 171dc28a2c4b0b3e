"""The random-weight GGUF generator: deterministic bytes, sensible facts, atomic writes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import gguf
import pytest

from slotkeeper.core.model import modelgen
from slotkeeper.core.model.gguf_info import read_model_info
from slotkeeper.core.model.gguf_memory import kv_estimate
from slotkeeper.core.model.modelgen import DEMO_FILENAME, write_model


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_kind_and_seed_give_identical_bytes(tmp_path: Path) -> None:
    a = write_model(tmp_path / "a.gguf", "llama", seed=7)
    b = write_model(tmp_path / "b.gguf", "llama", seed=7)
    assert a.read_bytes() == b.read_bytes()


def test_seed_and_kind_change_the_weights(tmp_path: Path) -> None:
    hashes = {
        sha(write_model(tmp_path / "l0.gguf", "llama", seed=0)),
        sha(write_model(tmp_path / "l1.gguf", "llama", seed=1)),
        sha(write_model(tmp_path / "alt.gguf", "llama-alt", seed=0)),
        sha(write_model(tmp_path / "g2.gguf", "gemma2", seed=0)),
    }
    assert len(hashes) == 4


def test_demo_is_the_llama_kind(tmp_path: Path) -> None:
    demo = write_model(tmp_path / "demo.gguf", "demo")
    llama = write_model(tmp_path / "llama.gguf", "llama")
    assert demo.read_bytes() == llama.read_bytes()


def test_llama_alt_has_the_same_shape(tmp_path: Path) -> None:
    a = read_model_info(write_model(tmp_path / "a.gguf", "llama"))
    b = read_model_info(write_model(tmp_path / "b.gguf", "llama-alt"))
    shape = lambda i: (i.arch, i.n_layers, i.n_embd, i.n_head, i.n_head_kv, i.context_length)
    assert shape(a) == shape(b)
    assert kv_estimate(a, 4096).bytes_full == kv_estimate(b, 4096).bytes_full


def test_llama_facts(tmp_path: Path) -> None:
    info = read_model_info(write_model(tmp_path / "llama.gguf", "llama"))
    assert info.arch == "llama"
    assert info.name == "Slotkeeper demo (random weights)"
    assert (info.n_layers, info.n_embd, info.n_head, info.n_head_kv) == (4, 128, 4, 2)
    assert (info.head_dim_k, info.head_dim_v) == (32, 32)
    assert info.context_length == 8192
    assert not info.has_swa
    assert 1_000_000 < info.file_size < 3_000_000


def test_gemma2_facts(tmp_path: Path) -> None:
    info = read_model_info(write_model(tmp_path / "gemma2.gguf", "gemma2"))
    assert info.arch == "gemma2"
    assert info.has_swa
    assert info.sliding_window == 128
    assert info.swa_layers == (True, False, True, False)
    assert info.context_length == 8192
    est = kv_estimate(info, 4096)
    assert est.bytes_swa < est.bytes_full


def test_gemma2_tensors_and_keys(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_model(tmp_path / "gemma2.gguf", "gemma2"))
    names = {t.name for t in reader.tensors}
    assert "output.weight" not in names  # llama.cpp's gemma2 loader refuses it
    for il in range(4):
        assert f"blk.{il}.post_attention_norm.weight" in names
        assert f"blk.{il}.post_ffw_norm.weight" in names
    assert reader.fields["gemma2.attn_logit_softcapping"].contents() == 50.0
    assert reader.fields["gemma2.final_logit_softcapping"].contents() == 30.0


def test_tokenizer(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_model(tmp_path / "llama.gguf", "llama"))
    field = lambda key: reader.fields[key].contents()
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    assert field("tokenizer.ggml.model") == "llama"
    assert len(tokens) == len(types) == len(field("tokenizer.ggml.scores"))
    assert len(tokens) == len(set(tokens))
    assert tokens[:5] == ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    assert types[:5] == [2, 3, 3, 3, 3]
    assert all(f"<0x{b:02X}>" in tokens for b in range(256))
    assert types[tokens.index("<0x0A>")] == 6
    # SPM reaches a whole word only through its prefixes.
    for word in ("\u2581hello", "\u2581restore", "\u2581the"):
        assert all(word[:n] in tokens for n in range(1, len(word) + 1)), word
    assert tokens[field("tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[field("tokenizer.ggml.bos_token_id")] == "<s>"
    template = field("tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template


def test_bench_shape_without_writing_it() -> None:
    # The bench model is ~190 MB; its shape is checked here and the file in e2e/bench runs.
    bench = modelgen._KINDS["bench"]
    assert (bench.n_layers, bench.n_embd, bench.n_head, bench.n_head_kv, bench.n_ff) == (
        8,
        1024,
        16,
        8,
        2816,
    )
    assert bench.context_length == 16384


def test_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gemma2"):
        write_model(tmp_path / "x.gguf", "mystery")
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.gguf"
    target.write_bytes(b"previous model")

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        write_model(target, "llama")
    assert target.read_bytes() == b"previous model"  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no partial file left


def test_written_file_has_normal_permissions(tmp_path: Path) -> None:
    path = write_model(tmp_path / "m.gguf", "llama")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_the_demo_kind_is_a_small_llama_the_tests_use(tmp_path: Path) -> None:
    path = write_model(tmp_path / DEMO_FILENAME, "demo", seed=0)
    assert (read_model_info(path).name == "Slotkeeper demo (random weights)"
            and read_model_info(path).arch == "llama")


@pytest.mark.parametrize(
    ("kind", "family", "slides", "kv_layers", "recurrent"),
    [
        ("qwen3", "full attention", [], [0, 1, 2, 3], []),
        ("gemma3", "sliding window", [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], []),
        ("gpt-oss", "sliding window", [0, 2], [0, 1, 2, 3], []),
        ("qwen35", "hybrid", [], [3], [0, 1, 2]),
    ],
)
def test_family_kinds(tmp_path: Path, kind: str, family: str, slides: list[int], kv_layers: list[int],
                      recurrent: list[int]) -> None:
    path = write_model(tmp_path / f"{kind}.gguf", kind, seed=3)
    assert path.read_bytes() == write_model(tmp_path / "again.gguf", kind, seed=3).read_bytes()
    info = read_model_info(path)
    assert info.family == family and info.context_length == 2048
    assert [il for il in range(info.n_layers) if info.layer_slides(il)] == slides
    assert [il for il in range(info.n_layers) if info.layer_has_kv(il)] == kv_layers
    assert [il for il, r in enumerate(info.recurrent_layers) if r] == recurrent
    assert info.file_size < 4_000_000
    if kind == "gpt-oss":
        assert (info.n_expert, info.n_expert_used) == (4, 2)
