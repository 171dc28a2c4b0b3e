"""One table of use cases for every face: the command line runs the sessions' entries of the same
table the GUI's bridge does, and each returns one change type (tests/gui cover the bridge's hook)."""

from __future__ import annotations

import asyncio

import pytest
from sessions_helpers import make_session

from slotkeeper.cli.commands import main
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.services.sessions import SessionsService
from slotkeeper.core.services.use_cases import ENGINE_USE_CASES, SESSION_USE_CASES, Changes
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.views import RestoreSummary


@pytest.fixture
def folder(isolated_home):
    paths = app_paths(str(isolated_home)).ensure()
    make_session(paths.sessions_dir, "0123456789ab", title="A heron at dawn")
    make_session(paths.sessions_dir, "ba9876543210", title="Snow on the ridge")
    return isolated_home, paths


def test_the_command_line_runs_the_tables_sessions_entries(folder, capsys, monkeypatch):
    home, paths = folder
    ran: list[str] = []
    for name, case in SESSION_USE_CASES.items():
        real = case.run
        monkeypatch.setitem(SESSION_USE_CASES, name, type(case)(case.name, case.doing, case.done,
                                                                lambda s, sid, real=real, name=name:
                                                                ran.append(name) or real(s, sid)))
    assert main(["sessions", "--data-dir", str(home), "pin", "0123456789ab"]) == 0
    assert capsys.readouterr().out == "pinned 0123456789ab  A heron at dawn\n"
    assert main(["sessions", "--data-dir", str(home), "unpin", "0123"]) == 0
    assert capsys.readouterr().out == "unpinned 0123456789ab  A heron at dawn\n"
    assert main(["sessions", "--data-dir", str(home), "delete", "ba98"]) == 0
    assert capsys.readouterr().out.startswith("deleted ba9876543210")
    assert main(["sessions", "--data-dir", str(home), "verify", "0123456789ab"]) == 0
    assert capsys.readouterr().out.startswith("0123456789ab  ok")
    assert ran == ["pin", "unpin", "delete", "verify"]


def test_each_entry_says_what_it_changed(folder):
    _home, paths = folder
    service = SessionsService(SessionStore(paths.sessions_dir))
    pinned = SESSION_USE_CASES["pin"].run(service, "0123456789ab")
    assert isinstance(pinned, Changes) and pinned.sessions.changed[0].sidecar.pinned
    verified = SESSION_USE_CASES["verify"].run(service, "0123456789ab")
    assert verified.sessions.changed[0].id == "0123456789ab" and not verified.sessions.changed[0].problems
    deleted = SESSION_USE_CASES["delete"].run(service, "ba9876543210")
    assert deleted.sessions.removed == ("ba9876543210",) and deleted.settings is None


def test_the_engines_entries_return_changes_too():
    class Engine:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        async def start_async(self, resume_id=None):
            self.calls.append(("start", resume_id))

        async def restore_async(self, session_id, slot=None):
            self.calls.append(("restore", session_id, slot))
            return RestoreSummary(session_id, 0, 100, 1.0, "t")

    engine = Engine()
    resumed = asyncio.run(ENGINE_USE_CASES["resume"].run(engine, None, "0123456789ab"))
    restored = asyncio.run(ENGINE_USE_CASES["restore"].run(engine, None, "0123456789ab", 1))
    assert resumed == Changes() and restored.restored.id == "0123456789ab"
    assert engine.calls == [("start", "0123456789ab"), ("restore", "0123456789ab", 1)]
    assert set(ENGINE_USE_CASES) == {"settings", "switch", "resume", "restore"}
