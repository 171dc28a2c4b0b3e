"""Restoring a saved session into a slot (on request, on demand, and at launch), and erasing a slot
so a request is computed from scratch (restore points are ``slots.points``'s).
One slot's actions run under its lock; the slot's record (``slots.SlotBoard``) says what it holds
afterwards, for routing, autosave and the faces at once.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time

from slotkeeper.core.engine.desk.planning import LaunchCandidate, plan_launch_restores
from slotkeeper.core.engine.door.prompts import PromptTokens
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import SLOT_ACTION_TIMEOUT_SECONDS, ServerLink
from slotkeeper.core.engine.slots.board import UNKNOWN, SlotBoard
from slotkeeper.core.engine.slots.rates import Rates
from slotkeeper.core.engine.slots.saves import SlotSaves
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import (
    ActivityChanged,
    EventBus,
    SessionRefused,
    SessionRestored,
    SlotRecomputed,
)
from slotkeeper.core.model import families
from slotkeeper.core.model.families import EXACT_ONLY_MODES
from slotkeeper.core.server.client import LlamaClient, RestoreResult, ServerError, ServerUnavailable
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.kvfile import KvFileError, read_tokens
from slotkeeper.core.sessions.lineage import DEFAULT_TAIL_SLACK, common_prefix_len
from slotkeeper.core.sessions.pieces import PieceError
from slotkeeper.core.sessions.restoring import RestoreRefused, carried_over, check_restorable, record_restore
from slotkeeper.core.sessions.sidecar import parse_utc
from slotkeeper.core.sessions.staging import cached_state, ensure_staging
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, unlink_quietly
from slotkeeper.core.sessions.transcripts import Transcript, TranscriptError
from slotkeeper.core.views import Activity, RestoreSummary

log = logging.getLogger(__name__)

class SlotActions:
    def __init__(self, board: SlotBoard, link: ServerLink, library: Library, saves: SlotSaves,
                 loop: EngineLoop, events: EventBus, rates: Rates, prompts: PromptTokens) -> None:
        """``rates``: each restore's measured rate goes there (the front desk's break-even);
        ``prompts``: what a slot holds, learnt when it is not known yet."""
        self.board = board
        self.link = link
        self.library = library
        self.saves = saves
        self.loop = loop
        self.events = events
        self.rates = rates
        self.prompts = prompts

    async def restore(self, session_id: str, slot: int | None = None) -> RestoreSummary | None:
        """Restore a saved session into ``slot`` (or a free one). Returns a summary, or None when
        it was refused (a SessionRefused event says why)."""
        facts = self.link.facts
        if facts is None:
            raise EngineError("the server is not ready")
        holder = self.board.holder(session_id)
        if (holder is not None and (slot is None or slot == holder)
                and await self._still_holds(holder, session_id)):
            # Already in a slot (possibly with newer, unsaved turns): restoring would go back in time.
            entry = await self.loop.run_io(self.library.store.get, session_id)
            summary = RestoreSummary(session_id, holder, 0, 0.0, entry.sidecar.title if entry.sidecar else "",
                                     already_loaded=True)
            self.events.emit(SessionRestored(summary))
            return summary
        if slot is None:
            # The slot that held it went on with another conversation: bring it back there.
            slot = holder if holder is not None else self._free_slot(facts.n_parallel)
        if not (0 <= slot < facts.n_parallel):
            raise EngineError(f"slot {slot} does not exist (the server has {facts.n_parallel})")
        async with self.board.lock(slot):
            if self.board[slot].watch.changed and await self.saves.save_locked(slot, "before resume") is None:
                self.events.emit(SessionRefused(session_id, slot, (
                    f"slot {slot} holds a conversation that could not be saved first; nothing was replaced",
                    )))
                return None
            return await self.restore_locked(session_id, slot, facts)

    async def read_back(self, http: LlamaClient, slot: int, kv_file: str,
                        content_hash: str = "") -> tuple[RestoreResult, list[int]]:
        """llama-server restores ``slot`` from the state ``kv_file`` names (``content_hash``: its
        manifest's): the whole file kept in the staging folder's cache when there is one, else
        assembled there for the time it reads it. What it said, and the tokens of the state it read
        (PieceError: a piece is missing or damaged; FileNotFoundError: ``kv_file`` is gone, a save
        superseded it; ServerError: llama-server refused it)."""
        store = self.library.store
        folder = self.link.staging
        await self.loop.run_io(ensure_staging, folder)
        cached = await self.loop.run_io(cached_state, folder, content_hash)
        if cached is not None:
            try:
                tokens = (await self.loop.run_io(read_tokens, folder / cached)).tokens
                result = await self.loop.run_io(http.restore_slot, slot, cached, SLOT_ACTION_TIMEOUT_SECONDS)
                return result, tokens
            except (ServerError, OSError, KvFileError) as exc:  # gone meanwhile: assembled as below
                log.debug("the cached state of %s did not restore (%s); assembling it", kv_file, exc)
        name = f"restore-{secrets.token_hex(8)}.kv"
        try:
            await self.loop.run_io(store.states.materialize, kv_file, folder / name)
            tokens = (await self.loop.run_io(read_tokens, folder / name)).tokens
            return await self.loop.run_io(http.restore_slot, slot, name, SLOT_ACTION_TIMEOUT_SECONDS), tokens
        finally:
            await self.loop.run_io(unlink_quietly, folder / name)

    async def _still_holds(self, slot: int, session_id: str) -> bool:
        """Whether ``slot`` still holds the conversation of ``session_id``, the session it was last
        saved or restored as: yes unless it went on with another one since (its view is detached)
        and its tokens no longer start with the session's (allowing the re-rendered last reply, as
        lineage does). When that is not known, yes: a Resume never risks going back in time."""
        if not self.board[slot].view.detached:
            return True
        await self.board.learn_lagging(self.prompts.learn)
        c = self.board[slot].content
        if c.held >= UNKNOWN or not len(c.tokens):
            return True
        store = self.library.store
        try:
            entry = await self.loop.run_io(store.get, session_id)
            saved = await self.loop.run_io(store.tokens, entry)
        except (SessionNotFound, OSError, ValueError):
            return True
        return common_prefix_len(c.tokens, saved) >= len(saved) - DEFAULT_TAIL_SLACK

    async def restore_locked(self, session_id: str, slot: int, facts: ServerFacts,
                             point: str | None = None) -> RestoreSummary | None:
        """Restore ``session_id`` into ``slot`` (its lock is held): checked first (compatibility and
        integrity), then read by llama-server. ``point``: one of its restore points (by KV file) is
        restored instead of the whole conversation. None when it was refused."""
        store = self.library.store
        self.board.acting(slot, "restoring")
        http = self.link.client()
        try:
            try:
                await self.loop.run_io(store.ensure_folder)
            except OSError as exc:
                raise RestoreRefused(session_id, [str(exc)]) from exc
            for attempt in (1, 2):
                entry, chosen = await self.loop.run_io(check_restorable, store, session_id, facts, point)
                entry, chosen = await self.loop.run_io(carried_over, store, entry, chosen, facts,
                                                       self.link.staging)
                assert entry.sidecar is not None
                try:
                    state = chosen if chosen is not None else entry.sidecar
                    result, tokens = await self.read_back(http, slot, state.kv_file, state.content_hash)
                    break
                except FileNotFoundError as exc:
                    # A save committing meanwhile (the conversation this slot held before the
                    # switch, found to be a newer version of this one) superseded the state: once
                    # it is committed, the session is looked at again.
                    if attempt == 2:
                        raise RestoreRefused(session_id,
                                             [f"its state changed while it was read: {exc}"]) from exc
                    await self.saves.await_commits()
                except PieceError as exc:  # a piece missing or damaged: what uses it cannot be restored
                    if chosen is not None:
                        await self.loop.run_io(store.points.drop, session_id, [chosen.kv_file])
                        why = f"its restore point at {chosen.n_tokens} tokens: {exc}; the point was dropped"
                        raise RestoreRefused(session_id, [why]) from exc
                    await self.loop.run_io(store.mark_corrupt, session_id, str(exc))
                    raise RestoreRefused(session_id, [str(exc)]) from exc
                except ServerError as exc:
                    self.board.emptied(slot)  # a failed restore leaves the slot empty
                    raise RestoreRefused(session_id, [f"llama-server refused it: {exc.message}"]) from exc
            if chosen is not None and result.n_restored != chosen.n_tokens:
                # Not the point its sidecar describes: nothing of it is used, and it is dropped.
                await self.loop.run_io(http.erase_slot, slot)
                self.board.emptied(slot)
                await self.loop.run_io(store.points.drop, session_id, [chosen.kv_file])
                raise RestoreRefused(session_id, [
                    f"its restore point at {chosen.n_tokens} tokens gave llama-server "
                    f"{result.n_restored} tokens; the point was dropped"])
            assert entry.sidecar is not None
            transcript = await self.loop.run_io(_transcript_or_none, store, entry)
            if chosen is not None:
                transcript = None  # the transcript is the whole conversation's, not the point's
        except RestoreRefused as exc:
            self.events.emit(SessionRefused(session_id, slot, tuple(exc.reasons)))
            return None
        finally:
            self.board.acting(slot, None)
        # In order with the reuse recorded after the first request; off the request's path (the
        # folder lock may be held by a save committing after a switch).
        self.loop.in_background(record_restore, store, session_id, slot, result.n_restored,
                                what="recording the restore")
        sc = entry.sidecar
        self.board.restored(slot, session_id, tokens, result.n_restored, sc.restore_mode,
                            exact_only=facts.restore_mode in EXACT_ONLY_MODES, transcript=transcript)
        self.rates.restore_measured(result.restore_ms, result.n_read)
        summary = RestoreSummary(session_id, slot, result.n_restored, result.restore_ms, sc.title)
        self.events.emit(SessionRestored(summary))
        return summary

    def _free_slot(self, n_slots: int) -> int:
        slots = [self.board[i] for i in range(n_slots)]
        for s in slots:
            if not s.view.session_id and not s.leased and not s.watch.changed:
                return s.id
        idle = [s for s in slots if not s.leased]
        if not idle:
            raise EngineError("every slot is busy; try again when a reply has finished")
        return min(idle, key=lambda s: s.id).id

    async def at_launch(self, adopted: bool, idle_save_seconds: float, limit: int | None,
                        resume_id: str | None) -> list[RestoreSummary]:
        """The launch's restores (``planning.plan_launch_restores``): after a crash each slot gets
        back what it held; otherwise the resume request, then the most recent usable sessions, up to
        ``limit``. A server an earlier run left (``adopted``) keeps what its slots hold."""
        facts = self.link.facts
        assert facts is not None
        n_slots = facts.n_parallel
        if adopted:
            # Its slots hold what they held (not known here): another conversation saves them first.
            self.board.reset(n_slots, facts.n_ctx_slot, unknown=True)
            return []
        after_crash = None
        if self.link.crashed:
            after_crash = {s.id: s.session_id for s in self.board if s.session_id}
            # A save llama-server was writing when it died left an incoming file: once no commit is
            # still using one, and no save of the last run is still at work, the folder is tidied.
            await self.saves.await_commits()
            async with contextlib.AsyncExitStack() as held:
                for lock in self.board.locks():
                    await held.enter_async_context(lock)
                await self.library.tidy()
        self.link.crashed = False
        self.board.reset(n_slots, facts.n_ctx_slot, idle_save_seconds=idle_save_seconds)
        http = self.link.client()
        candidates: list[LaunchCandidate] = []
        if after_crash is None:
            listing = await self.loop.run_io(self.library.store.listing)
            candidates = [
                LaunchCandidate(e.id, parse_utc(e.sidecar.last_used_at).timestamp(),
                                usable=not e.problems and not check_compatible(e.sidecar, facts)
                                and facts.restore_mode != families.RESTORE_NEVER)
                for e in listing.sessions if e.sidecar is not None
            ]
        used = {info.id for info in await self.loop.run_io(http.slots) if info.id_task is not None}
        plan = plan_launch_restores(n_slots=n_slots, candidates=candidates, limit=limit, resume_id=resume_id,
                                    after_crash=after_crash, used_slots=used)
        done: list[RestoreSummary] = []
        for i, (slot, sid) in enumerate(sorted(plan.items())):
            self.events.emit(ActivityChanged(Activity("restoring", sid, i, len(plan))))
            outcome = await self.restore(sid, slot)
            if outcome:
                done.append(outcome)
        self.events.emit(ActivityChanged(Activity(None, "", len(plan), len(plan))))
        now = time.monotonic()
        self.board.observe(await self.loop.run_io(http.slots), now)
        self.board.settled({d.slot for d in done}, now)
        return done

    async def restore_for_request(self, session_id: str, slot: int,
                                  point: str | None = None) -> RestoreSummary | None:
        facts = self.link.facts
        if facts is None:
            return None
        return await self.restore_locked(session_id, slot, facts, point)

    async def recompute(self, slot: int, reason: str) -> None:
        """Empty ``slot`` so llama-server computes the request from scratch (its lock is held)."""
        try:
            await self.loop.run_io(self.link.client().erase_slot, slot)
        except (ServerError, ServerUnavailable) as exc:
            log.warning("could not erase slot %s: %s", slot, exc)
        pending = self.board.erased(slot)
        session_id = self.board[slot].session_id
        log.info("slot %s recomputed: %s", slot, reason)
        self.events.emit(SlotRecomputed(slot, session_id, reason))
        if pending is not None:  # the restore was not used, on purpose: not the restore's failure
            self.library.reuse_judged(slot, pending, 0, 0, None, f"not judged: recomputed because {reason}")


def _transcript_or_none(store: SessionStore, entry: SessionEntry) -> Transcript | None:  # an I/O thread
    """The session's transcript, which the slot then holds with it (a damaged one is left out: the
    next save writes the slot's own)."""
    try:
        return store.transcript(entry)
    except TranscriptError as exc:
        log.warning("%s", exc)
        return None
