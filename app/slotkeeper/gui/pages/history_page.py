"""The History tab: how much of each request's prompt came from the cache, over time."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from slotkeeper.core import events as ev
from slotkeeper.core.history import LaunchRecord
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.history_plot import HistoryPlot


class HistoryPage(QWidget):
    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._launches: list[LaunchRecord] = []  # as they came (the plot merges those of one moment)
        layout = QVBoxLayout(self)
        self.history_summary = QLabel()
        layout.addWidget(self.history_summary)
        self.history_plot = HistoryPlot()
        layout.addWidget(self.history_plot, 1)
        self._on_history(bridge.history)

        bridge.historyLoaded.connect(self._on_history)
        bridge.on(ev.EngineReady, self._on_launch)
        self._on_launch()
        bridge.load_history()
        # Launches of earlier runs too (the history file keeps them): a relaunch keeps the markers.
        bridge.jobs.run(bridge.engine.launches, on_success=self._add_launches,
                        description="Reading the request history")

    def _on_history(self, records: list) -> None:
        self.history_plot.set_records(records)
        # The plot says "No requests yet" itself; the line above it has nothing to add then.
        self.history_summary.setText(self.history_plot.summary() if records else "")
        self.history_summary.setVisible(bool(records))

    def _on_launch(self, event: ev.EngineReady | None = None) -> None:
        """This run's launch (and relaunches after a crash) as a marker among the bars."""
        started = self.bridge.snapshot.started_at
        if started:
            slots = tuple(r.slot for r in event.restored) if event is not None else ()
            self._add_launches([LaunchRecord(started, slots)])

    def _add_launches(self, launches: list[LaunchRecord]) -> None:
        self._launches.extend(launches)
        self.history_plot.set_launches(self._launches)
