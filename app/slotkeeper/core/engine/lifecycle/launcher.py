"""Planning each launch of llama-server, for the supervisor: the supervisor asks on its own thread
(``spec``, ``retry_start``, ``save_leftover``) and the work runs on the engine loop. A launch
begins with ``take``: what it runs goes to the server link, the model is hashed while it loads,
and what there is to say about it is said. The engine hears of it (``LaunchPlanned``) and reads
what it needs from here (``door_keys``); nothing here calls back into the engine."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from typing import Any

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity, byte_progress
from slotkeeper.core.engine.lifecycle.launching import LaunchPlan, plan_launch, remember_illegal_instruction
from slotkeeper.core.engine.lifecycle.leftover import save_leftover
from slotkeeper.core.engine.lifecycle.loop import EngineLoop, LoopClosed
from slotkeeper.core.engine.lifecycle.model_facts import resolve_model
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.lifecycle.tuning import FlashAttnTuning, MeasureRequest
from slotkeeper.core.engine.slots.saves import SHUTDOWN_SAVE_TIMEOUT_SECONDS, SlotSaves
from slotkeeper.core.events import ActivityChanged, EventBus, LaunchPlanned, NoticeRaised, WarningRaised
from slotkeeper.core.model.demo_model import DEMO_NOTICE
from slotkeeper.core.model.starter_model import StarterUnavailable
from slotkeeper.core.server.apikey import DoorKeys
from slotkeeper.core.server.flash_choice import calibration_key
from slotkeeper.core.server.supervisor import LaunchSpec, Supervisor, SupervisorError
from slotkeeper.core.settings import ServerProfile
from slotkeeper.core.views import Activity

LAUNCH_SPEC_TIMEOUT_SECONDS = 120.0


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

    # -- asked by the supervisor (its thread) ------------------------------------------------
    def spec(self) -> LaunchSpec:
        """The launch spec, built on the loop. A plan may wait as long as the starter model's
        download goes on; anything else, a bounded time."""
        try:
            future = self.loop.post(self._prepare())
        except LoopClosed as exc:
            raise SupervisorError("Slotkeeper is quitting") from exc
        while True:
            try:
                return future.result(LAUNCH_SPEC_TIMEOUT_SECONDS)
            except concurrent.futures.TimeoutError:
                if time.monotonic() - self._fetched_at > LAUNCH_SPEC_TIMEOUT_SECONDS:
                    future.cancel()
                    raise SupervisorError("Preparing llama-server's launch took too long") from None

    def retry_start(self, exit_code: int) -> bool:
        """llama-server ended during start-up: True to launch it again. Once, when it died of SIGILL
        as it loaded the model: then with --no-repack (see launching)."""
        if exit_code != -getattr(signal, "SIGILL", 4) or not self.binary:
            return False
        if not remember_illegal_instruction(self.binary, self.binary_facts):
            return False  # started so already: it failed for another reason
        self.events.emit(WarningRaised(
            "llama-server stopped on an illegal instruction while it loaded the model: this system reports "
            "CPU instructions it does not let programs use (AMX in some virtual machines, say), which "
            "llama-server's weight repacking uses. Slotkeeper starts it with --no-repack now, and from now "
            "on."))
        return True

    def save_leftover(self, record: dict[str, Any]) -> None:
        """A server an earlier run left running with other settings (Slotkeeper was killed): save what
        its slots hold before it is stopped."""
        try:
            self.loop.call(self._save_leftover(record), timeout=SHUTDOWN_SAVE_TIMEOUT_SECONDS)
        except LoopClosed:
            pass

    # -- on the loop ------------------------------------------------------------------------
    async def _save_leftover(self, record: dict[str, Any]) -> None:
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
