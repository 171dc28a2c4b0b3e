"""Windows: a sessions folder that is an NTFS junction (or another reparse point standing for
another path) is refused exactly as a symbolic link is: os.path.islink says False for a junction,
and anyone who can redirect the sessions folder can have a file restored into the model's context.

Faked here (the machine running the tests need not run Windows): sys.platform is "win32" and
os.lstat answers for the sessions folder what Windows answers for a junction: a directory whose
st_file_attributes carry FILE_ATTRIBUTE_REPARSE_POINT.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

from slotkeeper.core.basics import fsutil
from slotkeeper.core.basics.fsutil import UnsafeFolder
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.sessions.store import SessionStore

FILE_ATTRIBUTE_DIRECTORY = 0x10
FILE_ATTRIBUTE_NORMAL = 0x80
IO_REPARSE_TAG_MOUNT_POINT = 0xA0000003  # a junction
IO_REPARSE_TAG_CLOUD_6 = 0x9000601A  # a OneDrive placeholder: not a name surrogate


class WindowsStat:
    """A POSIX stat result with what Windows adds: st_file_attributes, st_reparse_tag."""

    def __init__(self, st: os.stat_result, attributes: int, reparse_tag: int | None) -> None:
        self._st = st
        self.st_file_attributes = attributes
        if reparse_tag is not None:
            self.st_reparse_tag = reparse_tag

    def __getattr__(self, name: str):
        return getattr(self._st, name)


def windows_sees(monkeypatch, folder, reparse_tag: int | None) -> None:
    """sys.platform is "win32" and ``folder`` is a reparse point with ``reparse_tag`` (None: the
    attribute without a tag); every other path a plain file or folder."""
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        st = real_lstat(path, *args, **kwargs)
        if os.fspath(path) == os.fspath(folder):
            return WindowsStat(st, FILE_ATTRIBUTE_DIRECTORY | stat.FILE_ATTRIBUTE_REPARSE_POINT, reparse_tag)
        plain = FILE_ATTRIBUTE_DIRECTORY if stat.S_ISDIR(st.st_mode) else FILE_ATTRIBUTE_NORMAL
        return WindowsStat(st, plain, 0)

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(fsutil.os, "lstat", lstat)


@pytest.mark.parametrize(("tag", "kind"), [(IO_REPARSE_TAG_MOUNT_POINT, "junction"),
                                           (None, "reparse point")])
def test_a_sessions_folder_that_is_a_junction_is_refused_as_a_symbolic_link_is(tmp_path, monkeypatch, tag,
                                                                                 kind):
    paths = app_paths(tmp_path / "home").ensure()
    windows_sees(monkeypatch, paths.sessions_dir, tag)
    for check in (paths.ensure, paths.check_private, lambda: SessionStore(paths.sessions_dir)):
        with pytest.raises(UnsafeFolder) as info:
            check()
        message = str(info.value)
        assert f"the sessions folder {paths.sessions_dir} is a {kind}" in message, message
        assert "only uses a real folder there: remove the link" in message, message


def test_a_onedrive_placeholder_folder_is_a_folder_not_a_link(tmp_path, monkeypatch):
    """Reparse points that do not stand for another path (cloud files, deduplication) are the
    folder itself: refusing them would refuse every data folder under OneDrive."""
    paths = app_paths(tmp_path / "home").ensure()
    windows_sees(monkeypatch, paths.sessions_dir, IO_REPARSE_TAG_CLOUD_6)
    assert paths.ensure() is paths and paths.check_private() is paths
