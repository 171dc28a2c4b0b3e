"""The sessions service is where the search index is kept in step with the folder: a save's text,
deletes and prunes, and the repair from the folder."""

from __future__ import annotations

import pytest
from sessions_helpers import make_session

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.services.sessions import SessionsService
from slotkeeper.core.sessions.search import SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.store import SessionStore


@pytest.fixture
def service(tmp_path):
    paths = app_paths(tmp_path / "data").ensure()
    return SessionsService(SessionStore(paths.sessions_dir), in_slots=frozenset, budget=lambda: 10**12,
                           search=SearchIndex(paths.search_index_file))


def test_a_saves_text_goes_in_whole_or_by_title_and_preview_until_a_server_can_say(service):
    whole = make_session(service.store.dir, "aaaaaaaaaaaa", title="Herons", preview="where they nest")
    service.index_text(whole, "where do herons nest?\nin tall trees by the water")
    [hit] = service.search("tall trees").hits
    assert hit.id == whole.id and hit.complete

    # The search text goes in as given: a transcript quoting template markers is not cut at them.
    quoting = make_session(service.store.dir, "cccccccccccc", title="Markers", preview="turns")
    service.index_text(quoting, "In Zephyr's template, <|user|> starts a turn and <|assistant|> the reply.")
    assert [h.id for h in service.search("zephyr").hits] == [quoting.id]

    partial = make_session(service.store.dir, "bbbbbbbbbbbb", title="Otters", preview="by the old mill")
    service.index_text(partial, None)  # the server could not detokenize
    [hit] = service.search("mill").hits
    assert hit.id == partial.id and not hit.complete
    assert service.search_index.partial(partial.model_sha256) == [(partial.id, partial.kv_file)]

    service.delete(partial.id)
    assert not service.search("otters").hits


def test_the_repair_from_the_folder_is_the_services_and_needs_an_index(service, tmp_path):
    sc = make_session(service.store.dir, "aaaaaaaaaaaa", title="Kayaks")
    service.search_index.put("cccccccccccc", "cccccccccccc.00000000.kv", sc.model_sha256, "gone", "gone")
    repaired = service.repair_search(service.store.listing())
    assert (repaired.added, repaired.dropped) == (1, 1)
    assert [h.id for h in service.search("kayaks").hits] == [sc.id]
    bare = SessionsService(service.store, in_slots=frozenset, budget=lambda: 10**12)
    bare.index_text(sc, "no index: nothing happens")
    with pytest.raises(SearchUnavailable):
        bare.repair_search()


def test_the_sessions_service_is_the_search_indexs_one_writer():
    """Only core/services/sessions.py calls the search index's writing methods; the engine's side
    (engine/searching.py, engine/library.py) reads it and hands what it found to the service."""
    import re
    from pathlib import Path

    app = Path(__file__).resolve().parents[2] / "app" / "slotkeeper"
    writes = re.compile(r"\.(put|complete|remove|reconcile|set_folder_stamp)\(")
    writers = []
    for path in app.rglob("*.py"):
        src = path.read_text()
        if "search" not in src or path.name == "search.py":
            continue
        for line in src.splitlines():
            if writes.search(line) and re.search(r"search(_index)?\.", line):
                writers.append(str(path.relative_to(app)))
    assert sorted(set(writers)) == ["core/services/sessions.py"], writers
