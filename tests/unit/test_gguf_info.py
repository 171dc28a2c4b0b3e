"""GGUF metadata -> model facts -> KV-cache bytes, checked against llama.cpp's own arithmetic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from slotkeeper.core.basics.units import human_bytes, parse_size
from slotkeeper.core.model.gguf_info import (
    ModelFileError,
    ModelInfo,
    read_model_info,
    swa_pattern_layers,
)
from slotkeeper.core.model.gguf_memory import CACHE_TYPES, kv_estimate
from slotkeeper.core.model.gguf_text import format_model_info, model_info_json

MiB = 1024 * 1024


def write_meta_gguf(
    path: Path,
    arch: str,
    *,
    n_layers: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int | list[int],
    context_length: int = 8192,
    key_length: int | None = None,
    value_length: int | None = None,
    sliding_window: int | None = None,
    pattern: int | list[bool] | None = None,
    name: str | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """A GGUF with metadata only (no tensors): all read_model_info needs."""
    writer = gguf.GGUFWriter(path, arch)
    if name:
        writer.add_name(name)
    writer.add_block_count(n_layers)
    writer.add_embedding_length(n_embd)
    writer.add_context_length(context_length)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    if key_length is not None:
        writer.add_key_length(key_length)
    if value_length is not None:
        writer.add_value_length(value_length)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    if pattern is not None:
        writer.add_sliding_window_pattern(pattern)
    if extra is not None:
        extra(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def gpt_oss(tmp_path: Path) -> ModelInfo:
    # gpt-oss-20b's attention shape: 24 layers, 64 query / 8 KV heads of dim 64, window 128.
    path = write_meta_gguf(
        tmp_path / "gpt-oss-like.gguf",
        "gpt-oss",
        n_layers=24,
        n_embd=2880,
        n_head=64,
        n_head_kv=8,
        context_length=131072,
        key_length=64,
        value_length=64,
        sliding_window=128,
        name="gpt-oss-like",
    )
    return read_model_info(path)


def mib(n: int) -> int:
    return round(n / MiB)


# -- facts ------------------------------------------------------------------------------


def test_gpt_oss_facts(gpt_oss: ModelInfo) -> None:
    assert gpt_oss.arch == "gpt-oss"
    assert gpt_oss.name == "gpt-oss-like"
    assert (gpt_oss.n_layers, gpt_oss.n_head, gpt_oss.n_head_kv) == (24, 64, 8)
    assert (gpt_oss.head_dim_k, gpt_oss.head_dim_v) == (64, 64)
    assert gpt_oss.context_length == 131072
    assert gpt_oss.sliding_window == 128
    assert gpt_oss.has_swa
    assert gpt_oss.n_swa_layers == 12
    assert gpt_oss.swa_layers == tuple(il % 2 == 0 for il in range(24))  # even layers slide


@pytest.mark.parametrize(
    ("n_ctx", "full_mib", "default_mib"),
    [(4096, 192, 114), (32768, 1536, 786), (131072, 6144, 3090)],
)
def test_gpt_oss_worked_example(
    gpt_oss: ModelInfo, n_ctx: int, full_mib: int, default_mib: int
) -> None:
    est = kv_estimate(gpt_oss, n_ctx)
    assert mib(est.bytes_full) == full_mib
    assert mib(est.bytes_swa) == default_mib
    assert est.per_token_full == est.bytes_full / n_ctx
    assert est.per_token_swa == est.bytes_swa / n_ctx
    assert est.saving_ratio == pytest.approx(est.bytes_full / est.bytes_swa)
    assert est.swa_full_extra_bytes == est.bytes_full - est.bytes_swa


def test_gemma2_default_pattern_and_window(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "g2.gguf",
        "gemma2",
        n_layers=26,
        n_embd=2304,
        n_head=8,
        n_head_kv=4,
        key_length=256,
        value_length=256,
    )
    info = read_model_info(path)
    assert info.has_swa
    assert info.sliding_window == 4096  # llama.cpp's gemma2 default when the key is absent
    assert info.swa_layers == tuple(il % 2 == 0 for il in range(26))


def test_gemma3_five_of_six_slide(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "g3.gguf",
        "gemma3",
        n_layers=12,
        n_embd=1152,
        n_head=4,
        n_head_kv=1,
        key_length=256,
        value_length=256,
        sliding_window=512,
    )
    info = read_model_info(path)
    assert info.has_swa and info.sliding_window == 512
    assert [il for il, s in enumerate(info.swa_layers) if not s] == [5, 11]
    assert info.n_swa_layers == 10


def test_gemma3_without_window_is_full_attention(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "g3.gguf", "gemma3", n_layers=6, n_embd=1152, n_head=4, n_head_kv=1
    )
    info = read_model_info(path)
    assert not info.has_swa
    est = kv_estimate(info, 4096)
    assert est.bytes_swa == est.bytes_full


def test_explicit_int_pattern_overrides_default(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "g3.gguf",
        "gemma3",
        n_layers=8,
        n_embd=512,
        n_head=4,
        n_head_kv=2,
        sliding_window=256,
        pattern=4,
    )
    info = read_model_info(path)
    assert info.swa_layers == (True, True, True, False, True, True, True, False)


def test_explicit_bool_array_pattern(tmp_path: Path) -> None:
    flags = [False, True, True, False, True, False]
    path = write_meta_gguf(
        tmp_path / "c2.gguf",
        "cohere2",
        n_layers=6,
        n_embd=512,
        n_head=4,
        n_head_kv=2,
        sliding_window=4096,
        pattern=flags,
    )
    info = read_model_info(path)
    assert info.swa_layers == tuple(flags)
    assert info.n_swa_layers == 3


def test_cohere2_default_three_of_four(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "c2.gguf",
        "cohere2",
        n_layers=8,
        n_embd=512,
        n_head=4,
        n_head_kv=2,
        sliding_window=4096,
    )
    assert read_model_info(path).swa_layers == swa_pattern_layers(8, 4)
    assert swa_pattern_layers(8, 4) == (True, True, True, False) * 2
    assert swa_pattern_layers(8, 4, dense_first=True) == (False, True, True, True) * 2
    assert swa_pattern_layers(3, 0) == (True, True, True)


def test_mistral_style_llama_with_window_is_full_attention(tmp_path: Path) -> None:
    # Mistral 7B v0.1 GGUFs carry sliding_window 4096, yet llama.cpp runs `llama` with full
    # attention: the cache is full-size and nothing is lost on restore.
    path = write_meta_gguf(
        tmp_path / "mistral.gguf",
        "llama",
        n_layers=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        context_length=32768,
        sliding_window=4096,
    )
    info = read_model_info(path)
    assert not info.has_swa
    assert info.n_swa_layers == 0
    assert info.swa_layers == (False,) * 32
    assert (info.head_dim_k, info.head_dim_v) == (128, 128)  # n_embd // n_head
    est = kv_estimate(info, 8192)
    assert est.bytes_swa == est.bytes_full == 32 * 8192 * (128 * 8 * 2) * 2  # 1 GiB
    assert est.saving_ratio == 1.0
    assert est.swa_full_extra_bytes == 0
    assert "full attention" in format_model_info(info, est)


def test_per_layer_kv_head_array(tmp_path: Path) -> None:
    path = write_meta_gguf(
        tmp_path / "var.gguf", "llama", n_layers=4, n_embd=256, n_head=4, n_head_kv=[2, 0, 4, 2]
    )
    info = read_model_info(path)
    assert info.n_head_kv_per_layer == (2, 0, 4, 2)
    assert info.n_head_kv == 4
    est = kv_estimate(info, 256)
    assert est.bytes_full == 256 * (2 + 0 + 4 + 2) * 64 * 2 * 2


# -- KV topology ------------------------------------------------------------------------


def test_parallel_slots_split_the_context(gpt_oss: ModelInfo) -> None:
    # -c 8192 -np 4: 4 streams of 2048 cells. Full layers: 8192 cells in all. Sliding layers:
    # per stream min(2048, 128 + 512) -> 768 cells, times 4 streams.
    est = kv_estimate(gpt_oss, 8192, n_parallel=4)
    cell = 64 * 8 * 2 * 2
    assert est.bytes_full == 24 * 8192 * cell
    assert est.bytes_swa == 12 * 8192 * cell + 12 * (768 * 4) * cell
    assert est.swa_cells == 3072


def test_unified_cache_scales_window_by_slots(gpt_oss: ModelInfo) -> None:
    # --kv-unified -np 4: one stream; the sliding cache holds 4 windows + one ubatch:
    # round_up(min(8192, 128 * 4 + 512), 256) = 1024 cells.
    est = kv_estimate(gpt_oss, 8192, n_parallel=4, unified=True)
    cell = 64 * 8 * 2 * 2
    assert est.bytes_full == 24 * 8192 * cell
    assert est.bytes_swa == 12 * 8192 * cell + 12 * 1024 * cell
    assert est.unified


def test_small_context_caps_the_sliding_cache(gpt_oss: ModelInfo) -> None:
    est = kv_estimate(gpt_oss, 512)
    assert est.bytes_swa == est.bytes_full  # min(512, 640) -> 512: no saving possible


def test_ubatch_changes_the_sliding_cache(gpt_oss: ModelInfo) -> None:
    cell = 64 * 8 * 2 * 2
    est = kv_estimate(gpt_oss, 4096, ubatch=2048)  # 128 + 2048 -> 2304 cells
    assert est.bytes_swa == 12 * 4096 * cell + 12 * 2304 * cell


def test_context_is_padded_like_llama_cpp(gpt_oss: ModelInfo) -> None:
    assert kv_estimate(gpt_oss, 4000).n_ctx == 4096


def test_zero_context_means_training_context(gpt_oss: ModelInfo) -> None:
    assert kv_estimate(gpt_oss, 0).n_ctx == 131072


def test_quantised_cache_types(gpt_oss: ModelInfo) -> None:
    f16 = kv_estimate(gpt_oss, 4096)
    q8 = kv_estimate(gpt_oss, 4096, type_k="q8_0", type_v="q8_0")
    assert q8.bytes_full * 64 == f16.bytes_full * 34  # 34 bytes per 32 elements vs 2 per 1
    mixed = kv_estimate(gpt_oss, 4096, type_k="q8_0", type_v="q4_0")
    assert mixed.bytes_full == 24 * 4096 * (512 // 32) * (34 + 18)
    f32 = kv_estimate(gpt_oss, 4096, type_k="F32", type_v="f32")
    assert f32.bytes_full == 2 * f16.bytes_full
    assert f32.type_k == "f32"
    assert set(CACHE_TYPES) == {
        "f32",
        "f16",
        "bf16",
        "q8_0",
        "q4_0",
        "q4_1",
        "q5_0",
        "q5_1",
        "iq4_nl",
    }


def test_unknown_cache_type_lists_valid_ones(gpt_oss: ModelInfo) -> None:
    with pytest.raises(ValueError, match="q8_0") as err:
        kv_estimate(gpt_oss, 4096, type_k="q3_k")
    assert "q3_k" in str(err.value)


def test_bad_parallel_rejected(gpt_oss: ModelInfo) -> None:
    with pytest.raises(ValueError):
        kv_estimate(gpt_oss, 4096, n_parallel=0)


# -- presentation -----------------------------------------------------------------------


def test_format_model_info_mentions_the_essentials(gpt_oss: ModelInfo) -> None:
    text = format_model_info(gpt_oss, kv_estimate(gpt_oss, 4096))
    for needle in (
        "gpt-oss",
        "24",
        "KV heads",
        "8",
        "key 64, value 64",
        "128 tokens",
        "12 of 24",
        "0, 2, 4",
        "114.0 MiB",
        "192.0 MiB",
        "--swa-full",
        "1.68x",
        "/token",
    ):
        assert needle in text, needle


def test_model_info_json_is_stable_and_serialisable(gpt_oss: ModelInfo) -> None:
    data = model_info_json(gpt_oss, kv_estimate(gpt_oss, 4096))
    json.dumps(data)
    for key in (
        "arch",
        "name",
        "n_layers",
        "n_head_kv",
        "head_dim_k",
        "head_dim_v",
        "context_length",
        "sliding_window",
        "swa",
        "swa_layers",
        "kv",
    ):
        assert key in data
    assert data["swa"] is True
    assert data["swa_layers"] == list(range(0, 24, 2))
    kv = data["kv"]
    assert set(kv) >= {
        "n_ctx",
        "n_parallel",
        "ubatch",
        "cache_type_k",
        "cache_type_v",
        "bytes_default",
        "bytes_swa_full",
        "per_token_default",
        "per_token_swa_full",
        "saving_ratio",
    }
    assert mib(kv["bytes_default"]) == 114 and mib(kv["bytes_swa_full"]) == 192


# -- bad files --------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        read_model_info(tmp_path / "nope.gguf")


def test_folder_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="folder"):
        read_model_info(tmp_path)


def test_text_file_renamed_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("these are my notes, not a model\n")
    with pytest.raises(ModelFileError, match="not a GGUF model") as err:
        read_model_info(path)
    assert "notes.gguf" in str(err.value)
    assert "text file" in str(err.value)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"PK\x03\x04" + b"\0" * 60, "zip"),
        ((100).to_bytes(8, "little") + b'{"weight": {}}' + b"\0" * 90, "safetensors"),
        (b"\x00\x01\x02\x03" * 16, "00 01 02 03"),
    ],
)
def test_other_formats_are_named(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match="not a GGUF model") as err:
        read_model_info(path)
    assert needle in str(err.value)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        read_model_info(path)


@pytest.mark.parametrize("keep", [6, 30, 200, 0.5, -30])
def test_truncated_file(tmp_path: Path, gpt_oss: ModelInfo, keep: float) -> None:
    data = gpt_oss.path.read_bytes()
    cut = (
        int(len(data) * keep)
        if isinstance(keep, float)
        else (len(data) + keep if keep < 0 else keep)
    )
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelFileError) as err:
        read_model_info(path)
    message = str(err.value)
    assert "cut.gguf" in message
    assert "truncated" in message or "corrupt" in message
    assert "unpack" not in message and "buffer" not in message and "index" not in message


def test_truncated_tensor_data(tmp_path: Path) -> None:
    # A half-downloaded model: header intact, tensor data cut short.
    path = tmp_path / "half.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", __import__("numpy").zeros((100, 64), dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFileError, match="truncated"):
        read_model_info(path)


def test_garbage_after_magic(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 64)
    with pytest.raises(ModelFileError, match="junk.gguf"):
        read_model_info(path)


def test_unsupported_version(tmp_path: Path) -> None:
    path = tmp_path / "v9.gguf"
    path.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + b"\0" * 64)
    with pytest.raises(ModelFileError, match="version 9"):
        read_model_info(path)


def test_missing_architecture_key(tmp_path: Path) -> None:
    # A valid, empty GGUF: magic, version 3, no tensors, no metadata.
    path = tmp_path / "noarch.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") * 2)
    with pytest.raises(ModelFileError, match="general.architecture"):
        read_model_info(path)


def test_large_vocab_is_read_quickly(tmp_path: Path) -> None:
    # The stock reader parses every vocabulary string (~40 s for 262k tokens); ours skips them.
    import time

    n = 100_000

    def vocab(writer: gguf.GGUFWriter) -> None:
        writer.add_token_list([f"t{i}" for i in range(n)])
        writer.add_token_scores([0.0] * n)

    path = write_meta_gguf(
        tmp_path / "big.gguf",
        "gemma3",
        n_layers=26,
        n_embd=1152,
        n_head=4,
        n_head_kv=1,
        sliding_window=512,
        extra=vocab,
    )
    start = time.perf_counter()
    info = read_model_info(path)
    assert time.perf_counter() - start < 5
    assert info.n_swa_layers == 22


# -- units ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1024, "1.0 KiB"),
        (114 * MiB, "114.0 MiB"),
        (6144 * MiB, "6.0 GiB"),
        (1536 * 1024**3, "1.5 TiB"),
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("20G", 20 * 1024**3),
        ("20g", 20 * 1024**3),
        ("512M", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("512mb", 512 * MiB),
        ("1.5GiB", 1536 * MiB),
        ("4096", 4096),
        ("4096B", 4096),
        (" 2 T ", 2 * 1024**4),
        ("1K", 1024),
        (123, 123),
    ],
)
def test_parse_size(text: str | int, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "G", "twenty", "-5G", "5X", "5 GB extra", "1.5", "5iB", -1])
def test_parse_size_rejects_bad_input(bad: str | int) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


# --- families (llama.cpp b11434): MLA, MoE, hybrid, recurrent, unknown ---------------------


def test_deepseek2_mla_caches_only_the_latent(tmp_path: Path) -> None:
    # DeepSeek-V2-Lite as convert_hf_to_gguf writes it for MLA: one KV "head" whose K is the
    # compressed latent (kv_lora_rank 512 + 64 RoPE dims = 576) and no V in the cache.
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_kv_lora_rank(512)
        w.add_uint32("deepseek2.attention.key_length_mla", 192)
        w.add_uint32("deepseek2.attention.value_length_mla", 128)
        w.add_rope_dimension_count(64)
        w.add_expert_count(64)
        w.add_expert_used_count(6)

    info = read_model_info(write_meta_gguf(tmp_path / "dsv2.gguf", "deepseek2", n_layers=27, n_embd=2048,
                                           n_head=16, n_head_kv=1, key_length=576, value_length=512,
                                           extra=extra))
    assert info.mla and info.family == "MLA" and info.kv_lora_rank == 512 and info.n_expert == 64
    est = kv_estimate(info, 4096, flash_attn=False)
    assert est.bytes_full == 27 * 4096 * 576 * 2  # K only, f16
    assert est.recurrent_bytes == 0
    text = format_model_info(info, est)
    assert "kv_lora_rank 512 + 64 RoPE dims" in text and "64 experts, 6 per token" in text
    assert info.restore_mode() == "works"


def test_deepseek2_without_mla_keys_is_plain_attention(tmp_path: Path) -> None:
    info = read_model_info(write_meta_gguf(tmp_path / "old.gguf", "deepseek2", n_layers=2, n_embd=256,
                                           n_head=4, n_head_kv=4, key_length=48, value_length=32))
    assert not info.mla
    assert kv_estimate(info, 256).bytes_full == 2 * 256 * 4 * (48 + 32) * 2


def _qwen35_keys(w: gguf.GGUFWriter) -> None:
    w.add_ssm_conv_kernel(4)
    w.add_ssm_state_size(128)
    w.add_ssm_group_count(16)
    w.add_ssm_time_step_rank(32)
    w.add_ssm_inner_size(4096)
    w.add_full_attention_interval(4)


def test_qwen35_hybrid_layers_and_state(tmp_path: Path) -> None:
    # Qwen3.5-9B's shape: 32 layers, every 4th full attention (4 KV heads of 256).
    info = read_model_info(write_meta_gguf(tmp_path / "q35.gguf", "qwen35", n_layers=32, n_embd=4096,
                                           n_head=16, n_head_kv=4, key_length=256, value_length=256,
                                           extra=_qwen35_keys))
    assert info.memory == "hybrid" and info.family == "hybrid"
    assert [il for il in range(32) if info.layer_has_kv(il)] == [3, 7, 11, 15, 19, 23, 27, 31]
    assert info.n_recurrent_layers == 24
    est = kv_estimate(info, 8192, n_parallel=2, flash_attn=True)
    assert est.bytes_full == 8 * 8192 * 4 * 256 * 2 * 2
    # per layer: conv (4-1) * (4096 + 2*16*128) + state 128 * 4096 f32 values; one state per slot
    per_layer = (3 * (4096 + 2 * 16 * 128) + 128 * 4096) * 4
    assert est.recurrent_bytes == 2 * 24 * per_layer
    assert info.restore_mode() == info.restore_mode(True) == "exact"
    text = format_model_info(info, est)
    assert "24 recurrent layers (0, 1, 2, 4, ..., 30) (gated delta net)" in text
    assert "8 attention layers (3, 7, 11, 15, ..., 31)" in text
    assert "exact continuation only" in text and "Recurrent state" in text
    assert "full attention on every layer" not in text
    data = model_info_json(info, est)
    assert data["attention_layers"] == [3, 7, 11, 15, 19, 23, 27, 31]
    assert data["kv"]["recurrent_bytes"] == est.recurrent_bytes and data["restore_mode"] == "exact"


def test_recurrent_layers_listed_in_the_gguf_win(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        _qwen35_keys(w)
        w.add_array("qwen3next.attention.recurrent_layers", [True, False, True, True])

    info = read_model_info(write_meta_gguf(tmp_path / "q3n.gguf", "qwen3next", n_layers=4, n_embd=256,
                                           n_head=4, n_head_kv=2, extra=extra))
    assert [info.layer_has_kv(il) for il in range(4)] == [False, True, False, False]


def test_granite_hybrid_attention_layers_are_those_with_kv_heads(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_state_size(128)
        w.add_ssm_group_count(1)
        w.add_ssm_time_step_rank(48)
        w.add_ssm_inner_size(3072)

    kv = [0, 0, 0, 0, 0, 8, 0, 0, 0, 0]
    info = read_model_info(write_meta_gguf(tmp_path / "g4.gguf", "granitehybrid", n_layers=10, n_embd=1536,
                                           n_head=12, n_head_kv=kv, extra=extra))
    assert [il for il in range(10) if info.layer_has_kv(il)] == [5]
    est = kv_estimate(info, 4096)
    assert est.bytes_full == 4096 * 8 * 128 * 2 * 2
    assert est.recurrent_bytes == 9 * (3 * (3072 + 2 * 128) + 128 * 3072) * 4


def test_lfm2_short_convolution_state(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_uint32("lfm2.shortconv.l_cache", 3)

    kv = [0, 0, 8, 0, 0, 8]
    info = read_model_info(write_meta_gguf(tmp_path / "lfm2.gguf", "lfm2", n_layers=6, n_embd=1024,
                                           n_head=16, n_head_kv=kv, extra=extra))
    assert info.recurrent_what == "short convolution" and not info.has_swa
    est = kv_estimate(info, 2048)
    assert est.recurrent_bytes == 4 * 1024 * 2 * 4
    assert est.bytes_full == 2 * 2048 * 8 * 64 * 2 * 2


def test_mamba_is_all_recurrent(tmp_path: Path) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_state_size(16)
        w.add_ssm_time_step_rank(48)
        w.add_ssm_inner_size(1536)

    info = read_model_info(write_meta_gguf(tmp_path / "mamba.gguf", "mamba", n_layers=24, n_embd=768,
                                           n_head=0, n_head_kv=0, extra=extra))
    est = kv_estimate(info, 2048, n_parallel=3)
    assert info.memory == "recurrent" and est.bytes_full == 0
    assert est.recurrent_bytes == 3 * 24 * (3 * 1536 + 16 * 1536) * 4
    assert "no per-token KV cache" in format_model_info(info, est)


def test_unknown_architecture_is_reported_not_guessed(tmp_path: Path) -> None:
    info = read_model_info(write_meta_gguf(tmp_path / "x.gguf", "brand-new-arch", n_layers=4, n_embd=128,
                                           n_head=4, n_head_kv=2))
    est = kv_estimate(info, 2048)
    assert info.memory == "unknown" and not est.known
    assert info.restore_mode() == "unknown"
    text = format_model_info(info, est)
    assert "does not know the architecture 'brand-new-arch'" in text
    assert "full attention" not in text
    assert model_info_json(info, est)["kv"]["bytes_default"] is None


def test_without_flash_attention_v_rows_are_padded_to_the_widest_layer(tmp_path: Path) -> None:
    # gemma4-style: sliding layers have smaller heads than the global ones.
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_uint32("gemma4.attention.key_length_swa", 64)
        w.add_uint32("gemma4.attention.value_length_swa", 64)

    info = read_model_info(write_meta_gguf(tmp_path / "g4.gguf", "gemma4", n_layers=2, n_embd=256, n_head=4,
                                           n_head_kv=1, key_length=128, value_length=128, sliding_window=128,
                                           pattern=[True, False], extra=extra))
    on = kv_estimate(info, 1024, flash_attn=True)
    off = kv_estimate(info, 1024, flash_attn=False)
    assert on.bytes_full == 1024 * ((64 + 64) + (128 + 128)) * 2
    assert off.bytes_full == 1024 * ((64 + 128) + (128 + 128)) * 2
