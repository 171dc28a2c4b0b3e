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
    from slotkeeper.core.model.modelgen import write_model

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
    assert "SmolLM2" in d.demo_button.toolTip()
    d.use_demo()
    assert d.chosen == DEMO_MODEL


def test_not_now(qtbot, jobs, tmp_path):
    d = FirstRunDialog(jobs, search_dirs=[])
    qtbot.addWidget(d)
    d.reject()
    assert d.chosen is None


def test_two_files_of_one_model_are_told_apart(qtbot, jobs, tmp_path):
    from pathlib import Path

    from slotkeeper.core.model.discovery import FoundModel

    d = FirstRunDialog(jobs, search_dirs=[("Empty", tmp_path / "none")])
    qtbot.addWidget(d)
    qtbot.waitUntil(lambda: d.searching == 0, timeout=10_000)
    name = "Smollm2 135M 8k Lc100K Mix1 Ep2"
    d.searching += 1
    d._found([FoundModel(Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf"), 98_362_432, "llama", name, "LM Studio",
                         None)])
    d.searching += 1  # a second search finds the other quantization
    d._found([FoundModel(Path("/m/SmolLM2-135M-Instruct.Q8_0.gguf"), 144_000_000, "llama", name, "LM Studio",
                         None)])
    labels = sorted(d.tree.topLevelItem(i).text(0) for i in range(d.tree.topLevelItemCount()))
    assert labels == [f"{name} (SmolLM2-135M-Instruct.Q4_1.gguf)",
                      f"{name} (SmolLM2-135M-Instruct.Q8_0.gguf)"]
