"""What counts towards the disk budget: saved sessions' KV files as the file system measures them.

A sidecar's size_bytes is what was saved (an integrity check), never what is counted: a sidecar
claiming 10 TB must not make the next save prune every real session. Files Slotkeeper did not
write are listed and shown, but never counted and never a reason to prune.
"""

from __future__ import annotations

import json

import pytest
from sessions_helpers import make_session, run_cli

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.services.sessions import SessionsService
from slotkeeper.core.sessions.store import SessionStore

IDS = ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"]
TEN_TB = 10 * 10**12


@pytest.fixture
def paths(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    for i, sid in enumerate(IDS):
        make_session(paths.sessions_dir, sid, size=1000, used=f"2026-0{i + 1}-01T00:00:00Z")
    return paths


def service(paths, budget: int) -> SessionsService:
    return SessionsService(SessionStore(paths.sessions_dir), in_slots=set, budget=lambda: budget)


def ids_left(paths) -> set[str]:
    return {e.id for e in SessionStore(paths.sessions_dir).sessions()}


def test_a_sidecar_claiming_10_tb_is_counted_at_its_real_size(paths):
    liar = make_session(paths.sessions_dir, "dddddddddddd", size=1000, used="2025-12-01T00:00:00Z")
    sc_path = paths.sessions_dir / f"{liar.id}.json"
    sc_path.write_text(json.dumps({**json.loads(sc_path.read_text()), "size_bytes": TEN_TB}))
    listing = SessionStore(paths.sessions_dir).listing()
    entry = next(e for e in listing.sessions if e.id == liar.id)
    assert entry.size_bytes == 1000 and "were saved" in entry.problems[0]  # the claim is still checked
    assert listing.total_bytes == 4000
    outcome = service(paths, budget=4000).prune()
    assert outcome.plan.delete == [] and outcome.plan.bytes_before == 4000
    assert ids_left(paths) == set(IDS) | {liar.id}
    rows = json.loads(run_cli(paths.data_dir, "list", "--json").stdout)
    assert {r["size_bytes"] for r in rows} == {1000}
    r = run_cli(paths.data_dir, "prune", "--budget", "4000")
    assert r.returncode == 0 and "deleting" not in r.stdout, r.stdout
    assert ids_left(paths) == set(IDS) | {liar.id}


def test_a_session_whose_kv_file_is_missing_counts_zero(paths):
    (paths.sessions_dir / f"{IDS[0]}.00000000.kv").unlink()
    entry = next(e for e in SessionStore(paths.sessions_dir).sessions() if e.id == IDS[0])
    assert entry.size_bytes == 0 and "missing" in entry.problems[0]
    plan = service(paths, budget=2000).plan_prune()
    assert plan.bytes_before == 2000 and plan.delete == []


def test_files_that_are_not_ours_never_cause_a_prune(paths):
    junk = paths.sessions_dir / "junk.bin"
    junk.write_bytes(b"\0" * 1_000_000)  # far over the budget on its own
    (paths.sessions_dir / "more-junk.kv").write_bytes(b"\0" * 10)
    outcome = service(paths, budget=3000).prune()
    assert outcome.plan.delete == [] and outcome.result.deleted == []
    assert outcome.plan.unmanaged_bytes == 1_000_010
    assert {u.name for u in outcome.unmanaged} == {"junk.bin", "more-junk.kv"}
    assert ids_left(paths) == set(IDS) and junk.exists()
    # Over the budget by the sessions alone, the oldest goes, as if the junk were not there.
    assert service(paths, budget=2500).prune().result.deleted == [IDS[0]]
    assert junk.exists()


def test_the_cli_shows_files_that_are_not_ours_and_says_they_do_not_count(paths):
    (paths.sessions_dir / "junk.bin").write_bytes(b"\0" * 5000)
    r = run_cli(paths.data_dir, "list")
    assert r.returncode == 0, r.stderr
    assert "3 saved conversations, 2.9 KiB on disk" in r.stdout  # the sessions only
    assert "1 unmanaged file, 4.9 KiB, not Slotkeeper's: they do not count towards the budget" in r.stdout
    assert "'junk.bin'" in r.stdout
    r = run_cli(paths.data_dir, "prune", "--budget", "3000", "--dry-run")
    assert r.returncode == 0 and "would delete" not in r.stdout
    assert "do not count towards the budget" in r.stdout
    assert "junk.bin" in r.stdout
