"""llama-server installed by a package manager is found with a minimal PATH (an app started from
Finder, the Dock or at login; one started before the install changed PATH): after PATH,
core/server/locate.py searches the folders Homebrew, MacPorts and WinGet put it in."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from slotkeeper.core.server.locate import ServerBinaryNotFound, known_folders, locate_server


def _exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_macos_searches_homebrew_and_macports(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert known_folders({})[:2] == ["/opt/homebrew/bin", "/usr/local/bin"]
    assert "/opt/local/bin" in known_folders({})


def test_macos_finds_it_in_a_known_folder_with_an_empty_path(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "darwin")
    brew = tmp_path / "homebrew" / "bin"  # standing in for /opt/homebrew/bin
    _exe(brew / "llama-server")
    found = locate_server(env={}, path_env="", use_package=False, folders=[str(tmp_path / "none"), str(brew)])
    assert found.argv_prefix == (str(brew / "llama-server"),) and found.source == "known folder"


def test_windows_finds_wingets_link_with_an_empty_path(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("PATHEXT", ".exe")  # one: shutil.which splits it at this system's os.pathsep
    monkeypatch.chdir(tmp_path)  # Windows' which looks in the working folder first
    local = tmp_path / "AppData" / "Local"
    link = _exe(local / "Microsoft" / "WinGet" / "Links" / "llama-server.exe")
    env = {"LOCALAPPDATA": str(local), "PATH": ""}
    assert known_folders(env) == [os.path.join(str(local), "Microsoft", "WinGet", "Links")]
    found = locate_server(env=env, use_package=False)
    assert found.path == str(link) and found.source == "known folder"


def test_path_comes_first(tmp_path):
    on_path = _exe(tmp_path / "p" / "llama-server")
    _exe(tmp_path / "known" / "llama-server")
    found = locate_server(env={}, path_env=str(on_path.parent), folders=[str(tmp_path / "known")])
    assert found.source == "PATH"


def test_the_refusal_names_the_folders_it_searched(tmp_path):
    with pytest.raises(ServerBinaryNotFound, match="llama-server in .*nowhere"):
        locate_server(env={}, path_env="", use_package=False, folders=[str(tmp_path / "nowhere")])
