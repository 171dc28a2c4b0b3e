"""The engine's bookkeeping of the saved conversations (``engine.library``), without a server."""

from __future__ import annotations

import asyncio

import pytest
from sessions_helpers import make_session

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.stored import library as library_module
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import EventBus, SearchIndexRepaired, SessionsPruned
from slotkeeper.core.sessions.index_file import load_index


def settle(loop: EngineLoop) -> None:
    """Until the loop has handed its background writes over and the bookkeeping thread has done them."""
    loop.call(asyncio.sleep(0.05))
    loop.bookkeeping.submit(lambda: None).result(30)  # first in, first out: the writes are done


@pytest.fixture
def running(tmp_path, monkeypatch):
    monkeypatch.setattr(library_module, "INDEX_WRITE_DELAY_SECONDS", 0.0)
    paths = app_paths(tmp_path / "data").ensure()
    for i in range(3):
        make_session(paths.sessions_dir, f"{i:012x}", size=1000, used=f"2026-01-0{i + 1}T00:00:00Z")
    loop = EngineLoop()
    loop.start_thread()
    lib = Library(paths, loop, EventBus(), budget_bytes=10**9)
    try:
        yield paths, loop, lib
    finally:
        loop.close()
        lib.close()


def test_a_deleted_or_pruned_session_is_forgotten_once_and_the_index_on_disk_follows(running, monkeypatch):
    paths, loop, lib = running
    lib.store.listing()
    forgotten: list[str] = []
    real = lib.index.forget
    monkeypatch.setattr(lib.index, "forget", lambda sid: forgotten.append(sid) or real(sid))
    pruned: list[SessionsPruned] = []
    lib.events.subscribe(pruned.append, SessionsPruned)

    lib.sessions.delete("000000000002")  # a face's delete (a Qt pool thread in the app)
    lib.budget_bytes = 1500
    loop.call(lib.prune())  # after a save: the least recently used goes
    settle(loop)  # the index on disk is written a moment later

    assert sorted(forgotten) == ["000000000000", "000000000002"]  # each once: by the store
    assert [p.ids for p in pruned] == [("000000000000",)]
    on_disk = load_index(paths.sessions_index_file, paths.sessions_dir)
    assert sorted(sid for sid, _ in on_disk.items()) == ["000000000001"]


def test_a_saved_conversations_text_goes_into_the_search_through_the_service(running):
    paths, loop, lib = running
    sc = lib.store.get("000000000001").sidecar

    async def save_text() -> None:
        lib.text_saved(sc, "User: where do herons nest?\nAssistant: in tall trees near water.")

    loop.call(save_text())
    settle(loop)
    [hit] = lib.sessions.search("herons").hits
    assert hit.id == sc.id and hit.complete


def test_a_search_that_repairs_the_index_first_says_so_as_an_event(running):
    paths, loop, lib = running
    loop.call(asyncio.sleep(0))  # the search index made
    lib.sessions.repair_search()
    repaired: list[SearchIndexRepaired] = []
    lib.events.subscribe(repaired.append, SearchIndexRepaired)
    lib.find("nothing said")
    settle(loop)
    assert repaired == []  # the folder did not change: nothing to repair, nothing said
    make_session(paths.sessions_dir, "00000000000a", size=1000, used="2026-01-09T00:00:00Z")  # copied in
    result = lib.find("nothing said")
    settle(loop)
    assert result.repaired.added == 1
    assert [(r.added, r.dropped) for r in repaired] == [(1, 0)]
