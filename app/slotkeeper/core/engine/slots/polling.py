"""The /slots poller: what llama-server's slots are doing, for autosave's idle saves and the faces'
live figures. It looks every 0.5 s while a slot works or waits for its idle save, every 2 s
otherwise (a request through the front door wakes it), and slowly while a non-streamed request
whose client left runs on (llama-server notices the client left only after a second without news
of any task, and each poll is news)."""

from __future__ import annotations

import asyncio
import time

from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.slots.autosave import IDLE_POLL_SECONDS, POLL_SECONDS
from slotkeeper.core.engine.slots.board import SlotBoard
from slotkeeper.core.engine.slots.points import RestorePoints
from slotkeeper.core.engine.slots.saves import SlotSaves
from slotkeeper.core.server.client import ServerError, ServerUnavailable

ABANDONED_POLL_SECONDS = 1.5  # llama-server's HTTP_POLLING_SECONDS is 1
ABANDONED_GIVE_UP_SECONDS = 120.0


class SlotPoller:
    def __init__(self, board: SlotBoard, link: ServerLink, loop: EngineLoop, saves: SlotSaves,
                 points: RestorePoints) -> None:
        """``saves``: where a slot whose conversation went idle is saved; ``points``: what makes its
        restore points then."""
        self.board = board
        self.link = link
        self.loop = loop
        self.saves = saves
        self.points = points
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._slowly = False
        self._idle_saves: set[int] = set()
        self._abandoned: dict[int, float] = {}  # slots running a request whose client left, since when

    def start(self, adopted: bool) -> None:
        """``adopted``: a server an earlier run left, whose slots may hold unsaved conversations."""
        self.stop()
        self._task = self.loop.spawn(self._poll(adopted), "slots poller")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def wake(self) -> None:
        """A request is starting (on the loop): a poller waiting its long interval looks now (and
        often until the slot is saved); one already looking often keeps its pace."""
        if self._slowly:
            self._wake.set()

    def abandoned(self, slot: int) -> None:
        """A request on ``slot`` lost its client before its reply began: poll slowly until
        llama-server has stopped it."""
        self._abandoned[slot] = time.monotonic()

    def _active(self) -> bool:
        return any(s.watch.changed or s.watch.processing or s.busy for s in self.board)

    async def _poll(self, first: bool) -> None:
        http = self.link.client()
        delay = 0.0  # the first poll at once: the faces show the slots as soon as we are ready
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            # Often while a slot works or waits for its idle save; a few times a minute otherwise.
            delay = POLL_SECONDS if self._active() else IDLE_POLL_SECONDS
            if self._abandoned:
                delay = max(delay, ABANDONED_POLL_SECONDS)
            self._slowly = delay > POLL_SECONDS
            try:
                infos = await self.loop.run_io(http.slots)
            except (ServerUnavailable, ServerError):
                continue
            now = time.monotonic()
            for info in infos:
                if (not info.is_processing
                        or now - self._abandoned.get(info.id, now) > ABANDONED_GIVE_UP_SECONDS):
                    self._abandoned.pop(info.id, None)
            self.board.observe(infos, now, first=first)
            first = False
            for slot in self.board.due(now):
                if slot not in self._idle_saves:  # not again while one waits for its turn
                    self._idle_saves.add(slot)
                    self.loop.spawn(self._save_idle(slot), f"idle save of slot {slot}")

    async def _save_idle(self, slot: int) -> None:
        try:
            if await self.saves.save(slot, "idle") is not None:
                await self.points.after_idle_save(slot)
        finally:
            self._idle_saves.discard(slot)
