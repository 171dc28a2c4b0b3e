"""States kept as shared pieces, against llama-server's own save files: a state assembled from its
pieces is llama-server's file byte for byte and restores; a state that continues another writes
only its new cells; a damaged or missing piece is named and leaves nothing that looks valid."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from e2e_helpers import bare_llama_server

from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.sessions import pieces
from slotkeeper.core.sessions.kvfile import read_tokens

pytestmark = pytest.mark.e2e

PROMPT = "The walkers went up the hill and came down again before the rain. " * 30
KINDS = [("llama", ["--flash-attn", "on"]), ("llama", ["--flash-attn", "off"]), ("gemma3", []),
         ("gemma3", ["--swa-full", "--flash-attn", "off"]), ("qwen35", []),
         ("gpt-oss", ["--swa-full", "--flash-attn", "on"]),
         ("llama", ["--flash-attn", "on", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0"])]


def model_of(models_dir: Path, kind: str) -> Path:
    path = models_dir / f"tiny-{kind}.gguf"
    return path if path.exists() else write_model(path, kind)


def two_saves(server_bin: str, model: Path, folder: Path, extra: list[str]) -> list[int]:
    """``a.kv``: a prompt and a reply; ``b.kv``: the same conversation a turn further, its reply
    re-rendered by the client. Returns a.kv's token list."""
    argv = [server_bin, "-m", str(model), "-c", "4096", "-np", "1", "--slot-save-path", str(folder),
            "--cache-ram", "0", *extra]
    with bare_llama_server(argv, folder.parent / "server.log") as base:
        def complete(prompt):
            r = httpx.post(f"{base}/completion", json={"prompt": prompt, "n_predict": 16, "temperature": 0,
                                                       "cache_prompt": True}, timeout=120)
            r.raise_for_status()
            return r.json()["content"]

        def save(name):
            httpx.post(f"{base}/slots/0", params={"action": "save"}, json={"filename": name},
                       timeout=120).raise_for_status()

        reply = complete(PROMPT)
        save("a.kv")
        complete(PROMPT + reply + " And then they went home.")
        save("b.kv")
    return read_tokens(folder / "a.kv").tokens


@pytest.mark.parametrize("kind, extra", KINDS, ids=[f"{k}{''.join(e)}" for k, e in KINDS])
def test_states_assemble_to_llama_servers_own_files_and_share_their_cells(kind, extra, server_bin,
                                                                          models_dir, tmp_path):
    folder = tmp_path / "slots"
    folder.mkdir()
    two_saves(server_bin, model_of(models_dir, kind), folder, extra)
    store = tmp_path / "pieces"
    a = pieces.put(folder / "a.kv", store, [], tmp_path / "a.kvm")
    size_a, size_b = (folder / "a.kv").stat().st_size, (folder / "b.kv").stat().st_size
    # the first state: everything is new (16-bit K and V: their high bytes compressed)
    assert a.written_bytes == sum(p.stat().st_size for p in store.rglob("*.kvp")) >= size_a * 0.5
    b = pieces.put(folder / "b.kv", store, [tmp_path / "a.kvm"], tmp_path / "b.kvm")
    assert b.written_bytes < 0.3 * size_b, "the second writes only the cells it does not share"
    # 16-bit K and V keep their high bytes compressed; other types (q8_0) are kept as they are
    codecs = {pieces._PIECE_HEAD.unpack_from(p.read_bytes())[5] for p in store.rglob("*.kvp")
              if pieces._PIECE_HEAD.unpack_from(p.read_bytes())[2]}  # cells' pieces, not a recurrent tail
    assert codecs == ({pieces.CODEC_RAW} if "q8_0" in extra else {pieces.CODEC_HIGH_BYTES})
    for name in ("a", "b"):
        manifest = pieces.read_manifest(tmp_path / f"{name}.kvm")
        assert read_tokens(tmp_path / f"{name}.kvm").tokens == read_tokens(folder / f"{name}.kv").tokens
        out = tmp_path / f"{name}.out"
        assert pieces.assemble(manifest, store, out) == manifest.state_bytes
        assert out.read_bytes() == (folder / f"{name}.kv").read_bytes()


def test_an_assembled_state_restores_into_llama_server(server_bin, models_dir, tmp_path):
    model = model_of(models_dir, "qwen35")
    folder = tmp_path / "slots"
    folder.mkdir()
    tokens = two_saves(server_bin, model, folder, [])
    store = tmp_path / "pieces"
    pieces.put(folder / "a.kv", store, [], tmp_path / "a.kvm")
    (folder / "a.kv").unlink()
    pieces.assemble(pieces.read_manifest(tmp_path / "a.kvm"), store, folder / "again.kv")
    argv = [server_bin, "-m", str(model), "-c", "4096", "-np", "1", "--slot-save-path", str(folder),
            "--cache-ram", "0"]
    with bare_llama_server(argv, tmp_path / "restore.log") as base:
        r = httpx.post(f"{base}/slots/0", params={"action": "restore"}, json={"filename": "again.kv"},
                       timeout=60)
        r.raise_for_status()
        assert r.json()["n_restored"] == len(tokens)
        more = httpx.post(f"{base}/completion", json={"prompt": tokens + tokens[:4], "n_predict": 1,
                                                       "cache_prompt": True}, timeout=60).json()
        assert more["timings"]["cache_n"] >= len(tokens) - 1  # a hybrid continues it exactly


def test_a_damaged_or_missing_piece_is_named_and_nothing_is_left(server_bin, models_dir, tmp_path):
    folder = tmp_path / "slots"
    folder.mkdir()
    two_saves(server_bin, model_of(models_dir, "llama"), folder, ["--flash-attn", "on"])
    store = tmp_path / "pieces"
    manifest = pieces.put(folder / "a.kv", store, [], tmp_path / "a.kvm").manifest
    victim = pieces.piece_path(store, sorted(manifest.piece_ids())[0])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    out = tmp_path / "out.kv"
    with pytest.raises(pieces.PieceError, match="damaged"):
        pieces.assemble(manifest, store, out)
    assert not out.exists()
    victim.unlink()
    with pytest.raises(pieces.PieceError, match="missing"):
        pieces.assemble(manifest, store, out)
    assert not out.exists()


def test_pieces_no_manifest_names_are_collected_once_old_enough(server_bin, models_dir, tmp_path):
    folder = tmp_path / "slots"
    folder.mkdir()
    two_saves(server_bin, model_of(models_dir, "llama"), folder, ["--flash-attn", "on"])
    store = tmp_path / "pieces"
    a = pieces.put(folder / "a.kv", store, [], tmp_path / "a.kvm").manifest
    # Without a as a candidate, b shares with it only the pieces whose bytes are the same: its
    # first whole pieces (a piece is named by its bytes); a's last one is a's alone.
    b = pieces.put(folder / "b.kv", store, [], tmp_path / "b.kvm").manifest
    only_a = a.piece_ids() - b.piece_ids()
    assert only_a and a.piece_ids() & b.piece_ids()
    assert pieces.collect(store, b.piece_ids(), older_than=time.time() - 3600) == (0, 0)  # too new
    removed, freed = pieces.collect(store, b.piece_ids(), older_than=time.time() + 1)
    assert removed == len(only_a) and freed > 0
    left = {p.stem for p in store.rglob("*.kvp")}
    assert left == b.piece_ids()
    out = tmp_path / "b.out"
    pieces.assemble(b, store, out)
    assert out.read_bytes() == (folder / "b.kv").read_bytes()
    assert os.stat(out).st_mode & 0o777 == 0o600


def test_a_version_a_save_supersedes_takes_its_own_pieces_with_it_at_once(server_bin, models_dir, tmp_path):
    """A conversation saved again (its reasoning dropped, its tail edited) leaves on disk the pieces
    its sidecar names and no more: the superseded version's own pieces go with the commit, not at a
    later sweep; a piece a state being kept claims, or another conversation names, stays."""
    from dataclasses import replace

    from slotkeeper.core.sessions import saving
    from slotkeeper.core.sessions.compat import ServerFacts
    from slotkeeper.core.sessions.naming import new_kv_name
    from slotkeeper.core.sessions.sidecar import tokens_digest
    from slotkeeper.core.sessions.store import SessionStore

    model = model_of(models_dir, "llama")
    folder = tmp_path / "slots"
    folder.mkdir()
    argv = [server_bin, "-m", str(model), "-c", "4096", "-np", "1", "--slot-save-path", str(folder),
            "--cache-ram", "0", "--flash-attn", "on"]
    with bare_llama_server(argv, tmp_path / "server.log") as base:
        for name, prompt in (("a.kv", PROMPT), ("b.kv", PROMPT[:len(PROMPT) // 2] + " Then it rained.")):
            httpx.post(f"{base}/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0,
                                                   "cache_prompt": False}, timeout=120).raise_for_status()
            httpx.post(f"{base}/slots/0", params={"action": "save"}, json={"filename": name},
                       timeout=120).raise_for_status()
    store = SessionStore(tmp_path / "sessions")
    store.ensure_folder()
    store.listing()
    facts = ServerFacts(model_sha256="a" * 64, model_path=str(model), flash_attn=True, cache_type_k="f16",
                        cache_type_v="f16", swa_full=False, n_parallel=1, n_ctx_slot=4096, swa=False)
    a_tokens = read_tokens(folder / "a.kv").tokens
    written = saving.Written(folder / "a.kv", a_tokens, (folder / "a.kv").stat().st_size, 0, 0)
    out = saving.commit_written(store, written, saving.SaveContext(facts, "llama", "b1"),
                                lambda t: ("walk", "walk"))
    first = out.sidecar
    assert first is not None and first.pieces

    def on_disk() -> set[str]:
        return {p.stem for p in store.pieces_dir.rglob("*.kvp")}

    assert on_disk() == set(first.pieces)
    b_tokens = read_tokens(folder / "b.kv").tokens
    inc = saving.keep_state(store, saving.Written(folder / "b.kv", b_tokens, (folder / "b.kv").stat().st_size,
                                                  0, 0), [first.kv_file])
    try:
        only_a = sorted(set(first.pieces) - set(pieces.read_manifest(inc.path).piece_ids()))
        assert len(only_a) >= 2, "the edit leaves pieces of the first version that the second does not use"
        store.states.claim(only_a[0])  # a state being kept elsewhere names it
        second = store.commit(inc.path, replace(first, kv_file=new_kv_name(first.id), size_bytes=inc.size,
                                                content_hash=inc.content_hash, n_tokens=len(b_tokens),
                                                tokens_digest=tokens_digest(b_tokens),
                                                state_bytes=inc.state_bytes),
                              b_tokens, hashed=inc.hashed, replaces=first.kv_file)
    finally:
        store.states.release(inc.claimed)
    assert on_disk() == set(second.pieces) | {only_a[0]}, "the first version's own pieces went at once"
    store.states.release([only_a[0]])
    assembled = tmp_path / "b.out"
    store.states.materialize(second.kv_file, assembled)
    assert assembled.read_bytes() == (folder / "b.kv").read_bytes()
    store.delete(second.id)
    assert on_disk() == {only_a[0]}  # a deleted conversation's pieces go with it; the claimed one waits
    store.sweep()
    assert on_disk() == {only_a[0]}  # too young for a collection: a save may be about to name it
    store.states.collect(grace_seconds=-1)
    assert on_disk() == set()
