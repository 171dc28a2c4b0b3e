"""The main window: the Server, Slots, History and Conversations pages (see ``pages``) in tabs,
menus, a status bar with the engine's activity.

Closing it hides it to the tray when there is one; Quit lives in the tray menu and File menu.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QLabel, QMainWindow, QMessageBox, QTabWidget, QWidget

from slotkeeper.core import events as ev
from slotkeeper.gui import icons
from slotkeeper.gui.about import AboutDialog
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.model_menu import ModelMenu
from slotkeeper.gui.notifications import ERROR, WARNING
from slotkeeper.gui.pages.history_page import HistoryPage
from slotkeeper.gui.pages.server_page import ServerPage
from slotkeeper.gui.pages.sessions_page import SessionsPage
from slotkeeper.gui.pages.slots_page import SlotsPage
from slotkeeper.gui.widgets import bring_forward

TABS = ("server", "slots", "history", "sessions")
STATUS_MS = 10_000


class MainWindow(QMainWindow):
    settingsRequested = Signal()
    quitRequested = Signal()
    modelRequested = Signal(str, str)  # model path, session to resume after the switch ("" = none)
    chooseModelRequested = Signal()  # the model chooser (the list of models found, a file, the demo)
    # A conversation for the chat window ("": the last chat window, or a new chat).
    chatRequested = Signal(str)
    newChatRequested = Signal()

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.hide_on_close = False
        self.setWindowTitle("Slotkeeper")
        self.setWindowIcon(icons.app_icon())
        self.resize(1180, 720)

        self.server_page = ServerPage(bridge)
        self.slots_page = SlotsPage(bridge)
        self.history_page = HistoryPage(bridge)
        self.sessions_page = SessionsPage(bridge)
        self.tabs = QTabWidget(self)
        self.setCentralWidget(self.tabs)
        self.tabs.addTab(self.server_page, "Server")
        self.tabs.addTab(self.slots_page, "Slots")
        self.tabs.addTab(self.history_page, "History")
        self.tabs.addTab(self.sessions_page, "Conversations")
        # Keys: Ctrl+1..4 choose a tab (Ctrl+Tab / Ctrl+Shift+Tab step through them, Qt's own).
        for i in range(self.tabs.count()):
            key = QKeySequence(f"Ctrl+{i + 1}")
            shortcut = QShortcut(key, self, context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(lambda i=i: self.tabs.setCurrentIndex(i))
            self.tabs.setTabToolTip(i, key.toString(QKeySequence.SequenceFormat.NativeText))
        self._build_menus()
        self.activity_label = QLabel("")
        self.statusBar().addPermanentWidget(self.activity_label)

        self.server_page.settingsRequested.connect(self.settingsRequested)
        self.server_page.chooseModelRequested.connect(self.chooseModelRequested)
        self.sessions_page.switchRequested.connect(self.modelRequested)
        self.sessions_page.chatRequested.connect(self.chatRequested)
        self.server_page.chatRequested.connect(lambda: self.chatRequested.emit(""))
        for page in (self.server_page, self.sessions_page):
            page.statusMessage.connect(self.show_status)
        bridge.on(ev.ActivityChanged, self._on_activity)

    # Shortcuts into the pages for callers that only know the window (the desktop scenario).
    # -- building -------------------------------------------------------------------------
    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        a = file_menu.addAction("&Settings…")
        a.setShortcut(QKeySequence.StandardKey.Preferences)
        a.triggered.connect(self.settingsRequested)
        file_menu.addSeparator()
        self.close_action = file_menu.addAction("&Close window")
        self.close_action.setShortcut(QKeySequence.StandardKey.Close)
        self.close_action.triggered.connect(self.close)
        a = file_menu.addAction("&Quit")
        a.setShortcut(QKeySequence.StandardKey.Quit)
        a.triggered.connect(self.quitRequested)
        server = self.server_page
        server_menu = self.menuBar().addMenu("Se&rver")
        for action in (server.start_action, server.stop_action, server.restart_action):
            server_menu.addAction(action)
        self.model_menu = ModelMenu(self.bridge, "&Model", self)
        self.model_menu.modelChosen.connect(lambda path: self.modelRequested.emit(path, ""))
        server_menu.addMenu(self.model_menu)
        server_menu.addSeparator()
        self.new_chat_action = server_menu.addAction("&New chat")
        self.new_chat_action.triggered.connect(self.newChatRequested)
        server_menu.addAction(server.open_chat_action)
        server_menu.addAction(server.web_ui_action)
        server_menu.addAction(server.copy_action)
        help_menu = self.menuBar().addMenu("&Help")
        self.about_action = help_menu.addAction("&About Slotkeeper")
        self.about_action.triggered.connect(self.show_about)
        self.about_dialog: AboutDialog | None = None

    def show_about(self) -> None:
        """Help ▸ About: the version, the licence, the README."""
        if self.about_dialog is None:
            self.about_dialog = AboutDialog(self, data_dir=self.bridge.paths.data_dir)
        bring_forward(self.about_dialog)

    # -- window behaviour -----------------------------------------------------------------
    def show_tab(self, name: str) -> None:
        # The tab's title, or its code name.
        name = {"conversations": "sessions"}.get(name.lower(), name.lower())
        if name in TABS:
            self.tabs.setCurrentIndex(TABS.index(name))

    def bring_forward(self, tab: str = "") -> None:
        if tab:
            self.show_tab(tab)
        bring_forward(self)

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.hide_on_close and not self.bridge.quitting:
            event.ignore()
            self.hide()
            return
        super().closeEvent(event)

    def show_status(self, message: str) -> None:
        self.statusBar().showMessage(message, STATUS_MS)

    def show_notification(self, title: str, message: str, level: str = "info") -> None:
        """Where there is no tray: the status bar, and a message box for errors."""
        self.show_status(f"{title}: {message}")
        if level == ERROR and self.isVisible():
            box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()
        elif level == WARNING:
            self.server_page.show_warning(message)

    def _on_activity(self, event: ev.ActivityChanged) -> None:
        self.activity_label.setText(event.activity.describe())
