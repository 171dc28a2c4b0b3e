"""GUI fixtures: a real Engine (no server started), a bridge closed after each test.

Nothing here starts llama-server; tests drive the bridge by emitting events on the engine's
bus from other threads, as the engine's own threads do (see gui_helpers.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.settings import Settings


@pytest.fixture
def engine() -> Engine:
    eng = Engine(app_paths(), Settings())
    yield eng
    eng.close(save=False)


@pytest.fixture
def bridge(qtbot, engine):
    from slotkeeper.gui.bridge import EngineBridge

    b = EngineBridge(engine)
    yield b
    b.close()
    assert b._observer is None
    b.deleteLater()


@pytest.fixture
def sessions_dir(engine) -> Path:
    return engine.paths.sessions_dir


@pytest.fixture(autouse=True)
def no_leftover_threads():
    before = {t.ident for t in threading.enumerate()}
    yield
    # Python threads a test started (watchdog observers, event emitters) must be gone. Qt's
    # pool threads show up as _DummyThread entries that never leave the list; they are
    # waited for by JobRunner.shutdown().
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
            and not isinstance(t, threading._DummyThread)]
    assert not left, f"threads outlived the test: {[t.name for t in left]}"
