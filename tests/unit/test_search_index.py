"""The full-text search index: kept in step with saves, deletes and prunes, repaired from the
folder when it disagrees, rebuilt when missing or damaged, private, and safe with any text."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from sessions_helpers import make_session, run_cli

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine.stored.searching import complete_partial
from slotkeeper.core.services.sessions import SessionsService, reconcile_search
from slotkeeper.core.sessions.search import SearchIndex, SearchUnavailable, fts_query
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.sessions.titles import conversation_text

RIVER = ("We walked along the river bank at dawn and talked about herons, otters and the old mill.\n"
         "The water was cold, so we kept to the path by the willows.")


@pytest.fixture
def paths(tmp_path):
    return app_paths(tmp_path / "data").ensure()


@pytest.fixture
def service(paths):
    store = SessionStore(paths.sessions_dir)
    return SessionsService(store, in_slots=frozenset, budget=lambda: 10**12,
                           search=SearchIndex(paths.search_index_file))


def index_session(service: SessionsService, sid: str, text: str, title: str = "A walk", **changes) -> None:
    """A session on disk and its text in the index, as a save leaves them."""
    sc = make_session(service.store.dir, sid, tokens=list(range(10, 90)), title=title, **changes)
    service.search_index.put(sid, sc.kv_file, sc.model_sha256, sc.title, text)


def test_a_word_from_the_middle_finds_the_conversation_with_its_passage(service):
    index_session(service, "river", RIVER)
    index_session(service, "hills", "Pack a rain jacket and a map for the hills.")
    result = service.search("otter")
    [hit] = result.hits
    assert hit.id == "river" and hit.complete
    assert ("otters", True) in hit.parts(), "the matched word is marked in the passage"
    assert "herons" in hit.plain() and "[otters]" in hit.plain()
    assert [h.id for h in service.search("RAIN  jacket").hits] == ["hills"], "every word, any case"
    assert service.search("river mountains").hits == (), "every word must be in it"
    assert service.search("   ...  ").hits == ()


def test_saves_replace_the_text_and_deletes_and_prunes_drop_it(service):
    index_session(service, "a", "first version about kayaks")
    sc = make_session(service.store.dir, "a", tokens=list(range(10, 99)))  # a newer save of the same session
    service.search_index.put("a", sc.kv_file, sc.model_sha256, sc.title, "second version about canoes")
    assert not service.search("kayaks").hits and [h.id for h in service.search("canoes").hits] == ["a"]

    index_session(service, "b", "lanterns and tents", used="2025-01-01T00:00:00Z")
    index_session(service, "c", "lanterns and stoves", used="2026-06-01T00:00:00Z")
    service.delete("a")
    assert not service.search("canoes").hits
    assert "a" not in service.search_index.entries()
    outcome = service.prune(budget=service.store.get("c").size_bytes)  # keeps only the most recent
    assert outcome.result.deleted == ["b"]
    assert [h.id for h in service.search("lanterns").hits] == ["c"]
    assert set(service.search_index.entries()) == {"c"}


def test_deletes_by_another_process_are_dropped_at_the_next_search(service, paths):
    index_session(service, "gone", "the lighthouse keeper's log")
    index_session(service, "kept", "the lighthouse at night")
    service.search("lighthouse")  # the index has seen the folder as it is
    # A process without the index (a file manager, an older CLI) removes a session's files.
    for name in os.listdir(paths.sessions_dir):
        if name.startswith("gone."):
            os.unlink(paths.sessions_dir / name)
    result = service.search("lighthouse")
    assert [h.id for h in result.hits] == ["kept"]
    assert result.repaired.dropped == 1


def test_the_cli_delete_keeps_the_index_in_step(service, paths):
    index_session(service, "cli1", "a conversation about sourdough starters")
    service.search("sourdough")
    r = run_cli(paths.data_dir, "delete", "cli1")
    assert r.returncode == 0, r.stderr
    assert "cli1" not in service.search_index.entries(), "the CLI's delete took it out of the same index"
    assert not service.search("sourdough").hits


def test_sessions_missing_from_the_index_are_found_by_title_until_completed(service):
    make_session(service.store.dir, "copied", tokens=list(range(5, 70)),
                 title="Planning the harbour festival",
                 preview="You: which boats come to the harbour festival?")
    result = service.search("harbour")
    [hit] = result.hits
    assert hit.id == "copied" and not hit.complete and result.partial == ("copied",)
    assert result.repaired.added == 1


class FakeDetokenizer:
    """Stands in for llama-server's /detokenize (the end-to-end tests use the real one)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls = 0

    def detokenize(self, tokens):
        self.calls += 1
        return self.text


def test_partial_entries_are_completed_by_a_server_of_their_model(service):
    sc = make_session(service.store.dir, "p", tokens=list(range(5, 70)), title="Untitled walk")
    make_session(service.store.dir, "other", tokens=list(range(5, 70)), title="Another model",
                 model_sha256="e" * 64)
    service.search("walk")
    http = FakeDetokenizer("<|im_start|>user\nTell me about the ferry timetable<|im_end|>")
    assert complete_partial(service, service.store, http, sc.model_sha256) == 1
    assert http.calls == 1, "only the sessions of the running model"
    [hit] = service.search("ferry").hits
    assert hit.id == "p" and hit.complete and "im_start" not in hit.plain()
    assert complete_partial(service, service.store, http, sc.model_sha256) == 0


def test_a_missing_index_is_rebuilt_from_the_folder(service, paths):
    index_session(service, "r1", RIVER, title="Dawn walk by the river")
    service.search_index.close()
    os.unlink(paths.search_index_file)
    result = service.search("river")
    assert [h.id for h in result.hits] == ["r1"] and not result.hits[0].complete
    assert paths.search_index_file.exists()


def test_an_index_deleted_while_open_is_rebuilt(service, paths):
    index_session(service, "r2", RIVER, title="Dawn walk by the river")
    service.search("river")
    os.unlink(paths.search_index_file)  # the connection is still open on the deleted file
    assert [h.id for h in service.search("river").hits] == ["r2"]
    assert paths.search_index_file.exists()


def test_a_damaged_index_is_rebuilt(paths, service):
    paths.search_index_file.write_bytes(b"this is not a database at all" * 100)
    make_session(service.store.dir, "d1", tokens=list(range(5, 70)), title="Orchard pruning")
    assert [h.id for h in service.search("orchard").hits] == ["d1"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_the_index_and_its_journal_are_private(service, paths):
    old = os.umask(0o022)  # SQLite would create its files 0644 under this umask
    try:
        index_session(service, "x", RIVER)
        service.search("river")
    finally:
        os.umask(old)
    for name in os.listdir(paths.data_dir):
        if name.startswith("search.sqlite3"):
            mode = stat.S_IMODE(os.stat(paths.data_dir / name).st_mode)
            assert mode == 0o600, f"{name} is {oct(mode)}"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_a_loose_mode_is_tightened_and_a_link_is_refused(paths, tmp_path):
    SearchIndex(paths.search_index_file).put("a", "a.1.kv", "m", "t", "x")
    os.chmod(paths.search_index_file, 0o644)
    index = SearchIndex(paths.search_index_file)
    assert len(index) == 1 and stat.S_IMODE(os.stat(paths.search_index_file).st_mode) == 0o600
    index.close()
    os.unlink(paths.search_index_file)
    os.symlink(tmp_path / "elsewhere.db", paths.search_index_file)
    with pytest.raises(SearchUnavailable):
        SearchIndex(paths.search_index_file).search("x")
    assert not (tmp_path / "elsewhere.db").exists()


HOSTILE = [
    'he said "stop" NEAR the (bridge) AND OR NOT * ^ -- ;',
    "'); DROP TABLE docs; --",
    "title:secret body:* {col1 col2}: x",
    "\x02fake mark\x03 and \x00 nul \x1b[31m escape",
    "emoji 🦦 otters, ümlauts Ürsprung, 中文 对话, RTL \u202e reversed",
    "x" * 100_000,
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_stored_and_searched_as_text(service, text):
    index_session(service, "h", text + " marmalade")
    assert [h.id for h in service.search("marmalade").hits] == ["h"]
    assert [h.id for h in service.search(text).hits] in (["h"], []), "typed text is never query syntax"
    assert len(service.search_index) == 1, "nothing was dropped or injected"
    for hit in service.search("marmalade").hits:
        assert "\x00" not in hit.plain() and "\x1b" not in hit.plain()
        assert all(piece == "marmalade" for piece, matched in hit.parts() if matched), "no forged marks"


def test_queries_quote_every_word():
    assert fts_query('a "b" NEAR(c)') == '"a" "b" "NEAR" "c"*'
    assert fts_query("*** ---") is None
    assert fts_query("Ürsprung 🦦 中文") == '"Ürsprung" "中文"*'


def test_unicode_words_match_without_diacritics(service):
    index_session(service, "u", "Café au lait in Zürich")
    assert [h.id for h in service.search("cafe zurich").hits] == ["u"]


def test_conversation_text_leaves_out_the_template():
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhere do otters sleep?<|im_end|>\n"
            "<|im_start|>assistant\nIn holts.<|im_end|>")
    assert conversation_text(text) == "Be brief.\nWhere do otters sleep?\nIn holts."
    assert conversation_text("plain text <s> only") == "plain text only"


def test_reconcile_keeps_a_version_newer_than_the_listing(service, paths):
    """A save that lands between a listing and the reconcile is not undone by it."""
    index_session(service, "n", "old text about gulls")
    listing = service.store.listing()  # taken before the next save
    sc = make_session(service.store.dir, "n2", tokens=list(range(10, 95)))
    service.search_index.put("n2", sc.kv_file, sc.model_sha256, sc.title, "new text about terns")
    done = reconcile_search(service.search_index, service.store, listing)
    assert done.dropped == 0 and [h.id for h in service.search("terns").hits] == ["n2"]


def test_cli_search_prints_the_passage_and_json(service, paths):
    index_session(service, "c1", RIVER, title="Dawn walk")
    index_session(service, "c2", "Notes on tide tables and the harbour", title="Tides")
    r = run_cli(paths.data_dir, "search", "willows")
    assert r.returncode == 0, r.stderr
    assert "c1" in r.stdout and "[willows]" in r.stdout and "c2" not in r.stdout
    r = run_cli(paths.data_dir, "search", "tide", "harbour", "--json")
    data = json.loads(r.stdout)
    assert [d["id"] for d in data] == ["c2"] and data[0]["matches"] == ["tide", "harbour"]
    assert data[0]["complete"] is True and "harbour" in data[0]["passage"]
    r = run_cli(paths.data_dir, "search", "zeppelin")
    assert r.returncode == 1 and "No saved conversation mentions" in r.stdout and not r.stderr
    r = run_cli(paths.data_dir, "search", '"); DROP', "--json")
    assert r.returncode == 1 and json.loads(r.stdout) == [] and "Traceback" not in r.stderr


def test_a_saves_search_text_is_its_transcript_whole_or_the_detokenized_text_without_markers():
    from slotkeeper.core.engine.stored.searching import Described
    from slotkeeper.core.sessions.transcripts import Transcript

    class Server:
        def detokenize(self, tokens):
            return ("<|im_start|>user\nwhere do herons nest?<|im_end|>\n"
                    "<|im_start|>assistant\nin tall trees by the water<|im_end|>\n")

    described = Described(Server())  # type: ignore[arg-type]
    described([1, 2, 3])
    assert described.text == "where do herons nest?\nin tall trees by the water"  # the markers left out

    # A transcript is what was said, as it was said: a message that quotes template markers is
    # kept whole, not cut where a marker would have begun a turn.
    quoted = "In Zephyr's template, <|user|> starts a turn and <|assistant|> starts the reply."
    transcript = Transcript.from_json({"version": 1, "kind": "chat", "messages": [
        {"role": "user", "content": "How does Zephyr's template mark turns?"},
        {"role": "assistant", "content": quoted}]})
    described = Described(Server(), transcript)  # type: ignore[arg-type]
    title, _preview = described([1, 2, 3])
    assert described.text == "How does Zephyr's template mark turns?\n" + quoted
    assert title == "How does Zephyr's template mark turns?"
