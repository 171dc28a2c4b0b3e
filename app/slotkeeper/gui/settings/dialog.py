"""Settings: the server profile, autosave and launch behaviour, and the disk budget.

Changes to the server profile take effect at the next server start; when the server is running
the dialog says so and offers "Save and restart" (changed slots are saved first). Values this run
took from the command line carry a note; saving leaves their saved values alone unless the user
changed them here (the settings service decides, see ``core.services.settings``).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QMessageBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.events import ServerStateChanged
from slotkeeper.core.settings import Settings, SettingsError
from slotkeeper.core.units import human_bytes
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.settings.disk_tab import DiskTab
from slotkeeper.gui.settings.form import ERROR_STYLE, WARNING_STYLE, FormTab
from slotkeeper.gui.settings.server_tab import ServerTab
from slotkeeper.gui.settings.sessions_tab import SessionsTab

RESTART_NOTICE = ("The server is running with other settings: these changes take effect when it "
                  "restarts. “Save and restart server” saves changed conversations first.")


class SettingsDialog(QDialog):
    """``settings()`` is what the fields say; Save applies it through the bridge."""

    saved = Signal(object, bool)  # Settings, restart requested

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None,
                 autostart: Any | None = None, search_dirs: list | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setWindowTitle("Slotkeeper settings")
        self.base = bridge.settings
        self._autostart = autostart
        self._closing = False

        self.server_tab = ServerTab(bridge, self.base, search_dirs)
        self.sessions_tab = SessionsTab(bridge, self.base)
        self.disk_tab = DiskTab(bridge, self.base)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.server_tab, "Server")
        self.tabs.addTab(self.sessions_tab, "Sessions")
        self.tabs.addTab(self.disk_tab, "Disk budget")

        self.restart_label = QLabel()
        self.restart_label.setWordWrap(True)
        self.restart_label.setStyleSheet(WARNING_STYLE)
        self.restart_label.hide()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(ERROR_STYLE)
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.restart_button = self.buttons.addButton("Save and restart server", QDialogButtonBox.ButtonRole.ApplyRole)
        self.restart_button.setToolTip("Saves changed conversations, then restarts llama-server with these settings")
        self.restart_button.hide()
        self.buttons.button(QDialogButtonBox.StandardButton.Save).clicked.connect(lambda: self.save(restart=False))
        self.restart_button.clicked.connect(lambda: self.save(restart=True))
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.restart_label)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)

        for tab in self.form_tabs:
            tab.show_overrides(bridge.settings_service)
            tab.changed.connect(self._changed)
        bridge.on(ServerStateChanged, self._on_server_state)
        self._changed()
        self.setMinimumWidth(640)
        self.resize(max(760, self.sizeHint().width()), max(640, self.sizeHint().height()))

    @property
    def form_tabs(self) -> tuple[FormTab, ...]:
        return (self.server_tab, self.sessions_tab, self.disk_tab)

    # -- the fields -----------------------------------------------------------------------
    def settings(self) -> Settings:
        """The settings the fields describe; SettingsError / ValueError say what is wrong."""
        settings = self.base
        for tab in self.form_tabs:
            settings = tab.apply(settings)
        settings.profile.validate()
        return settings

    def _changed(self, *_args) -> None:
        save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        try:
            candidate = self.settings()
        except (SettingsError, ValueError) as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            save_button.setEnabled(False)
            self.restart_button.setEnabled(False)
            return
        self.error_label.hide()
        save_button.setEnabled(True)
        self.restart_button.setEnabled(True)
        for tab in self.form_tabs:
            tab.update_overrides(candidate)
        restart = self.bridge.needs_restart(candidate)
        self.restart_label.setVisible(restart)
        self.restart_button.setVisible(restart)
        if restart:
            self.restart_label.setText(RESTART_NOTICE)

    def _on_server_state(self, *_args) -> None:
        if not self._closing:
            self._changed()

    # -- saving ---------------------------------------------------------------------------
    def autostart(self):
        if self._autostart is None:
            from slotkeeper.core.autostart import autostart_for

            self._autostart = autostart_for()
        return self._autostart

    def save(self, restart: bool = False) -> bool:
        try:
            settings = self.settings()
        except (SettingsError, ValueError) as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            return False
        plan = self.disk_tab.preview_plan
        if settings.budget_bytes < self.base.budget_bytes and plan is not None and plan.delete:
            answer = QMessageBox.question(
                self, "Delete saved conversations?",
                f"The smaller budget deletes {len(plan.delete)} saved conversation(s) now "
                f"({human_bytes(plan.bytes_freed)}). Continue?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )  # fmt: skip
            if answer != QMessageBox.StandardButton.Yes:
                return False
        if settings.start_at_login != self.base.start_at_login:
            self._apply_autostart(settings.start_at_login)
        self.bridge.apply_settings(settings, restart=restart)
        self.saved.emit(settings, restart)
        self.accept()
        return True

    def _apply_autostart(self, enable: bool) -> None:
        from slotkeeper.core.autostart import default_command

        switch = self.autostart()

        def apply() -> None:
            if enable:
                switch.enable(default_command())
            else:
                switch.disable()

        self.bridge.jobs.run(apply, description="Turning start at login " + ("on" if enable else "off"))

    def done(self, result: int) -> None:
        self._closing = True
        for tab in self.form_tabs:
            tab.close_down()
        super().done(result)
