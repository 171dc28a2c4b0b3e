"""One engine per data folder, also when the folder is deleted while an engine runs."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import types

import platformdirs  # noqa: F401 - imported before sys.platform is faked (it picks its kind on import)
import pytest

from slotkeeper.core.basics import datalock

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from slotkeeper.core.basics import datalock
    home = Path(sys.argv[1])
    try:
        datalock.acquire(home / "state" / "engine.lock", str(home))
    except datalock.DataDirBusy as exc:
        print("BUSY", exc, flush=True)
        sys.exit(3)
    print("HELD", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def _hold(home, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(home), str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def test_a_deleted_data_folder_is_still_in_use_by_the_engine_that_runs_on_it(tmp_path):
    home = tmp_path / "home"
    first = _hold(home, 30)
    try:
        assert first.stdout.readline().strip() == "HELD"
        shutil.rmtree(home)  # the lock file inside it goes too
        second = subprocess.run([sys.executable, "-c", HOLD, str(home), "0"], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 3 and "already running" in second.stdout, second.stdout + second.stderr
    finally:
        first.kill()
        first.wait()
    third = subprocess.run([sys.executable, "-c", HOLD, str(home), "0"], capture_output=True, text=True,
                           timeout=60)
    assert third.returncode == 0 and "HELD" in third.stdout  # free again once the first one is gone


# -- Windows: msvcrt's locks are mandatory -------------------------------------------------------
# Faked here (the machine running the tests need not be Windows): a lock belongs to the handle that
# took it, and another handle's read of a locked byte fails, as Windows's LockFile makes it.

class FakeMsvcrt(types.ModuleType):
    LK_NBLCK = 2

    def __init__(self) -> None:
        super().__init__("msvcrt")
        self.locks: list[tuple[tuple[int, int], int, int, int]] = []  # (file, fd, start, length)

    @staticmethod
    def _file(fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def locked_by_other(self, fd: int, start: int, length: int) -> bool:
        file = self._file(fd)
        return any(f == file and owner != fd and start < s + n and s < start + length
                   for f, owner, s, n in self.locks)

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert mode == self.LK_NBLCK
        start = os.lseek(fd, 0, os.SEEK_CUR)  # msvcrt locks from the file position
        if self.locked_by_other(fd, start, nbytes):
            raise PermissionError(errno.EACCES, "Permission denied")
        self.locks.append((self._file(fd), fd, start, nbytes))


@pytest.fixture
def windows(monkeypatch):
    """sys.platform "win32", a fake msvcrt, and os.read failing on another handle's locked bytes."""
    fake = FakeMsvcrt()
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        try:
            pos = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:  # a pipe: nothing there is locked
            return real_read(fd, n)
        if fake.locked_by_other(fd, pos, n):
            raise PermissionError(errno.EACCES, "Permission denied")  # Windows: a lock violation
        return real_read(fd, n)

    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(datalock, "_held", {})
    yield fake
    for fd in datalock._held.values():
        os.close(fd)


def _as_process(monkeypatch, pid: int) -> None:
    """What a new process with ``pid`` starts with: no locks held."""
    monkeypatch.setattr(datalock, "_held", {})
    monkeypatch.setattr(os, "getpid", lambda: pid)


def test_on_windows_a_second_process_finds_the_folder_busy_and_names_the_first(tmp_path, monkeypatch,
                                                                              windows):
    home = tmp_path / "home"
    _as_process(monkeypatch, 4242)
    datalock.acquire(home / "state" / "engine.lock", str(home))
    first = dict(datalock._held)
    try:
        _as_process(monkeypatch, 5151)
        with pytest.raises(datalock.DataDirBusy, match=r"pid 4242\)"):
            datalock.acquire(home / "state" / "engine.lock", str(home))
        assert datalock._held == {}
        assert len(windows.locks) == 2 and all(start > 0 for _, _, start, _ in windows.locks)  # not the pid
    finally:
        for fd in first.values():
            os.close(fd)


def test_on_windows_an_unreadable_pid_still_says_busy(tmp_path, monkeypatch, windows):
    """A lock file whose pid cannot be read (an older version locked the byte it is in)."""
    lock_file = tmp_path / "engine.lock"
    other = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(other, b"777")
        os.lseek(other, 0, os.SEEK_SET)
        windows.locking(other, windows.LK_NBLCK, 1)  # byte 0, and the byte this version locks
        os.lseek(other, datalock.WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        windows.locking(other, windows.LK_NBLCK, 1)
        with pytest.raises(datalock.DataDirBusy, match=r"pid \?\)"):
            datalock._lock(lock_file, str(tmp_path))
    finally:
        os.close(other)
