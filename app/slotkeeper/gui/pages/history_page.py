"""The History tab: how much of each request's prompt came from the cache, over time."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.history_plot import HistoryPlot


class HistoryPage(QWidget):
    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        layout = QVBoxLayout(self)
        self.history_summary = QLabel()
        layout.addWidget(self.history_summary)
        self.history_plot = HistoryPlot()
        layout.addWidget(self.history_plot, 1)
        self.history_summary.setText(self.history_plot.summary())

        bridge.historyLoaded.connect(self._on_history)
        bridge.load_history()

    def _on_history(self, records: list) -> None:
        self.history_plot.set_records(records)
        self.history_summary.setText(self.history_plot.summary())
