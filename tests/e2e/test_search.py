"""Searching saved conversations by content, against the real llama-server: the text comes from the
server's own detokenizer, a word from the middle of one conversation finds it, and the hit resumes
warm through the existing Resume path."""

from __future__ import annotations

import os

import pytest
from e2e_helpers import EventLog, chat, converse, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

CONVERSATIONS = {
    "boats": ["Let us plan a sailing trip along the coast next summer with the children.",
              "We could stop at the harbour where the kingfisher nests under the old stone quay.",
              "What food keeps well on a small boat for three days without a fridge?"],
    "bread": ["I want to bake bread at home this weekend for the first time ever.",
              "My neighbour gave me a sourdough starter in a jam jar yesterday evening.",
              "How long should the dough rest before it goes into the hot oven?"],
    "stars": ["Tell me how to find the north star on a clear night in the countryside.",
              "Last winter we saw the great nebula in Orion through binoculars from the hill.",
              "Which constellations are easiest to spot for a beginner in spring?"],
}


def test_save_three_find_one_by_a_middle_word_and_resume_it_warm(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, parallel=1, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        histories = {}
        for n, (name, turns) in enumerate(CONVERSATIONS.items(), start=1):
            histories[name], _ = converse(url, turns, max_tokens=8)
            # One slot: the next conversation saves this one first (or the idle save does).
            wait_until(lambda n=n: len(engine.library.store.sessions()) == n, what=f"save {n}")
        wait_until(lambda: len(engine.library.search) == 3, what="the three conversations in the index")

        result = engine.sessions.search("kingfisher")  # said in the middle of the first conversation
        [hit] = result.hits
        assert hit.complete, "indexed with the server's own detokenized text"
        assert ("kingfisher", True) in hit.parts() and "quay" in hit.plain()
        assert "harbour" in hit.plain(), "the passage shows the words around the match"
        entry = engine.library.store.get(hit.id)
        assert "sailing trip" in entry.sidecar.title
        assert [h.id for h in engine.sessions.search("sourdough jar").hits] != [hit.id]
        assert engine.sessions.search("nebula orion").hits[0].id not in (hit.id,)

        # Resume the hit (the Resume path the app and the tray use), then continue it.
        summary = engine.restore(hit.id)
        assert summary is not None and summary.n_restored > 0 and not summary.already_loaded
        follow = histories["boats"] + [{"role": "user", "content": "And a good knot for the mooring line?"}]
        t = chat(url, follow, max_tokens=4)["timings"]
        assert t["cache_n"] >= 0.9 * summary.n_restored, t
        [reuse] = wait_until(lambda: events.of(ev.RestoreReused), what="the reuse verdict")
        assert reuse.id == hit.id and reuse.effective is True
    finally:
        engine.close(save=False)
    assert not events.of(ev.SaveFailed)


def test_a_deleted_index_is_rebuilt_and_completed_by_the_running_server(llama_model, server_bin, port):
    """Without a server, a rebuild has titles only; the first launch on the model fills in the text."""
    engine = make_engine(llama_model, server_bin, port, parallel=1, ctx=4096)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        converse(engine.base_url, CONVERSATIONS["stars"], max_tokens=8)
        wait_until(lambda: len(engine.library.store.sessions()) == 1, what="the save")
    finally:
        engine.close()
    os.unlink(engine.paths.search_index_file)

    engine2 = make_engine(llama_model, server_bin, port, parallel=1, ctx=4096)
    events = EventLog(engine2)
    [title_only] = engine2.sessions.search("north star").hits  # no server yet: by title
    assert not title_only.complete
    assert engine2.sessions.search("nebula").hits == ()
    engine2.start()
    try:
        assert engine2.wait_ready(60) is ServerState.READY
        wait_until(lambda: any(e.completed for e in events.of(ev.SearchIndexRepaired)), what="completion")
        [hit] = engine2.sessions.search("nebula").hits
        assert hit.complete and hit.id == title_only.id
    finally:
        engine2.close(save=False)
