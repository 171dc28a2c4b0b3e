"""The fix for a sliding-window model's restores, in one click: turn on --swa-full (its memory cost
said on the button) and restart, which saves changed slots first.

Shown wherever the notice is (the Server tab's warning box) as long as the model in use slides and
the settings leave --swa-full off; gone once it is on.
"""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model.gguf_memory import kv_estimate
from slotkeeper.gui.bridge import EngineBridge


def swa_fix_offer(model, profile) -> str | None:
    """The button's text for ``model`` run with ``profile``, or None when there is nothing to fix."""
    if model is None or not model.info.has_swa or profile.swa_full:
        return None
    try:
        est = kv_estimate(model.info, profile.ctx, profile.parallel, type_k=profile.cache_type_k,
                          type_v=profile.cache_type_v)
    except ValueError:  # a cache type the estimate does not know: offer it without a figure
        return "Turn on --swa-full and restart"
    return f"Turn on --swa-full and restart (+{human_bytes(est.swa_full_extra_bytes)} memory)"


class SwaFixButton(QPushButton):
    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setToolTip("Keeps the full context for the sliding-window layers, so a restored conversation "
                        "is reused instead of re-read. Changed slots are saved before the restart.")
        self.setAccessibleDescription(self.toolTip())
        self.clicked.connect(self.apply)
        for event_type in (ev.ServerStateChanged, ev.EngineReady):
            bridge.on(event_type, self.refresh)
        bridge.settingsChanged.connect(self.refresh)
        self.refresh()

    def refresh(self, *_args) -> None:
        text = swa_fix_offer(self.bridge.snapshot.model, self.bridge.settings.profile)
        if text:
            self.setText(text)
        self.setVisible(bool(text))
        self.setEnabled(bool(text))

    def apply(self) -> None:
        settings = self.bridge.settings
        if settings.profile.swa_full:
            return
        wanted = settings.with_profile(swa_full=True)
        try:
            wanted.profile.validate()
        except ValueError as exc:
            QMessageBox.warning(self, "Turning on --swa-full", str(exc))
            return
        self.setEnabled(False)
        self.setText("Saving the conversations and restarting…")
        self.bridge.apply_settings(wanted, restart=self.bridge.running)
