"""A sidecar copied under another id must not take another session's conversation with it."""

from __future__ import annotations

import shutil

from sessions_helpers import make_session, run_cli

from slotkeeper.core.sessions.store import SessionStore


def test_a_copied_sidecar_is_a_problem_and_deleting_it_keeps_the_original(tmp_path):
    data = tmp_path / "data"
    store = SessionStore(data / "sessions")
    original = make_session(store.dir, "aaaaaaaaaaaa", size=2000)
    shutil.copy(store.sidecar_path("aaaaaaaaaaaa"), store.sidecar_path("bbbbbbbbbbbb"))  # `cp a.json b.json`
    copy = store.get("bbbbbbbbbbbb")
    assert any("belongs to another session" in p for p in copy.problems)
    assert store.get("aaaaaaaaaaaa").problems == []
    r = run_cli(data, "delete", "bbbbbbbbbbbb")
    assert r.returncode == 0, r.stderr
    assert (store.dir / original.kv_file).exists(), "the original's conversation is still there"
    assert store.verify("aaaaaaaaaaaa").status == "ok"
