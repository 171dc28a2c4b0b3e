"""The head start's rules (core/server/headstart.py): when it may start llama-server early, and when
it must not. The launch itself is tested with the real server in tests/e2e/test_headstart.py;
here the spawn is recorded instead."""

from __future__ import annotations

import json
import os
import socket

import pytest

from slotkeeper.core.basics import datalock
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.server import headstart, spawn
from slotkeeper.core.server.supervisor import Supervisor

COMMAND_LINE = ["serve", "--port", "8080"]


@pytest.fixture
def spawned(monkeypatch):
    calls = []

    class FakePopen:
        pid = os.getpid()  # a live process, as the state file must name one

        def poll(self):
            return None

        def kill(self):
            calls.append("killed")

        def wait(self, timeout=None):
            return -9

    def fake_spawn(argv, env, log_path):
        calls.append(list(argv))
        return FakePopen()

    monkeypatch.setattr(spawn, "spawn_server", fake_spawn)
    monkeypatch.setattr(headstart, "_early", None)
    monkeypatch.setattr(datalock, "_held", {})
    yield calls
    headstart._early = None


@pytest.fixture
def noted(isolated_home, tmp_path):
    """A data folder with a note for COMMAND_LINE and its private address; the binary and model exist."""
    paths = app_paths().ensure()
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_text("#!/bin/sh\n")
    model.write_bytes(b"GGUF")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    paths.private_address_file.write_text(json.dumps({"port": port, "key": "k" * 43}))
    server_argv = [str(binary), "--model", str(model), "--port", str(port)]
    headstart.remember(paths, COMMAND_LINE, server_argv, port)
    return paths, server_argv, port


def test_the_note_starts_exactly_its_server_and_only_for_its_command_line(noted, spawned):
    paths, server_argv, _ = noted
    headstart.begin(["serve", "--port", "9090"])
    assert spawned == []
    headstart.begin(COMMAND_LINE)
    assert spawned == [server_argv]
    early = headstart.early()
    assert early is not None and early.env["LLAMA_API_KEY"] == "k" * 43
    assert headstart.take(server_argv, {**early.env, "LLAMA_API_KEY": "another"}) is None  # not the plan's
    assert spawned[-1] == "killed" and headstart.early() is None


def test_the_early_server_is_recorded_at_once_and_the_record_goes_with_it(noted, spawned):
    paths, server_argv, port = noted
    headstart.begin(COMMAND_LINE)
    state = json.loads(paths.server_state_file.read_text())
    # Should this process die before the take-over, the next launch finds it (and stops it unsaved).
    assert state["early"] is True and state["pid"] == os.getpid() and state["argv"] == server_argv
    assert state["port"] == port and state["host"] == "127.0.0.1"
    # The supervisor's own check of the record (pid and start time) recognises it ...
    supervisor = Supervisor(log_path=paths.server_log,
                            state_file=paths.server_state_file)
    assert supervisor.leftover_port() == port
    # ... and the process that began it is not a leftover
    assert supervisor.leftover_port(ours=os.getpid()) is None
    headstart.discard()
    assert spawned[-1] == "killed" and not paths.server_state_file.exists()


def test_an_early_server_that_cannot_be_recorded_is_stopped(noted, spawned, monkeypatch):
    def no_room(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spawn, "write_state_file", no_room)
    headstart.begin(COMMAND_LINE)
    assert spawned[-1] == "killed" and headstart.early() is None


@pytest.mark.parametrize("change", ["model", "settings", "private", "garbled", "version", "cwd"])
def test_a_note_whose_inputs_changed_starts_nothing(noted, spawned, change, tmp_path, monkeypatch):
    paths, server_argv, _ = noted
    note_file = paths.cache_dir / headstart.NOTE_NAME
    if change == "model":
        with open(server_argv[2], "ab") as f:
            f.write(b"more")
    elif change == "settings":
        paths.settings_file.write_text("{}")
    elif change == "private":
        data = json.loads(paths.private_address_file.read_text())
        paths.private_address_file.write_text(json.dumps({**data, "key": "x" * 44}))
    elif change == "garbled":
        note_file.write_text("{not json")
    elif change == "version":
        note = json.loads(note_file.read_text())
        note_file.write_text(json.dumps({**note, "version": headstart.NOTE_VERSION + 1}))
    elif change == "cwd":
        monkeypatch.chdir(tmp_path)
    headstart.begin(COMMAND_LINE)
    assert spawned == [] and headstart.early() is None


def test_no_early_server_when_one_may_be_left_running_the_port_is_taken_or_the_folder_is_in_use(
        noted, spawned, monkeypatch):
    paths, _, port = noted
    paths.server_state_file.write_text("{}")  # an earlier run's server may be alive: the engine decides
    headstart.begin(COMMAND_LINE)
    assert spawned == []
    paths.server_state_file.unlink()

    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen(1)
        headstart.begin(COMMAND_LINE)
    assert spawned == []

    def busy(lock_file, what):
        raise datalock.DataDirBusy("another Slotkeeper")

    monkeypatch.setattr(datalock, "acquire", busy)
    headstart.begin(COMMAND_LINE)
    assert spawned == []


def test_data_dir_is_found_anywhere_before_the_extra_arguments():
    assert headstart._data_dir(["--data-dir", "/a", "serve"]) == "/a"
    assert headstart._data_dir(["serve", "--data-dir=/b"]) == "/b"
    assert headstart._data_dir(["serve", "--", "--data-dir", "/c"]) is None
    assert headstart._data_dir(["serve"]) is None


def test_other_commands_do_not_import_the_head_start(isolated_home):
    import subprocess
    import sys

    for args in (["--version"], ["sessions", "list", "--json"]):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slotkeeper", *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "slotkeeper.core.server.headstart" not in r.stderr and "slotkeeper.cli" in r.stderr
