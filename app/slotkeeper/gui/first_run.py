"""First run with no model chosen: offer the GGUF files already on disk, a picker, or the demo."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model.demo_model import DEMO_NOTICE
from slotkeeper.gui.jobs import JobRunner, describe_error
from slotkeeper.gui.widgets import top_level_items

log = logging.getLogger(__name__)

PATH_ROLE = Qt.ItemDataRole.UserRole + 1
MODEL_ROLE = Qt.ItemDataRole.UserRole + 2  # the FoundModel


def download_model(parent: QWidget | None, **kwargs) -> Path | None:
    """The curated list; the downloaded file, or None (imported when asked for: it is rarely used)."""
    from slotkeeper.gui.download_dialog import DownloadDialog

    return DownloadDialog.get_model(parent, **kwargs)


class FirstRunDialog(QDialog):
    """``chosen`` is a model path, ``DEMO_MODEL``, or None (the user chose later)."""

    def __init__(self, jobs: JobRunner, parent: QWidget | None = None,
                 search_dirs: list[tuple[str, Path]] | None = None, welcome: bool = True,
                 download: Callable[..., Path | None] | None = None) -> None:
        """``welcome``: the first run's dialog; False for "Choose model…" later on. ``download``
        shows the curated list and returns the downloaded file (default: the download dialog)."""
        super().__init__(parent)
        self.jobs = jobs
        self._download = download or download_model
        self.chosen: str | None = None
        self.searching = 0
        self._closing = False
        self.setWindowTitle("Welcome to Slotkeeper" if welcome else "Choose a model")

        intro = QLabel(
            "<b>Choose the model llama-server should run.</b><br>"
            + ("Slotkeeper saves each conversation's KV cache when a reply ends and restores it after "
               "a restart, so long conversations pick up without re-reading their prompt. "
               if welcome else "")
            + "The server starts on the model you choose."
        )
        intro.setWordWrap(True)
        self.status = QLabel("Looking for GGUF models in the usual places…")
        self.status.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Model", "Architecture", "Size", "Found in", "File"])
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setMinimumHeight(200)
        header = self.tree.header()
        header.setStretchLastSection(True)
        for col in range(4):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemSelectionChanged.connect(self._selection_changed)
        self.tree.itemDoubleClicked.connect(lambda *_: self.use_selected())

        self.folder_button = QPushButton("Search a folder…")
        self.folder_button.clicked.connect(self._search_folder)
        self.file_button = QPushButton("Choose a file…")
        self.file_button.clicked.connect(self._choose_file)
        self.download_button = QPushButton("Download a model…")
        self.download_button.setToolTip("A few well-known models, small to large, with what each needs; "
                                        "downloaded into the Hugging Face cache other tools share")
        self.download_button.clicked.connect(self.download)
        self.demo_button = QPushButton("Use the starter model")
        self.demo_button.setToolTip(DEMO_NOTICE)
        self.demo_button.clicked.connect(self.use_demo)
        # Said once: the button's tooltip carries the longer notice.
        self.demo_note = demo_note = QLabel("The starter model (SmolLM2 135M Instruct, 98 MB) is small and "
                                            "quick: good for trying Slotkeeper, not for real work.")
        demo_note.setWordWrap(True)
        self.later_button = QPushButton("Not now" if welcome else "Cancel")
        self.later_button.clicked.connect(self.reject)
        self.use_button = QPushButton("Use this model")
        self.use_button.setDefault(True)
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self.use_selected)

        left = QHBoxLayout()
        left.addWidget(self.folder_button)
        left.addWidget(self.file_button)
        left.addWidget(self.download_button)
        left.addStretch(1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.demo_button)
        bottom.addStretch(1)
        bottom.addWidget(self.later_button)
        bottom.addWidget(self.use_button)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.status)
        layout.addWidget(self.tree, 1)
        layout.addLayout(left)
        layout.addWidget(demo_note)
        layout.addLayout(bottom)
        self.resize(820, 460)
        self.search(search_dirs)

    # -- searching ------------------------------------------------------------------------
    def search(self, dirs: list[tuple[str, Path]] | None) -> None:
        from slotkeeper.core.model import discovery

        def find() -> list:
            where = dirs if dirs is not None else discovery.default_search_dirs()
            return discovery.find_models(where)

        self.searching += 1
        self.jobs.run(find, on_success=self._found, on_failure=self._search_failed,
                      description="Looking for models")

    def _name_apart(self) -> None:
        """Two files of one model (two quantizations) carry one GGUF name: say what tells them apart."""
        from slotkeeper.core.model.discovery import distinct_names

        items = top_level_items(self.tree)
        names = distinct_names(item.data(0, MODEL_ROLE) for item in items)
        for item in items:
            item.setText(0, names[item.data(0, MODEL_ROLE).path])

    def _found(self, models: list) -> None:
        if self._closing:
            return
        self.searching -= 1
        known = {item.data(0, PATH_ROLE) for item in top_level_items(self.tree)}
        for m in models:
            if str(m.path) in known:
                continue
            item = QTreeWidgetItem([m.display_name, m.arch or "?", human_bytes(m.size_bytes), m.source,
                                    str(m.path)])
            item.setData(0, PATH_ROLE, str(m.path))
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(4, str(m.path))
            if not m.usable:
                item.setDisabled(True)
                for col in range(5):
                    item.setToolTip(col, m.error or "cannot be used")
            item.setData(0, MODEL_ROLE, m)
            self.tree.addTopLevelItem(item)
        self._name_apart()
        n = sum(1 for item in top_level_items(self.tree) if not item.isDisabled())
        if self.searching:
            return
        if n:
            self.status.setText(f"Found {n} model{'s' if n != 1 else ''}. Pick one, or choose another file.")
            if not self.tree.selectedItems():
                for item in top_level_items(self.tree):
                    if not item.isDisabled():
                        self.tree.setCurrentItem(item)
                        break
        else:
            self.status.setText("No GGUF models found in the Hugging Face cache, llama.cpp's cache or "
                                "LM Studio's folders. Search another folder, choose a file, or try the "
                                "starter model.")

    def _search_failed(self, exc: BaseException) -> None:
        if self._closing:
            return
        self.searching -= 1
        self.status.setText(f"Searching for models failed: {describe_error(exc)}")

    def _search_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Search a folder for GGUF models", str(Path.home()))
        if folder:
            self.status.setText(f"Searching {folder}…")
            self.search([(folder, Path(folder))])

    # -- choosing -------------------------------------------------------------------------
    def _selection_changed(self) -> None:
        items = self.tree.selectedItems()
        self.use_button.setEnabled(bool(items) and not items[0].isDisabled())

    def selected_path(self) -> str | None:
        items = self.tree.selectedItems()
        if not items or items[0].isDisabled():
            return None
        return items[0].data(0, PATH_ROLE)

    def use_selected(self) -> None:
        path = self.selected_path()
        if path:
            self.chosen = path
            self.accept()

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.chosen = path
            self.accept()

    def download(self) -> None:
        path = self._download(self, jobs=self.jobs)
        if path is not None:
            self.chosen = str(path)
            self.accept()

    def use_demo(self) -> None:
        self.chosen = DEMO_MODEL
        self.accept()

    def done(self, result: int) -> None:
        self._closing = True
        super().done(result)
