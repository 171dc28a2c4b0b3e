"""Every run of llama-server starts in one place (core/server/spawn.py): the server, the
flash-attention probe and its --help. On a faked Windows each gets no console window, and the
packaged (PyInstaller) app's DLL folder is cleared for the start and put back after; the Popen calls
are recorded, never made."""

from __future__ import annotations

import ctypes
import io
import os
import stat
import subprocess
import sys

import pytest
from windows_fakes import fake_windows_files

from slotkeeper.core.server import flash_attn, locate, logfile, spawn
from slotkeeper.core.server.locate import ServerBinary, probe_flags

BUNDLE = "C:\\Program Files\\Slotkeeper\\_internal"


@pytest.fixture
def events(monkeypatch) -> list:
    """What happens, in order: each Popen (its argv and options) and each DLL-folder call."""
    happened: list = []

    class FakePopen:
        pid = os.getpid()

        def __init__(self, argv, **options):
            happened.append(("popen", list(argv), options))
            self.stdout = io.BytesIO(b"")

        def communicate(self, timeout=None):
            return "usage: llama-server --metrics --cache-ram N", None

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

        def kill(self):
            pass

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr(locate, "_flag_cache", {})
    fake_windows_files(monkeypatch)  # the server log's handle, on a faked Windows
    return happened


@pytest.fixture
def binary(tmp_path) -> ServerBinary:
    path = tmp_path / "llama-server"
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return ServerBinary((str(path),), "test")


def run_each(binary: ServerBinary, tmp_path) -> list[str]:
    """Start llama-server each way the app does; the names of the ways."""
    spawn.spawn_server([binary.path, "--port", "1"], None, tmp_path / "logs" / "llama-server.log")
    flash_attn._ask([binary.path, "--flash-attn", "auto"], 5.0)
    assert probe_flags(binary) == {"--metrics", "--cache-ram"}
    return ["server", "flash-attention probe", "--help"]


def popens(events: list) -> list:
    return [e for e in events if e[0] == "popen"]


def test_no_run_of_llama_server_opens_a_console_window_on_windows(monkeypatch, events, binary, tmp_path):
    monkeypatch.setattr(sys, "platform", "win32")
    ways = run_each(binary, tmp_path)
    runs = popens(events)
    assert len(runs) == len(ways)
    for way, (_, _, options) in zip(ways, runs):
        assert options["creationflags"] & 0x08000000, f"the {way} opens a console window"  # CREATE_NO_WINDOW
        assert "start_new_session" not in options and "umask" not in options, way
    server, probe, help_run = (options["creationflags"] for _, _, options in runs)
    assert server & 0x200 and probe & 0x200, "stopped with their children"  # CREATE_NEW_PROCESS_GROUP
    assert not help_run & 0x200


def test_posix_servers_get_their_own_session_and_a_private_umask(events, binary, tmp_path):
    if sys.platform == "win32":
        pytest.skip("POSIX options")
    run_each(binary, tmp_path)
    (_, _, server), (_, _, probe), (_, _, help_run) = popens(events)
    assert server["start_new_session"] and server["umask"] == 0o077
    assert probe["start_new_session"]
    assert "creationflags" not in help_run and "start_new_session" not in help_run


class FakeKernel32:
    """SetDllDirectoryW and GetDllDirectoryW, recorded; PyInstaller's bootloader set ``BUNDLE``."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.folder: str | None = BUNDLE

    def GetDllDirectoryW(self, size, buffer):  # noqa: N802 - the Windows API's name
        self.events.append(("get",))
        if not self.folder:
            return 0
        buffer.value = self.folder
        return len(self.folder)

    def SetDllDirectoryW(self, folder):  # noqa: N802
        self.events.append(("set", folder))
        self.folder = folder
        return 1


@pytest.fixture
def windows_app(monkeypatch, events):
    """A faked packaged app on Windows: sys.frozen, and ctypes.windll.kernel32 recorded."""
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    kernel32 = FakeKernel32(events)
    monkeypatch.setattr(ctypes, "windll", type("WinDLL", (), {"kernel32": kernel32})(), raising=False)
    return kernel32


def test_the_packaged_apps_dll_folder_is_cleared_for_each_start_and_put_back(windows_app, events, binary,
                                                                              tmp_path):
    ways = run_each(binary, tmp_path)
    starts = [i for i, e in enumerate(events) if e[0] == "popen"]
    assert len(starts) == len(ways)
    for way, i in zip(ways, starts):
        # cleared before the start (the child inherits it), ours again right after
        assert events[i - 2:i] == [("get",), ("set", None)], way
        assert events[i + 1] == ("set", BUNDLE), way
    assert windows_app.folder == BUNDLE


def test_a_dll_folder_nobody_set_is_not_set_after(windows_app, events, binary, tmp_path):
    windows_app.folder = None
    spawn.spawn_server([binary.path], None, tmp_path / "llama-server.log")
    assert [e for e in events if e[0] != "popen"] == [("get",), ("set", None)]


@pytest.mark.parametrize("platform", ["win32", "linux"])
def test_the_dll_folder_is_left_alone_from_source_and_off_windows(monkeypatch, events, binary, tmp_path,
                                                                  platform):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(sys, "frozen", platform == "linux", raising=False)
    monkeypatch.setattr(ctypes, "windll", None, raising=False)  # any use of it would fail
    run_each(binary, tmp_path)
    assert len(popens(events)) == 3


def test_help_runs_without_the_packaged_apps_library_paths(monkeypatch, events, binary):
    """A frozen Linux app's LD_LIBRARY_PATH points into the bundle (PyInstaller keeps the user's own
    as LD_LIBRARY_PATH_ORIG): llama-server's --help gets the user's, as the server does."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/bundle/_internal")
    monkeypatch.setenv("LD_LIBRARY_PATH_ORIG", "/usr/local/cuda/lib64")
    probe_flags(binary)
    [(_, _, options)] = popens(events)
    assert options["env"]["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert "LD_LIBRARY_PATH_ORIG" not in options["env"]


def test_help_that_hangs_is_stopped(monkeypatch, binary):
    killed = []

    class Hanging:
        def __init__(self, argv, **options):
            pass

        def communicate(self, timeout=None):
            if timeout is not None:
                raise subprocess.TimeoutExpired("llama-server", timeout)
            return "", None

        def kill(self):
            killed.append(True)

    monkeypatch.setattr(subprocess, "Popen", Hanging)
    monkeypatch.setattr(locate, "_flag_cache", {})
    assert probe_flags(binary, timeout=0.1) == frozenset()
    assert killed == [True]


def test_on_windows_the_server_writes_its_log_through_an_append_only_handle(monkeypatch, events, binary,
                                                                            tmp_path):
    monkeypatch.setattr(sys, "platform", "win32")
    files = fake_windows_files(monkeypatch)
    log_path = tmp_path / "logs" / "llama-server.log"
    spawn.spawn_server([binary.path, "--port", "1"], None, log_path)
    [(name, access, *_rest)] = files.created
    assert name == str(log_path)
    assert access & logfile.FILE_APPEND_DATA and not access & logfile.FILE_WRITE_DATA
    [(_popen, _argv, options)] = popens(events)
    assert options["stdout"].name == files.fds[-1] and options["stderr"] == subprocess.STDOUT
