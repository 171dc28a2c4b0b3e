"""Slotkeeper's own actions in words: one wording for `serve`'s log and the Server tab's activity list.

``journal_entry(event)`` turns an engine event that records something Slotkeeper did or saw
(saved, restored, refused and why, reused, recomputed, pruned, repaired, the server failed or crashed,
restarted, was adopted) into a ``JournalEntry``; events that are not actions (slot gauges,
progress, per-request figures) give None. Texts start lower case with what happened, name slots
as "slot N", sessions by id with their title in quotes, and numbers with thousands separators.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.views import ServerState

__all__ = ["ERROR", "INFO", "KINDS", "WARNING", "JournalEntry", "journal_entry"]

INFO, WARNING, ERROR = "info", "warning", "error"

# Every kind an entry can have, in the order a filter offers them.
KINDS = ("saved", "save failed", "restored", "refused", "reused", "not reused", "recomputed", "pruned",
         "repaired", "server", "failed", "crashed", "restarted", "warning", "notice")


@dataclass(frozen=True)
class JournalEntry:
    at: float  # unix time
    kind: str  # one of KINDS
    level: str  # INFO, WARNING, ERROR
    text: str

    def __str__(self) -> str:
        return self.text


def _title(title: str) -> str:
    return f" “{title}”" if title else ""


def _n(value: int) -> str:
    return f"{value:,}"


def journal_entry(event: ev.Event, at: float | None = None) -> JournalEntry | None:
    """The entry for ``event``, or None when it is not one of Slotkeeper's actions."""
    found = _describe(event)
    if found is None:
        return None
    kind, level, text = found
    return JournalEntry(time.time() if at is None else at, kind, level, text)


def _describe(event: ev.Event) -> tuple[str, str, str] | None:  # noqa: C901 - one case per event type
    match event:
        case ev.SessionSaved(summary=s):
            head = f"saved slot {s.slot} ({s.reason}, {s.kind})"
            if s.kind == "empty" or s.id is None:
                return "saved", INFO, f"{head}: the slot was empty, nothing to keep"
            if s.kind in ("unchanged", "contained"):
                return "saved", INFO, f"{head}: session {s.id}{_title(s.title)} holds it already"
            return "saved", INFO, (f"{head}: {_n(s.n_tokens)} tokens as session {s.id}{_title(s.title)}, "
                                   f"{human_bytes(s.size_bytes)} in {s.ms:,.0f} ms")
        case ev.SaveFailed(slot=slot, message=message):
            return "save failed", ERROR, f"saving slot {slot} failed: {message}"
        case ev.SessionRestored(summary=r) if r.already_loaded:
            return ("restored", INFO,
                    f"session {r.id}{_title(r.title)} is already in slot {r.slot}: nothing to restore")
        case ev.SessionRestored(summary=r):
            return "restored", INFO, (f"restored session {r.id}{_title(r.title)} into slot {r.slot}: "
                                      f"{_n(r.n_restored)} tokens in {r.ms:,.0f} ms")
        case ev.SessionRefused(id=sid, slot=slot, reasons=reasons):
            where = f" into slot {slot}" if slot is not None else ""
            return "refused", WARNING, f"refused to restore session {sid}{where}: {'; '.join(reasons)}"
        case ev.RestoreReused(effective=True, slot=slot, id=sid, cache_n=cache_n, n_restored=n):
            return ("reused", INFO,
                    f"slot {slot} reused {_n(cache_n)} of {_n(n)} restored tokens of session {sid}")
        case ev.RestoreReused(effective=None, id=sid, reason=reason):
            return "reused", INFO, f"restore of session {sid} {reason or 'not judged'}"
        case ev.RestoreReused(slot=slot, id=sid, cache_n=cache_n, n_restored=n, reason=reason):
            why = f": {reason}" if reason else ""
            return "not reused", WARNING, (f"restore of session {sid} into slot {slot} gave little reuse "
                                           f"({_n(cache_n)} of {_n(n)} restored tokens){why}")
        case ev.SlotRecomputed(slot=slot, session_id=sid, reason=reason):
            what = f" (session {sid})" if sid else ""
            return ("recomputed", INFO,
                    f"emptied slot {slot}{what} so llama-server computes from scratch: {reason}")
        case ev.SessionsPruned(ids=ids, bytes_freed=freed):
            return "pruned", INFO, (f"pruned {len(ids)} session{'s' if len(ids) != 1 else ''} "
                                    f"({human_bytes(freed)}) to stay under the disk budget: {', '.join(ids)}")
        case ev.FolderTidied(removed=removed):
            return "repaired", INFO, (f"repaired the sessions folder: removed {len(removed)} file"
                                      f"{'s' if len(removed) != 1 else ''} an interrupted save left "
                                      f"({', '.join(removed[:5])}{', …' if len(removed) > 5 else ''})")
        case ev.SearchIndexRepaired(added=added, dropped=dropped, completed=completed):
            parts = []
            if added:
                parts.append(f"added {_n(added)} session{'s' if added != 1 else ''} by title")
            if dropped:
                parts.append(f"dropped {_n(dropped)} deleted session{'s' if dropped != 1 else ''}")
            if completed:
                parts.append(f"indexed the full text of {_n(completed)} "
                             f"conversation{'s' if completed != 1 else ''}")
            if not parts:
                return None
            return "repaired", INFO, "repaired the search index: " + ", ".join(parts)
        case ev.ServerStateChanged():
            return _server(event)
        case ev.ServerAdopted(pid=pid):
            return ("server", INFO,
                    f"took over llama-server (pid {pid}) that an earlier Slotkeeper left running")
        case ev.EngineReady(url=url, restored=restored):
            tokens = sum(r.n_restored for r in restored)
            what = (f"; restored {len(restored)} conversation{'s' if len(restored) != 1 else ''} "
                    f"({_n(tokens)} tokens)") if restored else ""
            return "server", INFO, f"ready at {url}{what}"
        case ev.WarningRaised(message=message):
            return "warning", WARNING, message
        case ev.NoticeRaised(message=message):
            return "notice", INFO, message
        case ev.FlashAttnMeasured(model=model, value=value, running=running, words=words):
            when = ("as it runs now" if value == running
                    else "from the next start (saved conversations are carried over)")
            return ("notice", INFO, f"measured flash attention for {model}: {'on' if value else 'off'}, "
                                    f"{when}. {words}")
    return None


def _server(event: ev.ServerStateChanged) -> tuple[str, str, str] | None:
    why = f": {event.message}" if event.message else ""
    match event.state:
        case ServerState.STARTING:
            return "server", INFO, f"starting llama-server{why}"
        case ServerState.READY:
            return "server", INFO, f"llama-server is up{f' (pid {event.pid})' if event.pid else ''}"
        case ServerState.STOPPED:
            return "server", INFO, "llama-server stopped"
        case ServerState.CRASHED:
            return "crashed", ERROR, f"llama-server crashed{why}"
        case ServerState.RESTARTING:
            when = f" in {event.delay:.0f} s" if event.delay is not None else ""
            return "restarted", WARNING, f"restarting llama-server{when}{why}"
        case ServerState.FAILED:  # could not start (a bad model file, a port in use) or gave up restarting
            return "failed", ERROR, f"llama-server failed{why}"
    return None  # STOPPING: the STOPPED that follows says it
