"""Windows' file calls, faked for tests that fake the platform: CreateFileW and open_osfhandle as
the server log opens its append-only handle (core/server/logfile.py)."""

from __future__ import annotations

import os
import sys

from slotkeeper.core.server import logfile
from slotkeeper.core.server.logfile import FILE_APPEND_DATA, FILE_WRITE_DATA


class FakeWindowsFiles:
    """CreateFileW and open_osfhandle, recorded; the handle number stands for the file it opened."""

    def __init__(self, fail_with: int | None = None) -> None:
        self.created: list[tuple] = []
        self.wrapped: list[tuple] = []
        self.fds: list[int] = []  # the C runtime fds handed out
        self.fail_with = fail_with
        self._paths: dict[int, str] = {}

    # kernel32
    def CreateFileW(self, *args):  # noqa: N802 - the system's name
        self.created.append(args)
        if self.fail_with is not None:
            return 2**64 - 1  # INVALID_HANDLE_VALUE through a c_void_p restype
        handle = 4 * (len(self.created) + 100)
        self._paths[handle] = args[0]
        return handle

    def last_error(self) -> int:
        return self.fail_with or 0

    # msvcrt
    def open_osfhandle(self, handle, flags):
        self.wrapped.append((handle, flags))
        access = self.created[-1][1]
        assert access & FILE_APPEND_DATA and not access & FILE_WRITE_DATA
        fd = os.open(self._paths[handle], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.fds.append(fd)
        return fd


def fake_windows_files(monkeypatch, fail_with: int | None = None) -> FakeWindowsFiles:
    """Installed as kernel32 and msvcrt for the server log; what it recorded."""
    files = FakeWindowsFiles(fail_with)
    monkeypatch.setattr(logfile, "_windows_kernel32", lambda: files)
    monkeypatch.setitem(sys.modules, "msvcrt", files)
    return files
