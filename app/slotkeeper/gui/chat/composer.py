"""Where the user writes: Enter sends, Shift+Enter starts a new line, Esc cancels an edit."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QSizePolicy, QWidget

MAX_LINES = 8  # the composer grows with its text up to this many lines, then scrolls


class Composer(QPlainTextEdit):
    submitted = Signal(str)  # Enter: the text to send (never empty)
    cancelled = Signal()  # Esc

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.setAccessibleName("Message to send")
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().contentsChanged.connect(self.updateGeometry)
        self.document().contentsChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key, mods = event.key(), event.modifiers()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if mods & Qt.KeyboardModifier.ShiftModifier:
                self.textCursor().insertText("\n")
                return
            if not mods & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
                           | Qt.KeyboardModifier.MetaModifier) or key == Qt.Key.Key_Enter:
                self.submit()
                return
        if key == Qt.Key.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)

    def submit(self) -> None:
        text = self.toPlainText()
        if text.strip() and self.isEnabled() and not self.isReadOnly():
            self.submitted.emit(text)

    def _lines_height(self, lines: int) -> int:
        fm = self.fontMetrics()
        margins = self.contentsMargins()
        return (lines * fm.lineSpacing() + 2 * int(self.document().documentMargin()) + margins.top()
                + margins.bottom() + 4)

    def _fit(self) -> None:
        lines = max(2, min(MAX_LINES, self.document().size().height() or 1))
        self.setFixedHeight(self._lines_height(int(lines)))

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.height())
