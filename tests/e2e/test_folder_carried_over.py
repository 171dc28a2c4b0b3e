"""A sessions folder written by the version before (each state whole, sidecar schema 2) is carried
over to shared pieces once, at the first start: nothing lost, the conversations restore and hit the
cache, a fork shares its parent's pieces, and an older Slotkeeper refuses the folder in words."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest
from e2e_helpers import USER_TURNS, EventLog, bare_llama_server, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions import sidecar as sidecar_module
from slotkeeper.core.sessions.kvfile import read_tokens
from slotkeeper.core.sessions.sidecar import Sidecar, SidecarError, content_hash_file, tokens_digest
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.e2e

V2 = Path(__file__).parents[1] / "data" / "sidecar_v2.json"


def old_sidecar(sid: str, kv: Path, model: Path, parent: str | None, used: str) -> dict:
    """The sidecar the version before wrote for the whole state ``kv`` (schema 2)."""
    tokens = read_tokens(kv).tokens
    data = json.loads(V2.read_text())
    data.update(id=sid, kv_file=kv.name, model_path=str(model),
                model_sha256=hashlib.sha256(model.read_bytes()).hexdigest(), arch="llama",
                swa=False, swa_full=False, flash_attn=False, cache_type_k="f16", cache_type_v="f16",
                n_parallel=1, kv_unified=False, n_ctx_slot=2048, n_tokens=len(tokens),
                tokens_digest=tokens_digest(tokens), size_bytes=kv.stat().st_size,
                content_hash=content_hash_file(kv), parent=parent, last_used_at=used, created_at=used,
                restore_mode="works", pinned=False, last_restore=None, corrupt=None, kv_args=[],
                n_prompt=None, n_media=0, mmproj_sha256=None, verified=None, schema_version=2)
    for key in ("points", "continues", "state_bytes", "pieces"):
        data.pop(key, None)
    return data


def test_a_folder_of_the_version_before_is_carried_over_once_and_nothing_is_lost(llama_model, server_bin,
                                                                                 port, tmp_path):
    sessions = app_paths().ensure().sessions_dir
    chat = [{"role": "system", "content": "You are a helpful assistant for walkers."}]
    argv = [server_bin, "-m", str(llama_model), "-c", "2048", "-np", "1", "--flash-attn", "off",
            "--slot-save-path", str(sessions), "--cache-ram", "0"]
    with bare_llama_server(argv, tmp_path / "old.log") as base:
        def turn(text):
            chat.append({"role": "user", "content": text})
            r = httpx.post(f"{base}/v1/chat/completions", json={"messages": chat, "max_tokens": 16,
                                                                 "temperature": 0}, timeout=60)
            chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})

        def save(name):
            httpx.post(f"{base}/slots/0", params={"action": "save"}, json={"filename": name},
                       timeout=60).raise_for_status()

        turn(USER_TURNS[0] * 6)
        turn(USER_TURNS[1])
        save("aaaaaaaaaaaa.00000001.kv")
        fork = chat[:-2]  # an edited last message: a branch of the same conversation
        chat[:] = fork
        turn("Something else entirely, please.")
        save("bbbbbbbbbbbb.00000001.kv")
    a, b = sessions / "aaaaaaaaaaaa.00000001.kv", sessions / "bbbbbbbbbbbb.00000001.kv"
    whole = a.stat().st_size + b.stat().st_size
    for sid, kv, parent, used in (("aaaaaaaaaaaa", a, None, "2026-01-01T00:00:00Z"),
                                  ("bbbbbbbbbbbb", b, "aaaaaaaaaaaa", "2026-01-02T00:00:00Z")):
        (sessions / f"{sid}.json").write_text(json.dumps(old_sidecar(sid, kv, llama_model, parent, used)))
    tokens_before = {sid: read_tokens(kv).tokens for sid, kv in (("aaaaaaaaaaaa", a), ("bbbbbbbbbbbb", b))}

    engine = make_engine(llama_model, server_bin, port, idle_save=3600, flash_attn=False)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        said = [e.message for e in events.of(ev.NoticeRaised)]
        assert any("kept 2 saved conversations as shared pieces" in m for m in said), said
        carrying = [e.activity for e in events.of(ev.ActivityChanged)
                    if e.activity.activity == "carrying over"]
        assert [(a.done, a.total) for a in carrying] == [(0, 2), (1, 2)]
        [restored] = events.of(ev.SessionRestored)
        assert restored.id == "bbbbbbbbbbbb" and restored.n_restored == len(tokens_before["bbbbbbbbbbbb"])
        follow = chat + [{"role": "user", "content": USER_TURNS[2]}]
        r = httpx.post(f"{engine.base_url}/v1/chat/completions", json={"messages": follow, "max_tokens": 4,
                                                                      "temperature": 0}, timeout=60).json()
        # all but the last reply (16 tokens), which the chat template renders anew
        assert r["timings"]["cache_n"] >= len(tokens_before["bbbbbbbbbbbb"]) - 16, "the carried state serves"
    finally:
        engine.stop(save=False)

    store = SessionStore(sessions)
    entries = {e.id: e for e in store.sessions()}
    assert set(entries) == {"aaaaaaaaaaaa", "bbbbbbbbbbbb"} and not any(e.problems for e in entries.values())
    for sid, e in entries.items():
        sc = e.sidecar
        assert sc.kv_file.endswith(".kvm") and sc.schema_version == 3 and sc.pieces
        assert list(store.tokens(e)) == tokens_before[sid]
        assert store.verify(sid).status == "ok"
    assert not a.exists() and not b.exists(), "the whole files are gone"
    shared = set(entries["aaaaaaaaaaaa"].sidecar.pieces) & set(entries["bbbbbbbbbbbb"].sidecar.pieces)
    assert shared, "the branch shares its parent's pieces"
    assert store.usage_bytes() < whole
    # An older Slotkeeper (one that reads schema 2) refuses the carried-over sidecars in words.
    data = json.loads((sessions / "aaaaaaaaaaaa.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sidecar_module, "SCHEMA_VERSION", 2)
        with pytest.raises(SidecarError, match=r"newer Slotkeeper \(schema 3\); this version reads up to 2"):
            Sidecar.from_json(data)

    engine = make_engine(llama_model, server_bin, port, idle_save=3600, flash_attn=False)  # once only
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not [e for e in events.of(ev.ActivityChanged) if e.activity.activity == "carrying over"]
        wait_until(lambda: events.of(ev.SessionRestored), what="the launch restore")
    finally:
        engine.stop(save=False)
