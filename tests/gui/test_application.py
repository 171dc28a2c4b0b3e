"""The app shell: single instance, window without a tray, Quit and SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.settings import Settings, load_settings
from slotkeeper.gui.application import SingleInstance, SlotkeeperApp, instance_key, run_gui


def shell_settings() -> Settings:
    """The demo model chosen, the server not started at launch: these tests are about the shell
    (a llama-server would outlive a test that never stops it, and slow every one)."""
    return replace(Settings(), start_server_on_launch=False).with_profile(model_path=DEMO_MODEL)


@pytest.fixture
def paths():
    return app_paths().ensure()


def test_instance_key_depends_on_the_data_folder(tmp_path):
    a = instance_key(app_paths(tmp_path / "a"))
    b = instance_key(app_paths(tmp_path / "b"))
    assert a != b and a.startswith("slotkeeper-")
    assert a == instance_key(app_paths(tmp_path / "a"))


def test_second_instance_asks_the_first_to_show(qtbot, paths):
    first = SingleInstance(instance_key(paths))
    assert first.listen()
    second = SingleInstance(instance_key(paths))
    with qtbot.waitSignal(first.showRequested, timeout=5000):
        assert second.notify_running()
    first.close()
    third = SingleInstance(instance_key(paths))
    assert not third.notify_running(timeout_ms=200)


def test_run_gui_returns_at_once_when_already_running(qtbot, paths):
    first = SingleInstance(instance_key(paths))
    assert first.listen()
    with qtbot.waitSignal(first.showRequested, timeout=5000):
        assert run_gui(None, paths, SettingsService(paths.settings_file), Settings()) == 0
    first.close()


def test_without_a_tray_the_window_opens_and_quit_finishes(qtbot, paths):
    settings = shell_settings()
    app = SlotkeeperApp(paths, settings, tray_available=False)
    qtbot.addWidget(app.window)
    assert app.tray is None
    assert app.window.isVisible()
    assert not app.window.hide_on_close
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    assert app.done
    assert app.bridge._closed
    assert not app.window.isVisible()
    app.request_quit()  # a second Quit is ignored
    app.deleteLater()


def test_choosing_a_model_on_first_run_saves_it(qtbot, paths, monkeypatch):
    from slotkeeper.gui import application

    class Chooser:
        DialogCode = application.FirstRunDialog.DialogCode

        def __init__(self, *args, **kwargs):
            self.chosen = DEMO_MODEL

        def exec(self):
            return self.DialogCode.Accepted

        def deleteLater(self):
            pass

    monkeypatch.setattr(application, "FirstRunDialog", Chooser)
    service = SettingsService(paths.settings_file, {"budget_bytes": 123 * 1024**3})  # as from --budget
    app = SlotkeeperApp(paths, service.effective(), service, tray_available=False)
    qtbot.addWidget(app.window)
    qtbot.waitUntil(lambda: app.engine.settings.profile.model_path == DEMO_MODEL)
    assert app.engine.settings.budget_bytes == 123 * 1024**3
    qtbot.waitUntil(lambda: paths.settings_file.exists())
    on_disk = load_settings(paths.settings_file)
    assert on_disk.profile.model_path == DEMO_MODEL
    assert on_disk.start_server_on_launch, "once a model is chosen, a relaunch serves it"
    assert on_disk.budget_bytes != 123 * 1024**3  # this run's overrides are not saved
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    app.deleteLater()


def test_settings_dialog_opens_once(qtbot, paths):
    app = SlotkeeperApp(paths, shell_settings(), tray_available=False)
    qtbot.addWidget(app.window)
    app.open_settings()
    first = app.settings_dialog
    app.open_settings()
    assert app.settings_dialog is first
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    assert app.settings_dialog is None
    app.deleteLater()


def test_settings_opened_from_the_app_name_the_command_line_values(qtbot, paths):
    service = SettingsService(paths.settings_file, {"profile.port": 9000})  # as from --port 9000
    settings = replace(service.effective(), start_server_on_launch=False).with_profile(model_path=DEMO_MODEL)
    app = SlotkeeperApp(paths, settings, service,
                        tray_available=False)
    qtbot.addWidget(app.window)
    app.open_settings()
    server = app.settings_dialog.server_tab
    assert server.port.value() == 9000
    assert [n.text() for n in server.override_notes.values()] == ["from the command line (--port)"]
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    app.deleteLater()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_quits_like_quit(qtbot, paths):
    QTimer.singleShot(300, lambda: os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    code = run_gui(None, paths, SettingsService(paths.settings_file),
                   shell_settings(), start_now=False)
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_quit_says_when_conversations_could_not_be_saved(qtbot, paths, monkeypatch):
    from slotkeeper.core.views import SavesReport

    app = SlotkeeperApp(paths, shell_settings(), tray_available=False)
    qtbot.addWidget(app.window)

    async def close_async(save=True, timeout=0.0):
        return SavesReport(unsaved=(0, 1))  # as when the disk is full at Quit

    monkeypatch.setattr(app.engine, "close_async", close_async)
    app.request_quit()
    qtbot.waitUntil(lambda: app.unsaved_box is not None and app.unsaved_box.isVisible(), timeout=10_000)
    assert "2 conversations could not be saved" in app.unsaved_box.text()
    assert not app.done, "Quit waits until the person has seen it (or the notice times out)"
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.unsaved_box.accept()
    assert app.done and app.exit_code == 1
    app.deleteLater()


def test_an_app_left_in_the_tray_builds_its_window_only_when_it_is_shown(qtbot, paths, monkeypatch):
    """The window and its pages (~20 MB) are built the first time they are needed; what happened
    before (a warning, the activity list) is there when they are."""
    from slotkeeper.core.events import WarningRaised
    from slotkeeper.gui.tray import TrayController

    # a tray host shows it
    monkeypatch.setattr(TrayController, "show", lambda self: (self.tray.show(), True)[1])
    app = SlotkeeperApp(paths, shell_settings(), tray_available=True)
    assert app._window is None
    app.engine.events.emit(WarningRaised("the port is open to the network"))
    qtbot.waitUntil(lambda: app.bridge.last_warning == "the port is open to the network", timeout=5000)
    assert app._window is None
    app.show_window("sessions")
    window = app.window
    qtbot.addWidget(window)
    assert window.isVisible() and window.hide_on_close  # closing it hides it to the tray
    assert window.server_page.warning_box.text() == "the port is open to the network"
    assert window.tabs.currentWidget() is window.sessions_page
    assert app.switcher.parent_widget is window
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    assert not window.isVisible()
    app.deleteLater()


@pytest.mark.parametrize("platform", ["darwin", "linux"])
def test_macos_reopen_shows_the_window_of_the_app_in_the_menu_bar(qtbot, paths, monkeypatch, platform):
    """On macOS a second launch from Finder reaches the running app as a reopen (the app made active);
    elsewhere a second launch is a second process (SingleInstance), and activation means nothing."""
    from slotkeeper.gui.tray import TrayController

    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(TrayController, "show", lambda self: (self.tray.show(), True)[1])
    app = SlotkeeperApp(paths, shell_settings(), tray_available=True)
    assert app._window is None
    qapp = QApplication.instance()
    qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationActive)
    if platform == "linux":
        assert app._window is None
    else:
        window = app.window
        qtbot.addWidget(window)
        assert window.isVisible()
        window.close()  # hidden to the menu bar
        assert not window.isVisible()
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
        assert not window.isVisible()
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationActive)
        assert window.isVisible()
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    app.deleteLater()


def test_windows_logoff_shows_why_the_app_waits_while_it_saves(qtbot, paths):
    """Windows asks first (Qt's commitDataRequest): the reason is shown on the logoff screen until the
    app has saved and let go (the recorded user32 stands in for Windows')."""
    from slotkeeper.core.basics.session_end import SAVING_REASON, ShutdownBlock

    calls: list[tuple] = []

    class User32:
        def ShutdownBlockReasonCreate(self, hwnd, reason):  # noqa: N802 - the Win32 name
            calls.append(("create", hwnd, reason))
            return 1

        def ShutdownBlockReasonDestroy(self, hwnd):  # noqa: N802
            calls.append(("destroy", hwnd))
            return 1

    app = SlotkeeperApp(paths, shell_settings(), tray_available=False)
    qtbot.addWidget(app.window)
    app.shutdown_block = ShutdownBlock(user32=User32())
    app.on_session_ending()
    [(what, hwnd, reason)] = calls
    assert what == "create" and hwnd and reason == SAVING_REASON
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
    assert calls[-1] == ("destroy", hwnd)
    app.deleteLater()


def test_the_quit_progress_says_when_restore_points_are_kept(qtbot, paths):
    from slotkeeper.core.events import ActivityChanged
    from slotkeeper.core.views import Activity
    from slotkeeper.gui.widgets import waiting_dialog

    app = SlotkeeperApp(paths, shell_settings(), tray_available=False)
    qtbot.addWidget(app.window)
    app.progress = waiting_dialog("Saving conversations and stopping llama-server…", "Slotkeeper",
                                  Qt.WindowModality.NonModal)
    app._quit_progress(ActivityChanged(Activity("saving", "slot 0", 0, 2)))
    assert app.progress.labelText() == "Saving conversation 1 of 2 (slot 0)…"
    app._quit_progress(ActivityChanged(Activity("making restore points", "slot 1", 1, 2)))
    assert app.progress.labelText().startswith("Keeping restore points of conversation 2 of 2 (slot 1)")
    assert app.progress.value() == 1 and app.progress.maximum() == 2
    app.progress.close()
    app.progress = None
    with qtbot.waitSignal(app.finished, timeout=10_000):
        app.request_quit()
