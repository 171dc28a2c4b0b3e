"""Flash attention measured while the server sits idle (``core/server/calibrate.py``), once per
model, binary and arguments on this machine, for the launches after it.

A launch whose "auto" could not be settled by a rule (``flash_choice``: on the CPU, not measured
yet) hands its request here (``planned``). When the server is up and no slot has done anything
for ``IDLE_SECONDS``, two measuring servers run at a lower priority on a thread of their own; the
moment a slot gets busy (a request, a save, restore points) or the server stops, they are stopped,
to begin again at the next idle spell. The verdict is kept in the binary facts cache, where the
next launch's plan finds it (``launching.resolve_flash_attn``), and said once
(``FlashAttnMeasured``). Nothing here calls back into the engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.slots.board import SlotBoard
from slotkeeper.core.events import EventBus, FlashAttnMeasured
from slotkeeper.core.server.calibrate import Calibration, Cancelled, Verdict
from slotkeeper.core.server.flash_choice import MEASURED, FlashAttnChoice, describe_verdict, remember_choice

log = logging.getLogger(__name__)

JOIN_SECONDS = 15.0  # a stopped measurement's thread ends (its servers killed) within this
IDLE_SECONDS = 30.0  # nothing in any slot for this long before measuring
POLL_SECONDS = 0.2  # how soon a slot's work stops a measurement
RETRY_SECONDS = 600.0  # after a measurement that failed (not one that was stopped)


@dataclass(frozen=True)
class MeasureRequest:
    binary: str  # the binary file the verdict is kept under
    argv: tuple[str, ...]  # the launch's command line
    key: str  # flash_choice.calibration_key of it
    n_ctx_slot: int
    auto: bool  # llama-server's own choice, kept on a tie
    running: bool  # the value the running server passes
    model_name: str
    model_path: str


class FlashAttnTuning:
    def __init__(self, board: SlotBoard, link: ServerLink, loop: EngineLoop, events: EventBus,
                 binary_facts: FileFactsCache, model_facts: FileFactsCache,
                 idle_seconds: float | None = None) -> None:
        self.board = board
        self.link = link
        self.loop = loop
        self.events = events
        self.binary_facts = binary_facts
        self.model_facts = model_facts
        self.idle_seconds = IDLE_SECONDS if idle_seconds is None else idle_seconds
        self._task: asyncio.Task | None = None
        self.measuring = False  # a measurement runs now (for tests and the faces' activity)

    def planned(self, request: MeasureRequest | None) -> None:
        """A launch begins (on the loop): measure for it, or nothing (what ran before is stopped)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if request is not None:
            self._task = self.loop.spawn(self._measure_when_idle(request), "measuring flash attention")

    async def _measure_when_idle(self, request: MeasureRequest) -> None:
        while True:
            await self._idle()
            calibration = Calibration(request.argv, request.n_ctx_slot, request.auto)
            result = await self._run(calibration)
            if isinstance(result, Verdict):
                words = describe_verdict(result)
                await self.loop.run_io(self.binary_facts.put, request.binary, result.to_json(), request.key)
                await self.loop.run_io(remember_choice, self.model_facts, request.model_path,
                                       FlashAttnChoice(result.value, MEASURED, words))
                self.events.emit(FlashAttnMeasured(request.model_name, result.value, request.running, words))
                return
            if result is not None:  # it failed: said in the log, tried again much later
                log.warning("could not measure flash attention for %s: %s", request.model_name, result)
                await asyncio.sleep(RETRY_SECONDS)

    async def _idle(self) -> None:
        """Until the server is up and every slot has been idle for ``idle_seconds``."""
        quiet_since = time.monotonic()
        while True:
            if not self.link.serving.is_set() or self._busy():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= self.idle_seconds:
                return
            await asyncio.sleep(min(1.0, self.idle_seconds / 4 or POLL_SECONDS))

    def _busy(self) -> bool:
        return any(s.busy for s in self.board)

    async def _run(self, calibration: Calibration) -> Verdict | BaseException | None:
        """The verdict; None when a slot's work or a stop interrupted it; the error when it failed."""
        done = self.loop.loop.create_future()

        def work() -> None:
            try:
                outcome: object = calibration.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which decides
                outcome = exc
            def deliver() -> None:
                if not done.done():
                    done.set_result(outcome)

            self.loop.call_soon(deliver)

        self.measuring = True
        thread = threading.Thread(target=work, name="flash-attn-measure", daemon=True)
        thread.start()
        try:
            while not done.done():
                if self._busy() or not self.link.serving.is_set():
                    calibration.cancel()
                    break
                await asyncio.wait({done}, timeout=POLL_SECONDS)
            outcome = await done
        finally:
            calibration.cancel()  # the loop's task cancelled (a new launch, the engine closing)
            # its servers are killed: the thread ends within moments, and nothing outlives the engine
            await self.loop.run_io(thread.join, JOIN_SECONDS)
            self.measuring = False
        if isinstance(outcome, Cancelled):
            return None
        return outcome
