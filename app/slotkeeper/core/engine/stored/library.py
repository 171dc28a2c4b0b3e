"""The saved conversations as the engine keeps them: the sessions store (the one writer of the
folder and its index), the search index of what was said, the index kept on disk for the next
process, pruning to the budget, and filling in the search text the running model can give.

Loop-owned bookkeeping; the blocking work runs on the engine loop's executors. Nothing here
calls back into the engine: what it needs comes in as parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.basics.tokens import TokenArray
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.slots.board import PendingReuse
from slotkeeper.core.engine.stored.searching import complete_partial
from slotkeeper.core.events import (
    ActivityChanged,
    EventBus,
    FolderTidied,
    NoticeRaised,
    RestoreReused,
    SearchIndexRepaired,
    SessionsPruned,
    WarningRaised,
)
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.services.sessions import SearchResult, SessionsService
from slotkeeper.core.services.transcript_check import PromptReader, TranscriptCheck, check_transcript
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.in_slots import clear_in_slots, publish_in_slots
from slotkeeper.core.sessions.index import SessionsIndex
from slotkeeper.core.sessions.lineage import common_prefix_len
from slotkeeper.core.sessions.migration import carry_over_folder, needs_carrying_over
from slotkeeper.core.sessions.naming import INCOMING_PREFIX, MANIFEST_SUFFIX
from slotkeeper.core.sessions.pieces import PieceError
from slotkeeper.core.sessions.points import DEFAULT_POINT_SPACING_TOKENS
from slotkeeper.core.sessions.restoring import record_reuse
from slotkeeper.core.sessions.saving import SaveOutcome
from slotkeeper.core.sessions.search import SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.sidecar import RestorePoint, Sidecar
from slotkeeper.core.sessions.staging import cache_state, cached_state, in_memory
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, most_recent_first
from slotkeeper.core.views import Activity

log = logging.getLogger(__name__)

# The sessions index on disk is a cache for the next process (which repairs it by stat): written
# at most this often while sessions change, and when the engine closes. With thousands of
# sessions a write is megabytes of JSON.
INDEX_WRITE_DELAY_SECONDS = 30.0


PREWARM_POINTS = 2  # restore points of the latest conversation assembled ahead of a launch
PREWARM_MAX = 4  # conversations assembled ahead of a launch's restores, at most


def prewarm_count(parallel: int, restore_on_start: int | None) -> int:
    """How many conversations a launch assembles ahead: as many as it restores (one per slot, at
    most the setting's limit), at most PREWARM_MAX."""
    return min(parallel, restore_on_start if restore_on_start is not None else parallel, PREWARM_MAX)
SAVED_PREFIX_HITS = 2  # saved sessions routing compares for one request


@dataclass(frozen=True)
class SavedPrefix:
    """A saved session as routing sees it: the tokens it shares with a request, and its points."""

    session_id: str
    shared: int  # tokens of the request it holds (common prefix)
    n_tokens: int
    points: tuple[RestorePoint, ...]
    size_bytes: int


class Library:
    def __init__(self, paths: AppPaths, loop: EngineLoop, events: EventBus, budget_bytes: int) -> None:
        """``budget_bytes``: the disk budget (changed with the settings). The engine tells it which
        sessions are in the slots (``set_in_slots``)."""
        self.loop = loop
        self.paths = paths
        self._in_slots_file: frozenset[str] | None = None  # what the in-slots file says
        self.point_spacing = DEFAULT_POINT_SPACING_TOKENS  # earlier restore points' spacing (a setting)
        self.events = events
        self.store = SessionStore(paths.sessions_dir, index_file=paths.sessions_index_file)
        # What was said in every saved conversation (searched by the faces through the service).
        self.search = SearchIndex(paths.search_index_file)
        # The store's index forgets a deleted or pruned session itself; the index on disk is a cache
        # that the next process repairs by stat, written after saves and when the engine closes.
        self.sessions = SessionsService(self.store, search=self.search, budget_bytes=budget_bytes)
        self._swept: asyncio.Future[Any] | None = None
        self._index_dirty = False
        self._completing: asyncio.Task[None] | None = None  # filling in the search index's partial entries
        self._prewarm: asyncio.Task[None] | None = None  # whole states for the launch's restores

    @property
    def budget_bytes(self) -> int:
        return self.sessions.budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self.sessions.budget_bytes = value

    @property
    def index(self) -> SessionsIndex:
        """The sessions index (the store keeps it true and is its one writer; routing and lineage read it)."""
        return self.store.index

    # -- the folder, once -------------------------------------------------------------------
    def begin_sweep(self) -> None:
        """Tidy the folder and bring the index up to date, in the background (a launch is loading)."""
        if self._swept is None:
            self._swept = asyncio.ensure_future(self.loop.run_io(self._open_folder))

    async def sweep_once(self) -> None:
        """Tidy the sessions folder and bring the sessions index up to date, once."""
        self.begin_sweep()
        assert self._swept is not None
        try:
            await asyncio.shield(self._swept)
        except OSError as exc:
            log.warning("could not tidy the sessions folder: %s", exc)

    def _open_folder(self) -> None:  # an I/O thread: what it finds is posted to the loop
        removed = self.store.sweep()  # brings the sessions index up to the folder (by stat) as it goes
        if removed:
            self.loop.call_soon(self.events.emit, FolderTidied(tuple(removed)))
        self._carry_over()
        self.store.index_tokens()  # token lists of sessions new or changed since it was kept
        self.store.save_index()
        try:
            repaired = self.sessions.repair_search(self.store.listing())
            if repaired:
                self.loop.call_soon(self.events.emit, SearchIndexRepaired(repaired.added, repaired.dropped))
        except (sqlite3.Error, SearchUnavailable) as exc:
            self.loop.call_soon(self.events.emit, WarningRaised(
                f"searching saved conversations by content is not available: {exc}"))

    def _carry_over(self) -> None:  # an I/O thread
        """Conversations saved whole (the layout before pieces) kept as pieces, once, with progress."""
        if not any(needs_carrying_over(e) for e in self.store.sessions()):
            return

        def progress(done: int, total: int, what: str) -> None:
            activity = Activity("carrying over", what, done, total) if done < total else Activity()
            self.loop.call_soon(self.events.emit, ActivityChanged(activity))

        result = carry_over_folder(self.store, progress)
        if result.done:
            n = result.done
            before, after = human_bytes(result.bytes_before), human_bytes(result.bytes_written)
            self.loop.call_soon(self.events.emit, NoticeRaised(
                f"kept {n} saved conversation{'s' if n != 1 else ''} as shared pieces ({before} of whole "
                f"files now take {after})"))
        for session_id, why in result.skipped or ():
            self.loop.call_soon(self.events.emit, WarningRaised(
                f"saved conversation {session_id} stays as it was saved: {why}"))

    # -- what the slots hold, and the settings -----------------------------------------------
    def set_in_slots(self, in_slots: frozenset[str], launched: bool) -> None:
        """The sessions in the slots now (on the loop, as it changes): the sessions service keeps
        them from deletion and pruning, and the in-slots file says so to other processes."""
        self.sessions.set_in_slots(in_slots)  # before anyone may delete what the slots hold
        if launched and in_slots != self._in_slots_file:
            self._in_slots_file = in_slots
            self.loop.in_background(publish_in_slots, self.paths.in_slots_file, in_slots,
                                    what="recording the sessions in slots")

    def slots_emptied(self) -> None:
        """The server stopped: no slot holds anything now."""
        self._in_slots_file = None
        self.loop.in_background(clear_in_slots, self.paths.in_slots_file, what="clearing the in-slots file")

    async def settings_changed(self, budget_bytes: int, point_spacing: int) -> None:
        """The disk budget and the restore points' spacing the settings name now; a smaller budget
        prunes at once."""
        changed = budget_bytes != self.budget_bytes
        self.budget_bytes, self.point_spacing = budget_bytes, point_spacing
        if changed:
            await self.prune()

    async def check_transcript(self, session_id: str, facts: ServerFacts | None,
                               reader: PromptReader) -> TranscriptCheck | None:
        """Whether a saved conversation's transcript says what its KV file holds, read by ``reader``
        (the front door's prompts). None: it has none, or no server of its model runs (``facts``),
        which alone can render and tokenize it. SessionNotFound, TranscriptError (a file that is
        not a transcript)."""
        entry = await self.loop.run_io(self.store.get, session_id)
        sc = entry.sidecar
        if facts is None or sc is None or facts.model_sha256 != sc.model_sha256:
            return None
        transcript = await self.loop.run_io(self.store.transcript, entry)
        if transcript is None:
            return None
        return await check_transcript(transcript, await self.loop.run_io(self.store.tokens, entry), reader)

    # -- whole states ready for the launch's restores ---------------------------------------
    def begin_prewarm(self, folder: Path, model_path: str, n: int) -> None:
        """A launch begins (on the loop): while llama-server loads the model, the whole files of the
        ``n`` most recently used conversations of that model (and the last PREWARM_POINTS restore
        points of the latest, where its next turn may go on from) are assembled into the staging
        folder's cache (``staging.cache_state``), so the launch's restores read them as they are. After a
        restart of the machine the cache in memory is empty; assembling takes ~6 ms per MB of a
        transposed V."""
        async def run() -> None:
            await self.sweep_once()  # the folder carried over and tidied first
            done = await self.loop.run_io(self._assemble_recent, folder, model_path, n)
            if done:
                log.info("assembled %d state(s) for the launch's restores", done)

        if self._prewarm is not None:
            self._prewarm.cancel()
        self._prewarm = self.loop.spawn(run(), "assembling the conversations the launch restores")

    async def prewarmed(self) -> None:
        """Until the launch's assembling is done (or has failed: the restores assemble themselves)."""
        task = self._prewarm
        if task is not None and not task.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    def _assemble_recent(self, folder: Path, model_path: str, n: int) -> int:  # an I/O thread
        if n <= 0 or not in_memory(folder):
            return 0
        entries = most_recent_first(e for e in self.store.listing().sessions
                                    if e.sidecar is not None and not e.problems
                                    and e.sidecar.model_path == model_path and e.sidecar.content_hash
                                    and e.sidecar.kv_file.endswith(MANIFEST_SUFFIX))
        states: list[tuple[str, str, str]] = []  # (session, its state's file, that state's hash)
        for i, entry in enumerate(entries[:n]):
            sc = entry.sidecar
            assert sc is not None
            states.append((sc.id, sc.kv_file, sc.content_hash))
            if i == 0:  # the latest conversation's next turn may roll back to its last points
                last = sorted(sc.points, key=lambda p: p.n_tokens, reverse=True)[:PREWARM_POINTS]
                states += [(sc.id, p.kv_file, p.content_hash) for p in last if p.content_hash]
        done = 0
        for session_id, kv_file, content_hash in states:
            if not kv_file.endswith(MANIFEST_SUFFIX) or cached_state(folder, content_hash):
                continue
            staged = folder / f"{INCOMING_PREFIX}assembled-{secrets.token_hex(6)}.kv"
            try:
                self.store.states.materialize(kv_file, staged)
            except (OSError, PieceError) as exc:  # the restore says it, as it always has
                log.info("could not assemble %s before its restore: %s", session_id, exc)
                continue
            done += cache_state(staged, content_hash)
        return done

    async def tidy(self) -> None:
        """Remove what an interrupted save left (the caller holds every slot's lock)."""
        removed = await self.loop.run_io(self.store.sweep)
        if removed:
            self.events.emit(FolderTidied(tuple(removed)))

    def find(self, text: str, limit: int = 20) -> SearchResult:  # any thread (a job)
        """Saved conversations by what was said in them (``SessionsService.search``); a repair of
        the search index that it needed first is told as an event."""
        result = self.sessions.search(text, limit)
        if result.repaired:
            added, dropped = result.repaired.added, result.repaired.dropped
            self.loop.call_soon(self.events.emit, SearchIndexRepaired(added, dropped))
        return result

    # -- the index on disk ------------------------------------------------------------------
    def saved(self, outcome: SaveOutcome) -> None:
        if outcome.sidecar is not None:  # the save told the store's index; keep it on disk too
            self._changed()

    def text_saved(self, sidecar: Sidecar, text: str | None) -> None:
        """A save changed this session: its text goes into the search index (in the background)."""
        self.loop.in_background(self.sessions.index_text, sidecar, text,
                                what="indexing the conversation's text")

    def _changed(self) -> None:
        """Keep the index on disk too, a moment after the last change (one write for a burst)."""
        if self._index_dirty:
            return
        self._index_dirty = True

        async def write_later() -> None:
            await asyncio.sleep(INDEX_WRITE_DELAY_SECONDS)
            self._index_dirty = False
            self.loop.in_background(self.store.save_index, what="saving the sessions index")

        self.loop.spawn(write_later(), "saving the sessions index")

    async def keep_index(self) -> None:
        """Write the index for the next process now (the engine closes)."""
        try:
            await self.loop.run_io(self.store.save_index)
        except OSError as exc:  # a cache: the next process rebuilds what it lacks
            log.info("could not keep the sessions index: %s", exc)

    # -- the budget -------------------------------------------------------------------------
    async def prune(self) -> None:
        try:
            outcome = await self.loop.run_io(self.sessions.prune, quick=True)
        except (OSError, ValueError) as exc:
            self.events.emit(WarningRaised(f"could not keep the saved sessions under the budget: {exc}"))
            return
        result = outcome.result  # each deletion was forgotten by the store's index
        if result and result.deleted:
            self._changed()
            freed = sum(c.size_bytes for c in outcome.plan.delete if c.id in result.deleted)
            self.events.emit(SessionsPruned(tuple(result.deleted), freed))

    # -- restores ---------------------------------------------------------------------------
    def reuse_judged(self, slot: int, pending: PendingReuse, cache_n: int, n_prompt: int,
                     effective: bool | None, reason: str | None) -> None:
        """What the first request after a restore reused, or why it was not judged: recorded in the
        session's sidecar (in the background, in order with the restore's record) and told."""
        self.loop.in_background(record_reuse, self.store, pending.session_id, cache_n, n_prompt, effective,
                                reason, what="recording the restore's reuse")
        self.events.emit(RestoreReused(slot, pending.session_id, cache_n, n_prompt, pending.n_restored,
                                       effective, reason))

    # -- routing's questions ----------------------------------------------------------------
    async def saved_prefixes(self, tokens: TokenArray, facts: ServerFacts | None,
                             beat: int = 0) -> AsyncIterator[SavedPrefix]:
        """The saved sessions sharing the longest prefixes with ``tokens`` (longest first), healthy
        and compatible with the running server (``facts``), with their restore points, each read
        only when the caller asks for it. None at once (nothing read from disk) when no session can
        share more than ``beat`` tokens."""
        if facts is None:
            return
        for hit in self.index.longest_prefix(tokens, facts.model_sha256, limit=SAVED_PREFIX_HITS):
            if min(len(tokens), hit.at_most) <= beat:
                break
            try:
                entry = await self.loop.run_io(self.store.get, hit.session_id)
                if entry.problems or entry.sidecar is None or check_compatible(entry.sidecar, facts):
                    continue
                saved = await self.loop.run_io(self.store.tokens, entry)
            except (OSError, SessionNotFound, ValueError):
                self.store.unroute(hit.session_id)  # gone or changed behind our back
                continue
            sc = entry.sidecar
            yield SavedPrefix(hit.session_id, common_prefix_len(tokens, saved), len(saved), sc.points,
                              sc.state_bytes or sc.size_bytes)  # what a restore reads

    # -- the search index ---------------------------------------------------------------------
    def complete_search(self, facts: ServerFacts | None, http: Callable[[], LlamaClient],
                        still_serving: Callable[[], bool]) -> None:
        """Fill in the full text of the running model's sessions the search index holds only by
        title (on the loop; once at a time; a no-op while no server is ready)."""
        if facts is None or (self._completing is not None and not self._completing.done()):
            return
        self._completing = self.loop.spawn(self._complete_search(facts.model_sha256, http(), still_serving),
                                           "completing the search index")

    async def _complete_search(self, model_sha256: str, http: LlamaClient,
                               still_serving: Callable[[], bool]) -> None:
        try:
            done = await self.loop.run_io(complete_partial, self.sessions, self.store, http, model_sha256,
                                          still_serving)
        except (sqlite3.Error, SearchUnavailable) as exc:
            log.warning("could not complete the search index: %s", exc)
            return
        if done:
            self.events.emit(SearchIndexRepaired(completed=done))

    def close(self) -> None:
        self.search.close()
