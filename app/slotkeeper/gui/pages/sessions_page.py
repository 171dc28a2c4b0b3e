"""The Sessions tab: saved conversations (filter, one row per conversation with its branches under
it, disk usage) and what can be done with them: resume, pin, delete (after asking), verify, show
in the file manager, copy the id. An empty folder (or filter) says what to do instead of showing
an empty table."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.views import STOPPED_STATES
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.desktop import no_file_manager_message, reveal_in_file_manager
from slotkeeper.gui.search_results import SearchResults
from slotkeeper.gui.sessions_model import (
    COLUMN,
    ENTRY_ROLE,
    SAVES_ROLE,
    SessionsFilterProxy,
    SessionsTableModel,
)
from slotkeeper.gui.widgets import WrappedLabel

OVER_BUDGET_STYLE = "QProgressBar::chunk { background: #dc2626; }"


class SessionsPage(QWidget):
    statusMessage = Signal(str)  # a short message for the window's status bar
    switchRequested = Signal(str, str)  # model path, session to resume once it runs
    chatRequested = Signal(str)  # open this conversation in the chat window

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._build()

        # Whether the selected conversation can be resumed depends on the server and the model.
        for event_type in (ev.ServerStateChanged, ev.EngineReady, ev.ActivityChanged):
            bridge.on(event_type, self._update_buttons)
        bridge.on(ev.SlotsChanged, self._on_slots)
        bridge.on(ev.ServerStateChanged, self._on_slots)
        bridge.on(ev.ServerStateChanged, self._update_empty)
        bridge.sessionsListed.connect(self._on_listing)
        bridge.settingsChanged.connect(self._on_settings_changed)
        bridge.sessionVerified.connect(self._on_verified)
        bridge.modelFileResolved.connect(self._update_buttons)
        self._on_slots()  # where each is now: the window is built after the slots last changed
        if bridge.listing is not None:
            self._on_listing(bridge.listing, bridge.facts)
        bridge.refresh_sessions()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self._layout = layout
        top = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText(
            "Search everything said in the conversations, titles, models or ids")
        self.filter_edit.setAccessibleName("Search saved conversations")
        self.filter_edit.setClearButtonEnabled(True)
        top.addWidget(self.filter_edit, 1)
        self.sessions_count = QLabel()
        top.addWidget(self.sessions_count)
        layout.addLayout(top)
        self._build_search(layout)

        self.sessions_model = SessionsTableModel(self)
        self.sessions_proxy = SessionsFilterProxy(self)
        self.sessions_proxy.setSourceModel(self.sessions_model)
        self.filter_edit.textChanged.connect(self.sessions_proxy.set_filter_text)
        self.filter_edit.textChanged.connect(self._update_empty)
        # A tree: one row per conversation, its branches (edited or regenerated turns) under it.
        self.table = QTreeView()
        self.table.setModel(self.sessions_proxy)
        self.table.setAccessibleName("Saved conversations")
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(COLUMN["last_used"], Qt.SortOrder.DescendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setUniformRowHeights(True)
        self.table.setWordWrap(False)
        self.table.setAllColumnsShowFocus(True)
        self.table.setExpandsOnDoubleClick(False)  # a double click resumes; the arrow expands
        header = self.table.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # The title takes the room left; every other column, the model's file name included, is
        # as wide as its longest value (the view scrolls sideways rather than cut them).
        header.setSectionResizeMode(COLUMN["title"], QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(48)
        header.setHighlightSections(False)
        self.table.activated.connect(lambda _: self.resume_selected())  # double click, or Enter
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        layout.addWidget(self.table, 1)
        self.empty_label = WrappedLabel()
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.empty_label.hide()
        layout.addWidget(self.empty_label)
        self._empty_stretch = layout.count()
        layout.addStretch(0)

        buttons = QHBoxLayout()
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(self.resume_selected)
        self.pin_button = QPushButton("Pin")
        self.pin_button.clicked.connect(self.toggle_pin_selected)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.clicked.connect(self.delete_selected)
        self.verify_button = QPushButton("Verify")
        self.verify_button.setToolTip("Check the KV file's size and content hash")
        self.verify_button.clicked.connect(self.verify_selected)
        self.reveal_button = QPushButton("Show file")
        self.reveal_button.setToolTip("Show the saved cache file in the file manager")
        self.reveal_button.clicked.connect(self.reveal_selected)
        for w in (self.resume_button, self.pin_button, self.delete_button, self.verify_button,
                  self.reveal_button):
            buttons.addWidget(w)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self.copy_id_button = QPushButton("Copy id")  # the context menu's; kept for its state
        self.copy_id_button.clicked.connect(self.copy_id_selected)
        self.copy_id_button.hide()
        # Keys: Enter resumes (activated), Delete deletes (in the table only), Ctrl+F filters.
        QShortcut(QKeySequence.StandardKey.Delete, self.table,
                  context=Qt.ShortcutContext.WidgetShortcut).activated.connect(self.delete_selected)
        QShortcut(QKeySequence.StandardKey.Find, self,
                  context=Qt.ShortcutContext.WidgetWithChildrenShortcut).activated.connect(self._focus_filter)
        self.setTabOrder(self.filter_edit, self.table)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self.filter_edit,
                  context=Qt.ShortcutContext.WidgetShortcut).activated.connect(self.filter_edit.clear)
        self._update_empty()

        usage = QHBoxLayout()
        usage.addWidget(QLabel("Disk:"))
        self.usage_bar = QProgressBar()
        self.usage_bar.setTextVisible(True)
        self.usage_bar.setRange(0, 1000)
        usage.addWidget(self.usage_bar, 1)
        self.usage_label = QLabel()
        usage.addWidget(self.usage_label)
        layout.addLayout(usage)
        self._update_buttons()

    # -- searching by content (gui/search_results.py) -------------------------------------
    def _build_search(self, layout: QVBoxLayout) -> None:
        self.search_results = SearchResults(self)
        layout.addWidget(self.search_results)
        self.filter_edit.textChanged.connect(self.search_results.set_text)
        self.search_results.searchRequested.connect(self.bridge.search_sessions)
        self.search_results.sessionChosen.connect(self.select_session)
        self.search_results.resumeRequested.connect(self._resume_found)
        self.bridge.sessionsFound.connect(self._on_found)
        self.bridge.sessionsChanged.connect(self.search_results.search_again)
        self.bridge.on(ev.SearchIndexRepaired, self._on_index_repaired)

    def _on_index_repaired(self, _event: ev.SearchIndexRepaired) -> None:
        self.search_results.search_again()  # e.g. completed with the full text: more may match

    def _on_found(self, result) -> None:
        self.search_results.show_result(result)
        self.sessions_proxy.set_found_ids(self.search_results.ids)

    def _resume_found(self, session_id: str) -> None:
        if self.select_session(session_id):
            self.resume_selected()

    # -- the listing ----------------------------------------------------------------------
    def _on_listing(self, listing: Listing, facts) -> None:
        selected = {e.id for e in self.selected_saves()}
        current = self.current_entry()
        expanded = self._expanded_ids()
        self.sessions_model.set_listing(listing, facts, self.bridge.saved_at)  # the tray's ages too
        for sid in expanded:  # branches stay open across a new listing
            self.table.expand(self.sessions_proxy.mapFromSource(self.sessions_model.index_of(sid)))
        if selected:  # the same conversations stay selected (a save that went on stays in its row)
            sel = self.table.selectionModel()
            done: set[int] = set()
            for sid in selected:
                index = self.sessions_proxy.mapFromSource(self.sessions_model.index_of(sid))
                if not index.isValid() or index.internalId() in done:
                    continue
                done.add(index.internalId())
                flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
                saves = index.data(SAVES_ROLE) or []
                if current is not None and current.id in {e.id for e in saves}:
                    flags |= QItemSelectionModel.SelectionFlag.Current
                sel.select(index, flags)
        # The expand arrows' column only when some conversation has branches to show.
        self.table.setRootIsDecorated(any(c.branches for c in self.sessions_model.conversations()))
        n = len(self.sessions_model.conversations())
        self.sessions_count.setText(f"{n} saved conversation{'s' if n != 1 else ''}")
        self._update_usage(listing)
        self._update_buttons()
        self._update_empty()

    def _expanded_ids(self) -> list[str]:
        out = []
        stack = [self.sessions_proxy.index(r, 0) for r in range(self.sessions_proxy.rowCount())]
        while stack:
            index = stack.pop()
            if self.table.isExpanded(index):
                entry = index.data(ENTRY_ROLE)
                if entry is not None:
                    out.append(entry.id)
                stack += [self.sessions_proxy.index(r, 0, index)
                          for r in range(self.sessions_proxy.rowCount(index))]
        return out

    def _focus_filter(self) -> None:
        self.filter_edit.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.filter_edit.selectAll()

    def _update_empty(self, *_args) -> None:
        """No rows: say why and what to do, in place of an empty table."""
        text = ""
        if self.bridge.listing is None:
            text = "Reading the saved conversations…"
        elif not self.sessions_model.conversations():
            text = ("No saved conversations yet.\n\nChat through Slotkeeper's address, "
                    f"{self.bridge.base_url}/v1 (any OpenAI-compatible client, or “New chat” in the tray "
                    "menu). Each conversation is saved here when a reply ends, and comes back after a "
                    "restart.")
            if self.bridge.state in STOPPED_STATES:
                text += "\n\nThe server is stopped: start it from the tray menu or the Server tab first."
        elif self.sessions_proxy.rowCount() == 0:
            text = (f"No saved conversation matches “{self.filter_edit.text().strip()}”.\n"
                    "Clear the filter (Esc) to see them all.")
        self.empty_label.setText(text)
        self.empty_label.setVisible(bool(text))
        self.table.setVisible(not text)
        self._layout.setStretch(self._empty_stretch, 1 if text else 0)

    def _on_settings_changed(self, _settings) -> None:
        self._update_usage()
        self._update_buttons()

    def _update_usage(self, listing: Listing | None = None) -> None:
        listing = listing or self.bridge.listing
        if listing is None:
            return
        used = listing.total_bytes
        budget = max(1, self.bridge.settings.budget_bytes)
        share = used / budget
        self.usage_bar.setValue(min(1000, int(1000 * share)))
        self.usage_bar.setFormat(f"{human_bytes(used)} of {human_bytes(budget)} budget ({share:.0%})")
        over = used > budget
        self.usage_bar.setStyleSheet(OVER_BUDGET_STYLE if over else "")
        extra = []
        if listing.unmanaged:
            extra.append(f"{len(listing.unmanaged)} other file(s), {human_bytes(listing.unmanaged_bytes)}, "
                         "not Slotkeeper's: not counted")
        if over:
            extra.append("over budget: pinned conversations and those in a slot are never pruned")
        self.usage_label.setText("; ".join(extra))

    # -- the selection --------------------------------------------------------------------
    def selected_entries(self) -> list[SessionEntry]:
        """The selected conversations, each as its newest save (what Resume restores)."""
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return [r.data(ENTRY_ROLE) for r in rows if r.data(ENTRY_ROLE) is not None]

    def selected_saves(self) -> list[SessionEntry]:
        """Every save of the selected conversations (what Delete, Unpin and Verify act on)."""
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return [e for r in rows for e in (r.data(SAVES_ROLE) or [])]

    def current_entry(self) -> SessionEntry | None:
        entries = self.selected_entries()
        if not entries:
            return None
        index = self.table.currentIndex()
        if index.isValid():
            entry = index.siblingAtColumn(0).data(ENTRY_ROLE)
            if entry is not None and entry.id in {e.id for e in entries}:
                return entry
        return entries[0]

    def select_session(self, session_id: str) -> bool:
        """Select the row of the conversation holding ``session_id`` (opening its parents)."""
        index = self.sessions_proxy.mapFromSource(self.sessions_model.index_of(session_id))
        if not index.isValid():
            return False
        parent = index.parent()
        while parent.isValid():
            self.table.expand(parent)
            parent = parent.parent()
        self.table.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
        self.table.scrollTo(index)
        return True

    def _update_buttons(self, *_args) -> None:
        entries = self.selected_entries()
        current = self.current_entry()
        can_resume, why, label = False, "Select a conversation", "Resume"
        if current is not None:
            verdict = self.bridge.resume_verdict(current)
            can_resume, why, label = verdict.enabled, verdict.why, verdict.label
        self.resume_button.setEnabled(can_resume)
        self.resume_button.setToolTip(why)
        self.resume_button.setText(label)
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        pinned = [r for r in rows if any(e.sidecar and e.sidecar.pinned for e in (r.data(SAVES_ROLE) or []))]
        self.pin_button.setText("Unpin" if rows and len(pinned) == len(rows) else "Pin")
        self.pin_button.setEnabled(any(e.sidecar for e in entries))
        self.delete_button.setEnabled(bool(entries))
        self.verify_button.setEnabled(bool(entries))
        self.reveal_button.setEnabled(current is not None)
        self.copy_id_button.setEnabled(current is not None)
        self.copy_id_button.setToolTip(f"Copy {current.id} (for `slotkeeper sessions show`)"
                                       if current else "")

    # -- actions --------------------------------------------------------------------------
    def _context_menu(self, pos) -> None:
        index = self.table.indexAt(pos)
        if not index.isValid():
            return
        self.build_context_menu().popup(self.table.viewport().mapToGlobal(pos))

    def build_context_menu(self) -> QMenu:
        """What can be done with the selected conversations (the buttons' actions, in a menu)."""
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.setToolTipsVisible(True)
        for button, fn in ((self.resume_button, self.resume_selected),
                           (self.pin_button, self.toggle_pin_selected),
                           (self.verify_button, self.verify_selected),
                           (self.reveal_button, self.reveal_selected),
                           (self.copy_id_button, self.copy_id_selected),
                           (self.delete_button, self.delete_selected)):
            action = menu.addAction(button.text())
            action.setEnabled(button.isEnabled())
            action.setToolTip(button.toolTip())
            action.triggered.connect(fn)
        return menu

    def resume_selected(self) -> None:
        """Open the conversation in the chat window (its slot is restored when a message is sent),
        switching to its model or starting the server first when that is what it needs."""
        entry = self.current_entry()
        if entry is None or not self.resume_button.isEnabled():
            return
        verdict = self.bridge.resume_verdict(entry)
        if verdict.switch_to:
            self.switchRequested.emit(verdict.switch_to, entry.id)
            self.statusMessage.emit(f"{verdict.label}…")
        elif self.bridge.state in STOPPED_STATES:
            self.bridge.start_server(resume_id=entry.id)
            self.statusMessage.emit("Starting the server to resume this conversation…")
        self.chatRequested.emit(entry.id)

    def toggle_pin_selected(self) -> None:
        """Pin: the conversation as it is now (its newest save). Unpin: every save of it."""
        rows = self.table.selectionModel().selectedRows()
        groups = [[e for e in (r.data(SAVES_ROLE) or []) if e.sidecar] for r in rows]
        groups = [g for g in groups if g]
        if not groups:
            return
        pin = not all(any(e.sidecar.pinned for e in g) for g in groups)
        for g in groups:
            if pin:
                self.bridge.set_pinned(g[-1].id, True)
            else:
                for e in g:
                    if e.sidecar.pinned:
                        self.bridge.set_pinned(e.id, False)

    def copy_id_selected(self) -> None:
        entry = self.current_entry()
        if entry is not None:
            QGuiApplication.clipboard().setText(entry.id)
            self.statusMessage.emit(f"Copied the id {entry.id}")

    def confirm_delete(self, entries: list[SessionEntry], saves: list[SessionEntry] | None = None) -> bool:
        saves = saves if saves is not None else entries
        if len(entries) == 1:
            sc = entries[0].sidecar
            what = f"“{sc.title}”" if sc else f"conversation {entries[0].id}"
        else:
            what = f"{len(entries)} saved conversations"
        if len(saves) > len(entries):
            what += f" ({len(saves)} saves)"
        size = human_bytes(sum(e.size_bytes for e in saves))
        answer = QMessageBox.question(
            self, "Delete saved conversations",
            f"Delete {what}, {size}? The saved cache is removed from disk; this cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )  # fmt: skip
        return answer == QMessageBox.StandardButton.Yes

    def delete_selected(self) -> None:
        entries, saves = self.selected_entries(), self.selected_saves()
        if not entries or not self.confirm_delete(entries, saves):
            return
        for e in saves:
            self.bridge.delete_session(e.id)

    def verify_selected(self) -> None:
        for e in self.selected_saves():
            self.bridge.verify_session(e.id)
        self.statusMessage.emit("Verifying…")

    def _on_slots(self, _event=None) -> None:
        self.sessions_model.set_slots(self.bridge.slots)

    def _on_verified(self, entry: SessionEntry) -> None:
        title = entry.sidecar.title if entry.sidecar else entry.id
        if entry.problems:
            self.statusMessage.emit(f"“{title}” is damaged: {'; '.join(entry.problems)}")
        else:
            self.statusMessage.emit(f"“{title}” verified: size and content hash match")

    def reveal_selected(self) -> None:
        entry = self.current_entry()
        if entry is None:
            return
        path = self.bridge.session_file(entry)
        if not reveal_in_file_manager(path):
            QGuiApplication.clipboard().setText(str(path))
            self.statusMessage.emit(no_file_manager_message(path))
