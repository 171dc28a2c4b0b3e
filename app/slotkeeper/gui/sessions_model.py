"""The saved sessions as rows of conversations, with compatibility against the server.

One row per conversation: the saves of a conversation that went on from a pinned snapshot are
one row (``core.sessions.conversations``); a branch (an edited or regenerated turn) is a child
row under the conversation it left."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, overload

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
)
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model.families import describe_restore_mode, restore_mode_explanation
from slotkeeper.core.services.resume import compat_reasons
from slotkeeper.core.sessions.compat import ServerFacts, model_file_name, swa_mode
from slotkeeper.core.sessions.conversations import Conversation, group_conversations
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.sessions.sidecar import Sidecar, parse_utc
from slotkeeper.gui.theme import error_colour

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ID_ROLE = Qt.ItemDataRole.UserRole + 2
ENTRY_ROLE = Qt.ItemDataRole.UserRole + 3  # the conversation's newest save (what Resume restores)
SEARCH_ROLE = Qt.ItemDataRole.UserRole + 4
RESTORABLE_ROLE = Qt.ItemDataRole.UserRole + 5
SAVES_ROLE = Qt.ItemDataRole.UserRole + 6  # every save of the conversation, oldest first

# (key, header, header tooltip): plain names; the details are in the tooltips.
COLUMNS = (
    ("title", "Title", "The conversation, named by how it starts. A branch (an edited or regenerated "
                       "turn) shows under the conversation it left."),
    ("in_slot", "In slot", "The slot of the running server that holds the conversation now; empty when it "
                           "waits on disk."),
    ("model", "Model", "The model it was made with (the tooltip says how its cache was stored)."),
    ("tokens", "Tokens", "How long the conversation is, in tokens."),
    ("size", "Size", "Disk space its saved cache takes (every save of it)."),
    ("last_used", "Last changed", "When the conversation last changed (its last save; bringing it back "
                                  "into a slot does not count). The tray's Resume menu says the same."),
    ("pinned", "Pinned", "Pinned conversations are never deleted to stay within the disk budget."),
    ("restore", "Restore", "What bringing it back saves: with most models any part of it is reused; with "
                           "some only an exact continuation."),
    ("compat", "Resumable", "Whether it can be resumed into the running server (the tooltip says why not)."),
    ("status", "Status", "Whether its files are complete and unchanged."),
)
COLUMN = {key: i for i, (key, *_rest) in enumerate(COLUMNS)}
_NUMERIC = {"tokens", "size"}

Index = QModelIndex | QPersistentModelIndex


def cache_text(sidecar: Sidecar) -> str:
    fa = "on" if sidecar.flash_attn else "off"
    if sidecar.cache_type_k == sidecar.cache_type_v:
        return f"flash attention {fa}, cache {sidecar.cache_type_k}"
    return f"flash attention {fa}, cache K {sidecar.cache_type_k} / V {sidecar.cache_type_v}"


def relative_time(moment: float, now: float) -> str:
    """How long before ``now`` the unix time ``moment`` was: "just now", "5 min ago", "3 h ago",
    "yesterday", "12 days ago", else a date."""
    seconds = max(0.0, now - moment)
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
    return datetime.fromtimestamp(moment).strftime("%Y-%m-%d")


def changed_at(entry: SessionEntry, saved_at: Mapping[str, float]) -> float | None:
    """When a saved conversation last changed: its KV file's time (``saved_at``, from the listing's
    feed), else its sidecar's last use. One source for the Sessions tab and the tray: "last used"
    also moves when a launch restores it or a quit finds it unchanged."""
    moment = saved_at.get(entry.id)
    if moment:
        return moment
    if entry.sidecar is None:
        return None
    try:
        return parse_utc(entry.sidecar.last_used_at).timestamp()
    except ValueError:
        return None


def conversation_slot(conversation: Conversation, in_slot: Mapping[str, int]) -> int | None:
    """The slot holding any save of ``conversation`` now (``in_slot``: session id -> slot), newest
    save first; the rule the Sessions tab and the tray share."""
    for e in reversed(conversation.saves):
        if e.id in in_slot:
            return in_slot[e.id]
    return None


class _Node:
    """A row: one conversation (its saves) under its parent row (None: top level)."""

    __slots__ = ("children", "conversation", "nid", "parent", "row")

    def __init__(self, conversation: Conversation, parent: _Node | None, row: int, nid: int) -> None:
        self.conversation = conversation
        self.parent = parent
        self.row = row
        self.nid = nid
        self.children: list[_Node] = []


class SessionsTableModel(QAbstractItemModel):
    """One row per conversation (``core.sessions.conversations``), its branches as child rows."""

    def __init__(self, parent=None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(parent)
        self._entries: list[SessionEntry] = []
        self._roots: list[_Node] = []
        self._nodes: list[_Node] = []
        self._reasons: dict[str, list[str] | None] = {}
        self._facts: ServerFacts | None = None
        self._clock = clock
        self._in_slot: dict[str, int] = {}  # session id -> the slot holding it now
        self._saved_at: Mapping[str, float] = {}  # session id -> when its KV file was written
        self.total_bytes = 0
        self.unmanaged_bytes = 0

    # -- feeding --------------------------------------------------------------------------
    def set_listing(self, listing: Listing, facts: ServerFacts | None,
                    saved_at: Mapping[str, float] | None = None) -> None:
        """``saved_at``: when each session's KV file was written (``Feeds.saved_at``)."""
        self.beginResetModel()
        self._entries = list(listing.sessions)
        self._saved_at = dict(saved_at or {})
        self._facts = facts
        self._reasons = {e.id: compat_reasons(e, facts) for e in self._entries}
        self._nodes = []
        self._roots = [self._add(c, None, i) for i, c in enumerate(group_conversations(self._entries))]
        self.total_bytes = listing.total_bytes
        self.unmanaged_bytes = listing.unmanaged_bytes
        self.endResetModel()

    def _add(self, conversation: Conversation, parent: _Node | None, row: int) -> _Node:
        node = _Node(conversation, parent, row, len(self._nodes))
        self._nodes.append(node)
        node.children = [self._add(b, node, i) for i, b in enumerate(conversation.branches)]
        return node

    def _changed_all(self, first: int = 0, last: int | None = None) -> None:
        last = len(COLUMNS) - 1 if last is None else last
        for node in self._nodes:
            self.dataChanged.emit(self.createIndex(node.row, first, node.nid),
                                  self.createIndex(node.row, last, node.nid))

    def set_facts(self, facts: ServerFacts | None) -> None:
        self._facts = facts
        self._reasons = {e.id: compat_reasons(e, facts) for e in self._entries}
        self._changed_all()

    def set_slots(self, views) -> None:
        """Which slot holds which session now (from the engine's slot views)."""
        in_slot = {v.session_id: v.id for v in views if v.session_id}
        if in_slot == self._in_slot:
            return
        self._in_slot = in_slot
        self._changed_all(COLUMN["in_slot"], COLUMN["in_slot"])

    def slot_of(self, conversation: Conversation) -> int | None:
        return conversation_slot(conversation, self._in_slot)

    def where(self, session_id: str) -> str:
        slot = self._in_slot.get(session_id)
        return "on disk" if slot is None else f"slot {slot}"

    @property
    def facts(self) -> ServerFacts | None:
        return self._facts

    def entry(self, row: int) -> SessionEntry:
        """The newest save of the top-level conversation at ``row``."""
        return self._roots[row].conversation.head

    def entries(self) -> list[SessionEntry]:
        return list(self._entries)

    def conversations(self) -> list[Conversation]:
        return [n.conversation for n in self._roots]

    def reasons(self, row: int) -> list[str] | None:
        return self._reasons.get(self.entry(row).id)

    def row_of(self, session_id: str) -> int:
        """The top-level row whose conversation (or one of its branches) holds ``session_id``."""
        for node in self._roots:
            if any(session_id in c.ids for c in node.conversation.walk()):
                return node.row
        return -1

    def index_of(self, session_id: str, column: int = 0) -> QModelIndex:
        """The row of the conversation that holds ``session_id`` (a branch's row for a branch)."""
        for node in self._nodes:
            if session_id in node.conversation.ids:
                return self.createIndex(node.row, column, node.nid)
        return QModelIndex()

    # -- Qt model -------------------------------------------------------------------------
    def _node(self, index: Index) -> _Node | None:
        if not index.isValid():
            return None
        nid = index.internalId()
        return self._nodes[nid] if 0 <= nid < len(self._nodes) else None

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:  # noqa: B008
        if column < 0 or column >= len(COLUMNS):
            return QModelIndex()
        if parent.isValid():
            node = self._node(parent)
            if node is None:
                return QModelIndex()
            siblings = node.children
        else:
            siblings = self._roots
        if not 0 <= row < len(siblings):
            return QModelIndex()
        return self.createIndex(row, column, siblings[row].nid)

    # Qt's two parents: the QObject's (no argument) and an index's (the model's).
    @overload
    def parent(self, /) -> QObject | None: ...
    @overload
    def parent(self, index: Index, /) -> QModelIndex: ...
    def parent(self, index: Index | None = None, /) -> QObject | QModelIndex | None:
        if index is None:
            return super().parent()
        node = self._node(index)
        if node is None or node.parent is None:
            return QModelIndex()
        return self.createIndex(node.parent.row, 0, node.parent.nid)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        if not parent.isValid():
            return len(self._roots)
        if parent.column() != 0:
            return 0
        node = self._node(parent)
        return len(node.children) if node is not None else 0

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section][1]
        if role == Qt.ItemDataRole.ToolTipRole:
            return COLUMNS[section][2]
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        node = self._node(index)
        if node is None:
            return None
        conv = node.conversation
        entry = conv.head
        reasons = self._reasons.get(entry.id)
        key = COLUMNS[index.column()][0]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(conv, reasons, key)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(conv, reasons, key)
        if role == SORT_ROLE:
            return self._sort_value(conv, reasons, key)
        if role == ID_ROLE:
            return entry.id
        if role == ENTRY_ROLE:
            return entry
        if role == SAVES_ROLE:
            return list(conv.saves)
        if role == RESTORABLE_ROLE:
            return reasons == []
        if role == SEARCH_ROLE:
            parts: list[str] = []
            for e in conv.saves:
                parts.append(e.id)
                if e.sidecar is not None:
                    sc = e.sidecar
                    parts += [sc.title, sc.preview, model_file_name(sc.model_path), sc.arch]
            return " ".join(parts).lower()
        if role == Qt.ItemDataRole.TextAlignmentRole and key in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            if conv.problems and key in ("title", "status"):
                return error_colour()
            if reasons and key in ("compat", "title"):
                return QApplication.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
        return None

    def _display(self, conv: Conversation, reasons: list[str] | None, key: str) -> str:
        entry = conv.head
        sc = entry.sidecar
        if key == "title":
            return sc.title if sc else f"(unreadable) {entry.id}"
        if key == "status":
            return "ok" if not conv.problems else "damaged"
        if key == "compat":
            if reasons is None:
                return "—"
            if (reasons and sc is not None and self._facts is not None
                    and sc.model_sha256 != self._facts.model_sha256):
                return "other model"  # resumed by switching to it
            return "yes" if not reasons else "no"
        if key == "size":
            return human_bytes(conv.size_bytes)
        if key == "in_slot":
            slot = self.slot_of(conv)
            return "" if slot is None else f"slot {slot}"
        if key == "pinned":
            return "pinned" if conv.pinned else ""
        if sc is None:
            return ""
        if key == "model":
            return model_file_name(sc.model_path)
        if key == "tokens":
            return f"{sc.n_tokens:,}"
        if key == "restore":
            return describe_restore_mode(sc.restore_mode)
        if key == "last_used":
            moment = changed_at(entry, self._saved_at)
            if moment is None:
                return sc.last_used_at
            return relative_time(moment, self._clock())
        return ""

    def _tooltip(self, conv: Conversation, reasons: list[str] | None, key: str) -> str | None:
        entry = conv.head
        sc = entry.sidecar
        if key == "compat":
            if reasons is None:
                return "Start the server to check whether this conversation can be resumed."
            if not reasons:
                return "Can be resumed into the running server."
            return "Cannot be resumed into the running server:\n• " + "\n• ".join(reasons)
        if key == "status":
            if conv.problems:
                return "\n".join(conv.problems)
            return ("Its files are complete." if len(conv.saves) == 1
                    else "The files of every save are complete.")
        if key == "in_slot":
            slot = self.slot_of(conv)
            if slot is not None:
                return (f"In slot {slot} of the running server: the next request of this "
                        "conversation continues from there.")
            return "Saved on disk: a request that continues it brings it back into a slot first."
        if sc is None:
            return "\n".join(entry.problems) or None
        if key == "title":
            lines = [sc.title]
            if sc.preview:
                lines.append(sc.preview)
            lines.append(f"id {sc.id}")
            if len(conv.saves) > 1:
                first = conv.saves[0].sidecar
                kept = (f" (pinned at {first.n_tokens:,} tokens, kept as it was)"
                        if first and first.pinned else "")
                lines.append(f"{len(conv.saves)} saves of this conversation{kept}")
            elif sc.parent:
                lines.append(f"A branch: it left {sc.parent} before its end (an edited or regenerated turn)")
            if sc.last_restore and sc.last_restore.effective is False and sc.last_restore.reason:
                lines.append(f"Last restore was not reused: {sc.last_restore.reason}")
            return "\n".join(lines)
        if key == "model":
            return (f"{sc.model_path}\narchitecture {sc.arch}, sha256 {sc.model_sha256[:12]}…\n"
                    f"Saved with {swa_mode(sc)}; {cache_text(sc)}"
                    + ("\nWithout --swa-full the sliding-window layers keep only the last window, so "
                       "resuming it re-reads the whole conversation." if sc.swa and not sc.swa_full else ""))
        if key == "tokens":
            return (f"{sc.n_tokens:,} tokens; saved from slots of {sc.n_ctx_slot:,} tokens "
                    f"(-np {sc.n_parallel})")
        if key == "size":
            if len(conv.saves) > 1:
                return " + ".join(human_bytes(e.size_bytes) for e in conv.saves) + " (every save of it)"
            return None
        if key == "restore":
            size = human_bytes(sum(p.size_bytes for p in sc.points))
            points = (f" Restore points: {len(sc.points)} ({size}), so a regenerated reply or an edited "
                      "message after a restart re-reads only what it changed." if sc.points else "")
            return restore_mode_explanation(sc.restore_mode) + points
        if key == "last_used":
            moment = changed_at(entry, self._saved_at)
            return None if moment is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))
        if key == "pinned":
            return "Pinned: never deleted to stay within the disk budget." if conv.pinned else None
        return None

    def _sort_value(self, conv: Conversation, reasons: list[str] | None, key: str) -> Any:
        entry = conv.head
        sc = entry.sidecar
        if key == "size":
            return conv.size_bytes
        if key == "compat":
            return -1 if reasons is None else (1 if not reasons else 0)
        if key == "status":
            return 0 if conv.problems else 1
        if key == "pinned":
            return 1 if conv.pinned else 0
        if key == "in_slot":
            slot = self.slot_of(conv)
            return -1 if slot is None else slot
        if sc is None:
            return "" if key in ("title", "model", "restore") else 0
        if key == "tokens":
            return sc.n_tokens
        if key == "last_used":
            return changed_at(entry, self._saved_at) or 0.0
        return self._display(conv, reasons, key).lower()


class SessionsFilterProxy(QSortFilterProxyModel):
    """Keeps rows whose title, preview, model or id contain every word typed (and the rows above a
    branch that does), and the rows of conversations found by what was said in them
    (``set_found_ids``: the search by content)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._words: list[str] = []
        self._found: frozenset[str] = frozenset()
        self.setRecursiveFilteringEnabled(True)
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
            saves = self.sourceModel().data(index, SAVES_ROLE) or ()
            if any(e.id in self._found for e in saves):  # any save of the conversation was found
                return True
        haystack = self.sourceModel().data(index, SEARCH_ROLE) or ""
        return all(w in haystack for w in self._words)
