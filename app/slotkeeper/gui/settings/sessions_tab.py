"""The Conversations tab: autosave after idle, restores at launch, starting with the app and at login."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from slotkeeper.core.settings import Settings
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.settings.form import FormTab, note


def platform_login_note() -> str:
    if sys.platform == "darwin":
        return "Adds a LaunchAgent in ~/Library/LaunchAgents."
    if os.name == "nt":
        return "Adds an entry under HKCU\\…\\CurrentVersion\\Run."
    return "Adds slotkeeper.desktop to ~/.config/autostart."


class SessionsTab(FormTab):
    def __init__(self, bridge: EngineBridge, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(bridge, parent)
        form = QFormLayout(self)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        self.forms.append(form)
        self.idle_save = QDoubleSpinBox()
        self.idle_save.setRange(0, 3600)
        self.idle_save.setDecimals(0)
        self.idle_save.setSuffix(" s")
        self.idle_save.setToolTip("Save a conversation this long after its reply ends (0 = at once)")
        form.addRow("Autosave after idle:", self.idle_save)
        self.restore_count = QSpinBox()
        self.restore_count.setRange(-1, 64)
        self.restore_count.setSpecialValueText("one per slot")
        self.restore_count.setToolTip("How many of the most recent compatible conversations to restore "
                                      "when the server starts")
        form.addRow("Restore at launch:", self.restore_count)
        self.start_on_launch = QCheckBox("Start the server when Slotkeeper starts")
        self.start_on_launch.setToolTip(
            "Serve the chosen model as soon as Slotkeeper starts, so chat clients can connect at once "
            "(nothing starts before a model is chosen)")
        form.addRow("", self.start_on_launch)
        self.start_at_login = QCheckBox("Start Slotkeeper when I log in")
        self.login_note = note(platform_login_note())
        form.addRow("", self.start_at_login)
        form.addRow("", self.login_note)

        self.load(settings)
        self.idle_save.valueChanged.connect(self.changed)
        self.restore_count.valueChanged.connect(self.changed)
        for w in (self.start_on_launch, self.start_at_login):
            w.toggled.connect(self.changed)

    def override_fields(self) -> list[tuple[QWidget, tuple[str, ...]]]:
        return [
            (self.idle_save, ("idle_save_seconds",)),
            (self.restore_count, ("restore_on_start",)),
            (self.start_on_launch, ("start_server_on_launch",)),
            (self.start_at_login, ("start_at_login",)),
        ]

    def load(self, settings: Settings) -> None:
        self.idle_save.setValue(float(settings.idle_save_seconds))
        self.restore_count.setValue(-1 if settings.restore_on_start is None else settings.restore_on_start)
        self.start_on_launch.setChecked(settings.start_server_on_launch)
        self.start_at_login.setChecked(settings.start_at_login)

    def apply(self, settings: Settings) -> Settings:
        restore = self.restore_count.value()
        return replace(
            settings,
            idle_save_seconds=float(self.idle_save.value()),
            restore_on_start=None if restore < 0 else restore,
            start_server_on_launch=self.start_on_launch.isChecked(),
            start_at_login=self.start_at_login.isChecked(),
        )
