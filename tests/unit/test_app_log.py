"""Slotkeeper's own log file, and a start-up failure said where a user of the packaged app sees it
(a windowed .exe has no stderr; one opened from Finder writes it to nothing)."""

from __future__ import annotations

import logging
import stat
import sys
import types

import pytest

from slotkeeper.cli import commands, failure
from slotkeeper.core.basics import applog
from slotkeeper.core.basics.paths import app_paths


@pytest.fixture
def root_log():
    """The root logger as main() leaves it, restored after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def test_the_log_file_is_private_and_rotates(tmp_path, monkeypatch, root_log):
    monkeypatch.setattr(applog, "APP_LOG_MAX_BYTES", 400)
    path = tmp_path / "logs" / "slotkeeper.log"
    handler = applog.attach(path)
    assert handler is not None
    try:
        root_log.setLevel(logging.INFO)
        for i in range(30):
            logging.getLogger("slotkeeper.test").info("line %d of the app's own log", i)
    finally:
        applog.detach(handler)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["slotkeeper.log", "slotkeeper.log.1", "slotkeeper.log.2", "slotkeeper.log.3"], files
    assert "line 29 of the app's own log" in path.read_text()
    if sys.platform != "win32":
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in path.parent.iterdir())


def test_a_rotation_windows_refuses_keeps_the_records(tmp_path, monkeypatch, root_log):
    """Windows cannot rename a file another process holds open: the records go on in the same file."""
    monkeypatch.setattr(applog, "APP_LOG_MAX_BYTES", 200)
    path = tmp_path / "slotkeeper.log"
    handler = applog.attach(path)
    assert handler is not None

    def held_open(*_a):
        raise PermissionError(13, "The process cannot access the file because it is being used")

    monkeypatch.setattr(handler, "rotate", held_open)
    try:
        root_log.setLevel(logging.INFO)
        for i in range(20):
            logging.getLogger("slotkeeper.test").info("record %d", i)
    finally:
        applog.detach(handler)
    text = path.read_text()
    assert all(f"record {i}\n" in text for i in range(20))


def test_an_unopenable_log_is_no_reason_to_stop(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert applog.attach(blocker / "slotkeeper.log") is None


def test_serve_and_the_app_keep_their_own_log_other_commands_do_not(tmp_path, monkeypatch, root_log):
    def fake_serve(args, extra):
        logging.getLogger("slotkeeper").warning("serve says this in its own log")
        return 0

    monkeypatch.setattr("slotkeeper.cli.run.cmd_serve", fake_serve)
    folder = tmp_path / "data"
    assert commands.main(["--data-dir", str(folder), "serve"]) == 0
    log_file = app_paths(folder).app_log
    assert "serve says this in its own log" in log_file.read_text()
    assert not any(isinstance(h, applog.PrivateRotatingFileHandler) for h in root_log.handlers)  # detached

    other = tmp_path / "other"
    assert commands.main(["--data-dir", str(other), "sessions", "list"]) == 0
    assert not app_paths(other).app_log.exists()


@pytest.fixture
def dialogs(monkeypatch):
    shown: list[str] = []
    monkeypatch.setattr(failure, "show_dialog", lambda message: shown.append(message) or True)
    return shown


@pytest.mark.parametrize("windowed", ["no stderr", "frozen"])
def test_the_packaged_app_shows_a_refused_data_folder_in_a_dialog(windowed, tmp_path, monkeypatch, dialogs,
                                                                  capsys, root_log):
    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("a file where the data folder should be")
    if windowed == "no stderr":
        monkeypatch.setattr(sys, "stderr", None)
    else:
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert commands.main(["--data-dir", str(not_a_folder)]) == 2
    assert len(dialogs) == 1 and "it is a file, not a folder" in dialogs[0], dialogs
    assert commands.main(["--data-dir", str(not_a_folder), "serve"]) == 2  # serve: a terminal's command
    assert len(dialogs) == 1


def test_from_a_terminal_the_reason_goes_to_stderr_only(tmp_path, dialogs, capsys, root_log):
    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("")
    assert commands.main(["--data-dir", str(not_a_folder)]) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err
    assert dialogs == []


def test_the_app_stopping_on_an_error_says_so_and_where_the_details_are(tmp_path, monkeypatch, dialogs,
                                                                       root_log):
    def broken_app(args, extra):
        raise RuntimeError("the tray could not be made")

    monkeypatch.setattr("slotkeeper.cli.run.cmd_gui", broken_app)
    monkeypatch.setattr(sys, "stderr", None)
    folder = tmp_path / "data"
    assert commands.main(["--data-dir", str(folder)]) == 1
    [message] = dialogs
    log_file = app_paths(folder).app_log
    assert "the tray could not be made" in message and str(log_file) in message
    assert "Traceback" in log_file.read_text() and "RuntimeError" in log_file.read_text()


def test_the_system_dialogs_without_qt(monkeypatch):
    ran: list[list[str]] = []
    monkeypatch.setattr(failure.subprocess, "run", lambda argv, **kw: ran.append(argv))
    assert failure.native_dialog('a "quoted" C:\\path', platform="darwin")
    [argv] = ran
    assert argv[:2] == ["osascript", "-e"]
    assert argv[2] == 'display alert "Slotkeeper" message "a \\"quoted\\" C:\\\\path" as critical'

    boxes: list[tuple] = []
    user32 = types.SimpleNamespace(MessageBoxW=lambda *a: boxes.append(a) or 1)
    import ctypes

    monkeypatch.setattr(ctypes, "windll", types.SimpleNamespace(user32=user32), raising=False)
    assert failure.native_dialog("no model", platform="win32")
    assert boxes == [(None, "no model", "Slotkeeper", 0x10)]
    assert not failure.native_dialog("x", platform="linux")


def test_no_dialog_without_a_screen(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(k, raising=False)
    assert failure.show_dialog("anything") is False
