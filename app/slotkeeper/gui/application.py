"""The desktop app: QApplication, one instance per data folder, tray or window, clean quit.

``run_gui(args, paths, settings, start_now)`` is what the CLI calls when no subcommand is given.
Quit (tray, File menu, SIGTERM, SIGINT) saves every changed slot and stops the server in a
background job while a progress dialog shows what is being saved, then leaves the event loop.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import getpass
import hashlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QApplication, QMessageBox, QProgressDialog, QSystemTrayIcon, QWidget

from slotkeeper.core.basics import app_nap, objc_runtime
from slotkeeper.core.basics.objc_runtime import ObjC
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.basics.session_end import ShutdownBlock
from slotkeeper.core.engine import Engine, EngineError
from slotkeeper.core.events import ActivityChanged, EngineReady
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import SavesReport
from slotkeeper.gui import icons, theme
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.first_run import FirstRunDialog
from slotkeeper.gui.model_switch import ModelSwitcher
from slotkeeper.gui.notifications import Notifier
from slotkeeper.gui.tray import TrayController
from slotkeeper.gui.widgets import bring_forward, waiting_dialog

if TYPE_CHECKING:
    from slotkeeper.core.engine import Prelaunched
    from slotkeeper.gui.about import AboutDialog
    from slotkeeper.gui.chat.launcher import ChatLauncher
    from slotkeeper.gui.main_window import MainWindow
    from slotkeeper.gui.settings.dialog import SettingsDialog

log = logging.getLogger(__name__)

APP_DISPLAY_NAME = "Slotkeeper"
SHOW_MESSAGE = b"show\n"
CONNECT_TIMEOUT_MS = 1000
SIGNAL_TICK_MS = 200  # lets Python run its signal handlers while Qt's loop is in C++
NS_ACTIVATION_POLICY_ACCESSORY = 1  # NSApplicationActivationPolicyAccessory: no Dock icon, no menu bar
UNSAVED_NOTICE_MS = 30_000  # how long the "could not be saved" notice waits before Quit goes on


# -- one instance per data folder -----------------------------------------------------------
def instance_key(paths: AppPaths) -> str:
    """A local-socket name unique to this user and data folder (a test's temp home is its own),
    the folder's however it is spelt (``folder_key``: the data folder's lock goes by it too)."""
    from slotkeeper.core.basics.folder_identity import folder_key

    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "user"
    folder = folder_key(paths.data_dir)
    digest = hashlib.sha256(f"{user}\0{folder}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"slotkeeper-{digest}"


class SingleInstance(QObject):
    """The first launch listens on a local socket; later launches tell it to show itself."""

    showRequested = Signal()

    def __init__(self, key: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.server: QLocalServer | None = None

    def notify_running(self, timeout_ms: int = CONNECT_TIMEOUT_MS) -> bool:
        """True when another instance answered (and was asked to show its window)."""
        # Parented and deleted later: Qt may still hold a reference to it from queued events.
        socket = QLocalSocket(self)
        try:
            socket.connectToServer(self.key)
            if not socket.waitForConnected(timeout_ms):
                return False
            socket.write(SHOW_MESSAGE)
            socket.flush()
            socket.waitForBytesWritten(timeout_ms)
            socket.disconnectFromServer()
            if socket.state() != QLocalSocket.LocalSocketState.UnconnectedState:
                socket.waitForDisconnected(timeout_ms)
            return True
        finally:
            socket.abort()
            socket.deleteLater()

    def listen(self) -> bool:
        # Nobody answered, so a socket file left by a crashed instance is stale.
        QLocalServer.removeServer(self.key)
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.key):
            log.warning("single-instance socket %s: %s", self.key, server.errorString())
            return False
        server.newConnection.connect(self._on_connection)
        self.server = server
        return True

    def _on_connection(self) -> None:
        assert self.server is not None
        while self.server.hasPendingConnections():
            conn = self.server.nextPendingConnection()
            # A second launch writes one line and hangs up: wait for it briefly, right here,
            # rather than keeping per-connection objects (and their signals) alive.
            if not conn.bytesAvailable():
                conn.waitForReadyRead(CONNECT_TIMEOUT_MS)
            data = bytes(conn.readAll().data())
            conn.abort()
            conn.deleteLater()
            if b"show" in data:
                self.showRequested.emit()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server.deleteLater()
            self.server = None


def hide_dock_icon(objc: ObjC | None = None) -> bool:
    """macOS: a menu-bar-only app. The packaged app says so in Info.plist (LSUIElement); run from a
    Python install it tells AppKit itself (NSApplicationActivationPolicyAccessory), through the
    Objective-C runtime (no PyObjC needed). True when it was told."""
    objc = objc or objc_runtime.runtime()
    if objc is None:
        return False
    shared = objc.send(objc.cls("NSApplication"), "sharedApplication")
    return bool(objc.send(shared, "setActivationPolicy:", ctypes.c_long(NS_ACTIVATION_POLICY_ACCESSORY)))


# -- the app ---------------------------------------------------------------------------------
class SlotkeeperApp(QObject):
    """Everything the desktop app is made of, without the event loop (so tests can build it)."""

    finished = Signal()  # after Quit has saved and stopped everything

    def __init__(
        self,
        paths: AppPaths,
        settings: Settings,
        settings_service: SettingsService | None = None,
        resume_id: str | None = None,
        start_now: bool = False,
        tray_available: bool | None = None,
        engine: Engine | None = None,
        first_run: bool = True,
        prelaunched: Prelaunched | None = None,
    ) -> None:
        super().__init__()
        self.paths = paths
        self.engine = engine or Engine(paths, settings, prelaunched=prelaunched)
        self.bridge = EngineBridge(self.engine, settings_service or SettingsService(paths.settings_file),
                                   self)
        self.notifier = Notifier(self.bridge, self)
        # The main window is built when first needed (~20 MB): an app left in the tray never builds it.
        self._window: MainWindow | None = None
        self._hide_on_close = False
        self.switcher = ModelSwitcher(self.bridge)
        self._chats: ChatLauncher | None = None  # the chat windows, built when first opened
        self.chooser: FirstRunDialog | None = None
        self.tray: TrayController | None = None
        self.settings_dialog: SettingsDialog | None = None
        self.about_dialog: AboutDialog | None = None  # the tray's and the window's
        self.progress: QProgressDialog | None = None
        self.quitting = False
        self.done = False
        self.exit_code = 0  # 1 when conversations could not be saved at Quit
        self.unsaved_box: QMessageBox | None = None
        self.shutdown_block = ShutdownBlock()
        self._session_anchor: QWidget | None = None
        if tray_available is None:
            tray_available = QSystemTrayIcon.isSystemTrayAvailable()
        if tray_available:
            self.tray = TrayController(self.bridge, self)
            self.tray.showWindowRequested.connect(self.show_window)
            self.tray.settingsRequested.connect(self.open_settings)
            self.tray.quitRequested.connect(self.request_quit)
            self.tray.modelRequested.connect(self.choose_model)
            self.tray.chooseModelRequested.connect(self.open_model_chooser)
            self.tray.chatRequested.connect(self.open_chat)
            self.tray.newChatRequested.connect(self.new_chat)
            self.tray.aboutRequested.connect(self.show_about)
            self._hide_on_close = self.tray.show()
        self.notifier.notify.connect(self._notify)
        self.bridge.on(EngineReady, self._on_ready)
        if sys.platform == "darwin":
            # A second launch from Finder, Spotlight or Launchpad starts no second process there: the
            # system asks the running app to reopen, which Qt reports as the app becoming active.
            app = QApplication.instance()
            assert isinstance(app, QApplication)
            app.applicationStateChanged.connect(self.on_application_state)

        chose_now = False
        if first_run and not settings.profile.model_path:
            chose_now = self.run_first_run()
        has_model = bool(settings.profile.model_path) or chose_now
        if not self._hide_on_close or chose_now or not has_model:
            self.window.show()
        if (start_now or settings.start_server_on_launch) and settings.profile.model_path:
            self.bridge.start_server(resume_id=resume_id)

    def _on_ready(self, event: EngineReady) -> None:
        # The terminal says where clients go (llama-server's own address is private).
        log.info("ready: clients use %s (OpenAI API %s/v1)", event.url, event.url.rstrip("/"))

    # -- windows --------------------------------------------------------------------------
    @property
    def window(self) -> MainWindow:
        """The main window, built on first use (the tray's "Show window", a notification without
        a tray, a test)."""
        if self._window is None:
            from slotkeeper.gui.main_window import MainWindow

            window = MainWindow(self.bridge)
            window.hide_on_close = self._hide_on_close
            window.settingsRequested.connect(self.open_settings)
            window.quitRequested.connect(self.request_quit)
            window.modelRequested.connect(self.choose_model)
            window.chooseModelRequested.connect(self.open_model_chooser)
            window.chatRequested.connect(self.open_chat)
            window.newChatRequested.connect(self.new_chat)
            # One About for the tray and the window: the app's.
            window.about_action.triggered.disconnect(window.show_about)
            window.about_action.triggered.connect(self.show_about)
            self.switcher.parent_widget = window
            self._window = window
        return self._window

    def on_application_state(self, state: Qt.ApplicationState) -> None:
        """macOS: a reopen (the app launched again) with no window of ours open shows the main window,
        as a second launch does elsewhere (SingleInstance). Becoming active while a window is open
        (a click on it) changes nothing."""
        if state != Qt.ApplicationState.ApplicationActive or self.quitting:
            return
        popup = Qt.WindowType.Popup
        if any(w.isVisible() and (w.windowFlags() & popup) != popup for w in QApplication.topLevelWidgets()):
            return
        self.show_window()

    def show_window(self, tab: str = "") -> None:
        self.window.bring_forward(tab)

    @property
    def chats(self) -> ChatLauncher:
        """The chat windows (built on first use)."""
        if self._chats is None:
            from slotkeeper.gui.chat.launcher import ChatLauncher

            self._chats = ChatLauncher(self.bridge, self)
            self._chats.switchRequested.connect(lambda path: self.choose_model(path))
        return self._chats

    def open_chat(self, session_id: str = "") -> None:
        """A saved conversation in the chat window ("": the last chat window, or a new chat)."""
        self.chats.open_chat(session_id)

    def new_chat(self) -> None:
        self.chats.new_chat()

    def show_about(self) -> None:
        """About Slotkeeper, from the tray or the window's Help menu: one dialog, brought forward
        (the window is not built just for it)."""
        if self.about_dialog is None:
            from slotkeeper.gui.about import AboutDialog

            self.about_dialog = AboutDialog(None, data_dir=self.paths.data_dir)
        bring_forward(self.about_dialog)

    def open_settings(self) -> None:
        if self.settings_dialog is not None:
            bring_forward(self.settings_dialog)
            return
        from slotkeeper.gui.settings.dialog import SettingsDialog  # built when asked for

        dialog = SettingsDialog(self.bridge, self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(self._settings_closed)
        self.settings_dialog = dialog
        bring_forward(dialog)

    def _settings_closed(self, _result: int) -> None:
        self.settings_dialog = None

    def run_first_run(self) -> bool:
        dialog = FirstRunDialog(self.bridge.jobs, self._window, search_dirs=self.bridge.model_search_dirs)
        accepted = dialog.exec() == FirstRunDialog.DialogCode.Accepted and dialog.chosen
        chosen = dialog.chosen
        dialog.deleteLater()
        if not accepted or not chosen:
            return False
        self.choose_model(chosen)
        return True

    def open_model_chooser(self) -> None:
        """The models found on this computer, a file, or the demo; the one chosen starts."""
        if self.chooser is not None:
            self.chooser.raise_()
            self.chooser.activateWindow()
            return
        dialog = FirstRunDialog(self.bridge.jobs, self._window, search_dirs=self.bridge.model_search_dirs,
                                welcome=False)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.chooser = dialog

        def closed(result: int) -> None:
            self.chooser = None
            if result == FirstRunDialog.DialogCode.Accepted and dialog.chosen:
                self.choose_model(dialog.chosen)

        dialog.finished.connect(closed)
        dialog.open()

    def choose_model(self, model_path: str, resume_id: str = "") -> None:
        """Run ``model_path`` from now on with the settings remembered for it (saved; this run's
        per-model command-line values stop applying): after saying what the switch means when
        there is something to say, changed conversations are saved and the server (re)starts on
        it, resuming ``resume_id`` if given."""
        self.switcher.choose(model_path, resume_id or None)

    def _notify(self, title: str, message: str, level: str) -> None:
        if self.tray is not None and self.tray.tray.isVisible():
            self.tray.show_message(title, message, level)
        else:
            self.window.show_notification(title, message, level)

    # -- quitting -------------------------------------------------------------------------
    def request_quit(self) -> None:
        """Save changed slots and stop the server (showing progress), then finish."""
        if self.quitting:
            return
        self.quitting = True
        self.bridge.quitting = True
        if self.settings_dialog is not None:
            self.settings_dialog.reject()
        if self.bridge.running:
            progress = waiting_dialog("Saving conversations and stopping llama-server…", APP_DISPLAY_NAME,
                                      Qt.WindowModality.ApplicationModal)
            progress.setWindowIcon(icons.app_icon())
            self.progress = progress
            self.bridge.on(ActivityChanged, self._quit_progress)
            progress.show()
        self.bridge.shutdown(self._finish)

    def _quit_progress(self, event: ActivityChanged) -> None:
        if self.progress is None:
            return
        activity = event.activity
        total, done = activity.total, activity.done
        if activity.activity == "saving" and total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.progress.setLabelText(f"Saving conversation {min(total, done + 1)} of {total} "
                                       f"({activity.detail})…")
        elif activity.activity == "making restore points" and total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.progress.setLabelText(f"Keeping restore points of conversation {min(total, done + 1)} of "
                                       f"{total} ({activity.detail}), so an edit or a dropped reply after "
                                       "the next start is not read again…")
        elif activity.activity is None and total:
            self.progress.setValue(total)
            self.progress.setLabelText("Stopping llama-server…")

    def _finish(self, report: SavesReport) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress.deleteLater()
            self.progress = None
        if not report.ok:
            self.exit_code = 1
            self._say_unsaved(report)
            return
        self._done()

    def _say_unsaved(self, report: SavesReport) -> None:
        """Changed conversations could not be saved before the server stopped: say so before leaving
        (the box closes itself after a while, so a logout is not held up)."""
        n = len(report.unsaved)
        box = QMessageBox(QMessageBox.Icon.Warning, APP_DISPLAY_NAME,
                          f"{n} conversation{'s' if n != 1 else ''} could not be saved before llama-server "
                          "stopped, and will have to be read again from the start next time.",
                          QMessageBox.StandardButton.Ok)
        box.setInformativeText("The reason is in the notifications and in the log (Server tab).")
        box.setWindowIcon(icons.app_icon())
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda _r: self._done())
        QTimer.singleShot(UNSAVED_NOTICE_MS, box, box.accept)
        self.unsaved_box = box
        box.open()

    def _done(self) -> None:
        self.done = True
        self.dispose()
        self.finished.emit()

    def on_session_ending(self) -> None:
        """Windows is ending the session (logoff, shutdown): while the app saves on its way out, the
        logoff screen says why it waits."""
        if self._session_anchor is None:  # a window of ours that is never shown: its handle will do
            self._session_anchor = QWidget()
        self.shutdown_block.begin(int(self._session_anchor.winId()))

    def dispose(self) -> None:
        """Release everything that holds a thread, a timer or a socket."""
        self.shutdown_block.end()
        if self._session_anchor is not None:
            self._session_anchor.deleteLater()
            self._session_anchor = None
        self.switcher.dispose()
        if self._chats is not None:
            self._chats.dispose()
        if self.chooser is not None:
            self.chooser.reject()
        if self.tray is not None:
            self.tray.dispose()
        if self.settings_dialog is not None:
            self.settings_dialog.reject()
        if self.about_dialog is not None:
            self.about_dialog.close()
            self.about_dialog.deleteLater()
            self.about_dialog = None
        self.bridge.quitting = True
        if self._window is not None:
            self._window.hide_on_close = False
            self._window.close()
        self.bridge.close()


def _install_signal_handlers(on_signal: Callable[[], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM call ``on_signal`` on the GUI thread; returns a function that undoes it."""
    previous: dict[int, Any] = {}
    sigs = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])

    def handler(signum, _frame) -> None:
        log.info("received %s: quitting", signal.Signals(signum).name)
        QTimer.singleShot(0, on_signal)

    for sig in sigs:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: nothing to install
            pass

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def run_gui(args: argparse.Namespace | None, paths: AppPaths, service: SettingsService, settings: Settings,
            start_now: bool = False, first_run: bool = True,
            on_started: Callable[[SlotkeeperApp], None] | None = None,
            prelaunched: Prelaunched | None = None) -> int:
    """Run the desktop app until Quit. ``settings`` are this run's (saved + command line);
    ``start_now`` starts the server at once (a model was given on the command line);
    ``prelaunched``: that launch, begun before Qt was imported (the engine takes it over);
    ``on_started(app)`` runs once everything is built (the desktop test drives the app from it).
    Returns the process exit code: 0, also when another instance was asked to show itself."""
    owned = QApplication.instance() is None  # ours to shut down (a test's shared one is not)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)  # one made before us is a widgets application too
    app.setApplicationName("slotkeeper")
    app.setApplicationDisplayName(APP_DISPLAY_NAME)
    app.setOrganizationName("slotkeeper")
    app.setDesktopFileName("slotkeeper")
    app.setWindowIcon(icons.app_icon())
    app.setQuitOnLastWindowClosed(False)
    if not app.property("slotkeeper_follows_scheme"):  # light or dark as the system is, once per app
        theme.follow_color_scheme(app)
        app.setProperty("slotkeeper_follows_scheme", True)
    try:
        code = _run(app, args, paths, service, settings, start_now, first_run, on_started, prelaunched)
    finally:
        if prelaunched is not None and not prelaunched.taken:
            prelaunched.abandon()  # never leave a server nobody took over
    # Every Qt object of ours is deleted in _run; their Python wrappers go now, while Python is
    # whole. Left to the interpreter's final collection, PySide wrappers can crash the process at
    # exit ("bool_dealloc"), which a user sees as "Slotkeeper quit unexpectedly".
    gc.collect()
    if owned:
        app.shutdown()
        gc.collect()
    return code


def _run(app: QApplication, args: argparse.Namespace | None, paths: AppPaths, service: SettingsService,
         settings: Settings, start_now: bool, first_run: bool,
         on_started: Callable[[SlotkeeperApp], None] | None, prelaunched: Prelaunched | None) -> int:
    instance = SingleInstance(instance_key(paths))
    if instance.notify_running():
        log.info("Slotkeeper is already running for %s; asked it to show its window", paths.data_dir)
        return 0
    instance.listen()
    hide_dock_icon()
    app_nap.keep_awake()  # macOS: idle saves and streamed replies on time with no window open

    try:
        sk = SlotkeeperApp(paths, settings, service, resume_id=getattr(args, "resume", None),
                           start_now=start_now, first_run=first_run, prelaunched=prelaunched)
    except EngineError as exc:  # e.g. `slotkeeper serve` already uses this data folder
        log.error("%s", exc)
        QMessageBox.critical(None, APP_DISPLAY_NAME, f"Slotkeeper cannot start: {exc}.")
        return 1
    instance.showRequested.connect(lambda: sk.show_window())
    sk.finished.connect(lambda: app.exit(sk.exit_code))

    def on_about_to_quit() -> None:
        # Quit from outside our menu (the desktop session ending): still save before leaving.
        if not sk.done:
            log.info("quitting without Quit: saving and stopping llama-server now")
            sk.bridge.quitting = True
            try:
                sk.engine.close(save=True)
            except Exception:
                log.exception("stopping llama-server on quit failed")
            sk.dispose()
            sk.done = True

    app.aboutToQuit.connect(on_about_to_quit)
    if sys.platform == "win32":  # logoff or shutdown asked first (WM_QUERYENDSESSION)
        app.commitDataRequest.connect(lambda _manager: sk.on_session_ending())
    if on_started is not None:
        on_started(sk)
    restore_signals = _install_signal_handlers(sk.request_quit)
    tick = QTimer()
    tick.timeout.connect(lambda: None)
    tick.start(SIGNAL_TICK_MS)
    try:
        code = app.exec()
    finally:
        tick.stop()
        restore_signals()
        app.aboutToQuit.disconnect(on_about_to_quit)
        if not sk.done:
            on_about_to_quit()
        instance.close()
        for obj in (sk, instance, tick):
            obj.deleteLater()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    return int(code)
