"""The tray icon: state at a glance, a tooltip with the essentials, and the everyday menu.

Everything but ``show()`` works without a system tray (the menu is a plain QMenu), so the menu
and tooltip logic are tested offscreen where no tray exists.
"""

from __future__ import annotations

import sys
import time

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes, human_duration
from slotkeeper.core.model.model_choice import profile_model_name
from slotkeeper.core.sessions.conversations import group_conversations
from slotkeeper.core.views import STOPPED_STATES, ServerState
from slotkeeper.gui import icons
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.desktop import no_browser_message, open_url
from slotkeeper.gui.model_menu import ModelMenu
from slotkeeper.gui.notifications import ERROR, WARNING
from slotkeeper.gui.sessions_model import changed_at, conversation_slot, relative_time

RESUME_ITEMS = 10


TITLE_CHARS = 48
MESSAGE_MS = 8000


def api_address(base_url: str) -> str:
    """What OpenAI-compatible clients want as their base URL."""
    return f"{base_url.rstrip('/')}/v1"


def _elide(text: str, n: int = TITLE_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


class TrayController(QObject):
    showWindowRequested = Signal(str)  # tab: "server", "slots", "history", "sessions"
    settingsRequested = Signal()
    quitRequested = Signal()
    modelRequested = Signal(str, str)  # model path, session to resume after the switch ("" = none)
    chooseModelRequested = Signal()  # no model yet: open the model chooser
    # Open a conversation in the chat window ("": the last chat window, or a new chat).
    chatRequested = Signal(str)
    newChatRequested = Signal()
    aboutRequested = Signal()  # Slotkeeper's version and licence

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.tray = QSystemTrayIcon(self)
        self.menu = QMenu()
        self.menu.setToolTipsVisible(True)
        self.icon_state = ""

        self.status_action = self.menu.addAction("")
        self.status_action.setEnabled(False)
        self.menu.addSeparator()
        self.start_stop_action = self.menu.addAction("Start server")
        self.start_stop_action.triggered.connect(self._start_stop)
        self.model_menu = ModelMenu(bridge, "Model")
        self.model_menu.modelChosen.connect(lambda path: self.modelRequested.emit(path, ""))
        self.menu.addMenu(self.model_menu)
        self.resume_menu = self.menu.addMenu("Resume")
        self.resume_menu.setToolTipsVisible(True)
        self.new_chat_action = self.menu.addAction("New chat")
        self.new_chat_action.triggered.connect(self.newChatRequested)
        self.open_chat_action = self.menu.addAction("Open chat")
        self.open_chat_action.triggered.connect(lambda: self.chatRequested.emit(""))
        # llama-server's own chat page, when the binary serves one (bridge.check_web_ui)
        self.web_ui_action = self.menu.addAction("Open llama-server's web UI")
        self.web_ui_action.triggered.connect(self.open_web_ui)
        self.web_ui_action.setVisible(bridge.web_ui)
        bridge.webUiChanged.connect(self.web_ui_action.setVisible)
        self.copy_action = self.menu.addAction("Copy API address")
        self.copy_action.triggered.connect(self.copy_address)
        self.menu.addSeparator()
        self.sessions_action = self.menu.addAction("Conversations…")
        self.sessions_action.triggered.connect(lambda: self.showWindowRequested.emit("sessions"))
        self.window_action = self.menu.addAction("Show window…")
        self.window_action.triggered.connect(lambda: self.showWindowRequested.emit("server"))
        self.settings_action = self.menu.addAction("Settings…")
        self.settings_action.triggered.connect(self.settingsRequested)
        self.about_action = self.menu.addAction("About Slotkeeper…")
        self.about_action.triggered.connect(self.aboutRequested)
        self.menu.addSeparator()
        self.quit_action = self.menu.addAction("Quit Slotkeeper")
        self.quit_action.triggered.connect(self.quitRequested)

        self.tray.setContextMenu(self.menu)
        self.tray.activated.connect(self._activated)
        self.tray.messageClicked.connect(lambda: self.showWindowRequested.emit("server"))

        # Bound methods (not lambdas): Qt drops these connections if the tray goes first.
        for event_type in (ev.ServerStateChanged, ev.EngineReady, ev.ActivityChanged):
            bridge.on(event_type, self._on_change)
        for signal in (bridge.sessionsListed, bridge.settingsChanged):
            signal.connect(self._on_change)
        bridge.on(ev.SlotsChanged, self._on_slots)
        bridge.historyLoaded.connect(self._on_slots)  # the time saved in the tooltip
        self.resume_menu.aboutToShow.connect(self.rebuild_resume_menu)
        bridge.sessionsListed.connect(self._on_listed)
        self.menu.aboutToShow.connect(self.model_menu.rebuild)  # models found by the time "Model" opens
        self.refresh()
        if bridge.listing is None:
            # Resume and the tooltip list the saved conversations from the start: nothing else
            # lists them before the window opens or the server is ready.
            bridge.refresh_sessions()

    # -- showing --------------------------------------------------------------------------
    def show(self) -> bool:
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return False
        self.tray.show()
        return True

    def hide(self) -> None:
        self.tray.hide()

    def show_message(self, title: str, message: str, level: str = "info") -> None:
        if not self.tray.isVisible():
            return
        icon = {
            ERROR: QSystemTrayIcon.MessageIcon.Critical,
            WARNING: QSystemTrayIcon.MessageIcon.Warning,
        }.get(level, QSystemTrayIcon.MessageIcon.Information)
        self.tray.showMessage(title, message, icon, MESSAGE_MS)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        clicks = {QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick}
        if sys.platform == "darwin":
            # The menu-bar click that opens the menu also reports a Trigger: the menu is the answer
            # there (its "Show window…" opens the window), not the menu and the window at once.
            clicks.discard(QSystemTrayIcon.ActivationReason.Trigger)
        if reason in clicks:
            self.showWindowRequested.emit("")

    def _on_change(self, *_args) -> None:
        self.refresh()

    def _on_slots(self, *_args) -> None:
        self._refresh_icon_and_tip()

    def _on_listed(self, *_args) -> None:
        if self.resume_menu.isVisible():  # opened before the listing came
            self.rebuild_resume_menu()

    # -- state ----------------------------------------------------------------------------
    def refresh(self) -> None:
        b = self.bridge
        state = b.state
        ready = b.facts is not None
        has_model = bool(b.settings.profile.model_path)
        self.model_menu.setTitle(f"Model: {profile_model_name(b.settings.profile.model_path)}" if has_model
                                 else "Model")
        if state in STOPPED_STATES:
            self.start_stop_action.setText("Start server" if has_model else "Choose a model to start…")
            self.start_stop_action.setEnabled(True)
            self.start_stop_action.setToolTip("" if has_model else "No model chosen yet: pick a GGUF file, "
                                              "one found on this computer, or the starter model")
        elif state is ServerState.STOPPING:
            self.start_stop_action.setText("Stopping…")
            self.start_stop_action.setEnabled(False)
        else:
            self.start_stop_action.setText("Stop server (saves conversations)")
            self.start_stop_action.setEnabled(True)
        self.web_ui_action.setEnabled(ready)
        self.copy_action.setText(f"Copy API address ({api_address(b.base_url)})")
        self.status_action.setText(self._status_line())
        self._refresh_icon_and_tip()

    def _status_line(self) -> str:
        b = self.bridge
        state = b.state.value
        if b.state is ServerState.READY and b.facts is None:
            state = "preparing (restoring conversations)"
        return f"{b.model_name()}: {state}"

    def _refresh_icon_and_tip(self) -> None:
        b = self.bridge
        slot_states = [v.state for v in b.slots]
        name = icons.icon_state_for(b.state.value, b.facts is not None, b.activity.activity, slot_states)
        if name != self.icon_state:
            self.icon_state = name
            self.tray.setIcon(icons.tray_icon(name))
        self.tray.setToolTip(self.tooltip())

    def tooltip(self) -> str:
        b = self.bridge
        lines = [f"Slotkeeper: {b.state.value}", f"Model: {b.model_name()}"]
        if b.activity.activity:  # "Downloading the starter model: 40% of 93.8 MiB", "Saving (1 of 2): …"
            lines.append(b.activity.describe())
        if b.running:
            lines.append(f"Address: {b.base_url}")
        if b.slots:
            busy = sum(1 for v in b.slots if v.running or v.state != "idle")
            lines.append(f"Slots busy: {busy} of {len(b.slots)}")
        if b.listing is not None:
            n = len(b.listing.sessions)
            lines.append(f"Saved: {n} conversation{'s' if n != 1 else ''}, "
                         f"{human_bytes(b.listing.total_bytes)}")
        saved_ms = sum(r.saved_ms for r in b.history)
        if saved_ms:
            lines.append(f"Time saved by the cache: {human_duration(saved_ms / 1000)}")
        return "\n".join(lines)

    # -- resume ---------------------------------------------------------------------------
    def rebuild_resume_menu(self) -> None:
        """The most recent conversations (one entry each, as it is now); the ones in a slot say so,
        the others say when they last changed."""
        b = self.bridge
        menu = self.resume_menu
        menu.clear()
        listing = b.listing
        conversations = [c for top in group_conversations(listing.sessions if listing else [])
                         for c in top.walk()]
        # Where each is and when it changed: the Sessions tab's rules (sessions_model), one answer.
        slots = {v.session_id: v.id for v in b.slots if v.session_id}
        in_slot = {c.head.id: slot for c in conversations
                   if (slot := conversation_slot(c, slots)) is not None}
        entries = [c.head for c in conversations if c.head.sidecar is not None]

        def changed(e) -> float:
            return changed_at(e, b.saved_at) or 0.0

        entries.sort(key=lambda e: (e.id in in_slot, changed(e)), reverse=True)
        entries = entries[:RESUME_ITEMS]
        if not entries:
            a = menu.addAction("Reading the saved conversations…" if listing is None
                               else "No saved conversations yet")
            a.setEnabled(False)
            return
        now = time.time()
        for e in entries:
            sc = e.sidecar
            if e.id in in_slot:
                label = f"● {_elide(sc.title)}  (in slot {in_slot[e.id]})"
            else:
                label = f"{_elide(sc.title)}  ({relative_time(changed(e), now)})"
            verdict = b.resume_verdict(e)
            if verdict.switch_to and e.id not in in_slot:
                label += f" — {verdict.label[0].lower()}{verdict.label[1:]}"
            action = QAction(label, menu)
            action.setData(e.id)
            action.setEnabled(verdict.enabled)
            action.setToolTip("In a slot now: opens it in the chat window" if e.id in in_slot
                              else verdict.why)
            action.triggered.connect(lambda _=False, sid=e.id, to=verdict.switch_to: self.resume(sid, to))
            menu.addAction(action)

    def resume(self, session_id: str, switch_to: str | None = None) -> None:
        """Open the conversation in the chat window (its slot is restored when a message is sent);
        switch to its model first, or start the server, when that is what it needs."""
        b = self.bridge
        if switch_to:
            self.modelRequested.emit(switch_to, session_id)
        elif b.state in STOPPED_STATES:
            b.start_server(resume_id=session_id)
        self.chatRequested.emit(session_id)

    # -- actions --------------------------------------------------------------------------
    def _start_stop(self) -> None:
        b = self.bridge
        if b.state in STOPPED_STATES and not b.settings.profile.model_path:
            self.chooseModelRequested.emit()
        elif b.state in STOPPED_STATES:
            b.start_server()
        else:
            b.stop_server(save=True)

    def open_web_ui(self) -> None:
        url = self.bridge.base_url
        if not open_url(url):
            QGuiApplication.clipboard().setText(url)
            self.show_message("llama-server's web UI", no_browser_message(url), WARNING)

    def copy_address(self) -> None:
        QGuiApplication.clipboard().setText(api_address(self.bridge.base_url))

    def dispose(self) -> None:
        self.tray.hide()
        self.model_menu.deleteLater()
        self.menu.deleteLater()
