"""Planning each launch of llama-server and handing it to the supervisor (``begin``): commands go
down, and the supervisor is never asked anything on its thread. The supervisor is told a launch
is being planned, then given it (with its fallback) or told why it cannot run; a server an earlier
run left with other settings has its conversations saved first. A launch begins with ``take``:
what it runs goes to the server link, the model is hashed while it loads, and what there is to say
about it is said. The engine hears of it (``LaunchPlanned``) and reads what it needs from here
(``door_keys``); nothing here calls back into the engine."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity, byte_progress
from slotkeeper.core.engine.lifecycle.launching import (
    ILLEGAL_INSTRUCTION,
    LaunchPlan,
    plan_launch,
    remember_illegal_instruction,
)
from slotkeeper.core.engine.lifecycle.leftover import save_leftover
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import resolve_model
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.lifecycle.tuning import FlashAttnTuning, MeasureRequest
from slotkeeper.core.engine.slots.saves import SHUTDOWN_SAVE_TIMEOUT_SECONDS, SlotSaves
from slotkeeper.core.events import (
    ActivityChanged,
    EventBus,
    LaunchFellBack,
    LaunchPlanned,
    NoticeRaised,
    WarningRaised,
)
from slotkeeper.core.model.demo_model import DEMO_NOTICE
from slotkeeper.core.model.starter_model import StarterUnavailable
from slotkeeper.core.server.apikey import DoorKeys
from slotkeeper.core.server.flash_choice import calibration_key
from slotkeeper.core.server.supervisor import LaunchSpec, Supervisor, SupervisorError
from slotkeeper.core.settings import ServerProfile
from slotkeeper.core.views import Activity

log = logging.getLogger(__name__)

LAUNCH_SPEC_TIMEOUT_SECONDS = 120.0
PLAN_STOP_SECONDS = 10.0  # at most this long for a launch being planned to end after a stop


class Launcher:
    def __init__(self, paths: AppPaths, profile: ServerProfile, supervisor: Supervisor, link: ServerLink,
                 identity: ModelIdentity, saves: SlotSaves, loop: EngineLoop, events: EventBus,
                 model_facts: FileFactsCache, binary_facts: FileFactsCache,
                 tuning: FlashAttnTuning) -> None:
        """``profile``: what the next launch runs (the engine replaces it when the settings change)."""
        self.paths = paths
        self.profile = profile
        self.supervisor = supervisor
        self.link = link
        self.identity = identity
        self.saves = saves
        self.loop = loop
        self.events = events
        self.model_facts = model_facts
        self.binary_facts = binary_facts
        self.tuning = tuning
        self.binary = ""  # llama-server's file, this launch
        self.door_keys: DoorKeys | None = None  # the user's keys for the front door (per launch)
        self._fetched_at = 0.0  # when the starter model's download last got further (its thread)
        self._demo_said = False
        self._launching: asyncio.Task[None] | None = None

    # -- commands (on the loop) ---------------------------------------------------------------
    def begin(self) -> None:
        """Plan a launch and hand it to the supervisor, as a task (planning may wait for the starter
        model's download). Nothing when the server runs or starts already."""
        if not self.supervisor.preparing():
            return
        self.cancel()
        self._launching = self.loop.spawn(self._launch(), "planning the launch")

    def cancel(self) -> None:
        """Give up the launch being planned at once."""
        if self._launching is not None and not self._launching.done():
            self._launching.cancel()
        self._launching = None

    async def stopped(self) -> None:
        """The supervisor was told to stop: the launch being planned ends as it sees that (a download
        stops and removes what it wrote; the supervisor refuses the spec), within
        PLAN_STOP_SECONDS, else it is given up."""
        task, self._launching = self._launching, None
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=PLAN_STOP_SECONDS)  # its failure is the task's to log
        if not done:
            log.warning("the launch being planned did not end with the stop; given up")
            task.cancel()

    def fell_back(self, event: LaunchFellBack) -> None:
        """llama-server ended during start-up and the supervisor runs the launch's fallback: the
        one there is, with --no-repack (see launching), is kept for this binary and said."""
        if event.exit_code == ILLEGAL_INSTRUCTION and self.binary:
            self.loop.spawn(self._remember_no_repack(self.binary), "remembering --no-repack")

    async def _remember_no_repack(self, binary: str) -> None:
        if not await self.loop.run_io(remember_illegal_instruction, binary, self.binary_facts):
            return  # said already
        self.events.emit(WarningRaised(
            "llama-server stopped on an illegal instruction while it loaded the model: this system reports "
            "CPU instructions it does not let programs use (AMX in some virtual machines, say), which "
            "llama-server's weight repacking uses. Slotkeeper starts it with --no-repack now, and from now "
            "on."))

    # -- on the loop ------------------------------------------------------------------------
    async def _launch(self) -> None:
        try:
            spec = await self._prepare_in_time()
        except SupervisorError as exc:
            self.supervisor.fail(str(exc))
            return
        except Exception as exc:  # never leave the server "starting"
            log.exception("planning the launch failed")
            self.supervisor.fail(f"unexpected error: {exc}")
            return
        record = await self.loop.run_io(self.supervisor.leftover_to_replace, spec)
        if record is not None and not self.supervisor.stop_requested:
            self.supervisor.preparing("saving the conversations of a server left by an earlier session")
            try:
                await asyncio.wait_for(self._save_leftover(record), SHUTDOWN_SAVE_TIMEOUT_SECONDS)
            except Exception:  # its conversations are lost, but the new launch goes on
                log.exception("saving the slots of the server left running failed")
        self.supervisor.launch(spec)

    async def _prepare_in_time(self) -> LaunchSpec:
        """The launch spec. A plan may wait as long as the starter model's download goes on;
        anything else, a bounded time."""
        task = asyncio.ensure_future(self._prepare())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=LAUNCH_SPEC_TIMEOUT_SECONDS)
                if done:
                    return task.result()
                if time.monotonic() - self._fetched_at > LAUNCH_SPEC_TIMEOUT_SECONDS:
                    raise SupervisorError("Preparing llama-server's launch took too long")
        finally:
            task.cancel()

    async def _save_leftover(self, record: dict[str, Any]) -> None:
        """A server an earlier run left running with other settings (Slotkeeper was killed): save what
        its slots hold before it is stopped."""
        _url, key = self.link.upstream()  # a server we left runs on the private address we keep
        await save_leftover(record, key, self.loop, self.events,
                            lambda path: resolve_model(path, self.paths.models_dir, self.model_facts),
                            self.identity, self.saves)

    async def _prepare(self) -> LaunchSpec:
        began = time.monotonic()
        report = byte_progress(self.loop, self.events, "downloading", "downloading the starter model")

        def fetching(done: int, total: int) -> None:  # an I/O thread
            if self.supervisor.stop_requested:
                raise StarterUnavailable("the download stopped with the server")
            self._fetched_at = time.monotonic()
            report(done, total)

        profile = self.profile

        def plan() -> LaunchPlan:  # an I/O thread (the leftover's port is read from its state file)
            return plan_launch(self.paths, profile, self.model_facts, self.binary_facts,
                               self.supervisor.leftover_port(), fetching)

        try:
            planned = await self.loop.run_io(plan)
        finally:
            if self._fetched_at > began:  # it downloaded: clear, after the progress the I/O thread queued
                self.loop.call_soon(self.events.emit, ActivityChanged(Activity()))
        self.take(planned)
        return planned.spec

    def take(self, plan: LaunchPlan) -> None:
        """A launch begins (on the loop): what it runs, and what to say about it."""
        self.binary = plan.binary
        self.link.launching(plan.private, plan.profile, plan.model, plan.flash_attn, plan.staging)
        self.door_keys = DoorKeys(plan.profile.extra_args)
        self.identity.begin(plan.model.path)
        self.tuning.planned(measure_request(plan))
        if plan.model.is_demo and not self._demo_said:  # once, however often it is launched
            self._demo_said = True
            self.events.emit(NoticeRaised(DEMO_NOTICE))
        for note in plan.notes:
            self.events.emit(WarningRaised(note))
        self.events.emit(LaunchPlanned(plan.profile.model_path))


def measure_request(plan: LaunchPlan) -> MeasureRequest | None:
    """What to measure for this launch's flash attention, when its choice waits for a measurement."""
    choice = plan.flash_choice
    if choice is None or not choice.measure:
        return None
    try:
        key = calibration_key(plan.spec.argv, plan.model.path)
    except OSError:
        return None
    return MeasureRequest(plan.binary, tuple(plan.spec.argv), key, plan.profile.ctx_per_slot, choice.value,
                          plan.flash_attn, plan.model.display_name, str(plan.model.path))
