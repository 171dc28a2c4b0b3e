"""The saved sessions as a table: one row per sidecar, with compatibility against the server."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
)
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from slotkeeper.core.engine.resume import compat_reasons
from slotkeeper.core.families import describe_restore_mode, restore_mode_explanation
from slotkeeper.core.sessions.compat import ServerFacts, model_file_name, swa_mode
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.sessions.sidecar import Sidecar, parse_utc
from slotkeeper.core.units import human_bytes

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ID_ROLE = Qt.ItemDataRole.UserRole + 2
ENTRY_ROLE = Qt.ItemDataRole.UserRole + 3
SEARCH_ROLE = Qt.ItemDataRole.UserRole + 4
RESTORABLE_ROLE = Qt.ItemDataRole.UserRole + 5

COLUMNS = (
    ("title", "Title"),
    ("where", "Where"),
    ("model", "Model"),
    ("tokens", "Tokens"),
    ("size", "Size"),
    ("swa", "Attention"),
    ("restore", "Restore"),
    ("cache", "FA / cache"),
    ("last_used", "Last used"),
    ("pinned", "Pinned"),
    ("compat", "Compatible"),
    ("status", "Status"),
)
COLUMN = {key: i for i, (key, _) in enumerate(COLUMNS)}
_NUMERIC = {"tokens", "size"}

Index = QModelIndex | QPersistentModelIndex


def cache_text(sidecar: Sidecar) -> str:
    fa = "on" if sidecar.flash_attn else "off"
    if sidecar.cache_type_k == sidecar.cache_type_v:
        return f"FA {fa}, {sidecar.cache_type_k}"
    return f"FA {fa}, K {sidecar.cache_type_k} / V {sidecar.cache_type_v}"


def relative_time(moment: datetime, now: float) -> str:
    """"just now", "5 min ago", "3 h ago", "yesterday", "12 days ago", else a date."""
    seconds = max(0.0, now - moment.timestamp())
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    days = int(seconds // 86400)
    if days == 1:
        return "yesterday"
    if days < 30:
        return f"{days} days ago"
    return moment.astimezone().strftime("%Y-%m-%d")


class SessionsTableModel(QAbstractTableModel):
    def __init__(self, parent=None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(parent)
        self._entries: list[SessionEntry] = []
        self._reasons: list[list[str] | None] = []
        self._facts: ServerFacts | None = None
        self._clock = clock
        self._in_slot: dict[str, int] = {}  # session id -> the slot holding it now
        self.total_bytes = 0
        self.unmanaged_bytes = 0

    # -- feeding --------------------------------------------------------------------------
    def set_listing(self, listing: Listing, facts: ServerFacts | None) -> None:
        self.beginResetModel()
        self._entries = list(listing.sessions)
        self._facts = facts
        self._reasons = [compat_reasons(e, facts) for e in self._entries]
        self.total_bytes = listing.total_bytes
        self.unmanaged_bytes = listing.unmanaged_bytes
        self.endResetModel()

    def set_facts(self, facts: ServerFacts | None) -> None:
        self._facts = facts
        self._reasons = [compat_reasons(e, facts) for e in self._entries]
        if self._entries:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self._entries) - 1, len(COLUMNS) - 1))

    def set_slots(self, views) -> None:
        """Which slot holds which session now (from the engine's slot views)."""
        in_slot = {v.session_id: v.id for v in views if v.session_id}
        if in_slot == self._in_slot:
            return
        self._in_slot = in_slot
        if self._entries:
            col = COLUMN["where"]
            self.dataChanged.emit(self.index(0, col), self.index(len(self._entries) - 1, col))

    def where(self, session_id: str) -> str:
        slot = self._in_slot.get(session_id)
        return "on disk" if slot is None else f"slot {slot}"

    @property
    def facts(self) -> ServerFacts | None:
        return self._facts

    def entry(self, row: int) -> SessionEntry:
        return self._entries[row]

    def entries(self) -> list[SessionEntry]:
        return list(self._entries)

    def reasons(self, row: int) -> list[str] | None:
        return self._reasons[row]

    def row_of(self, session_id: str) -> int:
        for i, e in enumerate(self._entries):
            if e.id == session_id:
                return i
        return -1

    # -- Qt model -------------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section][1]
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not (0 <= index.row() < len(self._entries)):
            return None
        entry = self._entries[index.row()]
        reasons = self._reasons[index.row()]
        key = COLUMNS[index.column()][0]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(entry, reasons, key)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(entry, reasons, key)
        if role == SORT_ROLE:
            return self._sort_value(entry, reasons, key)
        if role == ID_ROLE:
            return entry.id
        if role == ENTRY_ROLE:
            return entry
        if role == RESTORABLE_ROLE:
            return reasons == []
        if role == SEARCH_ROLE:
            sc = entry.sidecar
            parts = [entry.id]
            if sc is not None:
                parts += [sc.title, sc.preview, model_file_name(sc.model_path), sc.arch]
            return " ".join(parts).lower()
        if role == Qt.ItemDataRole.TextAlignmentRole and key in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            if entry.problems:
                return QColor("#b91c1c")
            if reasons and key in ("compat", "title"):
                return QApplication.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
        return None

    def _display(self, entry: SessionEntry, reasons: list[str] | None, key: str) -> str:
        sc = entry.sidecar
        if key == "title":
            return sc.title if sc else f"(unreadable) {entry.id}"
        if key == "status":
            return "ok" if not entry.problems else "damaged"
        if key == "compat":
            if reasons is None:
                return "—"
            if reasons and sc is not None and self._facts is not None and sc.model_sha256 != self._facts.model_sha256:
                return "other model"  # resumed by switching to it
            return "yes" if not reasons else "no"
        if key == "size":
            return human_bytes(entry.size_bytes)
        if key == "where":
            return self.where(entry.id)
        if sc is None:
            return ""
        if key == "model":
            return model_file_name(sc.model_path)
        if key == "tokens":
            return f"{sc.n_tokens:,}"
        if key == "swa":
            return swa_mode(sc)
        if key == "restore":
            return describe_restore_mode(sc.restore_mode)
        if key == "cache":
            return cache_text(sc)
        if key == "last_used":
            try:
                return relative_time(parse_utc(sc.last_used_at), self._clock())
            except ValueError:
                return sc.last_used_at
        if key == "pinned":
            return "pinned" if sc.pinned else ""
        return ""

    def _tooltip(self, entry: SessionEntry, reasons: list[str] | None, key: str) -> str | None:
        sc = entry.sidecar
        if key == "compat":
            if reasons is None:
                return "Start the server to check whether this conversation can be resumed."
            if not reasons:
                return "Can be resumed into the running server."
            return "Cannot be resumed into the running server:\n• " + "\n• ".join(reasons)
        if key == "status":
            return "\n".join(entry.problems) if entry.problems else "Sidecar and KV file look complete."
        if key == "where":
            if entry.id in self._in_slot:
                return (f"In slot {self._in_slot[entry.id]} of the running server: the next request of this "
                        "conversation continues from there.")
            return "Saved on disk: a request that continues it brings it back into a slot first."
        if sc is None:
            return "\n".join(entry.problems) or None
        if key == "title":
            lines = [sc.title]
            if sc.preview:
                lines.append(sc.preview)
            lines.append(f"id {sc.id}" + (f", continued from {sc.parent}" if sc.parent else ""))
            if sc.last_restore and sc.last_restore.effective is False and sc.last_restore.reason:
                lines.append(f"Last restore was not reused: {sc.last_restore.reason}")
            return "\n".join(lines)
        if key == "model":
            return f"{sc.model_path}\narchitecture {sc.arch}, sha256 {sc.model_sha256[:12]}…"
        if key == "tokens":
            return f"{sc.n_tokens:,} tokens; saved from slots of {sc.n_ctx_slot:,} tokens (-np {sc.n_parallel})"
        if key == "swa":
            if sc.swa and not sc.swa_full:
                return ("Saved without --swa-full: the sliding-window layers keep only the last window, "
                        "so resuming it re-reads the whole conversation.")
            return None
        if key == "restore":
            return restore_mode_explanation(sc.restore_mode)
        if key == "last_used":
            try:
                return parse_utc(sc.last_used_at).astimezone().strftime("%Y-%m-%d %H:%M:%S")
            except ValueError:
                return None
        if key == "pinned":
            return "Pinned sessions are never pruned." if sc.pinned else None
        return None

    def _sort_value(self, entry: SessionEntry, reasons: list[str] | None, key: str) -> Any:
        sc = entry.sidecar
        if key == "size":
            return entry.size_bytes
        if key == "compat":
            return -1 if reasons is None else (1 if not reasons else 0)
        if key == "status":
            return 0 if entry.problems else 1
        if sc is None:
            return "" if key in ("title", "model", "swa", "restore", "cache", "last_used") else 0
        if key == "tokens":
            return sc.n_tokens
        if key == "pinned":
            return 1 if sc.pinned else 0
        if key == "last_used":
            try:
                return parse_utc(sc.last_used_at).timestamp()
            except ValueError:
                return 0.0
        return self._display(entry, reasons, key).lower()


class SessionsFilterProxy(QSortFilterProxyModel):
    """Keeps rows whose title, preview, model or id contain every word typed, and the rows of
    conversations found by what was said in them (``set_found_ids``: the search by content)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._words: list[str] = []
        self._found: frozenset[str] = frozenset()
        self.setSortRole(SORT_ROLE)
        self.setDynamicSortFilter(True)

    def set_filter_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt >= 6.9; invalidateFilter is deprecated there
            self.beginFilterChange()
            self._words = text.lower().split()
            self.endFilterChange()
        else:  # pragma: no cover - older PySide6
            self._words = text.lower().split()
            self.invalidateFilter()

    def set_found_ids(self, ids) -> None:
        """Sessions found by content: shown whatever their titles say."""
        found = frozenset(ids)
        if found == self._found:
            return
        if hasattr(self, "beginFilterChange"):
            self.beginFilterChange()
            self._found = found
            self.endFilterChange()
        else:  # pragma: no cover - older PySide6
            self._found = found
            self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:
        if not self._words:
            return True
        index = self.sourceModel().index(source_row, 0, source_parent)
        if self._found:
            entry = self.sourceModel().data(index, ENTRY_ROLE)
            if entry is not None and entry.id in self._found:
                return True
        haystack = self.sourceModel().data(index, SEARCH_ROLE) or ""
        return all(w in haystack for w in self._words)
