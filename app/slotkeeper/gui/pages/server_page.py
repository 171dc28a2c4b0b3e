"""The Server tab: state, Start/Stop/Restart, model, flags, address, uptime, warnings, and below
them Slotkeeper's own activity (a searchable list) beside llama-server's raw log."""

from __future__ import annotations

import os
import time

import psutil
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_duration
from slotkeeper.core.views import STOPPED_STATES, ServerState
from slotkeeper.gui import icons
from slotkeeper.gui.activity_view import ActivityView
from slotkeeper.gui.bridge import EngineBridge, initial_log
from slotkeeper.gui.desktop import no_browser_message, open_url
from slotkeeper.gui.log_view import LogView
from slotkeeper.gui.swa_fix import SwaFixButton
from slotkeeper.gui.tray import api_address
from slotkeeper.gui.widgets import describe_profile

STATE_TEXT = {
    ServerState.STOPPED: "Stopped",
    ServerState.STARTING: "Starting",
    ServerState.READY: "Ready",
    ServerState.STOPPING: "Stopping",
    ServerState.CRASHED: "Crashed",
    ServerState.RESTARTING: "Restarting",
    ServerState.FAILED: "Failed",
}
WARNING_BOX_STYLE = (
    "QLabel { background: #fef3c7; color: #78350f; border: 1px solid #f59e0b; "
    "border-radius: 4px; padding: 6px; }"
)


def read_log(engine, since: float | None = None) -> tuple[list[str], str | None]:
    """The server log's last lines, and a note when they are an earlier run's: written before
    ``since`` (default: when this Slotkeeper started), as when llama-server has not run since (a
    start refused before it ran, a port in use). Reads the disk: a job."""
    lines = initial_log(engine)
    if since is None:
        since = psutil.Process().create_time()
    try:
        written = os.stat(engine.paths.server_log).st_mtime
    except OSError:
        return lines, None
    if written >= since:
        return lines, None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(written))
    return lines, f"——— llama-server's earlier run, until {when}: it has not run since Slotkeeper started ———"


def failure_line(message: str) -> str:
    return f"——— llama-server failed: {message or 'it could not be started'} ———"


def action_button(action: QAction) -> QPushButton:
    """A push button that triggers ``action`` and follows its text and enabled state."""
    button = QPushButton(action.text())
    button.setToolTip(action.toolTip() if action.toolTip() != action.text() else "")
    button.clicked.connect(action.trigger)

    def follow() -> None:
        button.setEnabled(action.isEnabled())
        button.setText(action.text())

    action.changed.connect(follow)
    return button


class ServerPage(QWidget):
    """The server's state and controls. Its actions (``start_action`` ...) also fill the window's menu."""

    settingsRequested = Signal()
    chooseModelRequested = Signal()
    statusMessage = Signal(str)  # a short message for the window's status bar
    chatRequested = Signal()  # "Open chat": the chat window

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._build()

        # Ticks only while the page is on screen; showing it again brings the uptime up to date.
        self._uptime_timer = QTimer(self)
        self._uptime_timer.setInterval(1000)
        self._uptime_timer.timeout.connect(self._update_uptime)

        bridge.on(ev.ServerStateChanged, self._on_state)
        bridge.on(ev.ServerLoading, self._on_loading)
        bridge.on(ev.EngineReady, self.refresh)
        bridge.on(ev.ActivityChanged, self.refresh)  # the state icon shows what the engine is doing
        bridge.on(ev.WarningRaised, self._on_warning)
        if bridge.last_warning:  # raised before this page was built (the window is built when first shown)
            self.show_warning(bridge.last_warning)
        bridge.logLines.connect(self.log_view.append_lines)
        self.activity_view.set_entries(bridge.journal)
        bridge.journalAdded.connect(self.activity_view.add)
        bridge.settingsChanged.connect(self.refresh)

        self.refresh()
        self._last_state = bridge.state
        bridge.jobs.run(read_log if not bridge.running else lambda e: (initial_log(e), None), bridge.engine,
                        on_success=self._log_read,
                        description="Reading the server log")

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        outer = QVBoxLayout(self)
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

        bridge = self.bridge
        self.start_action = QAction("Start", self)
        self.start_action.triggered.connect(lambda: bridge.start_server())
        self.stop_action = QAction("Stop", self)
        self.stop_action.setToolTip("Saves every changed conversation, then stops llama-server")
        self.stop_action.triggered.connect(lambda: bridge.stop_server(save=True))
        self.restart_action = QAction("Restart", self)
        self.restart_action.setToolTip("Saves every changed conversation, then restarts llama-server")
        self.restart_action.triggered.connect(bridge.restart_server)
        self.open_chat_action = QAction("Open chat", self)
        self.open_chat_action.setToolTip("Slotkeeper's chat window: a saved conversation, or a new one")
        self.open_chat_action.triggered.connect(self.chatRequested)
        self.web_ui_action = QAction("Open llama-server's web UI", self)  # when the binary serves one
        self.web_ui_action.triggered.connect(self.open_web_ui)
        self.web_ui_action.setVisible(bridge.web_ui)
        bridge.webUiChanged.connect(self.web_ui_action.setVisible)
        self.copy_action = QAction("Copy API address", self)
        self.copy_action.triggered.connect(self.copy_address)
        buttons = QHBoxLayout()
        self.start_button = action_button(self.start_action)
        self.stop_button = action_button(self.stop_action)
        self.restart_button = action_button(self.restart_action)
        self.open_chat_button = action_button(self.open_chat_action)
        self.choose_model_button = QPushButton("Choose model…")
        self.choose_model_button.setToolTip("A GGUF model on this computer, a file, or the starter model")
        self.choose_model_button.clicked.connect(self.chooseModelRequested)
        settings_button = QPushButton("Settings…")
        settings_button.clicked.connect(self.settingsRequested)
        for w in (self.start_button, self.stop_button, self.restart_button, self.open_chat_button):
            buttons.addWidget(w)
        buttons.addStretch(1)
        buttons.addWidget(self.choose_model_button)
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
        copy_button.clicked.connect(self.copy_address)
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
        self.warning_box.setStyleSheet(WARNING_BOX_STYLE)
        self.warning_box.hide()
        outer.addWidget(self.warning_box)
        self.swa_fix_button = SwaFixButton(self.bridge)  # the sliding-window notice's fix, one click
        outer.addWidget(self.swa_fix_button)

        # Slotkeeper's own actions beside llama-server's raw log; the divider can be dragged.
        self.activity_view = ActivityView(self)
        log_box = QWidget(self)
        log_layout = QVBoxLayout(log_box)
        log_layout.setContentsMargins(0, 0, 0, 0)
        log_title = QLabel("llama-server's log")
        bold = log_title.font()
        bold.setBold(True)
        log_title.setFont(bold)
        log_layout.addWidget(log_title)
        self.log_view = LogView(log_box)
        log_layout.addWidget(self.log_view, 1)
        self.log_splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.log_splitter.setChildrenCollapsible(False)
        self.log_splitter.addWidget(self.activity_view)
        self.log_splitter.addWidget(log_box)
        self.log_splitter.setStretchFactor(0, 3)
        self.log_splitter.setStretchFactor(1, 2)
        self.log_splitter.setSizes([560, 440])
        outer.addWidget(self.log_splitter, 1)

    # -- showing --------------------------------------------------------------------------
    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._update_uptime()
        self._uptime_timer.start()

    def hideEvent(self, event) -> None:
        self._uptime_timer.stop()
        super().hideEvent(event)

    def refresh(self, *_args) -> None:
        """Everything the page shows, from what the bridge knows now."""
        b = self.bridge
        state = b.state
        ready = b.facts is not None
        icon_name = icons.icon_state_for(state.value, ready, b.activity.activity)
        self.state_icon.setPixmap(icons.state_icon(icon_name).pixmap(32, 32))
        text = STATE_TEXT[state]
        if state is ServerState.READY and not ready:
            text = "Preparing"
        self.state_label.setText(text)
        message = b.state_message
        if b.activity.activity == "downloading":  # the starter model, before llama-server can start
            message = b.activity.describe()
        elif state is ServerState.READY and not ready:
            message = "llama-server answers; identifying the model and restoring conversations…"
        elif state is ServerState.READY:
            message = b.base_url  # where clients go: the front door, not llama-server's private address
        has_model = bool(b.settings.profile.model_path)
        if state is ServerState.STOPPED and not has_model:
            message = ("No model chosen yet. Choose a GGUF model (one found on this computer, a file, or the "
                       "starter model) and the server starts on it.")
        elif state is ServerState.STOPPED and not message:
            message = "Start the server to serve the model and resume saved conversations."
        self.state_message.setText(message)
        stopped = state in STOPPED_STATES
        self.start_action.setEnabled(stopped and has_model)
        self.start_action.setToolTip("" if has_model else "No model chosen yet: use “Choose model…” first")
        self.start_button.setToolTip(self.start_action.toolTip())
        self.choose_model_button.setDefault(not has_model)
        self.stop_action.setEnabled(not stopped and state is not ServerState.STOPPING)
        self.restart_action.setEnabled(not stopped and state is not ServerState.STOPPING)
        self.web_ui_action.setEnabled(ready)
        profile = b.launched_profile or b.settings.profile
        model = b.snapshot.model
        model_text = b.model_name()
        if model is not None and not model.is_demo:
            info = model.info
            model_text = f"{model.path.name} ({info.arch}{', sliding window' if info.has_swa else ''})"
            self.model_label.setToolTip(str(model.path))
        elif model is not None:
            model_text = "starter model (SmolLM2 135M Instruct)"
        self.model_label.setText(model_text)
        self.flags_label.setText(describe_profile(profile, b.facts.flash_attn if b.facts else None))
        url = b.base_url
        if b.running:
            self.address_label.setText(f'<a href="{url}">{url}</a> · API {api_address(url)}')
        else:
            self.address_label.setText(f"{url} (not running)")
        note = b.snapshot.swa_note if ready else None
        if note:
            self.show_warning(note)
        self._update_uptime()

    def show_warning(self, message: str) -> None:
        self.warning_box.setText(message)
        self.warning_box.show()

    # -- events ---------------------------------------------------------------------------
    def _log_read(self, got: tuple[list[str], str | None]) -> None:
        self.log_view.set_lines(*got)
        if self.bridge.state is ServerState.FAILED:  # the window was built after it
            self.log_view.append_lines([failure_line(self.bridge.state_message)])

    def _on_state(self, event: ev.ServerStateChanged) -> None:
        if event.state is ServerState.STARTING and self._last_state is not ServerState.STARTING:
            # a new llama-server: its lines follow, apart from the earlier ones
            self.log_view.append_lines([f"——— llama-server starting, {time.strftime('%H:%M:%S')} ———"])
        elif event.state is ServerState.FAILED:
            # what ended it, after its last words (or after nothing: a start refused before it ran)
            self.log_view.append_lines([failure_line(event.message)])
        self._last_state = event.state
        self.refresh()
        if event.state is ServerState.FAILED and event.log_tail:
            self.state_message.setToolTip("\n".join(event.log_tail[-10:]))

    def _on_loading(self, event: ev.ServerLoading) -> None:
        self.state_message.setText(f"Loading the model… {event.elapsed:.0f} s\n{event.detail[:200]}")

    def _on_warning(self, event: ev.WarningRaised) -> None:
        self.show_warning(event.message)

    def _update_uptime(self) -> None:
        started_at = self.bridge.snapshot.started_at
        if self.bridge.state is ServerState.READY and started_at:
            self.uptime_label.setText(human_duration(int(time.time() - started_at)))
        else:
            self.uptime_label.setText("—")

    def open_web_ui(self) -> None:
        url = self.bridge.base_url
        if not open_url(url):
            QGuiApplication.clipboard().setText(url)
            self.statusMessage.emit(no_browser_message(url))

    def copy_address(self) -> None:
        address = api_address(self.bridge.base_url)
        QGuiApplication.clipboard().setText(address)
        self.statusMessage.emit(f"Copied {address}")
