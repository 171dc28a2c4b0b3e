"""The engine: supervisor + llama-server link + slots + saved conversations, owned by one event loop.

Who owns what (see docs/ARCHITECTURE.md):
- The engine's state lives on the engine loop (``EngineLoop``) and changes only there: the
  settings, the launch (``ServerLink``: the private address, the model, the server's facts, the
  serving gate), the slots (``SlotBoard``: one record per slot, autosave's policy), the activity.
  After every change the engine publishes an immutable ``EngineSnapshot``; other threads read
  that, never the state itself.
- The engine composes the parts and owns the lifecycle and the launch restores: the slot actions
  (``SlotActions`` restore and erase, ``SlotSaves`` save), the saved conversations (``Library``),
  the poller (``SlotPoller``), the request ledger, and the front desk and door that clients reach.
  None of them calls back into the engine.
- The supervisor thread runs the process; its state events are posted to the loop. Its launch
  spec is built on the loop (``Launcher.spec``).
- The GUI and `serve` post commands (``post(engine.start_async(...))``, or the blocking
  wrappers ``start()``, ``stop()``, ``restore()``... from any thread but the loop's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from slotkeeper.core.basics import datalock
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.desk.frontdesk import FrontDesk
from slotkeeper.core.engine.desk.ledger import RequestLedger
from slotkeeper.core.engine.door.frontdoor import DoorPolicy, FrontDoor
from slotkeeper.core.engine.door.prompts import PromptTokens
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.face import EngineFace
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity
from slotkeeper.core.engine.lifecycle.launcher import Launcher
from slotkeeper.core.engine.lifecycle.launching import (
    Prelaunched,
    binary_facts_cache,
)
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import (
    model_facts_cache,
    resolve_model,
    swa_note,
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
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import (
    ActivityChanged,
    EngineReady,
    Event,
    EventBus,
    LaunchFellBack,
    LaunchPlanned,
    ServerStateChanged,
    SlotsChanged,
    WarningRaised,
)
from slotkeeper.core.history import LaunchRecord, RequestHistory
from slotkeeper.core.model.model_hash import ModelHashCache
from slotkeeper.core.server.apikey import DoorKeys, exposure_refusal
from slotkeeper.core.server.client import ServerError, ServerUnavailable
from slotkeeper.core.server.command import sse_ping_interval, user_wants
from slotkeeper.core.server.state import RUNNING_STATES, ServerState
from slotkeeper.core.server.supervisor import Supervisor, port_user
from slotkeeper.core.services.transcript_check import TranscriptCheck, check_saved
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.in_slots import clear_in_slots, publish_in_slots
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.core.views import Activity, RestoreSummary, SavesReport, SaveSummary

log = logging.getLogger(__name__)


LAUNCH_ATTEMPTS = 3
PREWARM_MAX = 4  # conversations assembled ahead of a launch's restores, at most
POINTS_AT_STOP_SECONDS = 60.0  # at most this long for the restore points owed when the server stops


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
        self._swa_note: str | None = None
        self._after_ready: asyncio.Task[None] | None = None
        self._published_in_slots: frozenset[str] | None = None
        self._snapshot = EngineSnapshot(settings=settings)

        # -- the parts, composed -------------------------------------------------------------
        # Composed one way: each part is handed the parts below it, never a callable of the engine
        # or the door; the engine hears from them through events (first, before any face).
        self.board = SlotBoard(settings.idle_save_seconds, self.events)
        self.link = ServerLink(self.supervisor, self.loop)
        self.library = Library(paths, self.loop, self.events, budget_bytes=settings.budget_bytes)
        self.store, self.search, self.sessions = (self.library.store, self.library.search,
                                                  self.library.sessions)
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
        self.front = FrontDoor(self.desk, self.prompts, upstream=self.link.upstream,
                               policy=self._door_policy())

        self._subscriptions = (
            self.events.subscribe(self._from_parts, SlotsChanged, ActivityChanged, LaunchPlanned, first=True),
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
        """``complete_search`` for other threads: ``engine.post(engine.complete_search_async())``."""
        self.complete_search()

    def complete_search(self) -> None:
        """Fill in the search index's text the running model can give (on the loop)."""
        self.library.complete_search(self.link.facts, self.link.client, self.link.serving_with_facts)

    async def check_transcript_async(self, session_id: str) -> TranscriptCheck | None:
        """Whether a saved conversation's transcript says what its KV file holds (None: it has none,
        or no server of its model runs, which alone can render and tokenize it)."""
        facts = self.link.facts
        if facts is None:
            return None
        entry = await self.loop.run_io(self.store.get, session_id)
        transcript = await self.loop.run_io(self.store.transcript, entry)
        return await self.loop.run_io(check_saved, self.store, entry, transcript, facts.model_sha256,
                                      self.link.client())

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
            await self._open_front_door(pre)
        self.link.serving.clear()
        self.link.facts = None  # facts describe one running server; a new launch works them out again
        self.board.forget_published()  # the faces forget the slots of a stopped server
        self._resume_id = resume_id
        self.link.crashed = False
        self._publish()
        if pre is not None:
            self.launcher.take(pre.plan)
            self.events.release()  # what the supervisor said before the engine was listening
            return
        self.launcher.begin()

    async def _open_front_door(self, pre: Prelaunched | None) -> None:
        profile = self._settings.profile
        refusal = exposure_refusal(profile.host, profile.port, profile.extra_args)
        if refusal:
            if pre is not None:
                pre.abandon()
            raise EngineError(refusal)
        try:
            await self.front.start(profile.host, profile.port, sock=pre.front_socket if pre else None)
        except OSError as exc:
            who = await self.loop.run_io(port_user, profile.host, profile.port)
            what = (f"Port {profile.port} on {profile.host} is already in use by {who}" if who
                    else f"Cannot listen on {profile.host} port {profile.port}: {exc.strerror or exc}")
            raise EngineError(f"{what}. Choose another port in Settings (or --port); Slotkeeper does not "
                              "stop programs it did not start.") from exc

    async def stop_async(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                         keep_front_door: bool = False) -> SavesReport:
        """Save every changed slot (with progress), then stop the server. The report says which
        changed slots could not be saved (their conversations are lost when the server stops).
        The front door closes first, unless the server is only restarting (then requests wait)."""
        if not keep_front_door:
            await self.front.stop()
        self.link.serving.clear()
        self.points.stopping = True  # restore points under way stop after their current step
        self.poller.stop()
        await self.saves.await_commits()  # saves finishing after a switch: before llama-server stops
        if self._after_ready is not None and not self._after_ready.done():
            self._after_ready.cancel()
        report = SavesReport()
        try:
            if save and self.supervisor.state is ServerState.READY and self.link.facts is not None:
                began = time.monotonic()
                report = await self.saves.save_changed(timeout, "shutdown")
                # The restore points every conversation still owes, in bounded time.
                left = min(POINTS_AT_STOP_SECONDS, timeout - (time.monotonic() - began))
                await self.points.at_stop(time.monotonic() + max(0.0, left))
        finally:
            self.launcher.cancel()  # a launch still being planned never runs
            await self.loop.run_io(self.supervisor.stop)
            self.points.stopping = False
        self.link.launched = None
        self.link.close_client()
        self._published_in_slots = None
        self.loop.in_background(clear_in_slots, self.paths.in_slots_file, what="clearing the in-slots file")
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
        budget_changed = settings.budget_bytes != self._settings.budget_bytes
        self._settings = settings
        self.launcher.profile = settings.profile
        self.board.set_idle_save(settings.idle_save_seconds)
        self.library.budget_bytes = settings.budget_bytes
        self.library.point_spacing = settings.point_spacing_tokens
        self.points.enabled = settings.restore_points
        self._publish()
        if budget_changed:
            await self.library.prune()

    # -- from the supervisor (its thread) -------------------------------------------------
    def _from_supervisor(self, event: Event) -> None:
        if isinstance(event, LaunchFellBack):
            self.loop.call_soon(self.launcher.fell_back, event)
        elif isinstance(event, ServerStateChanged):
            self.loop.call_soon(self._on_server_state, event)

    def _door_policy(self) -> DoorPolicy:
        """What clients may reach through the front door, and with which keys (on the loop)."""
        profile = self._running_profile()
        keys = self.launcher.door_keys
        if keys is None:  # no launch yet: the keys the settings name
            keys = self.launcher.door_keys = DoorKeys(profile.extra_args)
        facts = self.link.facts
        return DoorPolicy(keys, slots=user_wants(profile.extra_args, "slots"),
                          metrics=user_wants(profile.extra_args, "metrics"),
                          n_slots=facts.n_parallel if facts is not None else profile.parallel,
                          sse_ping=sse_ping_interval(profile.extra_args))

    def _on_server_state(self, event: ServerStateChanged) -> None:
        self._server_state = event.state
        self._state_message = event.message
        self.link.on_state(event.state, event.delay)
        if event.state is ServerState.READY:
            # Launch work (restores) runs as a task; "ready" is announced only after it, so a
            # client that waits for ready hits the cache.
            self._after_ready = self.loop.spawn(self._after_server_ready(), "launch restores")
        else:  # the link closed its serving gate (link.on_state)
            self._swa_note = None
            if (event.state in (ServerState.CRASHED, ServerState.STOPPED, ServerState.FAILED)
                    and self._after_ready):
                self._after_ready.cancel()
            if event.state is not ServerState.STOPPING:
                self.link.facts = None  # stale once the server is gone (or is being replaced)
            if event.state is not ServerState.STARTING:
                self.poller.stop()
            if event.state in (ServerState.STOPPED, ServerState.FAILED):
                self.link.close_client()
                self.board.clear()
        self._publish()

    # -- launch ---------------------------------------------------------------------------
    async def _after_server_ready(self) -> None:
        restored: list[RestoreSummary] = []
        api_ok = False
        try:
            for attempt in range(LAUNCH_ATTEMPTS):
                try:
                    self.link.facts = await self._server_facts()
                    restored = await self._launch_restores()
                    api_ok = True
                    break
                except (ServerUnavailable, ServerError) as exc:
                    if self.supervisor.state is not ServerState.READY:
                        log.warning("server went away during launch: %s", exc)
                        return  # the supervisor reports the crash and relaunches
                    if attempt == LAUNCH_ATTEMPTS - 1:
                        self.events.emit(WarningRaised(
                            f"llama-server answers /health but not the session API ({exc}); "
                            "conversations are not saved or restored this run"))
                    else:
                        await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave the engine stuck in "starting"
            log.exception("launch restores failed")
            self.events.emit(WarningRaised(f"could not restore sessions: {exc}"))
            api_ok = self.link.facts is not None
        if api_ok:
            self.poller.start(adopted=self.supervisor.adopted)
            self.complete_search()
        self._swa_note = swa_note(self.link.model, self._running_profile())
        self.link.serving.set()  # ready: requests pass, and the snapshot says so
        self._publish()
        # Every face's History marks the launches (a relaunch's too) and what each restored.
        # On the bookkeeping thread: the first append reads the whole history file.
        self.loop.in_background(self.history.append,
                                LaunchRecord(self._snapshot.started_at or time.time(),
                                             tuple(r.slot for r in restored)),
                                what="recording the launch")
        self.events.emit(EngineReady(self.base_url, tuple(restored)))

    async def _server_facts(self) -> ServerFacts:
        model = self.link.model
        if model is None:
            model = self.link.model = await self.loop.run_io(resolve_model, self._settings.profile.model_path,
                                                             self.paths.models_dir, self.model_facts)
        launched = replace(self._running_profile(), flash_attn=self.link.flash_attn)  # as passed
        facts, self.link.llama_build = await self.identity.facts(model, launched, self.link.client())
        return facts

    async def _launch_restores(self) -> list[RestoreSummary]:
        # the folder tidied and the index up to date (a prelaunch does it meanwhile)
        await self.library.sweep_once()
        await self.library.prewarmed()  # the states it restores, assembled while the model loaded
        done = await self.actions.at_launch(self.supervisor.adopted, self._settings.idle_save_seconds,
                                            self._settings.restore_on_start, self._resume_id)
        if done:
            note = swa_note(self.link.model, self._running_profile())
            if note:
                self.events.emit(WarningRaised(note))
        return done

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
        self._publish(door=isinstance(event, LaunchPlanned))
        if isinstance(event, LaunchPlanned) and self.link.model is not None:
            n = self._settings.profile.parallel
            limit = self._settings.restore_on_start
            self.library.begin_prewarm(self.link.staging, str(self.link.model.path),
                                       min(n, limit if limit is not None else n, PREWARM_MAX))
        if not isinstance(event, SlotsChanged):
            return
        self.sessions.hold(self.board.held_sessions())  # before anyone may delete what they hold
        in_slots = self._snapshot.in_slots
        if self.link.launched is not None and in_slots != self._published_in_slots:
            self._published_in_slots = in_slots
            self.loop.in_background(publish_in_slots, self.paths.in_slots_file, in_slots,
                                    what="recording the sessions in slots")

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
            in_slots=self.board.held_sessions() if launched is not None else frozenset(),
            activity=self._activity,
            started_at=self.supervisor.started_at if self._server_state is ServerState.READY else None,
            swa_note=self._swa_note,
        )
        if door:
            self.front.policy = self._door_policy()
