"""The first-run model chooser."""

from __future__ import annotations

import pytest

from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.gui.first_run import FirstRunDialog
from slotkeeper.gui.jobs import JobRunner


@pytest.fixture
def jobs():
    runner = JobRunner()
    yield runner
    runner.shutdown()
    runner.deleteLater()


@pytest.fixture
def models(tmp_path):
    from slotkeeper.core.modelgen import write_model

    folder = tmp_path / "models"
    write_model(folder / "tiny-llama.gguf", "llama")
    (folder / "broken.gguf").write_bytes(b"GGUF but not really")
    return folder


def test_offers_found_models_and_picks_one(qtbot, jobs, models):
    d = FirstRunDialog(jobs, search_dirs=[("My folder", models)])
    qtbot.addWidget(d)
    qtbot.waitUntil(lambda: d.tree.topLevelItemCount() == 2, timeout=10_000)
    qtbot.waitUntil(lambda: d.searching == 0)
    items = {d.tree.topLevelItem(i).text(4): d.tree.topLevelItem(i) for i in range(2)}
    good = items[str(models / "tiny-llama.gguf")]
    bad = items[str(models / "broken.gguf")]
    assert good.text(1) == "llama" and good.text(3) == "My folder"
    assert bad.isDisabled() and bad.toolTip(0)
    assert "Found 1 model" in d.status.text()
    assert d.selected_path() == str(models / "tiny-llama.gguf")  # the first usable one is selected
    assert d.use_button.isEnabled()
    d.use_selected()
    assert d.chosen == str(models / "tiny-llama.gguf")
    assert d.result() == FirstRunDialog.DialogCode.Accepted


def test_nothing_found_offers_the_demo(qtbot, jobs, tmp_path):
    d = FirstRunDialog(jobs, search_dirs=[("empty", tmp_path / "nothing here")])
    qtbot.addWidget(d)
    qtbot.waitUntil(lambda: "No GGUF models found" in d.status.text(), timeout=10_000)
    assert not d.use_button.isEnabled()
    assert "gibberish" in d.demo_button.toolTip()
    d.use_demo()
    assert d.chosen == DEMO_MODEL


def test_not_now(qtbot, jobs, tmp_path):
    d = FirstRunDialog(jobs, search_dirs=[])
    qtbot.addWidget(d)
    d.reject()
    assert d.chosen is None
