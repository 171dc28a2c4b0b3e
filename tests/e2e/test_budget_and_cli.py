"""Disk budget and the `sessions` CLI on real saved sessions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from e2e_helpers import EventLog, converse, make_engine

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

CHATS = [
    ["Tell me about red apples and the orchards where they grow."],
    ["I am planning a trip by train across the country next spring."],
    ["My cat keeps waking me up at five in the morning every day."],
    ["What is a good way to start learning to play the guitar?"],
]


def cli(home, *args):
    r = subprocess.run([sys.executable, "-m", "slotkeeper", "sessions", "--data-dir", str(home), *args],
                       capture_output=True, text=True, timeout=60)
    return r


@pytest.fixture
def four_sessions(llama_model, server_bin, port, isolated_home):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for turns in CHATS:
            converse(engine.base_url, turns, max_tokens=8)
            assert engine.save_slot(0).kind == "new"
    finally:
        engine.stop(save=False)
    return isolated_home


def test_list_json_contract(four_sessions):
    r = cli(four_sessions, "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 4
    required = {"id", "title", "model_path", "model_sha256", "arch", "swa", "swa_full", "flash_attn",
                "cache_type_k", "cache_type_v", "n_parallel", "n_ctx_slot", "n_tokens", "size_bytes",
                "created_at", "last_used_at", "pinned", "parent", "status", "problems", "last_restore"}
    for row in rows:
        assert required <= row.keys()
        assert row["status"] == "ok" and row["problems"] == [] and row["last_restore"] is None
        assert row["arch"] == "llama" and row["swa"] is False and row["n_tokens"] > 10
    assert rows[0]["title"].startswith("What is a good way")  # most recently used first
    r = cli(four_sessions, "show", rows[0]["id"], "--json")
    assert json.loads(r.stdout)["id"] == rows[0]["id"]
    assert cli(four_sessions, "show", "nope").returncode == 1
    assert cli(four_sessions, "verify").returncode == 0


def test_prune_oldest_unused_first_pinned_survive_dry_run_matches(four_sessions):
    rows = json.loads(cli(four_sessions, "list", "--json").stdout)
    oldest_first = list(reversed(rows))
    assert cli(four_sessions, "pin", oldest_first[0]["id"]).returncode == 0
    sizes = [r["size_bytes"] for r in oldest_first]
    budget = sum(sizes) - sizes[0] - 1  # forces out more than one
    dry = cli(four_sessions, "prune", "--budget", str(budget), "--dry-run")
    assert dry.returncode == 0
    would = [line.split()[2] for line in dry.stdout.splitlines() if line.startswith("would delete")]
    assert oldest_first[0]["id"] not in would  # pinned
    assert would == [r["id"] for r in oldest_first[1:1 + len(would)]]  # oldest-unused first
    assert len(json.loads(cli(four_sessions, "list", "--json").stdout)) == 4  # dry run deleted nothing
    real = cli(four_sessions, "prune", "--budget", str(budget))
    assert real.returncode == 0
    left = {r["id"] for r in json.loads(cli(four_sessions, "list", "--json").stdout)}
    assert left == {r["id"] for r in rows} - set(would)
    assert sum(r["size_bytes"] for r in rows if r["id"] in left) <= budget


def test_engine_prunes_after_save_but_keeps_in_slot_sessions(llama_model, server_bin, port, isolated_home):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for turns in CHATS[:2]:
            converse(engine.base_url, turns, max_tokens=8)
            engine.save_slot(0)
        from dataclasses import replace

        update_settings(engine, replace(engine.settings, budget_bytes=1))
        [pruned] = events.of(ev.SessionsPruned)
        left = engine.library.store.sessions()
        assert len(left) == 1 and left[0].id in engine.snapshot.in_slots
        assert len(pruned.ids) == 1
    finally:
        engine.stop(save=False)


def test_delete_and_unmanaged_files(four_sessions):
    stray = four_sessions / "sessions" / "my-own-notes.bin"
    stray.write_bytes(b"x" * 100)
    rows = json.loads(cli(four_sessions, "list", "--json").stdout)
    assert cli(four_sessions, "delete", rows[0]["id"]).returncode == 0
    assert len(json.loads(cli(four_sessions, "list", "--json").stdout)) == 3
    out = cli(four_sessions, "list").stdout
    assert "1 unmanaged file" in out
    cli(four_sessions, "prune", "--budget", "0")
    assert stray.exists()  # never deleted automatically


def test_cli_prune_keeps_what_a_running_engine_holds_in_a_slot(four_sessions, llama_model, server_bin, port):
    rows = json.loads(cli(four_sessions, "list", "--json").stdout)
    engine = make_engine(llama_model, server_bin, port, idle_save=3600)
    engine.start(resume_id=rows[-1]["id"])  # the oldest, which a prune would take first
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert cli(four_sessions, "prune", "--budget", "0").returncode == 0
        left = [r["id"] for r in json.loads(cli(four_sessions, "list", "--json").stdout)]
        assert left == [rows[-1]["id"]]
    finally:
        engine.stop(save=False)
