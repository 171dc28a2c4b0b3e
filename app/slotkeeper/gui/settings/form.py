"""What the settings tabs share: notes under fields, form rows that hide as a whole, and the
note that says a value comes from this run's command line."""

from __future__ import annotations

from typing import Any, cast

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QFormLayout, QLabel, QWidget

from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.services.settings import SettingsService, get_field
from slotkeeper.core.settings import Settings
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.widgets import WrappedLabel

# The command-line option behind each setting the command line can set (see `slotkeeper --help`).
COMMAND_LINE_FLAGS = {
    "profile.model_path": "--model",
    "profile.server_bin": "--server-bin",
    "profile.host": "--host",
    "profile.port": "--port",
    "profile.ctx": "--ctx",
    "profile.parallel": "--parallel",
    "profile.flash_attn": "--flash-attn",
    "profile.cache_type_k": "--cache-type-k",
    "profile.cache_type_v": "--cache-type-v",
    "profile.swa_full": "--swa-full",
    "profile.extra_args": "arguments after --",
    "idle_save_seconds": "--idle-save",
    "restore_on_start": "--restore",
    "budget_bytes": "--budget",
}


def command_line_flag(name: str, value: Any) -> str | None:
    """How this run's command line set ``name`` (None when the name has no option of its own)."""
    if name == "profile.model_path" and value == DEMO_MODEL:
        return "--demo"
    return COMMAND_LINE_FLAGS.get(name)


def note(text: str = "") -> QLabel:
    label = WrappedLabel(text)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class OverrideNote(QLabel):
    """Under a field whose value comes from this run's command line."""

    def __init__(self, names: tuple[str, ...], overrides: dict[str, Any]) -> None:
        super().__init__()
        self.names = names
        self.overrides = overrides
        flags = [command_line_flag(n, overrides[n]) for n in names]
        self.flags = ", ".join(f for f in flags if f)
        font = self.font()
        font.setItalic(True)
        self.setFont(font)
        palette = self.palette()
        palette.setColor(QPalette.ColorRole.WindowText, palette.color(QPalette.ColorRole.PlaceholderText))
        self.setPalette(palette)
        self.changed_here = False
        self._show()

    def update_from(self, chosen: Settings) -> None:
        """Say whether the field still shows the command line's value or the user changed it."""
        changed = any(get_field(chosen, n) != self.overrides[n] for n in self.names)
        if changed != self.changed_here:
            self.changed_here = changed
            self._show()

    def _show(self) -> None:
        given = f" ({self.flags})" if self.flags else ""
        if self.changed_here:
            self.setText("changed here: saving stores it and uses it instead of "
                         f"{self.flags or 'the command line'}")
            self.setToolTip("This run took the value from the command line. You changed it here, so "
                            "saving writes your value to the settings and uses it from now on.")
        else:
            self.setText(f"from the command line{given}")
            self.setToolTip(f"This run uses the value given on the command line{given}. The saved value "
                            "stays unchanged unless you change it here.")


class FormTab(QWidget):
    """A settings tab: ``load`` fills the fields, ``apply`` reads them into settings, ``changed``
    says the user edited one. Form rows are shown and hidden whole (label too), so a hidden
    note leaves no gap."""

    changed = Signal()

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.closing = False
        self.forms: list[QFormLayout] = []
        self.override_notes: dict[QWidget, OverrideNote] = {}

    def load(self, settings: Settings) -> None:
        raise NotImplementedError

    def apply(self, settings: Settings) -> Settings:
        """``settings`` with this tab's fields; SettingsError / ValueError say what is wrong."""
        raise NotImplementedError

    def close_down(self) -> None:
        """The dialog is closing: answers that arrive later are dropped."""
        self.closing = True

    # -- rows -----------------------------------------------------------------------------
    def _row_of(self, widget: QWidget) -> tuple[QFormLayout | None, int]:
        """The form row ``widget`` is in, as the field or inside the field's layout."""
        for form in self.forms:
            # PySide6's stubs type it as object; it is getLayoutPosition's (row, role) pair.
            row, _role = cast("tuple[int, QFormLayout.ItemRole]", form.getWidgetPosition(widget))
            if row >= 0:
                return form, row
            for i in range(form.rowCount()):
                item = form.itemAt(i, QFormLayout.ItemRole.FieldRole)
                inner = item.layout() if item is not None else None
                if inner is not None and inner.indexOf(widget) >= 0:
                    return form, i
        return None, -1

    def show_row(self, widget: QWidget, visible: bool) -> None:
        """Show or hide a whole form row (its label too), and its command-line note with it."""
        form, row = self._row_of(widget)
        if form is None:
            return
        form.setRowVisible(row, visible)
        note_label = self.override_notes.get(widget)
        if note_label is not None:
            self.show_row(note_label, visible)

    def row_shown(self, widget: QWidget) -> bool:
        form, row = self._row_of(widget)
        return form.isRowVisible(row) if form is not None else widget.isVisible()

    # -- this run's command line ----------------------------------------------------------
    def override_fields(self) -> list[tuple[QWidget, tuple[str, ...]]]:
        """Each field (or a widget in its row) with the settings it edits, by dotted name."""
        return []

    def show_overrides(self, service: SettingsService) -> None:
        """Put a note under every field whose value this run took from the command line."""
        overrides = service.overrides
        for widget, names in self.override_fields():
            given = tuple(n for n in names if n in overrides)
            form, row = self._row_of(widget)
            if not given or form is None:
                continue
            label = OverrideNote(given, overrides)
            form.insertRow(row + 1, "", label)
            self.override_notes[widget] = label
            if not form.isRowVisible(row):
                form.setRowVisible(row + 1, False)

    def update_overrides(self, chosen: Settings) -> None:
        for label in self.override_notes.values():
            label.update_from(chosen)
