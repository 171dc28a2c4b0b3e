"""Conversations found by what was said in them: the Conversations tab's search results.

Typing in the Conversations tab's search box filters the table by title, preview, model and id at
once, and (a moment later, off the GUI thread) searches the conversations' full text through the
sessions service. This list shows each conversation found with the passage that matched, its
words in bold; choosing one selects its row in the table, and Enter or a double click resumes it
(the table's own Resume, with the same rules).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from slotkeeper.core.services.sessions import SearchResult
from slotkeeper.core.sessions.search import SearchHit

SEARCH_DELAY_MS = 250  # after the last key press
ID_ROLE = Qt.ItemDataRole.UserRole + 1
MAX_SHOWN = 20  # the service's default: the best ones (ranked) with their passages
MAX_LIST_HEIGHT = 220  # pixels: the table below keeps most of the room


def passage_html(hit: SearchHit) -> str:
    """The matched passage as rich text: everything escaped, the matched words in bold."""
    parts = [f"<b>{html.escape(t)}</b>" if matched else html.escape(t) for t, matched in hit.parts()]
    return "".join(parts).replace("\n", " ")


class SearchResults(QWidget):
    """The list of conversations found by content (hidden while there is nothing to show)."""

    searchRequested = Signal(str)  # debounced text to search by content
    sessionChosen = Signal(str)  # a result became current: select it in the table
    resumeRequested = Signal(str)  # Enter or a double click on a result

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations found by what was said in them")
        self.list.setAlternatingRowColors(True)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemActivated.connect(lambda item: self.resumeRequested.emit(item.data(ID_ROLE)))
        layout.addWidget(self.list)
        self.ids: tuple[str, ...] = ()
        self._text = ""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(SEARCH_DELAY_MS)
        self._timer.timeout.connect(lambda: self.searchRequested.emit(self._text))
        self.hide()

    def set_text(self, text: str) -> None:
        """The search box changed: search again a moment after the typing stops."""
        self._text = text.strip()
        if not self._text:
            self._timer.stop()
            self.show_result(None)
            return
        self._timer.start()

    def search_again(self) -> None:
        """Search the same words again now (the index changed)."""
        if self._text:
            self.searchRequested.emit(self._text)

    def show_result(self, result: SearchResult | None) -> None:
        self.list.clear()
        if result is None or result.query.strip() != self._text:
            self.ids = ()
            self.hide()
            return
        hits = result.hits[:MAX_SHOWN]
        self.ids = tuple(h.id for h in hits)
        if not hits:
            self.summary.setText(f"Nothing said in a saved conversation matches “{html.escape(self._text)}”.")
            self.list.hide()
            self.show()
            return
        n = max(result.total, len(hits))
        best = f" (the best {len(hits)})" if n > len(hits) else ""
        note = ""
        if result.partial:
            note = " Some are searched by title and preview only until a server of their model runs."
        self.summary.setText(f"Said in {n:,} conversation{'s' if n != 1 else ''}{best}:{note}")
        for hit in hits:
            item = QListWidgetItem()
            item.setData(ID_ROLE, hit.id)
            plain = hit.plain("", "")
            item.setToolTip(plain)
            item.setData(Qt.ItemDataRole.AccessibleTextRole, f"{hit.title}: {plain}")
            label = QLabel(f"<b>{html.escape(hit.title)}</b> — {passage_html(hit)}")
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(False)
            label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
            label.setContentsMargins(4, 2, 4, 2)
            self.list.addItem(item)
            item.setSizeHint(label.sizeHint())
            self.list.setItemWidget(item, label)
        rows = sum(self.list.sizeHintForRow(i) for i in range(self.list.count()))
        self.list.setFixedHeight(min(MAX_LIST_HEIGHT, rows + 2 * self.list.frameWidth() + 4))
        self.list.show()
        self.show()

    def _on_current(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None:
            self.sessionChosen.emit(item.data(ID_ROLE))
