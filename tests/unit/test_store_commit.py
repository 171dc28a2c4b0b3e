"""The store is the one writer of the sessions folder and its index: a save's last step is
``SessionStore.commit``, the index changes only through its own methods, and writing the index
out holds its lock only for a copy."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from sessions_helpers import facts_of, locked_elsewhere, make_session, write_slot_save

from slotkeeper.core.sessions import index_file
from slotkeeper.core.sessions.index import BLOCK, SessionsIndex, SidecarRecord
from slotkeeper.core.sessions.index_file import index_bytes
from slotkeeper.core.sessions.sidecar import load_sidecar
from slotkeeper.core.sessions.stamps import hash_with_stamp
from slotkeeper.core.sessions.store import SessionStore

A = list(range(1, 10 * BLOCK + 1))
SHA = "1a2b3c4d000000000000000000000000000000000000000000000000deadbeef"  # the fixture sidecar's model
SESSIONS = Path(__file__).resolve().parents[2] / "app" / "slotkeeper" / "core" / "sessions"


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_commit_makes_the_incoming_file_the_new_version_step_by_step_and_the_index_learns_it(tmp_path):
    folder = tmp_path / "sessions"
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder, index_file=tmp_path / "index.json")
    store.listing()
    store.index_tokens()
    incoming = write_slot_save(folder / "incoming-0000000000000000.kv", A[:200])
    content_hash, hashed = hash_with_stamp(incoming)
    new = replace(old, kv_file="aaaaaaaaaaaa.00000001.kv", content_hash=content_hash, n_tokens=200,
                  size_bytes=incoming.stat().st_size, verified=None)
    other = SessionStore(folder, lock_timeout=0.2)
    seen = []

    def step(name: str) -> None:
        seen.append((name, _names(folder), load_sidecar(folder / "aaaaaaaaaaaa.json").kv_file,
                     locked_elsewhere(other)))

    sc = store.commit(incoming, new, A[:200], hashed=hashed, replaces=old.kv_file, step=step)

    # Renamed (the previous version still whole), then the sidecar (only now the new version
    # exists), then the previous version's file removed; all under the folder lock.
    assert seen == [
        ("after_rename", ["aaaaaaaaaaaa.00000000.kv", "aaaaaaaaaaaa.00000001.kv", "aaaaaaaaaaaa.json"],
         old.kv_file, True),
        ("after_sidecar", ["aaaaaaaaaaaa.00000000.kv", "aaaaaaaaaaaa.00000001.kv", "aaaaaaaaaaaa.json"],
         new.kv_file, True),
    ]
    assert _names(folder) == ["aaaaaaaaaaaa.00000001.kv", "aaaaaaaaaaaa.json"]
    assert load_sidecar(folder / "aaaaaaaaaaaa.json") == sc
    # The hash's stamp is carried over: a restore may trust the file while it keeps it.
    assert sc.verified is not None and sc.verified.matches(os.lstat(folder / new.kv_file), content_hash)
    # The index learnt it without a look at the folder: the sidecar, both files, the tokens.
    index = store.index
    assert store.indexed("aaaaaaaaaaaa").sidecar == sc
    assert index.file_stat(old.kv_file) is None and index.file_stat(new.kv_file) is not None
    assert index.usage_bytes() == (folder / new.kv_file).stat().st_size
    assert index.longest_prefix(A[:300], SHA)[0].n_blocks == 3
    assert store.index_tokens() == 0  # nothing left to read


def test_commit_refuses_a_kv_name_that_is_not_the_sessions_own_and_touches_nothing(tmp_path):
    folder = tmp_path / "sessions"
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    incoming = write_slot_save(folder / "incoming-0000000000000000.kv", A[:200])
    before = _names(folder)
    for kv in ("bbbbbbbbbbbb.00000001.kv", "../aaaaaaaaaaaa.00000001.kv", "aaaaaaaaaaaa.json"):
        with pytest.raises(ValueError):
            store.commit(incoming, replace(old, kv_file=kv), A[:200], replaces=old.kv_file)
    assert _names(folder) == before


def test_a_first_save_without_its_tokens_is_read_from_its_file_later(tmp_path):
    folder = tmp_path / "sessions"
    make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    template = load_sidecar(folder / "aaaaaaaaaaaa.json")
    store = SessionStore(folder)
    store.listing()
    store.index_tokens()
    incoming = write_slot_save(folder / "incoming-0000000000000000.kv", A[:150])
    sc = store.commit(incoming, replace(template, id="bbbbbbbbbbbb", kv_file="bbbbbbbbbbbb.00000001.kv"),
                      None)
    assert sc.verified is None  # no hash stamp given: a restore hashes the file
    assert store.index_tokens() == 1
    assert {h.session_id
            for h in store.index.longest_prefix(A[:100], SHA)} == {"aaaaaaaaaaaa", "bbbbbbbbbbbb"}


def test_the_index_changes_through_its_own_methods(tmp_path):
    index = SessionsIndex(tmp_path)
    assert index.usage_bytes() is None  # no look at the folder yet
    reads = []

    def read(sid, st):
        reads.append(sid)
        return SidecarRecord(st,
                             {"id": sid, "kv_file": f"{sid}.00000000.kv", "size_bytes": 5, "corrupt": None,
                              "last_used_at": "2026-01-01T00:00:00Z", "model_sha256": "m"})

    old = 1_000_000_000
    st = {sid: (0o100600, 100, old, i, old) for i, sid in enumerate(("a" * 12, "b" * 12))}
    kv = {f"{sid}.00000000.kv": (0o100600, 7, old, 10 + i, old) for i, sid in enumerate(st)}
    files = {**{f"{sid}.json": s for sid, s in st.items()}, **kv}
    index.refresh(files, st, read)
    assert sorted(reads) == ["a" * 12, "b" * 12] and index.usage_bytes() == 14
    assert index.kv_claims() == {sid: {f"{sid}.00000000.kv", f"{sid}.00000000.chat"} for sid in st}
    assert [sid for sid, _ in index.items()] == ["a" * 12, "b" * 12]

    # Unchanged: nothing read; a changed stat: read again; a session gone: forgotten.
    reads.clear()
    index.refresh(files, st, read)
    assert reads == []
    changed = (0o100600, 101, old + 1, 0, old + 1)
    assert index.fresh_record("a" * 12, changed, read).stamp == changed and reads == ["a" * 12]
    index.refresh({k: v for k, v in files.items() if not k.startswith("b")}, {"a" * 12: changed}, read)
    assert index.record("b" * 12) is None and index.file_stat("b" * 12 + ".00000000.kv") is None

    # Entries the store changed: set, then gone.
    index.note_files({"a" * 12 + ".00000000.kv": (0o100600, 9, old, 10, old)})
    assert index.usage_bytes() == 9
    index.note_files({"a" * 12 + ".00000000.kv": None})
    assert index.usage_bytes() == 0 and index.file_stat("a" * 12 + ".00000000.kv") is None

    # Token parts: offered while missing; one that does not read is not offered until it changes.
    key_st = (0o100600, 9, old, 10, old)
    index.note_files({"a" * 12 + ".00000000.kv": key_st}, recheck="a" * 12)
    [(sid, sha, key)] = index.tokens_to_read()
    assert (sid, sha, key) == ("a" * 12, "m", ("a" * 12 + ".00000000.kv", 9, old))
    index.tokens_unreadable(sid, key)
    index.note_files({}, recheck=sid)
    assert index.tokens_to_read() == []
    index.note_files({"a" * 12 + ".00000000.kv": (0o100600, 10, old + 5, 10, old + 5)}, recheck=sid)
    assert [t[0] for t in index.tokens_to_read()] == [sid]

    # A save: the sidecar, its KV file and tokens, the previous file gone, in one call.
    rec = read("c" * 12, (0o100600, 50, old, 30, old))
    assert index.note_save("c" * 12, "m", ("c" * 12 + ".json", rec), "c" * 12 + ".00000001.kv",
                           (0o100600, 11, old, 31, old), "a" * 12 + ".00000000.kv", A[:130])
    assert index.record("c" * 12) is rec and index.file_stat("c" * 12 + ".json") == rec.stamp
    assert index.file_stat("a" * 12 + ".00000000.kv") is None
    assert index.longest_prefix(A[:200], "m")[0].session_id == "c" * 12
    assert "c" * 12 not in {t[0] for t in index.tokens_to_read()}


def test_the_store_changes_the_index_through_its_methods_and_the_save_protocol_writes_no_session_file():
    store_src = (SESSIONS / "store.py").read_text()
    assert not re.findall(r"\bindex\.(records|files|lock|unindexed|token_errors|scanned|_\w+)\b", store_src)
    saving_src = (SESSIONS / "saving.py").read_text()
    for writes in ("os.replace", "write_sidecar_atomic", "fsync_dir", "record_saved", "forget_tokens"):
        assert writes not in saving_src, writes


def test_writing_the_index_out_holds_its_lock_only_for_a_copy(tmp_path, monkeypatch):
    index = SessionsIndex(tmp_path)
    stamp = (0o100600, 100, 1_000_000_000, 1, 1_000_000_000)
    for i in range(3):
        sid = f"{i:012x}"
        index.set_record(sid, SidecarRecord(stamp, {"id": sid, "kv_file": f"{sid}.00000000.kv"}))
        index.add_tokens(sid, "m", f"{sid}.00000000.kv", 1, 1, A[: 100 + i])
    encoded = []
    real = index_file.tokens_json

    def tokens_json(s):
        # While the index is encoded, another thread (routing, a save) takes the lock at once
        # and changes the index.
        got = []

        def other() -> None:
            if index.lock.acquire(timeout=0):
                got.append(True)
                index.lock.release()
                if not encoded:
                    index.set_record("ffffffffffff", SidecarRecord(stamp, {"id": "ffffffffffff"}))

        t = threading.Thread(target=other)
        t.start()
        t.join()
        encoded.append(bool(got))
        return real(s)

    monkeypatch.setattr(index_file, "tokens_json", tokens_json)
    data = index_bytes(index)
    assert encoded == [True, True, True]
    # What was written is the copy taken before the change, and the change makes it dirty again.
    ids = [orjson.loads(line.split(b"\t")[0])["id"] for line in data.splitlines()[1:]]
    assert ids == [f"{i:012x}" for i in range(3)]
    assert index.dirty and index.record("ffffffffffff") is not None


def test_a_save_decided_again_under_the_lock_asks_for_its_title_outside_the_lock(tmp_path, monkeypatch):
    """A save found unchanged (no title needed) whose session another save changed meanwhile is
    decided again under the folder lock; the title it now needs comes from llama-server (HTTP), so
    it is asked for after the lock is let go, never while the folder is locked."""
    from slotkeeper.core.sessions import saving
    from slotkeeper.core.sessions.sidecar import tokens_digest

    folder = tmp_path / "sessions"
    sc = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    store.listing()
    other = SessionStore(folder, lock_timeout=0.2)
    asked_while_locked = []

    def describe(tokens):
        asked_while_locked.append(locked_elsewhere(other))
        return "title", "preview"

    real = saving._classify
    calls = []

    def classify(*args, **kwargs):
        out = real(*args, **kwargs)
        if not calls:  # meanwhile another save makes the session shorter: this one now updates it
            incoming = write_slot_save(folder / "incoming-00000000000000ee.kv", A[:80])
            content_hash, hashed = hash_with_stamp(incoming)
            store.commit(incoming, replace(sc, kv_file="aaaaaaaaaaaa.00000002.kv", n_tokens=80,
                                           tokens_digest=tokens_digest(A[:80]), content_hash=content_hash,
                                           size_bytes=incoming.stat().st_size),
                         A[:80], hashed=hashed, replaces=sc.kv_file)
        calls.append(out[0])
        return out

    monkeypatch.setattr(saving, "_classify", classify)
    incoming = write_slot_save(folder / "incoming-00000000000000ff.kv", A[:100])
    facts = facts_of(sc)
    written = saving.Written(incoming, A[:100], incoming.stat().st_size, 0, 0)
    out = saving.commit_written(store, written, saving.SaveContext(facts, sc.arch, sc.llama_build), describe,
                                current_id=sc.id)
    assert calls[0] == "unchanged" and out.kind == "update" and out.sidecar.n_tokens == 100
    assert asked_while_locked == [False]

