"""The engine: supervisor + llama-server link + slots + saved conversations, owned by one event loop.

Who owns what (see docs/ARCHITECTURE.md):
- The engine's state lives on the engine loop (``EngineLoop``) and changes only there: the
  settings, the launch (``ServerLink``: the private address, the model, the server's facts, the
  serving gate), the slots (``SlotBoard``: one record per slot, autosave's policy), the activity.
  After every change the engine publishes an immutable ``EngineSnapshot``; other threads read
  that, never the state itself.
- The engine composes the parts and hands its commands down to them: the slot actions
  (``SlotActions`` restore and erase, ``SlotSaves`` save, ``RestorePoints``), the saved
  conversations (``Library``), the poller (``SlotPoller``), the request ledger, the launch
  (``Launcher`` plans it, ``LaunchCycle`` runs it from ready to stop), and the front desk and door
  that clients reach. None of them calls back into the engine.
- The supervisor thread runs the process it is handed (``Launcher.begin``); its events are posted
  to the loop.
- The GUI and `serve` post commands (``post(engine.start_async(...))``, or the blocking
  wrappers ``start()``, ``stop()``, ``restore()``... from any thread but the loop's).
"""

from __future__ import annotations

import logging

from slotkeeper.core.basics import datalock
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.desk.frontdesk import FrontDesk
from slotkeeper.core.engine.desk.ledger import RequestLedger
from slotkeeper.core.engine.door.frontdoor import DoorPolicy, FrontDoor, close_door, door_policy, open_door
from slotkeeper.core.engine.door.prompts import PromptTokens
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.face import EngineFace
from slotkeeper.core.engine.lifecycle.cycle import LaunchCycle
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity
from slotkeeper.core.engine.lifecycle.launcher import Launcher
from slotkeeper.core.engine.lifecycle.launching import (
    Prelaunched,
    binary_facts_cache,
)
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import (
    model_facts_cache,
)
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.lifecycle.tuning import FlashAttnTuning
from slotkeeper.core.engine.slots.actions import SlotActions
from slotkeeper.core.engine.slots.board import SlotBoard
from slotkeeper.core.engine.slots.points import RestorePoints
from slotkeeper.core.engine.slots.polling import SlotPoller
from slotkeeper.core.engine.slots.rates import Rates
from slotkeeper.core.engine.slots.saves import (
    SHUTDOWN_SAVE_TIMEOUT_SECONDS,
    SlotSaves,
)
from slotkeeper.core.engine.snapshot import EngineSnapshot
from slotkeeper.core.engine.stored.library import Library, prewarm_count
from slotkeeper.core.events import (
    ActivityChanged,
    EngineReady,
    Event,
    EventBus,
    LaunchFellBack,
    LaunchPlanned,
    ServerStateChanged,
    SlotsChanged,
)
from slotkeeper.core.history import RequestHistory
from slotkeeper.core.model.model_hash import ModelHashCache
from slotkeeper.core.server.apikey import DoorKeys
from slotkeeper.core.server.state import RUNNING_STATES, ServerState
from slotkeeper.core.server.supervisor import Supervisor
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.core.views import Activity, RestoreSummary, SavesReport, SaveSummary

log = logging.getLogger(__name__)




class Engine(EngineFace):
    def __init__(self, paths: AppPaths, settings: Settings, events: EventBus | None = None,
                 *, own_thread: bool = True, prelaunched: Prelaunched | None = None) -> None:
        """``own_thread``: run the engine loop on a thread of its own (the desktop app, tests);
        False when the caller runs it with ``run()`` (`slotkeeper serve`). ``prelaunched``: a
        launch ``launching.prelaunch`` began for these settings, which the first start takes over."""
        self.paths = paths.ensure()
        try:
            datalock.acquire(paths.engine_lock_file, str(paths.data_dir))
        except datalock.DataDirBusy as exc:
            raise EngineError(str(exc)) from exc
        self.events = prelaunched.events if prelaunched is not None else events or EventBus()
        self.loop = EngineLoop()
        self.hashes = ModelHashCache(paths.hash_cache_file)
        self.history = RequestHistory(paths.history_file)
        self._prelaunched = prelaunched
        if prelaunched is not None:
            prelaunched.taken = True
            self.model_facts, self.binary_facts = prelaunched.model_facts, prelaunched.binary_facts
            self.supervisor = prelaunched.supervisor
        else:
            self.model_facts = model_facts_cache(paths.model_facts_file)
            self.binary_facts = binary_facts_cache(paths.binary_facts_file)
            self.supervisor = Supervisor(log_path=paths.server_log,
                                         state_file=paths.server_state_file, events=self.events)

        # -- state owned by the loop -------------------------------------------------------
        self._settings = settings
        self._server_state = ServerState.STOPPED
        self._state_message = ""
        self._resume_id: str | None = None
        self._closed = False
        self._activity = Activity()
        self._snapshot = EngineSnapshot(settings=settings)

        # -- the parts, composed -------------------------------------------------------------
        # Composed one way: each part is handed the parts below it, never a callable of the engine
        # or the door; the engine hears from them through events (first, before any face).
        self.board = SlotBoard(settings.idle_save_seconds, self.events)
        self.link = ServerLink(self.supervisor, self.loop)
        self.library = Library(paths, self.loop, self.events, budget_bytes=settings.budget_bytes)
        self.sessions = self.library.sessions  # the faces' sessions service
        self.identity = ModelIdentity(self.hashes, self.loop, self.events)
        self.rates = Rates()
        self.prompts = PromptTokens(self.link)
        self.saves = SlotSaves(self.board, self.link, self.library, self.loop, self.events)
        self.tuning = FlashAttnTuning(self.board, self.link, self.loop, self.events, self.binary_facts,
                                      self.model_facts)
        self.launcher = Launcher(paths, settings.profile, self.supervisor, self.link, self.identity,
                                 self.saves, self.loop, self.events, self.model_facts, self.binary_facts,
                                 self.tuning)
        self.actions = SlotActions(self.board, self.link, self.library, self.saves, self.loop, self.events,
                                   self.rates, self.prompts)
        self.points = RestorePoints(self.board, self.link, self.library, self.saves, self.actions, self.loop,
                                    self.events, self.prompts)
        self.points.enabled = settings.restore_points
        self.library.point_spacing = settings.point_spacing_tokens
        self.poller = SlotPoller(self.board, self.link, self.loop, self.saves, self.points)
        self.ledger = RequestLedger(self.board, self.history, self.library, self.loop, self.events)
        self.desk = FrontDesk(self.board, self.link, self.actions, self.points, self.saves, self.library,
                              self.ledger, self.poller, self.rates, self.prompts)
        self.cycle = LaunchCycle(paths, self.supervisor, self.launcher, self.link, self.board, self.identity,
                                 self.library, self.actions, self.saves, self.points, self.poller,
                                 self.history, self.loop, self.events, self.model_facts)
        self.front = FrontDoor(self.desk, self.prompts, upstream=self.link.upstream,
                               policy=self._door_policy())

        self._subscriptions = (
            self.events.subscribe(self._from_parts, SlotsChanged, ActivityChanged, LaunchPlanned, EngineReady,
                                  first=True),
            self.events.subscribe(self._from_supervisor, ServerStateChanged, LaunchFellBack),
        )
        if own_thread:
            self.loop.start_thread()

    # =====================================================================================
    # Commands: coroutines on the loop (``EngineFace`` has their blocking wrappers)
    # =====================================================================================
    async def restore_async(self, session_id: str, slot: int | None = None) -> RestoreSummary | None:
        """Restore a saved session into ``slot`` (or a free one); None when it was refused."""
        return await self.actions.restore(session_id, slot)

    async def save_slot_async(self, slot: int) -> SaveSummary | None:
        return await self.saves.save(slot, reason="manual")

    async def save_changed_slots_async(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                                       reason: str = "shutdown") -> SavesReport:
        return await self.saves.save_changed(timeout, reason)

    async def complete_search_async(self) -> None:
        """Fill in the search index's text the running model can give."""
        self.library.complete_search(self.link.facts, self.link.client, self.link.serving_with_facts)

    # -- lifecycle ------------------------------------------------------------------------
    async def start_async(self, resume_id: str | None = None) -> None:
        if self._closed:
            log.info("not starting llama-server: Slotkeeper is quitting")
            return
        pre, self._prelaunched = self._prelaunched, None
        if pre is None:
            await self.library.sweep_once()
        else:  # llama-server is loading already: tidy the folder meanwhile
            self.library.begin_sweep()
        if not self.front.running:
            try:
                await open_door(self.front, self._settings.profile, self.loop, self.paths.door_file,
                                pre.front_socket if pre else None)
            except EngineError:
                if pre is not None:
                    pre.abandon()
                raise
        self.cycle.starting()
        self._resume_id = resume_id
        self._publish()
        if pre is not None:
            self.launcher.take(pre.plan)
            self.events.release()  # what the supervisor said before the engine was listening
            return
        self.launcher.begin()

    async def stop_async(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                         keep_front_door: bool = False) -> SavesReport:
        """``LaunchCycle.stop``; the front door closes first, unless the server is only restarting
        (then requests wait)."""
        if not keep_front_door:
            await close_door(self.front, self.loop, self.paths.door_file)
        report = await self.cycle.stop(save, timeout)
        self.library.slots_emptied()
        self._publish()
        return report

    async def close_async(self, save: bool = True,
                          timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport:
        """The final stop: after it start_async() does nothing, so a queued Start cannot outlive Quit."""
        self._closed = self.link.closed = True
        report = await self.stop_async(save=save, timeout=timeout)
        await self.library.keep_index()
        return report

    async def restart_async(self, resume_id: str | None = None) -> None:
        """Save changed slots, stop, and start again with the current settings."""
        await self.stop_async(save=True, keep_front_door=True)
        await self.start_async(resume_id)

    async def switch_model_async(self, settings: Settings, resume_id: str | None = None,
                                 timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport:
        """Run ``settings`` (another model, or the same one with other settings): every changed
        slot is saved first (with progress), then the server restarts with them; a stopped server
        starts. The report says which changed slots could not be saved (the caller decided to go
        on without them; see ``save_changed_slots_async``)."""
        report = SavesReport()
        if self.supervisor.state in RUNNING_STATES:
            # Turns that arrived since the caller's save are saved here, by the stop.
            report = await self.stop_async(save=True, timeout=timeout, keep_front_door=True)
        await self.update_settings_async(settings)
        await self.start_async(resume_id)
        return report

    async def update_settings_async(self, settings: Settings) -> None:
        self._settings = settings
        self.launcher.profile = settings.profile
        self.board.set_idle_save(settings.idle_save_seconds)
        self.points.enabled = settings.restore_points
        self._publish()
        await self.library.settings_changed(settings.budget_bytes, settings.point_spacing_tokens)

    # -- from the supervisor (its thread) -------------------------------------------------
    def _from_supervisor(self, event: Event) -> None:
        if isinstance(event, LaunchFellBack):
            self.loop.call_soon(self.launcher.fell_back, event)
        elif isinstance(event, ServerStateChanged):
            self.loop.call_soon(self._on_server_state, event)

    def _door_policy(self) -> DoorPolicy:
        """What clients may reach through the front door, and with which keys (on the loop)."""
        profile = self._running_profile()
        if self.launcher.door_keys is None:  # no launch yet: the keys the settings name
            self.launcher.door_keys = DoorKeys(profile.extra_args)
        return door_policy(profile, self.launcher.door_keys, self.link.facts)

    def _on_server_state(self, event: ServerStateChanged) -> None:
        self._server_state = event.state
        self._state_message = event.message
        self.cycle.on_state(event, self._settings, self._resume_id)
        self._publish()

    # -- publishing -----------------------------------------------------------------------
    def _running_profile(self) -> ServerProfile:
        return self.link.running_profile(self._settings.profile)

    def _unsubscribe(self) -> None:
        for unsubscribe in self._subscriptions:
            unsubscribe()

    def _from_parts(self, event: Event) -> None:
        """The parts said what changed (on the loop, before any face hears it): the snapshot first.
        Slots and activity change often (every poll, every progress step) and never what the door
        lets through; a launch does."""
        if isinstance(event, ActivityChanged):
            self._activity = event.activity
        self._publish(door=isinstance(event, (LaunchPlanned, EngineReady)))
        if isinstance(event, LaunchPlanned) and self.link.model is not None:
            n = prewarm_count(self._settings.profile.parallel, self._settings.restore_on_start)
            self.library.begin_prewarm(self.link.staging, str(self.link.model.path), n)
        if isinstance(event, SlotsChanged):
            self.library.set_in_slots(self.board.in_slots(), self.link.launched is not None)

    def _publish(self, door: bool = True) -> None:
        """A new snapshot; with ``door``, the door's policy too (the launch, its facts or the
        settings may have changed)."""
        launched = self.link.launched
        self._snapshot = EngineSnapshot(
            state=self._server_state,
            state_message=self._state_message,
            ready=self.link.serving.is_set(),
            settings=self._settings,
            launched_profile=launched,
            model=self.link.model,
            facts=self.link.facts,
            slots=self.board.views(),
            waiting=self.board.waiting,
            in_slots=self.board.in_slots() if launched is not None else frozenset(),
            activity=self._activity,
            started_at=self.supervisor.started_at if self._server_state is ServerState.READY else None,
            swa_note=self.cycle.swa_note,
        )
        if door:
            self.front.policy = self._door_policy()
