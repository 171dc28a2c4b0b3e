"""Transcripts in the sessions folder: written by the store in the same commit as the KV file,
removed with their version, swept when no sidecar claims them, never listed as a stranger's file."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest
from sessions_helpers import make_session, write_slot_save

from slotkeeper.core.sessions.stamps import hash_with_stamp
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.sessions.transcripts import Message, Transcript, TranscriptError

A = list(range(1, 300))
T1 = Transcript("chat", (Message("user", "Is the ridge icy?"), Message("assistant", "In places.")))
T2 = T1.with_reply(Message("user", "Then I take crampons."))


def _commit(folder, store, old, name, n, transcript):
    incoming = write_slot_save(folder / f"incoming-{name}.kv", A[:n])
    content_hash, hashed = hash_with_stamp(incoming)
    new = replace(old, kv_file=f"aaaaaaaaaaaa.{name}.kv", content_hash=content_hash, n_tokens=n,
                  size_bytes=incoming.stat().st_size, verified=None)
    return store.commit(incoming, new, A[:n], hashed=hashed, replaces=old.kv_file,
                        transcript=transcript.to_bytes() if transcript else None)


def test_a_version_carries_its_transcript_and_the_next_version_replaces_it(tmp_path):
    folder = tmp_path / "sessions"
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    store.listing()
    first = _commit(folder, store, old, "00000001", 200, T1)
    entry = store.get("aaaaaaaaaaaa")
    assert store.transcript(entry) == T1
    assert stat.S_IMODE(os.stat(folder / "aaaaaaaaaaaa.00000001.chat").st_mode) == 0o600
    _commit(folder, store, first, "00000002", 250, T2)
    assert store.transcript(store.get("aaaaaaaaaaaa")) == T2
    assert sorted(n for n in os.listdir(folder) if n.endswith(".chat")) == ["aaaaaaaaaaaa.00000002.chat"]
    assert not store.listing().unmanaged
    store.delete("aaaaaaaaaaaa")
    assert not [n for n in os.listdir(folder) if n.endswith(".chat")]


def test_a_version_saved_without_one_has_none_and_a_damaged_one_says_so(tmp_path):
    folder = tmp_path / "sessions"
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    assert store.transcript(store.get("aaaaaaaaaaaa")) is None
    _commit(folder, store, old, "00000001", 200, None)
    assert store.transcript(store.get("aaaaaaaaaaaa")) is None
    (folder / "aaaaaaaaaaaa.00000001.chat").write_bytes(b"{not json")
    with pytest.raises(TranscriptError):
        store.transcript(store.get("aaaaaaaaaaaa"))
    (folder / "aaaaaaaaaaaa.00000001.chat").unlink()
    os.symlink("/etc/passwd", folder / "aaaaaaaaaaaa.00000001.chat")  # never followed
    with pytest.raises(TranscriptError):
        store.transcript(store.get("aaaaaaaaaaaa"))


def test_a_transcript_no_version_claims_is_swept(tmp_path):
    folder = tmp_path / "sessions"
    make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    # A save that died after writing its transcript, before its sidecar: its version never existed.
    (folder / "aaaaaaaaaaaa.0000dead.chat").write_bytes(T1.to_bytes())
    (folder / "bbbbbbbbbbbb.00000001.chat").write_bytes(T1.to_bytes())  # no such session at all
    removed = store.sweep()
    assert sorted(removed) == ["aaaaaaaaaaaa.0000dead.chat", "bbbbbbbbbbbb.00000001.chat"]


def test_the_command_line_shows_and_exports_a_transcript(tmp_path):
    from sessions_helpers import run_cli

    home = tmp_path / "home"
    folder = home / "sessions"
    home.mkdir(mode=0o700)
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    _commit(folder, SessionStore(folder), old, "00000001", 200, T2)
    shown = run_cli(home, "show", "aaaa", "--transcript")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == ["--- user", "Is the ridge icy?"]
    assert "--- assistant\nIn places." in shown.stdout
    md = run_cli(home, "export", "aaaaaaaaaaaa")
    assert md.returncode == 0 and "## Assistant\n\nIn places." in md.stdout
    out = tmp_path / "chat.json"
    js = run_cli(home, "export", "aaaaaaaaaaaa", "--format", "json", "-o", str(out))
    assert js.returncode == 0 and stat.S_IMODE(out.stat().st_mode) == 0o600
    import json

    assert json.loads(out.read_text())["messages"][0] == {"role": "user", "content": "Is the ridge icy?"}
    make_session(folder, "bbbbbbbbbbbb", tokens=A[:50])
    none = run_cli(home, "export", "bbbbbbbbbbbb")
    assert none.returncode == 1 and "saved without a transcript" in none.stderr
