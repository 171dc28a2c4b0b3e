"""A frozen app hands URLs and folders to the desktop with the user's own environment."""

import sys

from slotkeeper.gui import desktop


def test_frozen_app_opens_urls_with_a_clean_environment(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/bundle/_internal")
    monkeypatch.setenv("LD_LIBRARY_PATH_ORIG", "/home/me/lib")
    monkeypatch.setenv("QT_PLUGIN_PATH", "/bundle/_internal/PySide6/plugins")
    monkeypatch.setenv("_PYI_APPLICATION_HOME_DIR", "/bundle")
    monkeypatch.setattr(desktop.subprocess, "Popen", lambda argv, **kw: started.append((argv, kw["env"])))
    desktop.open_url("http://127.0.0.1:8789")
    desktop.reveal_in_file_manager(tmp_path / "x.kv")
    (argv, env), (argv2, env2) = started
    assert argv[-1] == "http://127.0.0.1:8789"
    for e in (env, env2):
        assert e["LD_LIBRARY_PATH"] == "/home/me/lib"
        assert "QT_PLUGIN_PATH" not in e and not any(k.startswith("_PYI_") for k in e)
        assert "LD_LIBRARY_PATH_ORIG" not in e


def test_unfrozen_app_uses_qt(monkeypatch, qtbot):
    opened = []
    monkeypatch.delattr(sys, "frozen", raising=False)
    monkeypatch.setattr(desktop.QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    desktop.open_url("http://127.0.0.1:1234")
    assert opened == ["http://127.0.0.1:1234"]
