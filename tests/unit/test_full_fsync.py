"""macOS: fsync only hands the data to the drive; every durable write asks for F_FULLFSYNC.

Faked here (the machine running the tests need not be a Mac): sys.platform is "darwin" and fcntl is
a fake that records what it is asked.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from slotkeeper.core.basics import fsutil

F_FULLFSYNC = 51  # macOS's value


class FakeFcntl(types.ModuleType):
    F_FULLFSYNC = F_FULLFSYNC

    def __init__(self, fails: bool = False) -> None:
        super().__init__("fcntl")
        self.calls: list[tuple[int, int]] = []
        self.fsyncs: list[int] = []  # os.fsync's calls, by inode
        self.fails = fails

    def fcntl(self, fd: int, cmd: int, arg: int = 0) -> int:
        self.calls.append((os.fstat(fd).st_ino, cmd))
        if self.fails:  # a file system without it (some network ones)
            raise OSError(45, "Operation not supported")
        return 0


@pytest.fixture
def mac(monkeypatch):
    fake = FakeFcntl()
    monkeypatch.setitem(sys.modules, "fcntl", fake)
    monkeypatch.setattr(sys, "platform", "darwin")
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fake.fsyncs.append(os.fstat(fd).st_ino), real_fsync(fd))[1])
    return fake


def test_on_macos_an_atomic_write_reaches_the_disk(tmp_path, mac):
    path = tmp_path / "settings.json"
    fsutil.atomic_write_bytes(path, b"{}")
    synced = {ino for ino, cmd in mac.calls if cmd == F_FULLFSYNC}
    assert os.stat(path).st_ino in synced  # the file (its temp file, renamed)
    assert os.stat(tmp_path).st_ino in synced  # and the rename, by its folder
    assert mac.fsyncs == []  # F_FULLFSYNC did it


def test_on_macos_a_file_llama_server_wrote_reaches_the_disk(tmp_path, mac):
    path = tmp_path / "incoming.kv"
    path.write_bytes(b"kv")
    fsutil.fsync_private(path)
    fsutil.fsync_dir(tmp_path)
    assert mac.calls == [(os.stat(path).st_ino, F_FULLFSYNC), (os.stat(tmp_path).st_ino, F_FULLFSYNC)]


def test_without_f_fullfsync_fsync_still_runs(tmp_path, mac):
    mac.fails = True
    path = tmp_path / "incoming.kv"
    path.write_bytes(b"kv")
    fsutil.fsync_private(path)
    assert mac.calls and mac.fsyncs == [os.stat(path).st_ino]


def test_elsewhere_fsync_is_enough(tmp_path, monkeypatch, mac):
    monkeypatch.setattr(sys, "platform", "linux")
    path = tmp_path / "settings.json"
    fsutil.atomic_write_bytes(path, b"{}")
    assert mac.calls == [] and os.stat(path).st_ino in mac.fsyncs
