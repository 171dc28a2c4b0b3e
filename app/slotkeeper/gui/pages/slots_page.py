"""The Slots tab: a gauge per slot (prompt from cache, processed, tokens held) under a legend."""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from slotkeeper.core import events as ev
from slotkeeper.core.sessions.entries import Listing
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.gauges import CACHE_COLOUR, HELD_COLOUR, PROCESSED_COLOUR, SlotsPanel


def swatch(colour: QColor, text: str) -> QLabel:
    return QLabel(f'<span style="color:{colour.name()}">■</span> {text}')


class SlotsPage(QWidget):
    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        layout = QVBoxLayout(self)
        # The legend explains gauges: with no server there are none, and no legend.
        self.legend = QWidget()
        legend = QHBoxLayout(self.legend)
        legend.setContentsMargins(0, 0, 0, 0)
        legend.addWidget(swatch(CACHE_COLOUR, "prompt from cache"))
        legend.addWidget(swatch(PROCESSED_COLOUR, "prompt processed"))
        legend.addWidget(swatch(HELD_COLOUR, "tokens held in the slot"))
        legend.addStretch(1)
        layout.addWidget(self.legend)
        # More conversations than slots: the requests that wait their turn for one.
        self.waiting_label = QLabel()
        self.waiting_label.setVisible(False)
        layout.addWidget(self.waiting_label)
        self.slots_panel = SlotsPanel()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self.slots_panel)
        layout.addWidget(scroll, 1)

        # A stopped server has no slots: the bridge clears them on the state change.
        bridge.on(ev.ServerStateChanged, self._show_slots)
        bridge.on(ev.SlotsChanged, self._show_slots)
        bridge.sessionsListed.connect(self._on_listing)
        self._show_slots()
        if bridge.listing is not None:
            self._on_listing(bridge.listing, bridge.facts)

    def _show_slots(self, *_args) -> None:
        self.slots_panel.set_views(self.bridge.slots)
        self.legend.setVisible(bool(self.bridge.slots))
        n = self.bridge.waiting if self.bridge.slots else 0
        self.waiting_label.setText(f"{n} request{'s' if n != 1 else ''} waiting for a slot (each "
                                   "conversation leaves its slot saved and comes back restored)")
        self.waiting_label.setVisible(n > 0)

    def _on_listing(self, listing: Listing, _facts) -> None:
        """A slot holding a saved conversation shows its title."""
        self.slots_panel.set_titles({e.id: e.sidecar.title for e in listing.sessions if e.sidecar})
