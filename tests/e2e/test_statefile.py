"""The KV state inside llama-server's slot save files, read as llama.cpp lays it out, and rewritten
for the other flash-attention choice without loss: a file converted from one V layout restores into
a server running the other, which then holds exactly those values (its own save of the restored slot
is the converted file, byte for byte) and reuses every cell."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from e2e_helpers import bare_llama_server

from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.sessions.kvfile import read_tokens
from slotkeeper.core.sessions.statefile import StateLayoutError, convert_v_layout, parse_layout, read_layout

pytestmark = pytest.mark.e2e

PROMPT = "The walkers went up the hill and came down again before the rain. " * 30
# kind, extra llama-server arguments, attention caches in a save, a recurrent state after them
KINDS = [("llama", [], 1, False), ("gemma3", [], 2, False), ("gemma3", ["--swa-full"], 2, False),
         ("gpt-oss", ["--swa-full"], 2, False), ("qwen35", [], 1, True)]


def server(server_bin: str, model: Path, folder: Path, fa: bool, extra: list[str], log: str):
    argv = [server_bin, "-m", str(model), "-c", "2048", "-np", "1", "--flash-attn", "on" if fa else "off",
            "--slot-save-path", str(folder), "--cache-ram", "0", *extra]
    return bare_llama_server(argv, folder.parent / log)


def post(base: str, path: str, **body) -> dict:
    r = httpx.post(f"{base}{path}", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def slot(base: str, action: str, filename: str) -> dict:
    r = httpx.post(f"{base}/slots/0", params={"action": action}, json={"filename": filename}, timeout=120)
    r.raise_for_status()
    return r.json()


@pytest.mark.parametrize("kind, extra, n_caches, recurrent", KINDS,
                         ids=[k[0] + ("-swa-full" if k[1] else "") for k in KINDS])
@pytest.mark.parametrize("saved_with", ["fa-on", "fa-off"])
def test_a_save_converted_to_the_other_v_layout_is_restored_exactly(kind, extra, n_caches, recurrent,
                                                                     saved_with, server_bin, models_dir,
                                                                     tmp_path):
    model = models_dir / f"tiny-{kind}.gguf"
    if not model.exists():
        write_model(model, kind)
    fa = saved_with == "fa-on"
    folder = tmp_path / "slots"
    folder.mkdir()
    with server(server_bin, model, folder, fa, extra, "first.log") as base:
        done = post(base, "/completion", prompt=PROMPT, n_predict=8, temperature=0, cache_prompt=True)
        n = done["timings"]["prompt_n"] + 8
        assert slot(base, "save", "a.kv")["n_saved"] >= n - 1
    a = folder / "a.kv"
    layout = read_layout(a)
    assert len(layout.caches) == n_caches
    assert (layout.tail_offset < layout.size) is recurrent  # a recurrent state after the caches
    assert layout.v_trans is (not fa)
    full = layout.caches[0].streams[0]
    assert full.cell_count == len(read_tokens(a).tokens)
    assert list(full.positions) == list(range(full.cell_count))
    if n_caches == 2 and not extra:  # the sliding layers keep their window only
        assert layout.caches[1].streams[0].cell_count < full.cell_count

    convert_v_layout(a, folder / "b.kv", v_trans=fa)
    assert read_layout(folder / "b.kv").v_trans is fa
    assert (folder / "b.kv").stat().st_size == a.stat().st_size
    convert_v_layout(folder / "b.kv", tmp_path / "back.kv", v_trans=not fa)
    assert (tmp_path / "back.kv").read_bytes() == a.read_bytes(), "converting back gives the file again"

    with server(server_bin, model, folder, not fa, extra, "other.log") as base:
        with pytest.raises(httpx.HTTPStatusError):
            slot(base, "restore", "a.kv")  # the other layout: llama-server refuses it as it is
        restored = slot(base, "restore", "b.kv")
        assert restored["n_restored"] == len(read_tokens(a).tokens)
        slot(base, "save", "c.kv")
        assert (folder / "c.kv").read_bytes() == (folder / "b.kv").read_bytes(), (
            "the server holds exactly the converted values")
        saved = read_tokens(a).tokens
        more = post(base, "/completion", prompt=[*saved, *saved[:4]], n_predict=1, temperature=0,
                    cache_prompt=True)
        # every saved cell reused by an exact continuation; a sliding-window model without
        # --swa-full never reuses a restore (llama-server's own rule: its window is one cell short)
        assert more["timings"]["cache_n"] >= len(saved) - 1 or kind == "gemma3" and not extra


def test_a_file_that_is_not_laid_out_so_is_refused_whole(tmp_path, server_bin, llama_model):
    folder = tmp_path / "slots"
    folder.mkdir()
    with server(server_bin, llama_model, folder, True, [], "s.log") as base:
        post(base, "/completion", prompt=PROMPT, n_predict=2, temperature=0, cache_prompt=True)
        slot(base, "save", "a.kv")
    data = (folder / "a.kv").read_bytes()
    header = read_tokens(folder / "a.kv").header_bytes
    for cut in (1, 2, 100, len(data) // 2):  # cut short: nothing reads as a whole state
        with pytest.raises(StateLayoutError):
            layout = parse_layout(data[:-cut], header)
            if layout.tail_offset != layout.size:
                raise StateLayoutError("a tail where none was written")
    broken = tmp_path / "broken.kv"
    broken.write_bytes(data[:-3])
    with pytest.raises(StateLayoutError):
        convert_v_layout(broken, tmp_path / "out.kv", v_trans=True)
    assert not (tmp_path / "out.kv").exists()
    shutil.rmtree(folder)
