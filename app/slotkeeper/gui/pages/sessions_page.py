"""The Sessions tab: saved conversations (filter, table, disk usage) and what can be done with
them: resume, pin, delete (after asking), verify, show in the file manager."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtGui import QGuiApplication
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
    QTableView,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import STOPPED_STATES
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.units import human_bytes
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.desktop import no_file_manager_message, reveal_in_file_manager
from slotkeeper.gui.search_results import SearchResults
from slotkeeper.gui.sessions_model import COLUMN, ENTRY_ROLE, SessionsFilterProxy, SessionsTableModel

OVER_BUDGET_STYLE = "QProgressBar::chunk { background: #dc2626; }"


class SessionsPage(QWidget):
    statusMessage = Signal(str)  # a short message for the window's status bar
    switchRequested = Signal(str, str)  # model path, session to resume once it runs

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._build()

        # Whether the selected conversation can be resumed depends on the server and the model.
        for event_type in (ev.ServerStateChanged, ev.EngineReady, ev.ActivityChanged):
            bridge.on(event_type, self._update_buttons)
        bridge.on(ev.SlotsChanged, self._on_slots)
        bridge.on(ev.ServerStateChanged, self._on_slots)
        bridge.sessionsListed.connect(self._on_listing)
        bridge.settingsChanged.connect(self._on_settings_changed)
        bridge.sessionVerified.connect(self._on_verified)
        bridge.modelFileResolved.connect(self._update_buttons)
        if bridge.listing is not None:
            self._on_listing(bridge.listing, bridge.facts)
        bridge.refresh_sessions()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Search everything said in the conversations, titles, models or ids")
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
        self.table = QTableView()
        self.table.setModel(self.sessions_proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(COLUMN["last_used"], Qt.SortOrder.DescendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMN["title"], QHeaderView.ResizeMode.Stretch)
        # Model file names can be very long; they elide instead of squeezing the title.
        header.setSectionResizeMode(COLUMN["model"], QHeaderView.ResizeMode.Interactive)
        header.resizeSection(COLUMN["model"], 160)
        header.setHighlightSections(False)
        self.table.doubleClicked.connect(lambda _: self.resume_selected())
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        layout.addWidget(self.table, 1)

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
        self.reveal_button = QPushButton("Show in file manager")
        self.reveal_button.clicked.connect(self.reveal_selected)
        for w in (self.resume_button, self.pin_button, self.delete_button, self.verify_button, self.reveal_button):
            buttons.addWidget(w)
        buttons.addStretch(1)
        layout.addLayout(buttons)

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
        selected = {e.id for e in self.selected_entries()}
        current = self.current_entry()
        self.sessions_model.set_listing(listing, facts)
        if selected:  # the same conversations stay selected across a new listing
            sel = self.table.selectionModel()
            for row in range(self.sessions_proxy.rowCount()):
                index = self.sessions_proxy.index(row, 0)
                entry = index.data(ENTRY_ROLE)
                if entry is not None and entry.id in selected:
                    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
                    if current is not None and entry.id == current.id:
                        flags |= QItemSelectionModel.SelectionFlag.Current
                    sel.select(index, flags)
        n = len(listing.sessions)
        self.sessions_count.setText(f"{n} saved conversation{'s' if n != 1 else ''}")
        self._update_usage(listing)
        self._update_buttons()

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
            extra.append("over budget: pinned or in-use sessions cannot be pruned")
        self.usage_label.setText("; ".join(extra))

    # -- the selection --------------------------------------------------------------------
    def selected_entries(self) -> list[SessionEntry]:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return [r.data(ENTRY_ROLE) for r in rows if r.data(ENTRY_ROLE) is not None]

    def current_entry(self) -> SessionEntry | None:
        entries = self.selected_entries()
        if not entries:
            return None
        index = self.table.currentIndex()
        if index.isValid():
            entry = self.sessions_proxy.index(index.row(), 0).data(ENTRY_ROLE)
            if entry is not None and entry.id in {e.id for e in entries}:
                return entry
        return entries[0]

    def select_session(self, session_id: str) -> bool:
        for row in range(self.sessions_proxy.rowCount()):
            index = self.sessions_proxy.index(row, 0)
            entry = index.data(ENTRY_ROLE)
            if entry is not None and entry.id == session_id:
                self.table.selectRow(row)
                return True
        return False

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
        pinned = [e for e in entries if e.sidecar and e.sidecar.pinned]
        self.pin_button.setText("Unpin" if entries and len(pinned) == len(entries) else "Pin")
        self.pin_button.setEnabled(any(e.sidecar for e in entries))
        self.delete_button.setEnabled(bool(entries))
        self.verify_button.setEnabled(bool(entries))
        self.reveal_button.setEnabled(current is not None)

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
        for button, fn in ((self.resume_button, self.resume_selected), (self.pin_button, self.toggle_pin_selected),
                           (self.verify_button, self.verify_selected), (self.reveal_button, self.reveal_selected),
                           (self.delete_button, self.delete_selected)):
            action = menu.addAction(button.text())
            action.setEnabled(button.isEnabled())
            action.setToolTip(button.toolTip())
            action.triggered.connect(fn)
        return menu

    def resume_selected(self) -> None:
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
        else:
            self.bridge.resume_session(entry.id)
            self.statusMessage.emit("Restoring the conversation…")

    def toggle_pin_selected(self) -> None:
        entries = [e for e in self.selected_entries() if e.sidecar]
        if not entries:
            return
        pin = not all(e.sidecar.pinned for e in entries)
        for e in entries:
            self.bridge.set_pinned(e.id, pin)

    def confirm_delete(self, entries: list[SessionEntry]) -> bool:
        if len(entries) == 1:
            sc = entries[0].sidecar
            what = f"“{sc.title}”" if sc else f"session {entries[0].id}"
        else:
            what = f"{len(entries)} saved conversations"
        size = human_bytes(sum(e.size_bytes for e in entries))
        answer = QMessageBox.question(
            self, "Delete saved conversations",
            f"Delete {what} ({size})? Its KV cache file is removed from disk; this cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )  # fmt: skip
        return answer == QMessageBox.StandardButton.Yes

    def delete_selected(self) -> None:
        entries = self.selected_entries()
        if not entries or not self.confirm_delete(entries):
            return
        for e in entries:
            self.bridge.delete_session(e.id)

    def verify_selected(self) -> None:
        for e in self.selected_entries():
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
