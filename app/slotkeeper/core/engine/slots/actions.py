"""Restoring a saved session into a slot (on request, on demand, and at launch), and erasing a slot
so a request is computed from scratch.
One slot's actions run under its lock; the slot's record (``slots.SlotBoard``) says what it holds
afterwards, for routing, autosave and the faces at once.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time

from slotkeeper.core.basics.tokens import TokenArray, as_tokens
from slotkeeper.core.engine.desk.planning import LaunchCandidate, plan_launch_restores
from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.prompts import PromptTokens
from slotkeeper.core.engine.door.shapes import Learn
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import SLOT_ACTION_TIMEOUT_SECONDS, ServerLink
from slotkeeper.core.engine.slots.board import UNKNOWN, SlotBoard
from slotkeeper.core.engine.slots.rates import Rates
from slotkeeper.core.engine.slots.saves import SWITCH_REASON, SlotSaves
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
from slotkeeper.core.sessions.points import AGENT_POINTS_SHARE, POINTS_SHARE, prompt_point_back, wanted_points
from slotkeeper.core.sessions.restoring import RestoreRefused, carried_over, check_restorable, record_restore
from slotkeeper.core.sessions.saving import SaveError, commit_point
from slotkeeper.core.sessions.sidecar import parse_utc
from slotkeeper.core.sessions.staging import cached_state, ensure_staging
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, unlink_quietly
from slotkeeper.core.sessions.transcripts import Transcript, TranscriptError
from slotkeeper.core.views import Activity, RestoreSummary

log = logging.getLogger(__name__)

# Two user messages that part at their first token: where they part is where a user's words start.
USER_START_PROBES = ("Yes", "No")


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
        self.make_restore_points = True  # the setting (restore_points)
        self.stopping = False  # the server stops: point-making stops after the step it is in

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
                        await self.loop.run_io(store.drop_points, session_id, [chosen.kv_file])
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
                await self.loop.run_io(store.drop_points, session_id, [chosen.kv_file])
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


    # -- restore points ------------------------------------------------------------------------
    async def make_points(self, slot: int, restore_after: bool = True, at_quit: bool = False,
                          deadline: float | None = None) -> int:
        """Save restore points of the conversation ``slot`` holds, just saved (``sessions.points``),
        while it is idle: for each, llama-server is asked to hold a prefix of it (it rolls back
        through its own RAM checkpoint, evaluating a few tokens) and writes the slot, and the store
        keeps the file as a point of the session. Then the whole conversation is restored into the
        slot again (unless not ``restore_after``: the server stops). Only for models whose restored
        state cannot be rolled back; nothing when a request came meanwhile or the slot holds
        changes; when the server is stopping, no more after the step under way, unless ``at_quit``
        (the stop's own, until the monotonic ``deadline``). Returns how many points were made."""
        if not self._points_apply():
            return 0
        async with self.board.lock(slot):
            s = self.board[slot]
            if s.busy or s.watch.changed:
                return 0  # a request is on its way, or nothing a request left is in it
            return await self._make_points_held(slot, restore_after, at_quit=at_quit, deadline=deadline)

    async def points_before_leaving(self, slot: int) -> int:
        """The conversation ``slot`` holds is about to be replaced (its lock is held; the request
        replacing it has leased the slot): its restore points are made now, while llama-server still
        holds what they are made from (its RAM checkpoints go with the conversation). A conversation
        with unsaved changes is saved first, whole. The slot is left holding a prefix of it."""
        if not self._points_apply() or self.stopping:
            return 0
        s = self.board[slot]
        if s.session_id is None and not s.watch.changed:
            return 0
        if s.watch.changed and await self.saves.save_locked(slot, SWITCH_REASON) is None:
            return 0  # not saved: the switch's own save says why and keeps the slot
        return await self._make_points_held(slot, restore_after=False, leaving=True)

    async def points_at_stop(self, deadline: float) -> int:
        """The server stops: the restore points each slot's conversation still owes (an idle save's
        that a request or this stop interrupted, a shutdown save's), made before the monotonic
        ``deadline`` (said as the "saving" activity), after the steps under way have ended."""
        if not self._points_apply():
            return 0
        made = 0
        slots = [s.id for s in self.board if s.session_id is not None]
        try:
            for i, slot in enumerate(slots):
                if time.monotonic() >= deadline:
                    log.warning("restore points not all made before the stop (%d of %d slots left)",
                                len(slots) - i, len(slots))
                    break
                self.events.emit(ActivityChanged(Activity("making restore points", f"slot {slot}", i,
                                                          len(slots))))
                async with self.board.lock(slot):  # the step under way ends first
                    made += await self._make_points_held(slot, restore_after=False, at_quit=True,
                                                         deadline=deadline)
        finally:
            if slots:
                self.events.emit(ActivityChanged(Activity(None, "", len(slots), len(slots))))
        return made

    def _points_apply(self) -> bool:
        facts = self.link.facts
        return self.make_restore_points and facts is not None and facts.restore_mode in EXACT_ONLY_MODES

    async def _make_points_held(self, slot: int, restore_after: bool, leaving: bool = False,
                                at_quit: bool = False, deadline: float | None = None) -> int:
        s = self.board[slot]
        c = s.content
        sid = s.session_id
        if sid is None or c.request is None and c.shape is None:
            return 0
        await self.board.learn_lagging(self.prompts.learn)
        if (s.watch.changed or c.held >= UNKNOWN or not len(c.tokens) or c.n_prompt != len(c.tokens)
                or (s.busy and not leaving)):
            return 0
        self.board.acting(slot, "saving")
        try:
            return await self._make_points_locked(slot, sid, restore_after, leaving, at_quit, deadline)
        finally:
            self.board.acting(slot, None)

    async def _make_points_locked(self, slot: int, sid: str, restore_after: bool, leaving: bool = False,
                                  at_quit: bool = False, deadline: float | None = None) -> int:
        c = self.board[slot].content
        prompt, n_prompt, request = c.tokens, c.n_prompt, c.request
        store = self.library.store
        try:
            entry = await self.loop.run_io(store.get, sid)
            saved = await self.loop.run_io(store.tokens, entry)
        except (SessionNotFound, OSError, ValueError):
            return 0
        sc = entry.sidecar
        if sc is None or entry.problems or common_prefix_len(saved, prompt) < n_prompt:
            return 0  # the save is not this prompt's conversation
        user_start = await self._user_start(request, prompt) if request is not None else None
        # An agent (its requests carry tools) goes back further after a restart: more points kept.
        share = AGENT_POINTS_SHARE if request is not None and request.body.get("tools") else POINTS_SHARE
        back = prompt_point_back(sc.swa)
        wanted = [(n, kind) for n, kind in wanted_points(n_prompt, user_start, len(saved),
                                                         have=[p.n_tokens for p in sc.points], back=back)
                  if n >= c.fragile_until]  # below restored state llama-server has no checkpoint
        if not wanted:
            return 0
        http = self.link.client()
        made = 0
        held = None
        board = self.board
        try:
            for n, kind in wanted:
                if board[slot].wanted and not leaving:
                    break  # a request waits for this slot: the rest can wait
                if self.stopping and not at_quit:
                    break  # the server stops: the stop makes what is still owed, in time
                if deadline is not None and time.monotonic() > deadline:
                    break
                evaluated = await self.loop.run_io(http.hold_prefix, slot, list(prompt[:n]),
                                                   SLOT_ACTION_TIMEOUT_SECONDS)
                held = prompt[:n]
                written, _ = await self.saves.write_slot(http, slot, SLOT_ACTION_TIMEOUT_SECONDS)
                if written is None or list(written.tokens) != list(held):
                    if written is not None:
                        await self.loop.run_io(unlink_quietly, written.path)
                    raise SaveError(f"slot {slot} did not hold the {n} tokens asked for")
                point = await self.loop.run_io(commit_point, store, written, sid, kind,
                                               self.library.point_spacing, share)
                if point is None:
                    break  # the session changed meanwhile
                made += 1
                log.info("restore point of %s at %d tokens (%s; %d evaluated)", sid, n, kind, evaluated)
            if held is None or not restore_after or self.stopping:
                if held is not None and not self.stopping:
                    board.rewound(slot, as_tokens(held), restored=False)  # it holds the last point's prefix
                return made  # nothing was done, the conversation leaves, or the server stops
            if board[slot].wanted:
                # It holds a prefix of its conversation, live: the waiting request goes on from it.
                board.rewound(slot, as_tokens(held), restored=False)
                return made
            restored, _tokens = await self.read_back(http, slot, sc.kv_file, sc.content_hash)
            if restored.n_restored != len(saved):
                raise SaveError(f"restoring {sid} after its restore points gave {restored.n_restored} tokens")
            board.rewound(slot, as_tokens(saved), restored=True)
        except (ServerError, ServerUnavailable, SaveError, OSError) as exc:
            log.warning("restore points of %s in slot %s stopped: %s", sid, slot, exc)
            if held is not None:
                board.rewound(slot, as_tokens(held), restored=False)
        return made

    async def _user_start(self, request: Learn, prompt: TokenArray) -> int | None:
        """Where the words of a chat request's last user message start in its prompt's tokens: the
        prompt rendered with two other words in that message parts there (and agrees with the real
        prompt up to it), whatever the template puts before a user's words."""
        messages = request.body.get("messages")
        if request.prompt_kind != endpoints.PROMPT_CHAT or not isinstance(messages, list):
            return None
        last_user = max((i for i, m in enumerate(messages)
                         if isinstance(m, dict) and m.get("role") == "user"), default=None)
        if not last_user:
            return None
        renders = []
        for word in USER_START_PROBES:
            probe = [*messages[:last_user], {"role": "user", "content": word}]
            tokens = await self.prompts.tokens(endpoints.PROMPT_CHAT, {**request.body, "messages": probe})
            if tokens is None:
                return None
            renders.append(tokens)
        return min(common_prefix_len(renders[0], renders[1]), common_prefix_len(renders[0], prompt))


def _transcript_or_none(store: SessionStore, entry: SessionEntry) -> Transcript | None:  # an I/O thread
    """The session's transcript, which the slot then holds with it (a damaged one is left out: the
    next save writes the slot's own)."""
    try:
        return store.transcript(entry)
    except TranscriptError as exc:
        log.warning("%s", exc)
        return None
