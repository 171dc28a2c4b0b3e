"""Settings: the server profile, autosave and launch behaviour, and the disk budget.

Changes to the server profile take effect at the next server start; when the server is running
the dialog says so and offers "Save and restart" (changed slots are saved first). Values this run
took from the command line carry a note; saving leaves their saved values alone unless the user
changed them here (the settings service decides, see ``core.services.settings``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
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

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.events import ServerStateChanged
from slotkeeper.core.model import gguf_info
from slotkeeper.core.services.choosing import ModelIdentity, expected_facts, left_behind
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import Settings, SettingsError
from slotkeeper.gui.bridge import EngineBridge, resolved_model_file
from slotkeeper.gui.settings.disk_tab import DiskTab
from slotkeeper.gui.settings.form import FormTab
from slotkeeper.gui.settings.server_tab import ServerTab
from slotkeeper.gui.settings.sessions_tab import SessionsTab
from slotkeeper.gui.theme import error_style, warning_style

log = logging.getLogger(__name__)

RESTART_NOTICE = ("The server is running with other settings: these changes take effect when it "
                  "restarts. “Save and restart server” saves changed conversations first.")


class SettingsDialog(QDialog):
    """``settings()`` is what the fields say; Save applies it through the bridge."""

    saved = Signal(object, bool)  # Settings, restart requested

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None,
                 autostart: Any | None = None, search_dirs: list | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setWindowTitle("Settings")  # the platform adds " — Slotkeeper" (the application's display name)
        self._autostart = autostart
        self._closing = False
        # Start at login shows what was saved until _read_login_switch (a job: launchctl, the
        # registry) says how the switch is now.
        self.base = bridge.settings

        self.server_tab = ServerTab(bridge, self.base, search_dirs)
        self.sessions_tab = SessionsTab(bridge, self.base)
        self.disk_tab = DiskTab(bridge, self.base)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.server_tab, "Server")
        self.tabs.addTab(self.sessions_tab, "Conversations")
        self.tabs.addTab(self.disk_tab, "Disk budget")

        self.restart_label = QLabel()
        self.restart_label.setWordWrap(True)
        self.restart_label.setStyleSheet(warning_style())
        self.restart_label.hide()
        self.sessions_label = QLabel()
        self.sessions_label.setWordWrap(True)
        self.sessions_label.setStyleSheet(warning_style())
        self.sessions_label.hide()
        self.left_behind: list[str] = []
        self._current_identity: ModelIdentity | None = None
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(error_style())
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.restart_button = self.buttons.addButton("Save and restart server",
                                                     QDialogButtonBox.ButtonRole.ApplyRole)
        self.restart_button.setToolTip(
            "Saves changed conversations, then restarts llama-server with these settings")
        self.restart_button.hide()
        self.buttons.button(QDialogButtonBox.StandardButton.Save).clicked.connect(
            lambda: self.save(restart=False))
        self.restart_button.clicked.connect(lambda: self.save(restart=True))
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.sessions_label)
        layout.addWidget(self.restart_label)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)

        for tab in self.form_tabs:
            tab.show_overrides(bridge.settings_service)
            tab.changed.connect(self._changed)
        bridge.on(ServerStateChanged, self._on_server_state)
        bridge.sessionsListed.connect(self._changed)
        self.server_tab.modelRead.connect(self._changed)
        self._read_current_model()
        self._read_login_switch()
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
        self._update_left_behind(candidate)
        restart = self.bridge.needs_restart(candidate)
        self.restart_label.setVisible(restart)
        self.restart_button.setVisible(restart)
        if restart:
            self.restart_label.setText(RESTART_NOTICE)

    # -- saved conversations these settings leave behind ------------------------------------
    def _read_current_model(self) -> None:
        """Which sessions belong to the model of the settings in use (its file and hash; a job)."""
        bridge, model_path = self.bridge, self.base.profile.model_path
        if bridge.facts is not None or not model_path:
            return
        models_dir = bridge.paths.models_dir

        def read() -> ModelIdentity:
            real = resolved_model_file(model_path, models_dir) or model_path
            info = gguf_info.read_model_info(real)
            return ModelIdentity(real, bridge.known_model_sha256(real), info.has_swa)

        def done(identity: ModelIdentity) -> None:
            if not self._closing:
                self._current_identity = identity
                self._changed()

        self.bridge.jobs.run(read, on_success=done, on_failure=lambda exc: None,
                             description="Reading the current model")

    def _update_left_behind(self, candidate: Settings) -> None:
        """Say which saved conversations would no longer restore, before the settings are saved."""
        bridge = self.bridge
        facts = bridge.facts
        before_model: ModelIdentity | None
        before: ServerFacts | None
        if facts is not None:
            before_model = ModelIdentity(facts.model_path, facts.model_sha256, facts.swa)
            before = facts
        elif self._current_identity is not None:
            before_model = self._current_identity
            before = expected_facts(self.base.profile, before_model)
        else:
            before_model = before = None
        after_model = self.server_tab.identity
        listing = bridge.listing
        said: list[str] = []
        if (before is not None and before_model is not None and after_model is not None
                and listing is not None
                and candidate.profile.model_path == self.server_tab._model_info_for):
            said = left_behind(listing.sessions, before, before_model,
                               expected_facts(candidate.profile, after_model), after_model)
        self.left_behind = said
        self.sessions_label.setText(" ".join(said))
        self.sessions_label.setVisible(bool(said))

    def _on_server_state(self, *_args) -> None:
        if not self._closing:
            self._changed()

    # -- saving ---------------------------------------------------------------------------
    def autostart(self):
        if self._autostart is None:
            from slotkeeper.core.basics.autostart import autostart_for

            self._autostart = autostart_for()
        return self._autostart

    def _read_login_switch(self) -> None:
        """Start at login as it is (a job): the person may have turned it off outside the app
        (Login Items, the Startup apps list) since the setting was saved. The box follows unless
        the person has already ticked it differently; the read failing leaves what was saved."""
        saved = self.base.start_at_login
        box = self.sessions_tab.start_at_login
        switch = self.autostart()

        def done(on: bool) -> None:
            if self._closing or on == saved:
                return
            self.base = replace(self.base, start_at_login=on)
            if box.isChecked() == saved:
                box.setChecked(on)

        def failed(exc: BaseException) -> None:
            log.debug("cannot read the start-at-login switch: %s", exc)

        self.bridge.jobs.run(lambda: bool(switch.is_enabled()), on_success=done, on_failure=failed,
                             description="Reading the start-at-login switch")

    def save(self, restart: bool = False) -> bool:
        try:
            settings = self.settings()
        except (SettingsError, ValueError) as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            return False
        if self.left_behind:
            answer = QMessageBox.question(
                self, "Saved conversations will not restore",
                " ".join(self.left_behind) + "\n\nThey stay on disk and restore again with the settings they "
                "were made with. Save these settings anyway?",
                QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )  # fmt: skip
            if answer != QMessageBox.StandardButton.Save:
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
        from slotkeeper.core.basics.autostart import default_command

        switch = self.autostart()
        data_dir = self.bridge.paths.data_dir

        def apply() -> None:
            if enable:  # on the folder this app uses (--data-dir), not the default one
                switch.enable(default_command(data_dir=data_dir))
            else:
                switch.disable()

        self.bridge.jobs.run(apply, description="Turning start at login " + ("on" if enable else "off"))

    def done(self, result: int) -> None:
        self._closing = True
        for tab in self.form_tabs:
            tab.close_down()
        super().done(result)
