"""Getting a model from the places a person without one looks: the first-run dialog and the Model
menu open the curated list, and the file downloaded (from a local server speaking the Hub's API)
becomes the chosen model."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from fake_hub import FakeHub, isolate_huggingface_hub
from slotkeeper.core.model.hub_download import HubDownloader
from slotkeeper.core.model.model_catalog import CuratedModel
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.gui.download_dialog import DownloadDialog
from slotkeeper.gui.first_run import FirstRunDialog
from slotkeeper.gui.jobs import JobRunner

REPO, FILE = "test-org/tiny-llama-GGUF", "tiny-llama-Q8_0.gguf"


@pytest.fixture
def hub_model(tmp_path, monkeypatch):
    """A curated entry served by a local Hub, and a download function that shows the real dialog
    for it and presses Download, as a person would."""
    data = write_model(tmp_path / "gen" / "m.gguf", "llama").read_bytes()
    isolate_huggingface_hub(monkeypatch, tmp_path)
    tiny = CuratedModel(id="tiny", title="Tiny llama", repo_id=REPO, filename=FILE, quant="Q8_0",
                        download_bytes=len(data), arch="llama", n_layers=4, n_embd=128, n_head=4,
                        n_head_kv=2, head_dim=32, context_length=8192)
    shown: list[DownloadDialog] = []
    with FakeHub() as hub:
        hub.add_file(REPO, FILE, data)
        downloader = HubDownloader(cache_dir=tmp_path / "hf-cache", endpoint=hub.endpoint, token=False,
                                   retry_delay=0)

        def press_download() -> None:
            dialog = QApplication.activeModalWidget()
            if not isinstance(dialog, DownloadDialog):
                QTimer.singleShot(20, press_download)
                return
            shown.append(dialog)
            dialog.select("tiny")
            dialog.download_button.click()

        def download(parent, **kwargs) -> Path | None:
            QTimer.singleShot(0, press_download)
            return DownloadDialog.get_model(parent, catalog=[tiny], downloader=downloader, **kwargs)

        yield download, data, shown


def test_the_first_run_dialog_downloads_a_model_and_chooses_it(qtbot, tmp_path, hub_model):
    download, data, shown = hub_model
    jobs = JobRunner()
    dialog = FirstRunDialog(jobs, search_dirs=[("empty", tmp_path / "nothing-here")], download=download)
    qtbot.addWidget(dialog)
    try:
        assert dialog.download_button.isVisibleTo(dialog)
        dialog.download_button.click()  # runs the download dialog's own loop until it closes
        assert shown, "the curated list was shown"
        assert dialog.chosen is not None and Path(dialog.chosen).read_bytes() == data
        assert dialog.result() == FirstRunDialog.DialogCode.Accepted
    finally:
        jobs.shutdown()


def test_the_model_menu_downloads_a_model_and_chooses_it(qtbot, hub_model, monkeypatch):
    from gui_helpers import make_bridge

    from slotkeeper.core.settings import Settings
    from slotkeeper.gui.model_menu import ModelMenu

    download, data, _shown = hub_model
    bridge, engine, _ = make_bridge(qtbot, Settings())
    menu = ModelMenu(bridge)
    monkeypatch.setattr(menu, "download_model", download)
    try:
        with qtbot.waitSignal(menu.modelChosen, timeout=30_000) as chosen:
            menu.download_action.trigger()
        assert Path(chosen.args[0]).read_bytes() == data
        assert "snapshots" in Path(chosen.args[0]).parts  # in the Hugging Face cache layout
    finally:
        menu.deleteLater()
        bridge.close()
        bridge.deleteLater()
        engine.close(save=False)
