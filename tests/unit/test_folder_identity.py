"""One key per data folder however its path is spelt, on disks that ignore case too (Windows,
macOS's default APFS): the data folder's lock by path and the app's single instance go by it.

The machine running the tests has a case-sensitive disk: the platform is faked, and on "macOS" a
case-insensitive disk is stood in for by links named like the folder in other cases, with
realpath keeping the spelling it is given (macOS's realpath does not put a name in its stored case).
"""

from __future__ import annotations

import os
import sys

import platformdirs  # noqa: F401 - imported before sys.platform is faked (it picks its kind on import)
import pytest

from slotkeeper.core.basics import datalock
from slotkeeper.core.basics.folder_identity import folder_key, ignores_case


def _case_insensitive_disk(monkeypatch, folder, *spellings) -> None:
    """``folder`` also answers to each of ``spellings`` (names in the same parent)."""
    for name in spellings:
        (folder.parent / name).symlink_to(folder.name)
    monkeypatch.setattr(os.path, "realpath", os.path.abspath)  # spelling kept, as macOS keeps it


def test_on_windows_case_does_not_make_another_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    assert folder_key(tmp_path / "Data") == folder_key(tmp_path / "DATA")
    assert folder_key(tmp_path / "Data") != folder_key(tmp_path / "Other")


def test_on_a_case_insensitive_mac_disk_two_spellings_are_one_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    folder = tmp_path / "Data"
    folder.mkdir()
    _case_insensitive_disk(monkeypatch, folder, "dATA", "DATA", "data")
    assert ignores_case(str(folder))
    assert folder_key(folder) == folder_key(tmp_path / "DATA") == folder_key(tmp_path / "data")
    assert datalock.path_lock_file(str(folder)) == datalock.path_lock_file(str(tmp_path / "DATA"))


def test_on_a_case_sensitive_disk_two_spellings_are_two_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")  # a case-sensitive APFS volume
    (tmp_path / "Data").mkdir()
    (tmp_path / "dATA").mkdir()  # another folder
    (tmp_path / "DATA").mkdir()
    monkeypatch.setattr(os.path, "realpath", os.path.abspath)
    assert not ignores_case(str(tmp_path / "Data"))
    assert folder_key(tmp_path / "Data") != folder_key(tmp_path / "DATA")
    assert datalock.path_lock_file(str(tmp_path / "Data")) != datalock.path_lock_file(str(tmp_path / "DATA"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert folder_key(tmp_path / "Data") != folder_key(tmp_path / "DATA")


def test_a_folder_not_made_yet_is_judged_by_the_nearest_one_that_is(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    folder = tmp_path / "Home"
    folder.mkdir()
    _case_insensitive_disk(monkeypatch, folder, "hOME", "HOME", "home")
    assert folder_key(folder / "slotkeeper") == folder_key(tmp_path / "HOME" / "slotkeeper")


def test_links_and_dots_are_one_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    real = str(tmp_path / "real")
    assert folder_key(tmp_path / "link") == folder_key(tmp_path / "real" / ".." / "real") == real


def test_the_single_instance_goes_by_the_folder_key(tmp_path, monkeypatch):
    pytest.importorskip("PySide6")
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.gui.application import instance_key

    monkeypatch.setattr(sys, "platform", "win32")
    assert instance_key(app_paths(tmp_path / "Data")) == instance_key(app_paths(tmp_path / "DATA"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert instance_key(app_paths(tmp_path / "Data")) != instance_key(app_paths(tmp_path / "DATA"))
