"""What the settings tabs share: notes under fields, and form rows that hide as a whole."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFormLayout, QLabel, QWidget

from slotkeeper.core.settings import Settings
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.widgets import WrappedLabel

WARNING_STYLE = "color: #b45309;"
ERROR_STYLE = "color: #b91c1c;"

def note(text: str = "") -> QLabel:
    label = WrappedLabel(text)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


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
            row, _role = form.getWidgetPosition(widget)
            if row >= 0:
                return form, row
            for i in range(form.rowCount()):
                item = form.itemAt(i, QFormLayout.ItemRole.FieldRole)
                if item is not None and item.layout() is not None and item.layout().indexOf(widget) >= 0:
                    return form, i
        return None, -1

    def show_row(self, widget: QWidget, visible: bool) -> None:
        """Show or hide a whole form row (its label too)."""
        form, row = self._row_of(widget)
        if form is None:
            return
        form.setRowVisible(row, visible)

    def row_shown(self, widget: QWidget) -> bool:
        form, row = self._row_of(widget)
        return form.isRowVisible(row) if form is not None else widget.isVisible()
