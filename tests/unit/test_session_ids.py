"""A session id is a name, never a path: no face can reach a file outside the sessions folder."""

from __future__ import annotations

import json
import os

import pytest
from sessions_helpers import make_session, run_cli

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.services.sessions import SessionsService
from slotkeeper.core.sessions.naming import InvalidSessionId, validate_session_id
from slotkeeper.core.sessions.restoring import RestoreRefused, check_restorable
from slotkeeper.core.sessions.store import SessionStore

SID = "aaaaaaaaaaaa"
NOT_IDS = ["", "../x", "./" + SID, "/etc/passwd", "a/b", "a.b", "x" * 65, "..", "a\n", "a b", "é"]


@pytest.mark.parametrize("value", NOT_IDS)
def test_what_is_not_an_id(value):
    with pytest.raises(InvalidSessionId, match="is not a session id"):
        validate_session_id(value)


def test_ids_the_schema_allows():
    for value in (SID, "A-b_9", "x" * 64):
        assert validate_session_id(value) == value


@pytest.fixture
def outside(tmp_path):
    """A sidecar-looking file beside the sessions folder, where a path-like id would reach."""
    store = SessionStore(tmp_path / "sessions")
    make_session(store.dir, SID)
    victim = make_session(tmp_path / "elsewhere", "bbbbbbbbbbbb")
    return store, tmp_path / "elsewhere", victim


@pytest.mark.parametrize("face", ["get", "delete", "verify", "pin", "update", "mark_corrupt", "sidecar_path"])
def test_every_store_entry_point_refuses_a_path(outside, face):
    store, elsewhere, victim = outside
    before = sorted(p.name for p in elsewhere.iterdir())
    text = (elsewhere / f"{victim.id}.json").read_text()
    call = {
        "get": lambda bad: store.get(bad),
        "delete": lambda bad: store.delete(bad),
        "verify": lambda bad: store.verify(bad),
        "pin": lambda bad: store.set_pinned(bad, True),
        "update": lambda bad: store.update(bad, lambda s: s),
        "mark_corrupt": lambda bad: store.mark_corrupt(bad, "x"),
        "sidecar_path": lambda bad: store.sidecar_path(bad),
    }[face]
    for bad in (str(elsewhere / victim.id), f"../elsewhere/{victim.id}", f"./{SID}"):
        with pytest.raises(InvalidSessionId):
            call(bad)
    assert sorted(p.name for p in elsewhere.iterdir()) == before
    assert (elsewhere / f"{victim.id}.json").read_text() == text
    assert [e.id for e in store.sessions()] == [SID]


def test_the_in_slot_refusal_cannot_be_bypassed_with_another_spelling(outside):
    store, _elsewhere, _victim = outside
    service = SessionsService(store, in_slots=lambda: {SID}, budget=lambda: 10**9)
    with pytest.raises(InvalidSessionId):
        service.delete(f"./{SID}")
    assert [e.id for e in store.sessions()] == [SID]


def test_a_restore_of_a_path_is_refused_with_a_reason(outside):
    store, elsewhere, victim = outside
    with pytest.raises(RestoreRefused, match="is not a session id"):
        check_restorable(store, str(elsewhere / victim.id), facts=None)


# -- the command line, in real processes ------------------------------------------------------
@pytest.fixture
def home(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    make_session(paths.sessions_dir, SID)
    (paths.config_dir / "settings.json").write_text("{}")
    victim = make_session(tmp_path / "outside", "bbbbbbbbbbbb")
    return paths, tmp_path / "outside", victim


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("action", ["delete", "show", "verify", "pin", "unpin"])
def test_the_cli_refuses_paths_and_leaves_outside_files_alone(home, action):
    paths, outside, victim = home
    outside_before = snapshot(outside)
    config_before = snapshot(paths.config_dir)
    for bad in (str(outside / victim.id), "../config/settings", f"../../outside/{victim.id}"):
        r = run_cli(paths.data_dir, action, bad)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "is not a session id" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(outside) == outside_before
    assert snapshot(paths.config_dir) == config_before
    assert json.loads(run_cli(paths.data_dir, "list", "--json").stdout)[0]["pinned"] is False


def test_the_cli_keeps_a_session_in_a_slot_whatever_its_spelling(home):
    paths, _outside, _victim = home
    # A live engine (this test's own process) holds SID in a slot.
    paths.in_slots_file.write_text(json.dumps({"engine_pid": os.getpid(), "sessions": [SID]}))
    assert "loaded in a slot" in run_cli(paths.data_dir, "delete", SID).stderr
    r = run_cli(paths.data_dir, "delete", f"./{SID}")
    assert r.returncode == 1 and "is not a session id" in r.stderr
    assert (paths.sessions_dir / f"{SID}.json").exists()
