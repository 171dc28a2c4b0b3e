"""Slotkeeper's own actions as a searchable list (the Server tab, beside llama-server's log).

Every action the engine reports (saved, restored, refused and why, reused, recomputed, pruned,
repaired, crashed, restarted; ``core.journal`` words them, as `serve`'s log does) is one row,
newest first. The search box keeps rows with every word typed, in the text or the kind; "Problems
only" keeps warnings and errors.
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.journal import ERROR, INFO, KINDS, WARNING, JournalEntry
from slotkeeper.gui.log_view import search_width

Index = QModelIndex | QPersistentModelIndex
COLUMNS = ("Time", "What", "Details")
LEVEL_COLOURS = {WARNING: "#b45309", ERROR: "#dc2626"}
MAX_ROWS = 2000


def _when(at: float, now: float) -> str:
    fmt = "%H:%M:%S" if time.localtime(at)[:3] == time.localtime(now)[:3] else "%d %b %H:%M:%S"
    return time.strftime(fmt, time.localtime(at))


class ActivityModel(QAbstractTableModel):
    """Journal entries, newest first."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._rows: list[JournalEntry] = []

    def set_entries(self, entries: list[JournalEntry]) -> None:
        self.beginResetModel()
        self._rows = list(reversed(entries[-MAX_ROWS:]))
        self.endResetModel()

    def add(self, entry: JournalEntry) -> None:
        self.beginInsertRows(QModelIndex(), 0, 0)
        self._rows.insert(0, entry)
        self.endInsertRows()
        if len(self._rows) > MAX_ROWS:
            self.beginRemoveRows(QModelIndex(), MAX_ROWS, len(self._rows) - 1)
            del self._rows[MAX_ROWS:]
            self.endRemoveRows()

    def entry(self, row: int) -> JournalEntry:
        return self._rows[row]

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        e = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (_when(e.at, time.time()), e.kind, e.text)[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.at))}  {e.text}"
        if role == Qt.ItemDataRole.ForegroundRole and e.level != INFO and col != 0:
            return QBrush(QColor(LEVEL_COLOURS[e.level]))
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return f"{e.level}: {e.kind}: {e.text}" if col == 2 else None
        return None


class ActivityFilter(QSortFilterProxyModel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._words: list[str] = []
        self._problems_only = False

    def set_filter(self, text: str | None = None, problems_only: bool | None = None) -> None:
        change = getattr(self, "beginFilterChange", None)
        if change is not None:
            change()
        if text is not None:
            self._words = text.lower().split()
        if problems_only is not None:
            self._problems_only = problems_only
        if change is not None:
            self.endFilterChange()
        else:  # pragma: no cover - older PySide6
            self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:
        model = self.sourceModel()
        assert isinstance(model, ActivityModel)  # the one ActivityView sets
        e = model.entry(source_row)
        if self._problems_only and e.level == INFO:
            return False
        haystack = f"{e.kind} {e.text}".lower()
        return all(w in haystack for w in self._words)


class ActivityView(QWidget):
    """A search box, "Problems only", and the list."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        title = QLabel("Slotkeeper's activity")  # a row of its own: the search box keeps the room
        font = title.font()
        font.setBold(True)
        title.setFont(font)
        layout.addWidget(title)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search: saved, restored, refused, pruned, a conversation's id…")
        self.search.setClearButtonEnabled(True)
        self.search.setMinimumWidth(search_width(self.search, "Search: saved, restored"))
        self.search.setAccessibleName("Search Slotkeeper's activity")
        top.addWidget(self.search, 1)
        self.problems = QCheckBox("Problems only")
        self.problems.setToolTip("Warnings and errors: refusals, failed saves, crashes")
        top.addWidget(self.problems)
        layout.addLayout(top)

        self.model = ActivityModel(self)
        self.proxy = ActivityFilter(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setAccessibleName("Slotkeeper's activity, newest first")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        header = self.table.horizontalHeader()
        metrics = self.table.fontMetrics()
        for col, widest in ((0, "00 Mmm 00:00:00"), (1, max(KINDS, key=metrics.horizontalAdvance))):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            header.resizeSection(col, metrics.horizontalAdvance(widest) + 24)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table, 1)
        self.empty = QLabel("Nothing yet: saves, restores, prunes and repairs show here as they happen.")
        self.empty.setWordWrap(True)
        self.empty.setEnabled(False)
        layout.addWidget(self.empty)

        self.search.textChanged.connect(lambda text: self._filter(text=text))
        self.problems.toggled.connect(lambda on: self._filter(problems_only=on))
        self._update_empty()

    def set_entries(self, entries: list[JournalEntry]) -> None:
        self.model.set_entries(entries)
        self._update_empty()

    def add(self, entry: JournalEntry) -> None:
        self.model.add(entry)
        self._update_empty()

    def visible_texts(self) -> list[str]:
        return [self.proxy.index(r, 2).data() for r in range(self.proxy.rowCount())]

    def _filter(self, **changes) -> None:
        self.proxy.set_filter(**changes)
        self._update_empty()

    def _update_empty(self) -> None:
        if self.model.rowCount() == 0:
            self.empty.setText("Nothing yet: saves, restores, prunes and repairs show here as they happen.")
        else:
            self.empty.setText("Nothing matches the search." if self.proxy.rowCount() == 0 else "")
        self.empty.setVisible(bool(self.empty.text()))
