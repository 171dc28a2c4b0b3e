"""The main window: Server (state, flags, log), Slots (gauges), History (plot), Sessions (table).

Closing it hides it to the tray when there is one; Quit lives in the tray menu and File menu.
"""

from __future__ import annotations

import shlex
import time

from PySide6.QtCore import QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.engine.resume import resume_verdict
from slotkeeper.core.server.state import STOPPED_STATES, ServerState
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.units import human_bytes
from slotkeeper.gui import icons
from slotkeeper.gui.bridge import EngineBridge, initial_log
from slotkeeper.gui.desktop import open_url, reveal_in_file_manager
from slotkeeper.gui.gauges import CACHE_COLOUR, HELD_COLOUR, PROCESSED_COLOUR, SlotsPanel
from slotkeeper.gui.history_plot import HistoryPlot
from slotkeeper.gui.log_view import LogView
from slotkeeper.gui.notifications import ERROR, WARNING
from slotkeeper.gui.sessions_model import (
    COLUMN,
    ENTRY_ROLE,
    SessionsFilterProxy,
    SessionsTableModel,
)
from slotkeeper.gui.tray import api_address

TABS = ("server", "slots", "history", "sessions")
STATUS_MS = 10_000


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d} d {h} h {m} min"
    if h:
        return f"{h} h {m} min"
    if m:
        return f"{m} min {s} s"
    return f"{s} s"


def describe_flags(profile) -> str:
    parts = [
        f"context {profile.ctx:,} ({profile.ctx_per_slot:,} per slot)",
        f"{profile.parallel} slot{'s' if profile.parallel != 1 else ''}",
        f"flash attention {'on' if profile.flash_attn else 'off'}",
        f"K {profile.cache_type_k} / V {profile.cache_type_v}",
    ]
    if profile.swa_full:
        parts.append("--swa-full")
    if profile.extra_args:
        parts.append(shlex.join(profile.extra_args))
    return ", ".join(parts)


def _swatch(colour, text: str) -> QLabel:
    label = QLabel(f'<span style="color:{colour.name()}">■</span> {text}')
    return label


class MainWindow(QMainWindow):
    settingsRequested = Signal()
    quitRequested = Signal()

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.hide_on_close = False
        self.setWindowTitle("Slotkeeper")
        self.setWindowIcon(icons.app_icon())
        self.resize(1180, 720)

        self.tabs = QTabWidget(self)
        self.setCentralWidget(self.tabs)
        self.tabs.addTab(self._build_server_tab(), "Server")
        self.tabs.addTab(self._build_slots_tab(), "Slots")
        self.tabs.addTab(self._build_history_tab(), "History")
        self.tabs.addTab(self._build_sessions_tab(), "Sessions")
        self._build_menus()
        self.activity_label = QLabel("")
        self.statusBar().addPermanentWidget(self.activity_label)

        self._uptime_timer = QTimer(self)
        self._uptime_timer.setInterval(1000)
        self._uptime_timer.timeout.connect(self._update_uptime)

        b = bridge
        b.on(ev.ServerStateChanged, self._on_state)
        b.on(ev.ServerLoading, self._on_loading)
        b.on(ev.EngineReady, self._refresh_server)
        b.on(ev.ActivityChanged, self._on_activity)
        b.on(ev.SlotsChanged, self._on_slots)
        b.on(ev.WarningRaised, self._on_warning)
        b.sessionsListed.connect(self._on_listing)
        b.historyLoaded.connect(self._on_history)
        b.logLines.connect(self.log_view.append_lines)
        b.settingsChanged.connect(self._on_settings_changed)
        b.sessionVerified.connect(self._on_verified)

        self._refresh_server()
        self.slots_panel.set_views(b.slots)
        if b.listing is not None:
            self._on_listing(b.listing, b.facts)
        b.jobs.run(initial_log, b.engine, on_success=self.log_view.set_lines,
                   description="Reading the server log")
        b.refresh_sessions()
        b.load_history()

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
        server_menu = self.menuBar().addMenu("Se&rver")
        for action in (self.start_action, self.stop_action, self.restart_action):
            server_menu.addAction(action)
        server_menu.addSeparator()
        server_menu.addAction(self.open_chat_action)
        server_menu.addAction(self.copy_action)

    def _build_server_tab(self) -> QWidget:
        page = QWidget()
        outer = QVBoxLayout(page)
        top = QHBoxLayout()
        self.state_icon = QLabel()
        self.state_icon.setFixedSize(32, 32)
        self.state_label = QLabel()
        f = self.state_label.font()
        f.setPointSizeF(f.pointSizeF() * 1.25)
        f.setBold(True)
        self.state_label.setFont(f)
        self.state_message = QLabel()
        self.state_message.setWordWrap(True)
        self.state_message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        text_col = QVBoxLayout()
        text_col.setSpacing(2)
        text_col.addWidget(self.state_label)
        text_col.addWidget(self.state_message)
        top.addWidget(self.state_icon, 0, Qt.AlignmentFlag.AlignTop)
        top.addLayout(text_col, 1)

        self.start_action = QAction("Start", self)
        self.start_action.triggered.connect(lambda: self.bridge.start_server())
        self.stop_action = QAction("Stop", self)
        self.stop_action.setToolTip("Saves every changed conversation, then stops llama-server")
        self.stop_action.triggered.connect(lambda: self.bridge.stop_server(save=True))
        self.restart_action = QAction("Restart", self)
        self.restart_action.setToolTip("Saves every changed conversation, then restarts llama-server")
        self.restart_action.triggered.connect(self.bridge.restart_server)
        self.open_chat_action = QAction("Open chat in browser", self)
        self.open_chat_action.triggered.connect(lambda: open_url(self.bridge.base_url))
        self.copy_action = QAction("Copy API address", self)
        self.copy_action.triggered.connect(self._copy_address)
        buttons = QHBoxLayout()
        self.start_button = self._action_button(self.start_action)
        self.stop_button = self._action_button(self.stop_action)
        self.restart_button = self._action_button(self.restart_action)
        self.open_chat_button = self._action_button(self.open_chat_action)
        settings_button = QPushButton("Settings…")
        settings_button.clicked.connect(self.settingsRequested)
        for w in (self.start_button, self.stop_button, self.restart_button, self.open_chat_button):
            buttons.addWidget(w)
        buttons.addStretch(1)
        buttons.addWidget(settings_button)
        outer.addLayout(top)
        outer.addLayout(buttons)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.model_label = QLabel()
        self.flags_label = QLabel()
        self.flags_label.setWordWrap(True)
        self.address_label = QLabel()
        self.address_label.setOpenExternalLinks(True)
        self.uptime_label = QLabel("—")
        for label in (self.model_label, self.flags_label, self.address_label):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        address_row = QHBoxLayout()
        address_row.addWidget(self.address_label)
        copy_button = QPushButton("Copy API address")
        copy_button.clicked.connect(self._copy_address)
        address_row.addWidget(copy_button)
        address_row.addStretch(1)
        form.addRow("Model:", self.model_label)
        form.addRow("Flags:", self.flags_label)
        form.addRow("Address:", address_row)
        form.addRow("Uptime:", self.uptime_label)
        outer.addLayout(form)

        self.warning_box = QLabel()
        self.warning_box.setWordWrap(True)
        self.warning_box.setFrameShape(QFrame.Shape.StyledPanel)
        self.warning_box.setStyleSheet(
            "QLabel { background: #fef3c7; color: #78350f; border: 1px solid #f59e0b; "
            "border-radius: 4px; padding: 6px; }"
        )
        self.warning_box.hide()
        outer.addWidget(self.warning_box)

        self.log_view = LogView(page)
        outer.addWidget(self.log_view, 1)
        return page

    @staticmethod
    def _action_button(action: QAction) -> QPushButton:
        button = QPushButton(action.text())
        button.setToolTip(action.toolTip() if action.toolTip() != action.text() else "")
        button.clicked.connect(action.trigger)
        action.changed.connect(lambda: (button.setEnabled(action.isEnabled()), button.setText(action.text())))
        return button

    def _build_slots_tab(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        legend = QHBoxLayout()
        legend.addWidget(_swatch(CACHE_COLOUR, "prompt from cache"))
        legend.addWidget(_swatch(PROCESSED_COLOUR, "prompt processed"))
        legend.addWidget(_swatch(HELD_COLOUR, "tokens held in the slot"))
        legend.addStretch(1)
        layout.addLayout(legend)
        self.slots_panel = SlotsPanel()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self.slots_panel)
        layout.addWidget(scroll, 1)
        return page

    def _build_history_tab(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        self.history_summary = QLabel()
        layout.addWidget(self.history_summary)
        self.history_plot = HistoryPlot()
        layout.addWidget(self.history_plot, 1)
        self.history_summary.setText(self.history_plot.summary())
        return page

    def _build_sessions_tab(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        top = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by title, text, model or id")
        self.filter_edit.setClearButtonEnabled(True)
        top.addWidget(self.filter_edit, 1)
        self.sessions_count = QLabel()
        top.addWidget(self.sessions_count)
        layout.addLayout(top)

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
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_session_buttons())
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
        self._update_session_buttons()
        return page

    # -- window behaviour -----------------------------------------------------------------
    def show_tab(self, name: str) -> None:
        name = name.lower()
        if name in TABS:
            self.tabs.setCurrentIndex(TABS.index(name))

    def bring_forward(self, tab: str = "") -> None:
        if tab:
            self.show_tab(tab)
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.hide_on_close and not self.bridge.quitting:
            event.ignore()
            self.hide()
            return
        self._uptime_timer.stop()
        super().closeEvent(event)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._update_uptime()
        self._uptime_timer.start()

    def hideEvent(self, event) -> None:
        self._uptime_timer.stop()
        super().hideEvent(event)

    def show_notification(self, title: str, message: str, level: str = "info") -> None:
        """Where there is no tray: the status bar, and a message box for errors."""
        self.statusBar().showMessage(f"{title}: {message}", STATUS_MS)
        if level == ERROR and self.isVisible():
            box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()
        elif level == WARNING:
            self._show_warning(message)

    # -- server ---------------------------------------------------------------------------
    def _on_state(self, event: ev.ServerStateChanged) -> None:
        self._refresh_server()
        self.slots_panel.set_views(self.bridge.slots)
        if event.state is ServerState.FAILED and event.log_tail:
            self.state_message.setToolTip("\n".join(event.log_tail[-10:]))

    def _on_loading(self, event: ev.ServerLoading) -> None:
        self.state_message.setText(f"Loading the model… {event.elapsed:.0f} s\n{event.detail[:200]}")

    def _on_settings_changed(self, _settings) -> None:
        self._refresh_server()
        self._update_usage()

    def _refresh_server(self, *_args) -> None:
        b = self.bridge
        state = b.state
        ready = b.facts is not None
        icon_name = icons.icon_state_for(state.value, ready, b.activity.activity)
        self.state_icon.setPixmap(icons.state_icon(icon_name).pixmap(32, 32))
        text = {
            ServerState.STOPPED: "Stopped",
            ServerState.STARTING: "Starting",
            ServerState.READY: "Ready" if ready else "Preparing",
            ServerState.STOPPING: "Stopping",
            ServerState.CRASHED: "Crashed",
            ServerState.RESTARTING: "Restarting",
            ServerState.FAILED: "Failed",
        }[state]
        self.state_label.setText(text)
        message = b.state_message
        if state is ServerState.READY and not ready:
            message = "llama-server answers; identifying the model and restoring conversations…"
        elif state is ServerState.STOPPED and not message:
            message = "Start the server to serve the model and resume saved conversations."
        self.state_message.setText(message)
        stopped = state in STOPPED_STATES
        has_model = bool(b.settings.profile.model_path)
        self.start_action.setEnabled(stopped and has_model)
        self.start_action.setToolTip("" if has_model else "Choose a model in Settings first")
        self.stop_action.setEnabled(not stopped and state is not ServerState.STOPPING)
        self.restart_action.setEnabled(not stopped and state is not ServerState.STOPPING)
        self.open_chat_action.setEnabled(ready)
        profile = b.launched_profile or b.settings.profile
        model = b.snapshot.model
        model_text = b.model_name()
        if model is not None and not model.is_demo:
            info = model.info
            model_text = f"{model.path.name} ({info.arch}{', sliding window' if info.has_swa else ''})"
            self.model_label.setToolTip(str(model.path))
        elif model is not None:
            model_text = "demo model (random weights: it answers with gibberish)"
        self.model_label.setText(model_text)
        self.flags_label.setText(describe_flags(profile))
        url = b.base_url
        if b.running:
            self.address_label.setText(f'<a href="{url}">{url}</a> · API {api_address(url)}')
        else:
            self.address_label.setText(f"{url} (not running)")
        note = b.snapshot.swa_note if ready else None
        if note:
            self._show_warning(note)
        self._update_uptime()
        self._update_session_buttons()

    def _show_warning(self, message: str) -> None:
        self.warning_box.setText(message)
        self.warning_box.show()

    def _on_warning(self, event: ev.WarningRaised) -> None:
        self._show_warning(event.message)

    def _update_uptime(self) -> None:
        started_at = self.bridge.snapshot.started_at
        if self.bridge.state is ServerState.READY and started_at:
            self.uptime_label.setText(format_duration(time.time() - started_at))
        else:
            self.uptime_label.setText("—")

    def _copy_address(self) -> None:
        address = api_address(self.bridge.base_url)
        QGuiApplication.clipboard().setText(address)
        self.statusBar().showMessage(f"Copied {address}", STATUS_MS)

    def _on_activity(self, event: ev.ActivityChanged) -> None:
        activity = event.activity
        kind = activity.activity
        if kind:
            progress = f" ({activity.done + 1} of {activity.total})" if activity.total else ""
            self.activity_label.setText(f"{kind.capitalize()}{progress}: {activity.detail}")
        else:
            self.activity_label.setText("")
        self._refresh_server()

    # -- slots ----------------------------------------------------------------------------
    def _on_slots(self, event: ev.SlotsChanged) -> None:
        self.slots_panel.set_views(self.bridge.slots)

    # -- history --------------------------------------------------------------------------
    def _on_history(self, records: list) -> None:
        self.history_plot.set_records(records)
        self.history_summary.setText(self.history_plot.summary())

    # -- sessions -------------------------------------------------------------------------
    def _on_listing(self, listing: Listing, facts) -> None:
        selected = {e.id for e in self.selected_entries()}
        current = self.current_entry()
        self.sessions_model.set_listing(listing, facts)
        if selected:
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
        self.slots_panel.set_titles({e.id: e.sidecar.title for e in listing.sessions if e.sidecar})
        self._update_usage(listing)
        self._update_session_buttons()

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
        self.usage_bar.setStyleSheet("QProgressBar::chunk { background: #dc2626; }" if over else "")
        extra = []
        if listing.unmanaged:
            extra.append(f"{len(listing.unmanaged)} other file(s), {human_bytes(listing.unmanaged_bytes)}")
        if over:
            extra.append("over budget: pinned or in-use sessions cannot be pruned")
        self.usage_label.setText("; ".join(extra))

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

    def _update_session_buttons(self) -> None:
        if not hasattr(self, "resume_button"):
            return
        entries = self.selected_entries()
        current = self.current_entry()
        can_resume, why = False, "Select a conversation"
        if current is not None:
            verdict = resume_verdict(current, self.bridge.state, self.bridge.facts,
                                     bool(self.bridge.settings.profile.model_path))
            can_resume, why = verdict.enabled, verdict.why
        self.resume_button.setEnabled(can_resume)
        self.resume_button.setToolTip(why)
        pinned = [e for e in entries if e.sidecar and e.sidecar.pinned]
        self.pin_button.setText("Unpin" if entries and len(pinned) == len(entries) else "Pin")
        self.pin_button.setEnabled(any(e.sidecar for e in entries))
        self.delete_button.setEnabled(bool(entries))
        self.verify_button.setEnabled(bool(entries))
        self.reveal_button.setEnabled(current is not None)

    def resume_selected(self) -> None:
        entry = self.current_entry()
        if entry is None or not self.resume_button.isEnabled():
            return
        if self.bridge.state in STOPPED_STATES:
            self.bridge.start_server(resume_id=entry.id)
            self.statusBar().showMessage("Starting the server to resume this conversation…", STATUS_MS)
        else:
            self.bridge.resume_session(entry.id)
            self.statusBar().showMessage("Restoring the conversation…", STATUS_MS)

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
        self.statusBar().showMessage("Verifying…", STATUS_MS)

    def _on_verified(self, entry: SessionEntry) -> None:
        title = entry.sidecar.title if entry.sidecar else entry.id
        if entry.problems:
            self.statusBar().showMessage(f"“{title}” is damaged: {'; '.join(entry.problems)}", STATUS_MS)
        else:
            self.statusBar().showMessage(f"“{title}” verified: size and content hash match", STATUS_MS)

    def reveal_selected(self) -> None:
        entry = self.current_entry()
        if entry is None:
            return
        reveal_in_file_manager(self.bridge.session_file(entry))
