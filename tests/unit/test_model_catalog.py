"""The curated list: memory figures equal what gguf_memory computes from the real files' headers."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from slotkeeper.core.model import families
from slotkeeper.core.model.gguf_info import read_model_info
from slotkeeper.core.model.gguf_memory import kv_estimate
from slotkeeper.core.model.model_catalog import CATALOG, DEFAULT_CTX, CuratedModel, find_curated

MiB = 1024 * 1024


def header_like(entry: CuratedModel, path: Path) -> Path:
    """A metadata-only GGUF with the keys llama.cpp's converter writes for this model."""
    w = gguf.GGUFWriter(path, entry.arch)
    w.add_block_count(entry.n_layers)
    w.add_embedding_length(entry.n_embd)
    w.add_context_length(entry.context_length)
    w.add_head_count(entry.n_head)
    w.add_head_count_kv(entry.n_head_kv)
    w.add_key_length(entry.head_dim)
    w.add_value_length(entry.head_dim)
    if entry.sliding_window:
        w.add_sliding_window(entry.sliding_window)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("entry", CATALOG, ids=[m.id for m in CATALOG])
def test_catalog_facts_give_the_kv_cache_the_header_would(entry: CuratedModel, tmp_path):
    info = read_model_info(header_like(entry, tmp_path / entry.filename))
    from_header = kv_estimate(info, DEFAULT_CTX)
    need = entry.memory_need()
    assert (need.kv_default, need.kv_swa_full) == (from_header.bytes_swa, from_header.bytes_full)
    assert entry.model_info().swa_layers == info.swa_layers
    assert need.total == entry.download_bytes + need.kv_default


def test_worked_figures_at_the_default_context():
    assert DEFAULT_CTX == 8192
    # Qwen3 4B: 36 layers x 8 KV heads x 128 dims x (K + V) x 2 bytes = 144 KiB per token.
    assert find_curated("qwen3-4b").memory_need().kv_default == 36 * 8 * 128 * 2 * 2 * 8192 == 1152 * MiB
    # Gemma 3 4B: 5 global layers keep 8192 cells; 29 sliding layers keep 1024 + 512, padded to 1536.
    gemma = find_curated("gemma3-4b").memory_need()
    per_layer_cell = 4 * 256 * 2 * 2
    assert gemma.kv_default == per_layer_cell * (5 * 8192 + 29 * 1536)
    assert gemma.kv_swa_full == per_layer_cell * 34 * 8192 == 1088 * MiB
    # gpt-oss 20B: 12 full + 12 sliding (window 128 + 512, padded to 768) layers.
    oss = find_curated("gpt-oss-20b").memory_need()
    assert oss.kv_default == 8 * 64 * 2 * 2 * (12 * 8192 + 12 * 768)
    assert oss.kv_swa_full == 384 * MiB


def test_restore_modes_follow_the_architecture():
    modes = {m.id: m.restore_mode for m in CATALOG}
    assert modes["gemma3-4b"] == modes["gpt-oss-20b"] == families.RESTORE_NEEDS_SWA_FULL
    assert {modes[i]
            for i in ("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama3.2-3b")} == {families.RESTORE_WORKS}
    hybrid = CuratedModel(id="h", title="h", repo_id="a/b", filename="h.gguf", quant="Q4_K_M",
                          download_bytes=1, arch="lfm2", n_layers=4, n_embd=64, n_head=4, n_head_kv=4,
                          head_dim=16, context_length=4096, recurrent=True)
    assert hybrid.restore_mode == families.RESTORE_EXACT
    assert families.describe_restore_mode(hybrid.restore_mode) == "exact continuation only"


def test_the_list_is_small_to_large_with_unique_names():
    sizes = [m.download_bytes for m in CATALOG]
    assert sizes == sorted(sizes) and 4 <= len(CATALOG) <= 8
    assert len({m.id for m in CATALOG}) == len(CATALOG)
    assert all(m.filename.endswith(".gguf") and m.repo_id.count("/") == 1 for m in CATALOG)
    assert find_curated("QWEN3-4B") is find_curated("Qwen/Qwen3-4B-GGUF/Qwen3-4B-Q4_K_M.gguf") is not None
    assert find_curated("nope") is None


def test_memory_grows_with_context_and_slots():
    m = find_curated("llama3.2-3b")
    assert m.memory_need(16384).kv_default == 2 * m.memory_need(8192).kv_default
    assert m.memory_need(8192, n_parallel=2).kv_default == m.memory_need(8192).kv_default
