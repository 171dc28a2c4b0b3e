"""Every way into a chat leads here: the tray's Resume entries and "New chat", the Sessions table,
search results, "Open chat". One window per conversation (opening it again brings its window
forward); new chats each get their own."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.chat.chat_window import ChatWindow
from slotkeeper.gui.widgets import bring_forward


class ChatLauncher(QObject):
    switchRequested = Signal(str)  # a conversation's model: switch to it (the app's ModelSwitcher)

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.windows: list[ChatWindow] = []
        self._last: ChatWindow | None = None

    def _make(self) -> ChatWindow:
        window = ChatWindow(self.bridge)
        window.switchRequested.connect(self.switchRequested)
        window.newChatRequested.connect(self.new_chat)
        window.closed.connect(lambda w=window: self._forget(w))
        self.windows.append(window)
        return window

    def _forget(self, window: ChatWindow) -> None:
        if window in self.windows:
            self.windows.remove(window)
        if self._last is window:
            self._last = self.windows[-1] if self.windows else None
        window.deleteLater()

    def open_session(self, session_id: str) -> ChatWindow:
        """The chat window of a saved conversation (read in a job), brought forward."""
        window = next((w for w in self.windows if w.session_id == session_id), None)
        if window is None:
            window = self._make()
            window.open_session(session_id)
        self._last = window
        bring_forward(window)
        return window

    def new_chat(self) -> ChatWindow:
        window = self._make()
        self._last = window
        bring_forward(window)
        window.composer.setFocus()
        return window

    def open_chat(self, session_id: str = "") -> ChatWindow:
        """A conversation's window (``session_id``), else the last chat window, else a new chat."""
        if session_id:
            return self.open_session(session_id)
        if self._last is not None and self._last in self.windows:
            bring_forward(self._last)
            return self._last
        return self.new_chat()

    def dispose(self) -> None:
        for window in list(self.windows):
            window.close()
