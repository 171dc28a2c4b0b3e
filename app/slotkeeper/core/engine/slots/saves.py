"""Saving slots: llama-server writes a slot, the save protocol (``sessions.saving``) turns the file
into a session, the slot's record says what it holds. One slot's actions run under its lock.

- ``save``: a save the user asked for, an idle save, a save at shutdown; then a prune.
- ``save_before_switching``: before another conversation takes the slot, only llama-server's write
  waits; the rest (hash, fsync, lineage, title, commit) runs beside the request
  (``await_commits`` waits for it where it matters).
- ``save_changed``: every changed slot, idle ones first, within a time limit (shutdown, a switch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from slotkeeper.core.basics.tokens import TokenArray, as_tokens
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import SLOT_ACTION_TIMEOUT_SECONDS, ServerLink
from slotkeeper.core.engine.slots.board import UNKNOWN, SlotBoard
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.engine.stored.searching import Described
from slotkeeper.core.events import ActivityChanged, EventBus, SaveFailed, SessionSaved, WarningRaised
from slotkeeper.core.model import families
from slotkeeper.core.server.client import LlamaClient, ServerError, ServerUnavailable
from slotkeeper.core.sessions.lineage import common_prefix_len
from slotkeeper.core.sessions.naming import new_incoming_name
from slotkeeper.core.sessions.saving import (
    SaveContext,
    SaveError,
    SaveOutcome,
    Written,
    check_written,
    commit_written,
    server_refused,
)
from slotkeeper.core.sessions.staging import ensure_staging
from slotkeeper.core.sessions.store import unlink_quietly
from slotkeeper.core.sessions.transcripts import Transcript
from slotkeeper.core.views import Activity, SavesReport, SaveSummary

log = logging.getLogger(__name__)

SHUTDOWN_SAVE_TIMEOUT_SECONDS = 120.0
SWITCH_REASON = "before switching conversations"


class SlotSaves:
    def __init__(self, board: SlotBoard, link: ServerLink, library: Library, loop: EngineLoop,
                 events: EventBus) -> None:
        self.board = board
        self.link = link
        self.library = library
        self.loop = loop
        self.events = events
        self._commits: dict[asyncio.Future[None], TokenArray] = {}  # saves committing after a switch
        self._never_help_said = False

    # -- a save -------------------------------------------------------------------------------
    async def save(self, slot: int, reason: str,
                   timeout: float = SLOT_ACTION_TIMEOUT_SECONDS) -> SaveSummary | None:
        async with self.board.lock(slot):
            return await self.save_locked(slot, reason, timeout)

    async def save_locked(self, slot: int, reason: str,
                          timeout: float = SLOT_ACTION_TIMEOUT_SECONDS) -> SaveSummary | None:
        """Save the slot (its lock is held); None when nothing was saved (a SaveFailed says why)."""
        facts, model = self.link.facts, self.link.model
        if facts is None or model is None:
            return None
        s = self.board[slot]
        generation = s.watch.generation
        if reason != "manual" and self.never_help():
            # Nothing worth keeping: mark it as dealt with so it is not due again and again.
            self.board.saved(slot, None, generation)
            self.say_never_help()
            return None
        self.board.acting(slot, "saving")
        ctx = SaveContext(facts, model.info.arch, self.link.llama_build)
        try:
            outcome = await self.write_session(self.link.client(), ctx, slot, s.session_id, timeout,
                                               self._known_prompt(slot), s.content.transcript)
        except Exception as exc:  # whatever went wrong, the engine and its poller carry on
            self.failed(slot, describe_save_error(slot, exc))
            return None
        finally:
            self.board.acting(slot, None)
        sid = outcome.sidecar.id if outcome.sidecar else None
        self.board.saved(slot, sid, generation)
        summary = save_summary(slot, reason, outcome)
        self.library.saved(outcome)
        self.events.emit(SessionSaved(summary))
        if outcome.kind in ("new", "update", "fork"):
            await self.library.prune()
        return summary

    def _known_prompt(self, slot: int) -> int | None:
        """The slot's last prompt length, when it is known (lineage finds the reply after it)."""
        n_prompt = self.board[slot].content.n_prompt
        return n_prompt if 0 < n_prompt < UNKNOWN else None

    def _rolls_back(self) -> bool:
        """The running server's restored states may be rolled back (lineage's "contained")."""
        facts = self.link.facts
        return facts is not None and facts.restore_mode == families.RESTORE_WORKS

    def never_help(self) -> bool:
        """This model and server cannot reuse a restored slot (sliding window without --swa-full)."""
        facts = self.link.facts
        return facts is not None and facts.restore_mode == families.RESTORE_NEVER

    def say_never_help(self) -> None:
        """The launch said why (``swa_note``, once) and how to change it; the log says it here."""
        if not self._never_help_said:
            self._never_help_said = True
            log.info("not saving: restoring this model's conversations would not save any work")

    async def write_session(self, http: LlamaClient, ctx: SaveContext, slot: int, current_id: str | None,
                            timeout: float, n_prompt: int | None = None,
                            transcript: Transcript | None = None, folder: Path | None = None) -> SaveOutcome:
        """llama-server writes the slot (into ``folder``, its save folder; the running server's by
        default); the save protocol turns the file into a session (with ``transcript``, what the
        slot holds in words). Raises."""
        written, save_ms = await self.write_slot(http, slot, timeout, folder)
        if written is None:
            return SaveOutcome("empty", None)
        return await self._commit_written(http, ctx, written, current_id, save_ms, n_prompt, transcript)

    async def write_slot(self, http: LlamaClient, slot: int, timeout: float,
                         folder: Path | None = None) -> tuple[Written | None, float]:
        """llama-server writes the slot to an incoming file in its save folder (``folder``; the
        running server's staging folder by default), checked whole (None: the slot was empty)."""
        store = self.library.store
        await self.loop.run_io(store.ensure_folder)  # recreated if deleted; still private
        folder = self.link.staging if folder is None else folder
        await self.loop.run_io(ensure_staging, folder)
        name = new_incoming_name()
        try:
            result = await self.loop.run_io(http.save_slot, slot, name, timeout)
        except ServerError as exc:
            await self.loop.run_io(unlink_quietly, folder / name)
            raise server_refused(store, slot, exc.message) from exc
        except BaseException:  # llama-server gone mid-write: what it wrote is no save
            await self.loop.run_io(unlink_quietly, folder / name)
            raise
        written = await self.loop.run_io(check_written, store, folder / name, result.n_written, slot)
        return written, result.save_ms

    async def _commit_written(self, http: LlamaClient, ctx: SaveContext, written: Written,
                              current_id: str | None, save_ms: float, n_prompt: int | None,
                              transcript: Transcript | None = None) -> SaveOutcome:
        described = Described(http, transcript)  # keeps the conversation's text for the search index
        outcome = await self.loop.run_io(commit_written, self.library.store, written, ctx, described,
                                         current_id, save_ms, n_prompt, transcript, self._rolls_back())
        sc = outcome.sidecar
        if sc is not None and outcome.kind in ("new", "update", "fork"):
            self.library.text_saved(sc, described.text)
        return outcome

    def failed(self, slot: int, message: str) -> None:
        delay = self.board.save_failed(slot, time.monotonic())
        log.warning("saving slot %s failed (next try in %.0f s): %s", slot, delay, message)
        self.events.emit(SaveFailed(slot, message))

    # -- before a switch ------------------------------------------------------------------------
    async def save_before_switching(self, slot: int) -> bool:
        """Save what ``slot`` holds before another conversation takes it (its lock is held).
        False: it could not be saved, so it must not be replaced.

        Only llama-server's write waits: once the file is whole (its size and token list
        checked), the other conversation may take the slot, and the rest of the save (hash,
        fsync, lineage, title, commit) runs beside the request. A request that could use the
        session being committed waits for it (``await_commits``), and so does a stop."""
        if self.never_help():  # nothing worth keeping in it
            return await self.save_locked(slot, SWITCH_REASON) is None
        facts, model = self.link.facts, self.link.model
        if facts is None or model is None:
            return False
        s = self.board[slot]
        generation, current_id, transcript = s.watch.generation, s.session_id, s.content.transcript
        n_prompt = self._known_prompt(slot)
        ctx = SaveContext(facts, model.info.arch, self.link.llama_build)
        http = self.link.client()
        self.board.acting(slot, "saving")
        try:
            written, save_ms = await self.write_slot(http, slot, SLOT_ACTION_TIMEOUT_SECONDS)
        except Exception as exc:  # not written: the conversation stays in its slot
            self.failed(slot, describe_save_error(slot, exc))
            return False
        finally:
            self.board.acting(slot, None)
        # The slot is about to hold another conversation (a restore names it; a new one has none yet).
        self.board.left(slot, generation)
        if written is not None:
            commit = asyncio.ensure_future(self._finish_switch_save(http, ctx, written, current_id, save_ms,
                                                                    n_prompt, transcript))
            self._commits[commit] = as_tokens(written.tokens)
            commit.add_done_callback(lambda done: self._commits.pop(done, None))
        return True

    async def _finish_switch_save(self, http: LlamaClient, ctx: SaveContext, written: Written,
                                  current_id: str | None, save_ms: float, n_prompt: int | None,
                                  transcript: Transcript | None) -> None:
        slot = written.slot
        try:
            outcome = await self._commit_written(http, ctx, written, current_id, save_ms, n_prompt,
                                                 transcript)
        except Exception as exc:  # the slot holds another conversation by now
            message = describe_save_error(slot, exc)
            log.warning("the save of the conversation slot %s held before a switch failed: %s", slot, message)
            self.events.emit(SaveFailed(slot, f"{message} (the conversation it held before the switch keeps "
                                              "its previous save)"))
            return
        self.library.saved(outcome)
        self.events.emit(SessionSaved(save_summary(slot, SWITCH_REASON, outcome)))
        if outcome.kind in ("new", "update", "fork"):
            await self.library.prune()

    async def await_commits(self, tokens: TokenArray | None = None, beat: int = 0) -> None:
        """Until the saves committing after a switch are done: every one, or (``tokens``) those
        sharing more than ``beat`` tokens with them (the ones a route could choose)."""
        while True:
            waits = [c for c, held in self._commits.items()
                     if tokens is None or common_prefix_len(tokens, held) > beat]
            if not waits:
                return
            await asyncio.wait(waits)

    # -- every changed slot -------------------------------------------------------------------
    async def save_changed(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                           reason: str = "shutdown") -> SavesReport:
        """Save every changed slot within ``timeout`` seconds in all: idle slots first, then the ones
        still generating (llama-server holds a save until the slot is idle). Nothing is saved for a
        model whose restores never help."""
        if self.never_help():
            self.say_never_help()
            return SavesReport()
        board = self.board
        try:
            board.observe(await self.loop.run_io(self.link.client().slots), time.monotonic())
        except (ServerUnavailable, ServerError) as exc:
            self.events.emit(WarningRaised(f"could not reach llama-server to save the slots: {exc}"))
            return SavesReport(unsaved=tuple(board.changed_slots()))
        slots = sorted(board.changed_slots(), key=lambda s: board[s].watch.processing)
        deadline = time.monotonic() + timeout
        saved: list[SaveSummary] = []
        unsaved: list[int] = []
        try:
            for i, slot in enumerate(slots):
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    unsaved.extend(slots[i:])
                    self.events.emit(WarningRaised(f"saving took longer than {timeout:.0f} s; "
                                                   f"{len(slots) - i} slot(s) not saved"))
                    break
                self.events.emit(ActivityChanged(Activity("saving", f"slot {slot}", i, len(slots))))
                out = await self.save(slot, reason=reason, timeout=remaining)
                if out:
                    saved.append(out)
                else:
                    unsaved.append(slot)
        finally:
            self.events.emit(ActivityChanged(Activity(None, "", len(slots), len(slots))))
        return SavesReport(tuple(saved), tuple(unsaved))


def save_summary(slot: int, reason: str, outcome: SaveOutcome) -> SaveSummary:
    sc = outcome.sidecar
    return SaveSummary(slot=slot, kind=outcome.kind, id=sc.id if sc else None, reason=reason,
                       n_tokens=outcome.n_tokens, ms=outcome.save_ms,
                       size_bytes=(sc.state_bytes or sc.size_bytes) if sc else 0,
                       title=sc.title if sc else "")


def describe_save_error(slot: int | None, exc: BaseException) -> str:
    """A save failure in words; an error we did not expect is logged with its traceback too."""
    if isinstance(exc, (SaveError, ServerUnavailable, ServerError, OSError)):
        return str(exc)
    log.error("saving slot %s failed", slot, exc_info=exc)
    return f"unexpected error: {exc}"
