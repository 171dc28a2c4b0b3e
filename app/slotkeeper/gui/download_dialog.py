"""Get a model when there is none: the curated list, downloaded into the Hugging Face cache.

    path = DownloadDialog.get_model(parent)        # a Path, or None if the user gave up

or keep the dialog and listen to ``downloaded(str)``. The download runs on a background job
(gui/jobs.py); its progress comes back through a queued signal, so only the GUI thread touches
widgets. Cancel keeps what was received: downloading the same model again continues it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model import families
from slotkeeper.core.model.hub_download import (
    DownloadCancelled,
    DownloadError,
    DownloadProgress,
    HubDownloader,
    cached_file,
)
from slotkeeper.core.model.model_catalog import CATALOG, DEFAULT_CTX, CuratedModel
from slotkeeper.gui.jobs import JobRunner, describe_error
from slotkeeper.gui.theme import error_style
from slotkeeper.gui.widgets import show_bytes, top_level_items

log = logging.getLogger(__name__)

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1


def machine_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # the figure is a hint; the list works without it
        return None


class DownloadDialog(QDialog):
    """The curated models with download size, memory and restore behaviour; one download at a time.

    ``state`` is "idle", "downloading", "cancelling", "failed" or "done"; ``path`` the file once
    downloaded. ``downloaded`` is emitted with the path before the dialog accepts.
    """

    downloaded = Signal(str)
    _progress = Signal(object)  # DownloadProgress, from the worker thread (queued to ours)

    def __init__(self, parent: QWidget | None = None, *, jobs: JobRunner | None = None,
                 catalog: Sequence[CuratedModel] = CATALOG, downloader: HubDownloader | None = None,
                 memory_bytes: int | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download a model")
        self.path: Path | None = None
        self.state = "idle"
        self._own_jobs = jobs is None
        self.jobs = jobs if jobs is not None else JobRunner(self)
        self.downloader = downloader or HubDownloader()
        self._cancel: threading.Event | None = None
        self._close_when_stopped = False
        self._memory = memory_bytes if memory_bytes is not None else machine_memory()
        self._progress.connect(self._on_progress, Qt.ConnectionType.QueuedConnection)

        intro = QLabel(
            "<b>Download a model to get started.</b><br>"
            "Models come from Hugging Face and go into its shared cache "
            f"(<code>{self.downloader.cache_dir}</code>), where llama.cpp and other tools find them too. "
            "A download you cancel or that breaks off continues where it stopped; the file's checksum is "
            "checked before it is used."
        )
        intro.setWordWrap(True)
        intro.setTextFormat(Qt.TextFormat.RichText)

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Model", "Download", f"Memory ({DEFAULT_CTX:,} tokens)", "Restores",
                                   "Repository"])
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setMinimumHeight(200)
        header = self.tree.header()
        header.setStretchLastSection(True)
        for col in range(4):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        for entry in catalog:
            self.tree.addTopLevelItem(self._item(entry))
        self.tree.itemSelectionChanged.connect(self._selection_changed)
        self.tree.itemDoubleClicked.connect(lambda *_: self.start_download())

        self.details = QLabel()
        self.details.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.download_button = QPushButton("Download")
        self.download_button.setDefault(True)
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Close")
        self.cancel_button.clicked.connect(self._cancel_clicked)

        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.download_button)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.details)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.resize(820, 460)
        first = self.tree.topLevelItem(0)
        if first is not None:
            self.tree.setCurrentItem(first)

    # -- the list -------------------------------------------------------------------------
    def _item(self, entry: CuratedModel) -> QTreeWidgetItem:
        need = entry.memory_need()
        memory = human_bytes(need.total)
        if entry.restore_mode == families.RESTORE_NEEDS_SWA_FULL:
            memory += f" ({human_bytes(need.total_swa_full)} with --swa-full)"
        size = f"~{human_bytes(entry.download_bytes)}"
        if cached_file(entry.repo_id, entry.filename, cache_dir=self.downloader.cache_dir) is not None:
            size += " (downloaded)"
        item = QTreeWidgetItem([entry.title, size, memory,
                                families.describe_restore_mode(entry.restore_mode), entry.repo_id])
        item.setData(0, ENTRY_ROLE, entry)
        tip = (f"{entry.summary}\n{families.restore_mode_explanation(entry.restore_mode)}\n"
               f"{entry.repo_id}/{entry.filename}")
        if self._memory and need.total > self._memory:
            item.setForeground(2, Qt.GlobalColor.darkRed)
            tip += f"\nNeeds more memory than this computer has ({human_bytes(self._memory)})."
        for col in range(5):
            item.setToolTip(col, tip)
        return item

    def selected_entry(self) -> CuratedModel | None:
        item = self.tree.currentItem()
        return item.data(0, ENTRY_ROLE) if item is not None else None

    def select(self, model_id: str) -> None:
        for item in top_level_items(self.tree):
            if item.data(0, ENTRY_ROLE).id == model_id:
                self.tree.setCurrentItem(item)
                return
        raise KeyError(model_id)

    def _selection_changed(self) -> None:
        entry = self.selected_entry()
        self.download_button.setEnabled(entry is not None and self.state not in ("downloading", "cancelling"))
        if entry is None:
            self.details.clear()
            return
        need = entry.memory_need()
        text = (f"<b>{entry.title}</b> ({entry.quant}) — {entry.summary}<br>"
                f"Needs about {human_bytes(need.total)}: {human_bytes(need.weights)} of weights and "
                f"{human_bytes(need.kv_default)} of KV cache at {need.n_ctx:,} tokens. "
                f"{families.restore_mode_explanation(entry.restore_mode)}")
        if entry.restore_mode == families.RESTORE_NEEDS_SWA_FULL:
            text += f" With --swa-full the KV cache is {human_bytes(need.kv_swa_full)}."
        if self._memory and need.total > self._memory:
            text += f"<br><b>This is more than this computer's memory ({human_bytes(self._memory)}).</b>"
        self.details.setText(text)

    # -- downloading ----------------------------------------------------------------------
    @Slot()
    def start_download(self) -> None:
        entry = self.selected_entry()
        if entry is None or self.state in ("downloading", "cancelling"):
            return
        self._set_state("downloading")
        self._show_status(f"Asking Hugging Face about {entry.filename}…")
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)  # busy until the size is known
        cancel = threading.Event()
        self._cancel = cancel
        self.jobs.run(self.downloader.download, entry.repo_id, entry.filename,
                      on_progress=self._progress.emit, cancel=cancel,
                      on_success=self._finished, on_failure=self._failed,
                      description=f"download {entry.repo_id}/{entry.filename}")

    @Slot(object)
    def _on_progress(self, p: DownloadProgress) -> None:
        if self.state not in ("downloading", "cancelling"):
            return
        if p.total:
            show_bytes(self.progress, p.done, p.total)
        if self.state == "cancelling":
            return
        total = human_bytes(p.total) if p.total else "?"
        if p.phase == "checking":
            self._show_status(f"Checking the part downloaded before: {human_bytes(p.done)} of {total}")
        elif p.phase == "downloading":
            again = f" (continued from {human_bytes(p.resumed_from)})" if p.resumed_from else ""
            self._show_status(f"Downloading: {human_bytes(p.done)} of {total}{again}")

    def _finished(self, path: Path) -> None:
        self.path = Path(path)
        self._set_state("done")
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self._show_status(f"Downloaded and verified: {self.path}")
        self.downloaded.emit(str(self.path))
        if self._close_when_stopped:
            super().reject()
        else:
            self.accept()

    def _failed(self, exc: BaseException) -> None:
        self._cancel = None
        if self._close_when_stopped:
            self._set_state("idle")
            super().reject()
            return
        self.progress.setVisible(False)
        if isinstance(exc, DownloadCancelled):
            self._set_state("idle")
            self._show_status(str(exc)[0].upper() + str(exc)[1:] + ".")
            return
        if not isinstance(exc, DownloadError):
            log.error("download failed", exc_info=(type(exc), exc, exc.__traceback__))
        self._set_state("failed")
        self._show_status(f"The download failed: {describe_error(exc)}", error=True)

    def cancel_download(self) -> None:
        if self.state == "downloading" and self._cancel is not None:
            self._cancel.set()
            self._set_state("cancelling")
            self._show_status("Cancelling…")

    def _cancel_clicked(self) -> None:
        if self.state in ("downloading", "cancelling"):
            self.cancel_download()
        else:
            self.reject()

    def reject(self) -> None:
        """Closing while a download runs cancels it and closes once it has stopped."""
        if self.state in ("downloading", "cancelling"):
            self._close_when_stopped = True
            self.cancel_download()
            return
        super().reject()

    def done(self, result: int) -> None:
        super().done(result)
        if self._own_jobs:
            self.jobs.shutdown()

    # -- helpers --------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        self.state = state
        busy = state in ("downloading", "cancelling")
        self.tree.setEnabled(not busy)
        self.download_button.setEnabled(not busy and self.selected_entry() is not None)
        self.download_button.setText("Try again" if state == "failed" else "Download")
        self.cancel_button.setText("Cancel download" if busy else "Close")
        self.cancel_button.setEnabled(state != "cancelling")

    def _show_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(error_style() if error else "")
        self.status.setText(text)

    @classmethod
    def get_model(cls, parent: QWidget | None = None, **kwargs) -> Path | None:
        """Show the dialog modally; the downloaded file's path, or None."""
        dialog = cls(parent, **kwargs)
        try:
            dialog.exec()
            return dialog.path
        finally:
            dialog.deleteLater()
