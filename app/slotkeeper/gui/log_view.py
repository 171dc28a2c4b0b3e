"""The server's output, live, with a search box (next / previous, every match highlighted).

Long lines wrap (the view never needs scrolling sideways); the search box keeps a readable width
however small the window."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QKeySequence,
    QShortcut,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextOption,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.views import is_idle_heartbeat

MAX_LINES = 5000
MAX_HIGHLIGHTS = 1000  # beyond this, highlighting costs more than it helps
HIGHLIGHT = QColor("#fde68a")
CURRENT = QColor("#f59e0b")


def search_width(edit: QLineEdit, words: str) -> int:
    """A search box's least width: ``words`` readable beside its clear button."""
    return edit.fontMetrics().horizontalAdvance(words) + 48


class LogView(QWidget):
    """``append_lines`` adds server output; it follows the end unless the user scrolled up."""

    matchesChanged = Signal(int)

    def __init__(self, parent: QWidget | None = None, max_lines: int = MAX_LINES) -> None:
        super().__init__(parent)
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(max_lines)
        # Wrapped: llama-server's lines are long, and what matters is at their end.
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.text.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.text.setUndoRedoEnabled(False)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.text.setFont(mono)
        self.text.setPlaceholderText("llama-server's output appears here once it starts.")

        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Search the log")
        self.search.setClearButtonEnabled(True)
        self.search.setMinimumWidth(search_width(self.search, "Search the log"))
        self.case = QCheckBox("Match case", self)
        # Arrows, not words: the search box keeps the room in a narrow window.
        self.prev_button = QToolButton(self)
        self.prev_button.setArrowType(Qt.ArrowType.UpArrow)
        self.prev_button.setToolTip("Previous match")
        self.prev_button.setAccessibleName("Previous match")
        self.next_button = QToolButton(self)
        self.next_button.setArrowType(Qt.ArrowType.DownArrow)
        self.next_button.setToolTip("Next match")
        self.next_button.setAccessibleName("Next match")
        self.count_label = QLabel("", self)
        self.count_label.setMinimumWidth(self.count_label.fontMetrics().horizontalAdvance("999 matches"))
        self.follow = QCheckBox("Follow", self)
        self.follow.setChecked(True)
        self.follow.setToolTip("Keep the newest output in view")

        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.search, 1)
        bar.addWidget(self.case)
        bar.addWidget(self.prev_button)
        bar.addWidget(self.next_button)
        bar.addWidget(self.count_label)
        bar.addSpacing(12)
        bar.addWidget(self.follow)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.text, 1)

        self.match_count = 0
        self.search.textChanged.connect(self._search_changed)
        self.case.toggled.connect(self._search_changed)
        self.search.returnPressed.connect(self.find_next)
        self.next_button.clicked.connect(self.find_next)
        self.prev_button.clicked.connect(self.find_previous)
        QShortcut(QKeySequence.StandardKey.FindNext, self, self.find_next)
        QShortcut(QKeySequence.StandardKey.FindPrevious, self, self.find_previous)
        QShortcut(QKeySequence.StandardKey.Find, self, self.search.setFocus)
        self.text.verticalScrollBar().valueChanged.connect(self._scrolled)
        self._update_buttons()

    # -- content --------------------------------------------------------------------------
    def append_lines(self, lines: list[str]) -> None:
        lines = [line for line in lines if not is_idle_heartbeat(line)]  # the file keeps them
        if not lines:
            return
        bar = self.text.verticalScrollBar()
        keep = bar.value()
        self.text.appendPlainText("\n".join(line.rstrip("\n") for line in lines))
        if self.follow.isChecked():
            bar.setValue(bar.maximum())
        else:
            bar.setValue(keep)
        if self.search.text():
            self._highlight_all(keep_current=True)

    def set_lines(self, lines: list[str], note: str | None = None) -> None:
        """The log so far; ``note`` comes first (what these lines are, when they are not this run's)."""
        self.text.clear()
        self.append_lines(([note] if note and lines else []) + lines)

    def plain_text(self) -> str:
        return self.text.toPlainText()

    def _scrolled(self, value: int) -> None:
        bar = self.text.verticalScrollBar()
        at_end = value >= bar.maximum() - 2
        if self.follow.isChecked() != at_end and bar.maximum() > 0:
            self.follow.blockSignals(True)
            self.follow.setChecked(at_end)
            self.follow.blockSignals(False)

    # -- search ---------------------------------------------------------------------------
    def _flags(self, backward: bool = False) -> QTextDocument.FindFlag:
        flags = QTextDocument.FindFlag(0)
        if self.case.isChecked():
            flags |= QTextDocument.FindFlag.FindCaseSensitively
        if backward:
            flags |= QTextDocument.FindFlag.FindBackward
        return flags

    def _search_changed(self, *_args) -> None:
        self._highlight_all(keep_current=False)
        if self.search.text():
            # Start from the end: the newest output is what people look for first.
            cursor = self.text.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            self.text.setTextCursor(cursor)
            self.find_previous()
        self._update_buttons()

    def find_next(self) -> bool:
        return self._find(backward=False)

    def find_previous(self) -> bool:
        return self._find(backward=True)

    def _find(self, backward: bool) -> bool:
        needle = self.search.text()
        if not needle:
            return False
        doc = self.text.document()
        cursor = doc.find(needle, self.text.textCursor(), self._flags(backward))
        if cursor.isNull():  # wrap around
            start = QTextCursor(doc)
            start.movePosition(QTextCursor.MoveOperation.End if backward else QTextCursor.MoveOperation.Start)
            cursor = doc.find(needle, start, self._flags(backward))
        if cursor.isNull():
            return False
        self.follow.setChecked(False)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()
        self._highlight_all(keep_current=True)
        return True

    def _highlight_all(self, keep_current: bool) -> None:
        needle = self.search.text()
        selections: list[QTextEdit.ExtraSelection] = []
        count = 0
        if needle:
            doc = self.text.document()
            fmt = QTextCharFormat()
            fmt.setBackground(HIGHLIGHT)
            fmt.setForeground(QColor("#111827"))
            cursor = doc.find(needle, 0, self._flags())
            while not cursor.isNull():
                count += 1
                if count <= MAX_HIGHLIGHTS:
                    sel = QTextEdit.ExtraSelection()
                    sel.cursor = cursor
                    sel.format = fmt
                    selections.append(sel)
                cursor = doc.find(needle, cursor, self._flags())
            current = self.text.textCursor()
            if keep_current and current.hasSelection():
                cur = QTextEdit.ExtraSelection()
                cur.cursor = current
                cur_fmt = QTextCharFormat()
                cur_fmt.setBackground(CURRENT)
                cur_fmt.setForeground(QColor("#111827"))
                cur_fmt.setFontWeight(QFont.Weight.Bold)
                cur.format = cur_fmt
                selections.append(cur)
        self.text.setExtraSelections(selections)
        if count != self.match_count:
            self.match_count = count
            self.matchesChanged.emit(count)
        if not needle:
            self.count_label.setText("")
        elif count == 0:
            self.count_label.setText("no match")
        else:
            self.count_label.setText(f"{count} match" + ("" if count == 1 else "es"))
        self._update_buttons()

    def _update_buttons(self) -> None:
        has = bool(self.search.text()) and self.match_count > 0
        self.next_button.setEnabled(has)
        self.prev_button.setEnabled(has)

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape and self.search.text():
            self.search.clear()
            return
        super().keyPressEvent(event)
