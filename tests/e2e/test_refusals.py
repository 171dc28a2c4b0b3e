"""Nothing unsafe reaches llama-server: incompatible or damaged sessions are refused, kept, explained."""

from __future__ import annotations

import json
import os
import time

import pytest
from e2e_helpers import USER_TURNS, EventLog, converse, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e


@pytest.fixture
def saved_session(llama_model, server_bin, port):
    """One conversation saved from: llama, -fa off, f16/f16, -np 1, ctx 2048."""
    engine = make_engine(llama_model, server_bin, port, flash_attn=False)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, USER_TURNS[:3], max_tokens=24)
        [entry] = wait_until(lambda: engine.library.store.sessions(), what="save")
    finally:
        engine.stop()
    entry = engine.library.store.get(entry.id)
    assert entry.sidecar.n_tokens > 200
    # The save verified the file: its stamp is recorded, so damage below must get past it.
    assert entry.sidecar.verified.matches(os.lstat(entry.kv_path), entry.sidecar.content_hash)
    return entry


def _launch_and_try(model, server_bin, port, session_id, **profile):
    profile.setdefault("flash_attn", False)  # as the session was saved: only what a case changes differs
    engine = make_engine(model, server_bin, port, **profile)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not events.of(ev.SessionRestored), "an incompatible session was restored at launch"
        assert engine.restore(session_id, 0) is None
        [refusal] = events.of(ev.SessionRefused)
        with engine.client() as c:
            assert c.health().ok  # the server is fine
            assert all(s.id_task is None for s in c.slots())  # nothing was loaded into a slot
    finally:
        engine.stop()
    return refusal.reasons, engine


@pytest.mark.parametrize(
    "profile, reason",
    [
        (dict(cache_type_k="q8_0"), "saved with K cache type f16; the server uses q8_0"),
        (dict(parallel=2, ctx=4096), "saved with 1 slots (-np 1); the server runs 2"),
        (dict(ctx=256), "tokens of context per slot; the server's slots have 256"),
        (dict(extra_args=("--rope-freq-scale", "0.5")),
         "saved with llama-server arguments (none); the server runs with --rope-freq-scale 0.5"),
    ],
)
def test_incompatible_settings_are_refused(saved_session, llama_model, server_bin, port, profile, reason):
    reasons, engine = _launch_and_try(llama_model, server_bin, port, saved_session.id, **profile)
    assert any(reason in r for r in reasons), reasons
    entry = engine.library.store.get(saved_session.id)
    assert entry.kv_path.exists() and entry.status == "ok"


def test_other_model_of_the_same_shape_is_refused(saved_session, server_bin, port, models_dir):
    other = write_model(models_dir / "tiny-llama-alt.gguf", "llama-alt")
    reasons, engine = _launch_and_try(other, server_bin, port, saved_session.id)
    assert any("different model" in r for r in reasons), reasons
    assert engine.library.store.get(saved_session.id).kv_path.exists()


def _damage_truncate(p):
    p.write_bytes(p.read_bytes()[:-1])


def _damage_flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _damage_append(p):
    with open(p, "ab") as fh:
        fh.write(b"\0garbage")


def _keeping_mtime(damage):
    """``damage``, then the old mtime put back (as `cp -p` or `touch -d` would): only the ctime tells."""

    def run(p):
        st = os.lstat(p)
        time.sleep(0.02)  # past the file system clock's tick, so the ctime moves
        damage(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        now = os.lstat(p)
        assert (now.st_mtime_ns, now.st_ino) == (st.st_mtime_ns, st.st_ino)

    return run


def _flip_in_place(p):
    with open(p, "r+b") as fh:
        fh.seek(os.path.getsize(p) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _cut_and_refill(p):
    size = os.path.getsize(p)
    os.truncate(p, size - min(4096, size // 2))
    os.truncate(p, size)  # the same size again, zeros at the end


def _replace_same_size(p):
    """Another file of the same size and mtime moved into its place (another inode)."""
    st = os.lstat(p)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    other = p.with_name("replacement.tmp")
    other.write_bytes(bytes(data))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, p)


@pytest.mark.parametrize("damage", [
    _damage_truncate, _damage_flip, _damage_append, _keeping_mtime(_flip_in_place),
    _keeping_mtime(_cut_and_refill), _replace_same_size,
], ids=["truncated-1-byte", "flipped-byte", "trailing-garbage", "flipped-in-place-same-mtime",
        "cut-and-refilled-same-mtime", "replaced-same-size-same-mtime"])
def test_damaged_files_are_refused_marked_and_the_server_survives(saved_session, llama_model, server_bin,
                                                                  port, damage):
    damage(saved_session.kv_path)
    engine = make_engine(llama_model, server_bin, port)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not events.of(ev.SessionRestored)
        assert engine.restore(saved_session.id, 0) is None
        with engine.client() as c:
            assert c.health().ok
        assert engine.supervisor.state is ServerState.READY and engine.supervisor.last_exit_code is None
    finally:
        engine.stop()
    entry = engine.library.store.get(saved_session.id)
    assert entry.status == "corrupt" and entry.sidecar.corrupt
    assert entry.kv_path.exists()


def _piece(entry):
    """One of the pieces the saved conversation is made of."""
    from slotkeeper.core.sessions.pieces import piece_path

    return piece_path(entry.kv_path.parent / "pieces", sorted(entry.sidecar.pieces)[-1])


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_flip, _damage_append, os.unlink],
                         ids=["truncated-1-byte", "flipped-byte", "trailing-garbage", "missing"])
@pytest.mark.parametrize("flash_attn", [False, None], ids=["as-saved", "carried-over"])
def test_a_damaged_or_missing_piece_is_refused_marked_and_the_server_survives(saved_session, llama_model,
                                                                             server_bin, port, damage,
                                                                             flash_attn, monkeypatch):
    from slotkeeper.core.engine.slots import actions

    assert saved_session.sidecar.pieces, "kept as pieces"
    damage(_piece(saved_session))
    # As after the machine restarted: no whole copy of the state in memory, it is assembled.
    monkeypatch.setattr(actions, "cached_state", lambda folder, content_hash: None)
    engine = make_engine(llama_model, server_bin, port, flash_attn=flash_attn)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not events.of(ev.SessionRestored)
        assert engine.restore(saved_session.id, 0) is None
        refused = " ".join(r for e in events.of(ev.SessionRefused) for r in e.reasons)
        assert "piece" in refused and ("damaged" in refused or "missing" in refused or "short" in refused)
        with engine.client() as c:
            assert c.health().ok
        assert engine.supervisor.state is ServerState.READY and engine.supervisor.last_exit_code is None
    finally:
        engine.stop()
    entry = engine.library.store.get(saved_session.id)
    assert entry.status == "corrupt" and "piece" in entry.sidecar.corrupt["reason"]


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(n_tokens="many"),
    lambda d: d.update(schema_version=42),
], ids=["wrong-type", "unknown-schema"])
def test_bad_sidecars_list_as_corrupt_and_are_never_restored(saved_session, llama_model, server_bin, port,
                                                             mutate):
    path = saved_session.kv_path.parent / f"{saved_session.id}.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    engine = make_engine(llama_model, server_bin, port)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not events.of(ev.SessionRestored)
        assert engine.restore(saved_session.id, 0) is None
    finally:
        engine.stop()
    entry = engine.library.store.get(saved_session.id)
    assert entry.status == "corrupt" and entry.problems
    assert saved_session.kv_path.exists() and path.exists()


def test_a_good_save_of_the_same_conversation_replaces_a_corrupt_one(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        history, _ = converse(engine.base_url, USER_TURNS[:2], max_tokens=16)
        first = engine.save_slot(0)
        entry = engine.library.store.get(first.id)
        data = bytearray(entry.kv_path.read_bytes())
        data[-10] ^= 0xFF  # past its token list (which lineage still reads): what the state is made of
        entry.kv_path.write_bytes(bytes(data))
        assert engine.library.store.verify(first.id).status == "corrupt"
        converse(engine.base_url, USER_TURNS[:3], max_tokens=16)
        again = engine.save_slot(0)
    finally:
        engine.stop(save=False)
    assert again.id == first.id and again.kind == "update"
    entry = engine.library.store.get(first.id)
    assert entry.status == "ok" and entry.sidecar.corrupt is None
    assert engine.library.store.verify(first.id).status == "ok"


def test_a_saved_session_is_restored_without_hashing_it_again_until_it_is_touched(
        saved_session, llama_model, server_bin, port, monkeypatch):
    from slotkeeper.core.sessions import file_checks

    hashed = []
    real = file_checks.hash_with_stamp
    monkeypatch.setattr(file_checks, "hash_with_stamp", lambda p: hashed.append(p) or real(p))
    for touch in (False, True, False):
        if touch:
            time.sleep(0.02)
            os.utime(saved_session.kv_path)  # a new mtime and ctime: hashed once, then trusted again
        hashed.clear()
        engine = make_engine(llama_model, server_bin, port, flash_attn=False)  # as it was saved
        events = EventLog(engine)
        engine.start()
        try:
            assert engine.wait_ready(60) is ServerState.READY
            [restored] = events.of(ev.SessionRestored)
            assert restored.id == saved_session.id
        finally:
            engine.stop(save=False)
        assert hashed == ([saved_session.kv_path] if touch else [])
