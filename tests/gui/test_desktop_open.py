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


def test_no_opener_is_reported_not_silent(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no xdg-open / open / explorer to start
    assert desktop.open_url("http://127.0.0.1:8789") is False
    assert desktop.reveal_in_file_manager(tmp_path / "x.kv") is False


def test_the_window_says_so_when_no_browser_or_file_manager_starts(monkeypatch, qtbot, bridge, sessions_dir):
    from gui_helpers import make_session
    from PySide6.QtGui import QGuiApplication

    from slotkeeper.gui.pages import server_page, sessions_page

    monkeypatch.setattr(server_page, "open_url", lambda url: False)
    monkeypatch.setattr(sessions_page, "reveal_in_file_manager", lambda path: False)
    server = server_page.ServerPage(bridge)
    qtbot.addWidget(server)
    with qtbot.waitSignal(server.statusMessage) as said:
        server.open_web_ui()  # (offered once llama-server is found to serve its own page)
    assert "No web browser" in said.args[0] and bridge.base_url in said.args[0]
    assert QGuiApplication.clipboard().text() == bridge.base_url

    make_session(sessions_dir, "aaaaaaaaaaaa", title="Alpha")
    page = sessions_page.SessionsPage(bridge)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.select_session("aaaaaaaaaaaa"), timeout=10_000)
    with qtbot.waitSignal(page.statusMessage) as said:
        page.reveal_selected()
    assert "No file manager" in said.args[0] and "aaaaaaaaaaaa" in said.args[0]
