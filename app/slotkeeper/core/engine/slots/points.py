"""Restore points (``sessions.points``), one owner for all three moments they are made: after a
conversation's idle save (``after_idle_save``, from the poller), as it leaves its slot
(``before_leaving``, from the front desk's switch) and when the server stops (``at_stop``, from
the engine's stop). Only for models whose restored state cannot be rolled back (hybrid, recurrent,
``--swa-full``): for each point, llama-server is asked to hold a prefix of the conversation (it
rolls back through its own RAM checkpoint, evaluating a few tokens) and writes the slot, and the
store keeps the file as a point of the session.
"""

from __future__ import annotations

import logging
import time

from slotkeeper.core.basics.tokens import TokenArray, as_tokens
from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.prompts import PromptTokens
from slotkeeper.core.engine.door.shapes import PromptSource
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import SLOT_ACTION_TIMEOUT_SECONDS, ServerLink
from slotkeeper.core.engine.slots.actions import SlotActions
from slotkeeper.core.engine.slots.board import UNKNOWN, SlotBoard
from slotkeeper.core.engine.slots.saves import SWITCH_REASON, SlotSaves
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import ActivityChanged, EventBus
from slotkeeper.core.model.families import EXACT_ONLY_MODES
from slotkeeper.core.server.client import ServerError, ServerUnavailable
from slotkeeper.core.sessions.lineage import common_prefix_len
from slotkeeper.core.sessions.points import AGENT_POINTS_SHARE, POINTS_SHARE, prompt_point_back, wanted_points
from slotkeeper.core.sessions.saving import SaveError, commit_point
from slotkeeper.core.sessions.store import SessionNotFound, unlink_quietly
from slotkeeper.core.views import Activity

log = logging.getLogger(__name__)

# Two user messages that part at their first token: where they part is where a user's words start.
USER_START_PROBES = ("Yes", "No")


class RestorePoints:
    def __init__(self, board: SlotBoard, link: ServerLink, library: Library, saves: SlotSaves,
                 actions: SlotActions, loop: EngineLoop, events: EventBus, prompts: PromptTokens) -> None:
        """``actions``: what restores a conversation into its slot again after its points;
        ``prompts``: what a slot holds, learnt when it is not known yet."""
        self.board = board
        self.link = link
        self.library = library
        self.saves = saves
        self.actions = actions
        self.loop = loop
        self.events = events
        self.prompts = prompts
        self.enabled = True  # the setting (restore_points)
        self.stopping = False  # the server stops: point-making stops after the step it is in

    async def after_idle_save(self, slot: int, restore_after: bool = True, at_quit: bool = False,
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

    async def before_leaving(self, slot: int) -> int:
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

    async def at_stop(self, deadline: float) -> int:
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
        return self.enabled and facts is not None and facts.restore_mode in EXACT_ONLY_MODES

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
            restored, _tokens = await self.actions.read_back(http, slot, sc.kv_file, sc.content_hash)
            if restored.n_restored != len(saved):
                raise SaveError(f"restoring {sid} after its restore points gave {restored.n_restored} tokens")
            board.rewound(slot, as_tokens(saved), restored=True)
        except (ServerError, ServerUnavailable, SaveError, OSError) as exc:
            log.warning("restore points of %s in slot %s stopped: %s", sid, slot, exc)
            if held is not None:
                board.rewound(slot, as_tokens(held), restored=False)
        return made

    async def _user_start(self, request: PromptSource, prompt: TokenArray) -> int | None:
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
