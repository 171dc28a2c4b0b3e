"""A data folder on a disk whose format has no permissions (exFAT, FAT: USB disks, SD cards; or a
disk mounted with fmask/umask) shows mode 0777 whatever chmod does. It is still refused (anyone
could have put files there), but the message says why and what helps, not a chmod that cannot work.

Faked here: chmod that changes nothing (macOS, Linux's vfat with ``quiet``) or fails with EPERM
(Linux's vfat and exfat) on a folder really left 0777.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

import pytest

from slotkeeper.core.basics import fsutil
from slotkeeper.core.basics.fsutil import UnsafeFolder
from slotkeeper.core.basics.paths import app_paths

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_data_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    return home


def chmod_does_nothing(*args, **kwargs) -> None:
    pass


def chmod_not_permitted(path, *args, **kwargs) -> None:
    raise PermissionError(errno.EPERM, "Operation not permitted", os.fspath(path))


@pytest.mark.parametrize("chmod", [chmod_does_nothing, chmod_not_permitted])
def test_a_data_folder_on_a_disk_without_permissions_is_refused_with_the_reason(tmp_path, monkeypatch, chmod):
    home = open_data_folder(tmp_path)
    monkeypatch.setattr(fsutil.os, "chmod", chmod)
    with pytest.raises(UnsafeFolder) as info:
        app_paths(home).ensure()
    message = str(info.value)
    assert f"the data folder {home} can be written by" in message and "0777" in message, message
    assert "format has no permissions (exFAT or FAT" in message, message
    assert "APFS (macOS) or ext4 (Linux) with --data-dir" in message, message
    assert "chmod 700" not in message, message


def test_a_folder_too_open_on_a_disk_with_permissions_gets_the_chmod_advice_and_is_left_as_found(tmp_path):
    """Asking whether permissions can be set (chmod 0700, look) puts the mode back: the refusal stands
    until the user has looked, as before."""
    home = open_data_folder(tmp_path)
    with pytest.raises(UnsafeFolder, match=f"Fix: chmod 700 '{home}'") as info:
        app_paths(home).ensure()
    assert "exFAT" not in str(info.value)
    assert mode(home) == 0o777
    with pytest.raises(UnsafeFolder, match="chmod 700"):
        app_paths(home).check_private()
