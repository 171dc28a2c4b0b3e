"""Slotkeeper's own actions in words: the same entry for `serve`'s log and the activity list."""

from __future__ import annotations

import logging

import pytest

from slotkeeper.cli.run import ServeLog
from slotkeeper.core import events as ev
from slotkeeper.core.journal import ERROR, INFO, KINDS, WARNING, journal_entry
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import Activity, RestoreSummary, SaveSummary, SlotView

SAVED = ev.SessionSaved(SaveSummary(0, "new", "abc123", "idle", 1234, 41.0, 5 * 1024**2, "Otters at dawn"))
ACTIONS = [
    (SAVED, "saved", INFO,
     "saved slot 0 (idle, new): 1,234 tokens as session abc123 “Otters at dawn”, 5.0 MiB"),
    (ev.SessionSaved(SaveSummary(1, "empty", None, "shutdown", 0, 1.0, 0, "")), "saved", INFO,
     "saved slot 1 (shutdown, empty): the slot was empty"),
    (ev.SaveFailed(2, "the disk is full"), "save failed", ERROR, "saving slot 2 failed: the disk is full"),
    (ev.SessionRestored(RestoreSummary("abc123", 0, 900, 12.0, "Otters")), "restored", INFO,
     "restored session abc123 “Otters” into slot 0: 900 tokens in 12 ms"),
    (ev.SessionRefused("abc123", 1, ("made with flash attention on; the server runs with it off",)),
     "refused", WARNING, "refused to restore session abc123 into slot 1: made with flash attention on"),
    (ev.RestoreReused(0, "abc123", 880, 900, 900, True), "reused", INFO,
     "slot 0 reused 880 of 900 restored tokens of session abc123"),
    (ev.RestoreReused(0, "abc123", 0, 50, 900, None, "not judged: the next request was another conversation"),
     "reused", INFO, "restore of session abc123 not judged: the next request was another conversation"),
    (ev.RestoreReused(0, "abc123", 3, 900, 900, False, "the prompt was re-processed"), "not reused", WARNING,
     "gave little reuse (3 of 900 restored tokens): the prompt was re-processed"),
    (ev.SlotRecomputed(1, "abc123", "the request rolls back inside a restored state"), "recomputed", INFO,
     "emptied slot 1 (session abc123) so llama-server computes from scratch: the request rolls back"),
    (ev.SessionsPruned(("a1", "b2"), 3 * 1024**3), "pruned", INFO,
     "pruned 2 sessions (3.0 GiB) to stay under the disk budget: a1, b2"),
    (ev.FolderTidied(("incoming-1.kv",)), "repaired", INFO,
     "repaired the sessions folder: removed 1 file an interrupted save left (incoming-1.kv)"),
    (ev.SearchIndexRepaired(added=2, dropped=1), "repaired", INFO,
     "repaired the search index: added 2 sessions by title, dropped 1 deleted session"),
    (ev.SearchIndexRepaired(completed=3), "repaired", INFO,
     "repaired the search index: indexed the full text of 3 conversations"),
    (ev.ServerStateChanged(ServerState.CRASHED, "llama-server exited (code -9)"), "crashed", ERROR,
     "llama-server crashed: llama-server exited (code -9)"),
    (ev.ServerStateChanged(ServerState.RESTARTING, "attempt 1 of 5", delay=2.0), "restarted", WARNING,
     "restarting llama-server in 2 s: attempt 1 of 5"),
    (ev.ServerStateChanged(ServerState.FAILED, "gave up"), "failed", ERROR, "llama-server failed: gave up"),
    # a file that is not a model never ran: a failure, not a crash
    (ev.ServerStateChanged(ServerState.FAILED, "m.gguf is not a GGUF model file"), "failed", ERROR,
     "llama-server failed: m.gguf is not a GGUF model file"),
    (ev.ServerStateChanged(ServerState.STOPPED, "stopped"), "server", INFO, "llama-server stopped"),
    (ev.ServerAdopted(4242), "server", INFO, "took over llama-server (pid 4242)"),
    (ev.EngineReady("http://127.0.0.1:8080", (RestoreSummary("a", 0, 100, 1.0, "t"),)), "server", INFO,
     "ready at http://127.0.0.1:8080; restored 1 conversation (100 tokens)"),
    (ev.WarningRaised("the model has a sliding window"), "warning", WARNING,
     "the model has a sliding window"),
    (ev.NoticeRaised("saved 2 conversations"), "notice", INFO, "saved 2 conversations"),
]


@pytest.mark.parametrize(("event", "kind", "level", "text"), ACTIONS)
def test_every_action_has_an_entry_in_words(event, kind, level, text):
    entry = journal_entry(event, at=5.0)
    assert entry is not None and entry.at == 5.0
    assert (entry.kind, entry.level) == (kind, level) and kind in KINDS
    assert entry.text.startswith(text) or text in entry.text, entry.text


@pytest.mark.parametrize("event", [ev.SlotsChanged((SlotView(0),)), ev.ActivityChanged(Activity("saving")),
                                   ev.RequestDone(0, 1, 10, 5, 5, 1.0, 0.0), ev.ServerLoading(1.0, "loading"),
                                   ev.SearchIndexRepaired()])
def test_what_is_not_an_action_has_no_entry(event):
    assert journal_entry(event) is None


def test_serve_logs_every_action_at_its_level(caplog):
    serve_log = ServeLog()
    with caplog.at_level(logging.INFO):
        for event, *_ in ACTIONS:
            serve_log.on_event(event)
    texts = [r.getMessage() for r in caplog.records]
    for event, _kind, level, _text in ACTIONS:
        if isinstance(event, ev.EngineReady) or getattr(event, "state", None) is ServerState.FAILED:
            continue  # serve prints these itself (stdout's "ready URL"; the failure on exit)
        entry = journal_entry(event)
        [record] = [r for r in caplog.records if r.getMessage() == entry.text]
        assert record.levelname.lower() == level
    assert any(t.startswith("saved slot 0 (idle, new)") for t in texts), "the wording scripts rely on"
    assert sum("llama-server crashed" in t for t in texts) == 1
