"""The engine: supervisor + llama-server client + sessions, owned by one event loop.

Who owns what (see docs/ARCHITECTURE.md):
- The engine's state (settings, the launched profile, the model, the server facts, the slot
  table, the autosave policy, the activity) lives on the engine loop (``EngineLoop``) and changes
  only there. After every change the engine publishes an immutable ``EngineSnapshot``; other
  threads read that, never the state itself.
- The supervisor thread runs the process; its state events are posted to the loop. Its launch
  spec is built on the loop (``_prepare_launch``).
- The log tailer's lines are posted to the loop, where ``SlotLogParser`` turns them into
  per-request figures.
- The GUI and `serve` post commands (``post(engine.restore_async(...))``, or the blocking
  wrappers ``start()``, ``stop()``, ``restore()``... from any thread but the loop's).
- Blocking work (HTTP, disk) runs on the loop's executors; slot actions are serialised per slot
  by an ``asyncio.Lock``, so a save of slot 0 never stalls polling or slot 1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from slotkeeper.core import datalock, families
from slotkeeper.core.autosave import IDLE_POLL_SECONDS, POLL_SECONDS, AutosavePolicy
from slotkeeper.core.client import LlamaClient, ServerError, ServerUnavailable
from slotkeeper.core.demo_model import DEMO_NOTICE
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.frontdesk import UNKNOWN, Figures, FrontDesk, FrontDeskError, restore_mode
from slotkeeper.core.engine.frontdoor import DoorPolicy, FrontDoor
from slotkeeper.core.engine.launching import LaunchPlan, Prelaunched, binary_facts_cache, plan_launch
from slotkeeper.core.engine.loop import EngineLoop, LoopClosed
from slotkeeper.core.engine.model import (
    LLAMA_BUILD_FALLBACK,
    ModelChoice,
    llama_build_tag,
    model_facts_cache,
    profile_model_name,
    resolve_model,
    resolve_projector,
    server_facts,
    swa_note,
)
from slotkeeper.core.engine.planning import LaunchCandidate, plan_launch_restores
from slotkeeper.core.engine.searching import Described, complete_partial, index_saved
from slotkeeper.core.engine.slots import PendingReuse, SlotTable, judge_reuse
from slotkeeper.core.events import (
    ActivityChanged,
    EngineReady,
    EventBus,
    FolderTidied,
    NoticeRaised,
    RequestDone,
    RestoreReused,
    SaveFailed,
    SearchIndexRepaired,
    ServerStateChanged,
    SessionRefused,
    SessionRestored,
    SessionSaved,
    SessionsPruned,
    SlotRecomputed,
    SlotsChanged,
    WarningRaised,
)
from slotkeeper.core.history import RequestHistory, RequestRecord
from slotkeeper.core.model_hash import ModelHashCache
from slotkeeper.core.paths import AppPaths
from slotkeeper.core.server.apikey import DoorKeys, exposure_refusal
from slotkeeper.core.server.command import user_wants
from slotkeeper.core.server.private import PrivateAddress
from slotkeeper.core.server.state import RUNNING_STATES, ServerState
from slotkeeper.core.server.supervisor import LaunchSpec, Supervisor, SupervisorError, port_user
from slotkeeper.core.services.sessions import SessionsService, reconcile_search
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.in_slots import clear_in_slots, publish_in_slots
from slotkeeper.core.sessions.index import SessionsIndex
from slotkeeper.core.sessions.lineage import DEFAULT_TAIL_SLACK, common_prefix_len
from slotkeeper.core.sessions.naming import new_incoming_name
from slotkeeper.core.sessions.restoring import RestoreRefused, check_restorable, record_restore, record_reuse
from slotkeeper.core.sessions.saving import (
    SaveContext,
    SaveError,
    SaveOutcome,
    Written,
    check_written,
    commit_written,
    server_refused,
)
from slotkeeper.core.sessions.search import SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.sidecar import parse_utc
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, unlink_quietly
from slotkeeper.core.settings import ServerProfile, Settings, SettingsError, connect_url
from slotkeeper.core.tokens import TokenArray, as_tokens
from slotkeeper.core.views import Activity, RestoreSummary, SavesReport, SaveSummary, SlotView

log = logging.getLogger(__name__)

T = TypeVar("T")

SHUTDOWN_SAVE_TIMEOUT_SECONDS = 120.0
SLOT_ACTION_TIMEOUT_SECONDS = 600.0  # a busy slot defers the action until it is idle
SWITCH_REASON = "before switching conversations"
LAUNCH_ATTEMPTS = 3
HASH_PROGRESS_SECONDS = 0.5
LAUNCH_SPEC_TIMEOUT_SECONDS = 120.0
# The sessions index on disk is a cache for the next process (which repairs it by stat): written
# at most this often while sessions change, and when the engine closes. With thousands of
# sessions a write is megabytes of JSON.
INDEX_WRITE_DELAY_SECONDS = 30.0
# llama-server checks whether a non-streamed request's client is still there when it has waited a
# second (HTTP_POLLING_SECONDS) without a result for any task; a /slots poll is a result.
ABANDONED_POLL_SECONDS = 1.5
ABANDONED_GIVE_UP_SECONDS = 120.0


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state as one immutable value, for any thread (the GUI reads this)."""

    state: ServerState = ServerState.STOPPED
    state_message: str = ""
    ready: bool = False  # launch work done: the server's slots hold what was restored
    settings: Settings = Settings()
    launched_profile: ServerProfile | None = None  # what the running server was started with
    model: ModelChoice | None = None
    facts: ServerFacts | None = None
    slots: tuple[SlotView, ...] = ()
    in_slots: frozenset[str] = frozenset()
    activity: Activity = Activity()
    started_at: float | None = None  # unix time the server became ready
    swa_note: str | None = None

    @property
    def running_profile(self) -> ServerProfile:
        """What the running server was launched with; settings edited since apply at the next start."""
        return self.launched_profile or self.settings.profile

    @property
    def base_url(self) -> str:
        return self.running_profile.base_url

    @property
    def model_name(self) -> str:
        if self.model is not None:
            return self.model.display_name
        return profile_model_name(self.settings.profile.model_path)


class Engine:
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
        self.store = SessionStore(paths.sessions_dir, index_file=paths.sessions_index_file)
        # What was said in every saved conversation (searched by the faces through the service).
        self.search = SearchIndex(paths.search_index_file)
        self.sessions = SessionsService(self.store, in_slots=lambda: self._snapshot.in_slots,
                                        budget=lambda: self._snapshot.settings.budget_bytes,
                                        on_deleted=lambda sid: self.loop.call_soon(self._index_forget, sid),
                                        search=self.search,
                                        on_repaired=lambda r: self.events.emit(SearchIndexRepaired(r.added, r.dropped)))
        self.hashes = ModelHashCache(paths.hash_cache_file)
        self.history = RequestHistory(paths.history_file)
        self._prelaunched = prelaunched
        if prelaunched is not None:
            prelaunched.taken = True
            self.model_facts, self.binary_facts = prelaunched.model_facts, prelaunched.binary_facts
            self.supervisor = prelaunched.supervisor
            self.supervisor.set_planner(self._launch_spec, self._save_leftover)
        else:
            self.model_facts = model_facts_cache(paths.model_facts_file)
            self.binary_facts = binary_facts_cache(paths.binary_facts_file)
            self.supervisor = Supervisor(
                spec_factory=self._launch_spec,
                log_path=paths.server_log,
                state_file=paths.server_state_file,
                events=self.events,
                before_stopping_leftover=self._save_leftover,
            )
        self.loop = EngineLoop()
        self.ready = threading.Event()  # set once launch restores are done (for wait_ready)

        # -- state owned by the loop -------------------------------------------------------
        self._settings = settings
        self._launched: ServerProfile | None = None
        self._model: ModelChoice | None = None
        self._facts: ServerFacts | None = None
        self._llama_build = LLAMA_BUILD_FALLBACK
        self._server_state = ServerState.STOPPED
        self._state_message = ""
        self._ready = False
        self._resume_id: str | None = None
        self._crashed = False
        self._closed = False
        self._policy = AutosavePolicy(settings.idle_save_seconds, changes_from_polls=False)
        self._slots = SlotTable()
        self._slot_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._commits: dict[asyncio.Future, TokenArray] = {}  # saves committing after a switch, and their tokens
        self._activity = Activity()
        self._http: LlamaClient | None = None
        self._poller: asyncio.Task[None] | None = None
        self._idle_saves: set[int] = set()
        self._swa_note: str | None = None
        self._never_help_said = False
        self._after_ready: asyncio.Task[None] | None = None
        self._hashing: asyncio.Future[str] | None = None
        self._published_in_slots: frozenset[str] | None = None
        self._swept: asyncio.Future[Any] | None = None
        self._private: PrivateAddress | None = None  # llama-server's own port and key
        self._serving = asyncio.Event()  # set while the server is ready for requests
        self._index_dirty = False
        self._completing: asyncio.Task[None] | None = None  # filling in the search index's partial entries
        self._emitted_slots: Any = None  # the slots the last SlotsChanged carried
        self._poll_wake = asyncio.Event()  # a request began: poll now, and often while it runs
        self._starting_since: float | None = None  # when the current launch began (monotonic)
        self._load_seconds = 1.0  # how long the last launch took to be ready
        self._restart_at = 0.0  # when a restart after a crash launches (monotonic)
        self._door_keys: DoorKeys | None = None  # the user's keys for the front door (per launch)
        self._abandoned: dict[int, float] = {}  # slots running a request whose client left, since when
        self._polling_slowly = False
        self.desk = FrontDesk(self)
        self.front = FrontDoor(self.desk, upstream=self._upstream, policy=self._door_policy)
        self._snapshot = EngineSnapshot(settings=settings)

        self._unsubscribe = self.events.subscribe(self._from_supervisor, ServerStateChanged)
        if own_thread:
            self.loop.start_thread()

    # =====================================================================================
    # Reading: any thread
    # =====================================================================================
    @property
    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    @property
    def settings(self) -> Settings:
        return self._snapshot.settings

    @property
    def profile(self) -> ServerProfile:
        return self._snapshot.settings.profile

    @property
    def running_profile(self) -> ServerProfile:
        return self._snapshot.running_profile

    @property
    def launched_profile(self) -> ServerProfile | None:
        return self._snapshot.launched_profile

    @property
    def base_url(self) -> str:
        return self._snapshot.base_url

    @property
    def facts(self) -> ServerFacts | None:
        return self._snapshot.facts

    @property
    def model(self) -> ModelChoice | None:
        return self._snapshot.model

    @property
    def state(self) -> ServerState:
        return self.supervisor.state

    @property
    def api_key(self) -> str | None:
        """A key the front door takes now (None: it takes none), for Slotkeeper's own clients of it."""
        return DoorKeys(self.running_profile.extra_args).first()

    def client(self, timeout: float = 10.0) -> LlamaClient:
        """A client for the running server (slot actions may take up to ``timeout``)."""
        return LlamaClient(self.base_url, timeout=min(timeout, 10.0), api_key=self.api_key,
                           slot_action_timeout=timeout)

    def add_log_listener(self, fn: Callable[[str], None]) -> None:
        """``fn(line)`` for every line llama-server logs, on the log tailer's thread."""
        self.supervisor.add_log_listener(fn)

    def remove_log_listener(self, fn: Callable[[str], None]) -> None:
        self.supervisor.remove_log_listener(fn)

    def log_tail(self, n: int) -> list[str]:
        """The server log's last ``n`` lines (reads the file: not on the GUI thread)."""
        return self.supervisor.log_tail(n)

    def wait_ready(self, timeout: float | None = None) -> ServerState:
        """Waits for the engine's ready (after launch restores) or a terminal state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.supervisor.state
            if state in (ServerState.FAILED, ServerState.STOPPED):
                return state
            if self.ready.is_set():
                return ServerState.READY
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return state
            self.ready.wait(0.05 if remaining is None else min(0.05, remaining))

    # =====================================================================================
    # Commands: blocking wrappers for other threads, coroutines for the loop
    # =====================================================================================
    def post(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run one of the ``*_async`` commands on the engine loop; returns a future at once."""
        return self.loop.post(coro)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.loop.call(coro, timeout)

    def start(self, resume_id: str | None = None) -> None:
        self._call(self.start_async(resume_id))

    def stop(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport:
        return self._call(self.stop_async(save, timeout))

    def restart(self) -> None:
        self._call(self.restart_async())

    def close(self, save: bool = True) -> SavesReport:
        """The final stop (app quit), then the loop ends: no server outlives us, nothing runs after."""
        try:
            report = self._call(self.close_async(save))
        except LoopClosed:
            report = SavesReport()
        self.dispose()
        return report

    def dispose(self) -> None:
        """End the engine loop (after ``close_async``); from any thread but the loop's."""
        self._unsubscribe()
        self.loop.close()
        self.search.close()

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run the engine loop on this thread until ``main`` returns (`slotkeeper serve`)."""
        try:
            return self.loop.run(main)
        finally:
            self._unsubscribe()

    def restore(self, session_id: str, slot: int | None = None) -> RestoreSummary | None:
        return self._call(self.restore_async(session_id, slot))

    def save_slot(self, slot: int) -> SaveSummary | None:
        return self._call(self.save_slot_async(slot))

    def save_changed_slots(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                           reason: str = "shutdown") -> SavesReport:
        return self._call(self.save_changed_slots_async(timeout, reason))

    def update_settings(self, settings: Settings) -> None:
        self._call(self.update_settings_async(settings))

    def switch_model(self, settings: Settings, resume_id: str | None = None) -> SavesReport:
        return self._call(self.switch_model_async(settings, resume_id))

    # -- lifecycle ------------------------------------------------------------------------
    async def start_async(self, resume_id: str | None = None) -> None:
        if self._closed:
            log.info("not starting llama-server: Slotkeeper is quitting")
            return
        pre, self._prelaunched = self._prelaunched, None
        if pre is None:
            await self._sweep_once()
        elif self._swept is None:  # llama-server is loading already: tidy the folder meanwhile
            self._swept = asyncio.ensure_future(self.loop.run_io(self._open_folder))
        if not self.front.running:
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
        self.ready.clear()
        self._ready = False
        self._facts = None  # facts describe one running server; a new launch works them out again
        self._emitted_slots = None  # the faces forget the slots of a stopped server
        self._resume_id = resume_id
        self._crashed = False
        self._publish()
        if pre is not None:
            self._take_plan(pre.plan)
            self.events.release()  # what the supervisor said before the engine was listening
            return
        self.supervisor.start()

    async def _sweep_once(self) -> None:
        """Tidy the sessions folder and bring the sessions index up to date, once."""
        if self._swept is None:
            self._swept = asyncio.ensure_future(self.loop.run_io(self._open_folder))
        try:
            await asyncio.shield(self._swept)
        except OSError as exc:
            log.warning("could not tidy the sessions folder: %s", exc)

    def _open_folder(self) -> None:  # an I/O thread
        removed = self.store.sweep()  # brings the sessions index up to the folder (by stat) as it goes
        if removed:
            self.events.emit(FolderTidied(tuple(removed)))
        self.store.index_tokens()  # token lists of sessions new or changed since it was kept
        self.store.save_index()
        try:
            repaired = reconcile_search(self.search, self.store, self.store.listing())
            if repaired:
                self.events.emit(SearchIndexRepaired(repaired.added, repaired.dropped))
        except (sqlite3.Error, SearchUnavailable) as exc:
            self.events.emit(WarningRaised(f"searching saved conversations by content is not available: {exc}"))

    @property
    def index(self) -> SessionsIndex:
        """The sessions index (the store keeps it true; routing and lineage read it)."""
        return self.store.index

    async def stop_async(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                         keep_front_door: bool = False) -> SavesReport:
        """Save every changed slot (with progress), then stop the server. The report says which
        changed slots could not be saved (their conversations are lost when the server stops).
        The front door closes first, unless the server is only restarting (then requests wait)."""
        if not keep_front_door:
            await self.front.stop()
        self._serving.clear()
        self._stop_poller()
        await self.await_commits()  # saves finishing after a switch: before llama-server stops
        if self._after_ready is not None and not self._after_ready.done():
            self._after_ready.cancel()
        report = SavesReport()
        if save and self.supervisor.state is ServerState.READY and self._facts is not None:
            try:
                report = await self.save_changed_slots_async(timeout, "shutdown")
            finally:
                await self.loop.run_io(self.supervisor.stop)
        else:
            await self.loop.run_io(self.supervisor.stop)
        self._launched = None
        self._close_http()
        self._published_in_slots = None
        self.loop.in_background(clear_in_slots, self.paths.in_slots_file, what="clearing the in-slots file")
        self._publish()
        return report

    async def close_async(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport:
        """The final stop: after it start_async() does nothing, so a queued Start cannot outlive Quit."""
        self._closed = True
        report = await self.stop_async(save=save, timeout=timeout)
        try:
            await self.loop.run_io(self.store.save_index)
        except OSError as exc:  # a cache: the next process rebuilds what it lacks
            log.info("could not keep the sessions index: %s", exc)
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

    def known_model_sha256(self, model_path: str | Path) -> str | None:
        """The model's SHA-256 if it was hashed before and is unchanged (a stat and a small file;
        any thread but the GUI's)."""
        facts = self._snapshot.facts
        if facts is not None and facts.model_path == os.path.realpath(model_path):
            return facts.model_sha256
        return self.hashes.cached(model_path)

    async def update_settings_async(self, settings: Settings) -> None:
        budget_changed = settings.budget_bytes != self._settings.budget_bytes
        self._settings = settings
        self._policy.idle_save_seconds = max(0.0, float(settings.idle_save_seconds))
        self._publish()
        if budget_changed:
            await self._prune()

    # -- from the supervisor (its thread) -------------------------------------------------
    def _from_supervisor(self, event: ServerStateChanged) -> None:
        self.loop.call_soon(self._on_server_state, event)

    def _launch_spec(self) -> LaunchSpec:
        """The supervisor asks for the launch spec on its thread; it is built on the loop."""
        try:
            return self.loop.call(self._prepare_launch(), timeout=LAUNCH_SPEC_TIMEOUT_SECONDS)
        except LoopClosed as exc:
            raise SupervisorError("Slotkeeper is quitting") from exc

    async def _prepare_launch(self) -> LaunchSpec:
        plan = await self.loop.run_io(lambda: plan_launch(self.paths, self._settings.profile, self.model_facts,
                                                          self.binary_facts, self.supervisor.leftover_port()))
        self._take_plan(plan)
        return plan.spec

    def _take_plan(self, plan: LaunchPlan) -> None:
        """A launch begins (on the loop): what it runs, and what to say about it."""
        self._model = plan.model
        self._launched = plan.profile
        self._door_keys = DoorKeys(plan.profile.extra_args)
        self._private = plan.private
        self._close_http()  # a client of the previous address
        self._start_hashing(plan.model.path)
        if plan.model.is_demo:
            self.events.emit(NoticeRaised(DEMO_NOTICE))
        for note in plan.notes:
            self.events.emit(WarningRaised(note))
        self._publish()

    def _upstream(self) -> tuple[str, str]:
        """llama-server's private base URL and key (the front door's way in)."""
        private = self._private
        if private is None:
            return ("http://127.0.0.1:1", "")
        return (private.url, private.key)

    def _door_policy(self) -> DoorPolicy:
        """What clients may reach through the front door, and with which keys (on the loop)."""
        profile = self._running_profile()
        if self._door_keys is None:
            self._door_keys = DoorKeys(profile.extra_args)
        facts = self._facts
        return DoorPolicy(self._door_keys, slots=user_wants(profile.extra_args, "slots"),
                          metrics=user_wants(profile.extra_args, "metrics"),
                          n_slots=facts.n_parallel if facts is not None else profile.parallel)

    def _on_server_state(self, event: ServerStateChanged) -> None:
        self._server_state = event.state
        self._state_message = event.message
        now = time.monotonic()
        if event.state is ServerState.STARTING:
            self._starting_since = now
        elif event.state is ServerState.RESTARTING:
            self._restart_at = now + (event.delay or 0.0)
        if event.state is ServerState.READY:
            if self._starting_since is not None:
                self._load_seconds = now - self._starting_since
            # Launch work (restores) runs as a task; "ready" is announced only after it, so a
            # client that waits for ready hits the cache.
            self._after_ready = self.loop.spawn(self._after_server_ready(), "launch restores")
        else:
            self.ready.clear()
            self._serving.clear()
            self._ready = False
            self._swa_note = None
            if event.state in (ServerState.CRASHED, ServerState.STOPPED, ServerState.FAILED) and self._after_ready:
                self._after_ready.cancel()
            if event.state is not ServerState.STOPPING:
                self._facts = None  # stale once the server is gone (or is being replaced)
            if event.state is ServerState.CRASHED:
                self._crashed = True
            if event.state is not ServerState.STARTING:
                self._stop_poller()
            if event.state in (ServerState.STOPPED, ServerState.FAILED):
                self._slots.clear()
                self._close_http()
                self._publish_slots()
        self._publish()

    # -- launch ---------------------------------------------------------------------------
    def _start_hashing(self, path: Path) -> None:
        """Hash the model while llama-server loads it (both read the file; the page cache helps)."""
        self._hashing = None
        if self.hashes.cached(path):
            return
        last = [0.0]

        def progress(done: int, total: int) -> None:  # an I/O thread
            now = time.monotonic()
            if now - last[0] >= HASH_PROGRESS_SECONDS or done == total:
                last[0] = now
                self.loop.call_soon(self._set_activity, Activity("hashing", f"identifying {path.name}", done, total))

        self._hashing = asyncio.ensure_future(self.loop.run_io(self.hashes.compute, path, progress))

    async def _after_server_ready(self) -> None:
        restored: list[RestoreSummary] = []
        api_ok = False
        try:
            for attempt in range(LAUNCH_ATTEMPTS):
                try:
                    self._facts = await self._server_facts()
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
            api_ok = self._facts is not None
        if api_ok:
            self._start_poller()
            self.complete_search()
        self._ready = True
        self._serving.set()
        self._swa_note = swa_note(self._model, self._running_profile())
        self.ready.set()
        self._publish()
        self.events.emit(EngineReady(self.base_url, tuple(restored)))

    async def _server_facts(self) -> ServerFacts:
        model = self._model
        if model is None:
            model = self._model = await self.loop.run_io(resolve_model, self._settings.profile.model_path,
                                                         self.paths.models_dir, self.model_facts)
        hashing, self._hashing = self._hashing, None
        if hashing is not None:
            try:
                await hashing
            except Exception as exc:  # retried (and reported) just below
                log.warning("hashing %s failed: %s", model.path, exc)
        sha = await self.loop.run_io(self.hashes.compute, model.path)
        profile = self._running_profile()
        mmproj_sha = await self.loop.run_io(self._projector_sha256, profile)
        self._set_activity(Activity())
        http = self._client()
        props = await self.loop.run_io(http.props)
        self._llama_build = llama_build_tag(props.build_info)
        return server_facts(model, sha, props, profile, mmproj_sha)

    def _projector_sha256(self, profile: ServerProfile) -> str | None:  # an I/O thread
        path = resolve_projector(profile.mmproj_path)
        return None if path is None else self.hashes.compute(path)

    async def _launch_restores(self) -> list[RestoreSummary]:
        await self._sweep_once()  # the folder tidied and the index up to date (a prelaunch does it meanwhile)
        facts = self._facts
        assert facts is not None
        n_slots = facts.n_parallel
        if self.supervisor.adopted:
            # Its slots hold what they held (not known here): another conversation saves them first.
            self.desk.reset(n_slots, unknown=True)
            self._slots.reset(n_slots, facts.n_ctx_slot)
            return []
        after_crash = None
        if self._crashed:
            after_crash = {w.slot: w.session_id for w in self._policy.slots.values() if w.session_id}
            # A save llama-server was writing when it died left an incoming file: once no commit is
            # still using one, the folder is tidied now rather than at the next start.
            await self.await_commits()
            async with contextlib.AsyncExitStack() as held:  # and no save of the last run is still at work
                for slot in sorted(self._slot_locks):
                    await held.enter_async_context(self._slot_locks[slot])
                removed = await self.loop.run_io(self.store.sweep)
            if removed:
                self.events.emit(FolderTidied(tuple(removed)))
        self._policy = AutosavePolicy(self._settings.idle_save_seconds, changes_from_polls=False)
        self._crashed = False
        self._slots.reset(n_slots, facts.n_ctx_slot)
        self.desk.reset(n_slots)
        http = self._client()
        candidates: list[LaunchCandidate] = []
        if after_crash is None:
            listing = await self.loop.run_io(self.store.listing)
            candidates = [
                LaunchCandidate(e.id, parse_utc(e.sidecar.last_used_at).timestamp(),
                                usable=not e.problems and not check_compatible(e.sidecar, facts)
                                and facts.restore_mode != families.RESTORE_NEVER)
                for e in listing.sessions if e.sidecar is not None
            ]
        used = {info.id for info in await self.loop.run_io(http.slots) if info.id_task is not None}
        plan = plan_launch_restores(n_slots=n_slots, candidates=candidates, limit=self._settings.restore_on_start,
                                    resume_id=self._resume_id, after_crash=after_crash, used_slots=used)
        done: list[RestoreSummary] = []
        for i, (slot, sid) in enumerate(sorted(plan.items())):
            self._set_activity(Activity("restoring", sid, i, len(plan)))
            outcome = await self.restore_async(sid, slot)
            if outcome:
                done.append(outcome)
        self._set_activity(Activity(None, "", len(plan), len(plan)))
        now = time.monotonic()
        self._policy.observe(await self.loop.run_io(http.slots), now)
        restored = {d.slot for d in done}
        for w in self._policy.slots.values():
            # The baseline is what we restored (or an empty slot); anything else is news.
            w.changed = w.slot not in restored and w.last_task is not None
            if w.changed and w.idle_since is None and not w.processing:
                w.idle_since = now
        if done:
            note = swa_note(self._model, self._running_profile())
            if note:
                self.events.emit(WarningRaised(note))
        return done

    # -- restores -------------------------------------------------------------------------
    async def restore_async(self, session_id: str, slot: int | None = None) -> RestoreSummary | None:
        """Restore a saved session into ``slot`` (or a free one). Returns a summary, or None when
        it was refused (a SessionRefused event says why)."""
        facts = self._facts
        if facts is None:
            raise EngineError("the server is not ready")
        holder = next((w.slot for w in self._policy.slots.values() if w.session_id == session_id), None)
        if holder is not None and (slot is None or slot == holder) and await self._still_holds(holder, session_id):
            # Already in a slot (possibly with newer, unsaved turns): restoring would go back in time.
            entry = await self.loop.run_io(self.store.get, session_id)
            summary = RestoreSummary(session_id, holder, 0, 0.0, entry.sidecar.title if entry.sidecar else "",
                                     already_loaded=True)
            self.events.emit(SessionRestored(summary))
            return summary
        if slot is None:
            # The slot that held it went on with another conversation: bring it back there.
            slot = holder if holder is not None else self._free_slot(facts.n_parallel)
        if not (0 <= slot < facts.n_parallel):
            raise EngineError(f"slot {slot} does not exist (the server has {facts.n_parallel})")
        async with self._slot_locks[slot]:
            if self._policy.watch(slot).changed and await self._save_locked(slot, "before resume") is None:
                self.events.emit(SessionRefused(session_id, slot, (
                    f"slot {slot} holds a conversation that could not be saved first; nothing was replaced",)))
                return None
            return await self._restore_locked(session_id, slot, facts)

    async def _still_holds(self, slot: int, session_id: str) -> bool:
        """Whether ``slot`` still holds the conversation of ``session_id``, the session it was last
        saved or restored as: yes unless it went on with another one since (its view is detached)
        and its tokens no longer start with the session's (allowing the re-rendered last reply, as
        lineage does). When that is not known, yes: a Resume never risks going back in time."""
        if not self._slots.view(slot).detached:
            return True
        await self.desk.learn_lagging()
        c = self.desk.content(slot)
        if c.held >= UNKNOWN or not len(c.tokens):
            return True
        try:
            entry = await self.loop.run_io(self.store.get, session_id)
            saved = await self.loop.run_io(self.store.tokens, entry)
        except (SessionNotFound, OSError, ValueError):
            return True
        return common_prefix_len(c.tokens, saved) >= len(saved) - DEFAULT_TAIL_SLACK

    async def _restore_locked(self, session_id: str, slot: int, facts: ServerFacts) -> RestoreSummary | None:
        w = self._policy.watch(slot)
        w.busy_with = "restoring"
        self._set_slot(slot, state="restoring")
        http = self._client()
        try:
            try:
                await self.loop.run_io(self.store.ensure_folder)
            except OSError as exc:
                raise RestoreRefused(session_id, [str(exc)]) from exc
            entry = await self.loop.run_io(check_restorable, self.store, session_id, facts)
            assert entry.sidecar is not None
            try:
                result = await self.loop.run_io(http.restore_slot, slot, entry.sidecar.kv_file,
                                                SLOT_ACTION_TIMEOUT_SECONDS)
            except ServerError as exc:
                # A failed restore leaves the slot empty.
                w.session_id, w.changed = None, False
                self.desk.erased(slot)
                self._set_slot(slot, session_id=None, n_tokens=0, detached=False)
                raise RestoreRefused(session_id, [f"llama-server refused it: {exc.message}"]) from exc
            tokens = await self.loop.run_io(self.store.tokens, entry)
        except RestoreRefused as exc:
            self.events.emit(SessionRefused(session_id, slot, tuple(exc.reasons)))
            return None
        finally:
            w.busy_with = None
            self._set_slot(slot, state="idle")
        # In order with the reuse recorded after the first request; off the request's path (the
        # folder lock may be held by a save committing after a switch).
        self.loop.in_background(record_restore, self.store, session_id, slot, result.n_restored,
                                what="recording the restore")
        sc = entry.sidecar
        self._policy.mark_restored(slot, session_id)
        self.desk.restored(slot, tokens, result.restore_ms, result.n_read)
        self._slots.pending[slot] = PendingReuse(session_id, result.n_restored, sc.restore_mode)
        # The prompt figures were the previous conversation's: a restored slot has had no request yet.
        self._set_slot(slot, session_id=session_id, n_tokens=result.n_restored, warning=None, detached=False,
                       n_prompt=0, cache_n=0, prompt_n=0)
        summary = RestoreSummary(session_id, slot, result.n_restored, result.restore_ms, sc.title)
        self.events.emit(SessionRestored(summary))
        return summary

    def _free_slot(self, n_slots: int) -> int:
        views = [self._slots.view(i) for i in range(n_slots)]
        for v in views:
            if not v.session_id and not self.desk.content(v.id).busy and not self._policy.watch(v.id).changed:
                return v.id
        idle = [v for v in views if not self.desk.content(v.id).busy]
        if not idle:
            raise EngineError("every slot is busy; try again when a reply has finished")
        return min(idle, key=lambda v: v.id).id

    # -- saves ----------------------------------------------------------------------------
    async def save_slot_async(self, slot: int) -> SaveSummary | None:
        return await self._save(slot, reason="manual")

    async def _save(self, slot: int, reason: str, timeout: float = SLOT_ACTION_TIMEOUT_SECONDS) -> SaveSummary | None:
        async with self._slot_locks[slot]:
            return await self._save_locked(slot, reason, timeout)

    async def _save_locked(self, slot: int, reason: str,
                           timeout: float = SLOT_ACTION_TIMEOUT_SECONDS) -> SaveSummary | None:
        facts, model = self._facts, self._model
        if facts is None or model is None:
            return None
        w = self._policy.watch(slot)
        generation = w.generation
        if reason != "manual" and self._saves_never_help():
            # Nothing worth keeping: mark it as dealt with so it is not due again and again.
            self._policy.mark_saved(slot, None, generation)
            self._say_saves_never_help()
            return None
        w.busy_with = "saving"
        self._set_slot(slot, state="saving")
        ctx = SaveContext(facts, model.info.arch, self._llama_build)
        try:
            n_prompt = self.desk.content(slot).n_prompt
            known = 0 < n_prompt < UNKNOWN and restore_mode(facts) == families.RESTORE_WORKS
            outcome = await self._write_session(self._client(), ctx, slot, w.session_id, timeout,
                                                n_prompt if known else None)
        except Exception as exc:  # whatever went wrong, the engine and its poller carry on
            self._save_failed(slot, describe_save_error(slot, exc))
            return None
        finally:
            w.busy_with = None
            self._set_slot(slot, state="idle")
        sid = outcome.sidecar.id if outcome.sidecar else None
        self._policy.mark_saved(slot, sid, generation)
        self._set_slot(slot, session_id=sid, detached=False)
        summary = save_summary(slot, reason, outcome)
        self._index_saved(outcome)
        self.events.emit(SessionSaved(summary))
        if outcome.kind in ("new", "update", "fork"):
            await self._prune()
        return summary

    def _saves_never_help(self) -> bool:
        """This model and server cannot reuse a restored slot (sliding window without --swa-full)."""
        facts = self._facts
        return facts is not None and facts.restore_mode == families.RESTORE_NEVER

    def _say_saves_never_help(self) -> None:
        """The launch said why (``swa_note``, once) and how to change it; the log says it here."""
        if not self._never_help_said:
            self._never_help_said = True
            log.info("not saving: restoring this model's conversations would not save any work")

    async def _write_session(self, http: LlamaClient, ctx: SaveContext, slot: int, current_id: str | None,
                             timeout: float, n_prompt: int | None = None) -> SaveOutcome:
        """llama-server writes the slot; the save protocol turns the file into a session. Raises."""
        written, save_ms = await self._write_slot(http, slot, timeout)
        if written is None:
            return SaveOutcome("empty", None)
        return await self._commit_written(http, ctx, written, current_id, save_ms, n_prompt)

    async def _write_slot(self, http: LlamaClient, slot: int, timeout: float) -> tuple[Written | None, float]:
        """llama-server writes the slot to an incoming file, checked whole (None: the slot was empty)."""
        await self.loop.run_io(self.store.ensure_folder)  # recreated if deleted; still private
        name = new_incoming_name()
        try:
            result = await self.loop.run_io(http.save_slot, slot, name, timeout)
        except ServerError as exc:
            await self.loop.run_io(unlink_quietly, self.store.dir / name)
            raise server_refused(self.store, slot, exc.message) from exc
        written = await self.loop.run_io(check_written, self.store, name, result.n_written, slot)
        return written, result.save_ms

    async def _commit_written(self, http: LlamaClient, ctx: SaveContext, written: Written, current_id: str | None,
                              save_ms: float, n_prompt: int | None) -> SaveOutcome:
        described = Described(http)  # keeps the conversation's text for the search index
        outcome = await self.loop.run_io(commit_written, self.store, written, ctx, described, current_id, save_ms,
                                         n_prompt)
        sc = outcome.sidecar
        if sc is not None and outcome.kind in ("new", "update", "fork"):
            self.loop.in_background(index_saved, self.search, sc.id, sc.kv_file, sc.model_sha256, sc.title,
                                    sc.preview, described.text, what="indexing the conversation's text")
        return outcome

    def _save_leftover(self, record: dict[str, Any]) -> None:
        """The supervisor found a server an earlier run left running with other settings (Slotkeeper
        was killed): save what its slots hold before it is stopped. On the supervisor's thread."""
        try:
            self.loop.call(self._save_leftover_async(record), timeout=SHUTDOWN_SAVE_TIMEOUT_SECONDS)
        except LoopClosed:
            pass

    async def _save_leftover_async(self, record: dict[str, Any]) -> None:
        launch = record.get("launch") or {}
        try:
            profile = ServerProfile.from_json(launch["profile"])
            model = await self.loop.run_io(resolve_model, launch["model_path"], self.paths.models_dir,
                                           self.model_facts)
        except (KeyError, TypeError, SettingsError, EngineError) as exc:
            self.events.emit(WarningRaised(
                f"a llama-server left running by an earlier Slotkeeper is stopped without saving its "
                f"conversations: what it ran with is not known ({exc})"))
            return
        url = connect_url(str(record.get("host", profile.host)), int(record.get("port", profile.port)))
        _url, key = self._upstream()  # a server we left runs on the private address we keep
        with LlamaClient(url, timeout=10.0, api_key=key or None,
                         slot_action_timeout=SLOT_ACTION_TIMEOUT_SECONDS) as http:
            try:
                sha = await self.loop.run_io(self.hashes.compute, model.path)
                mmproj_sha = await self.loop.run_io(self._projector_sha256, profile)
                props = await self.loop.run_io(http.props)
                used = [info.id for info in await self.loop.run_io(http.slots) if info.id_task is not None]
            except Exception as exc:
                self.events.emit(WarningRaised(f"could not save the conversations of the llama-server an earlier "
                                               f"Slotkeeper left running: {describe_save_error(None, exc)}"))
                return
            ctx = SaveContext(server_facts(model, sha, props, profile, mmproj_sha), model.info.arch,
                              llama_build_tag(props.build_info))
            for slot in used:
                try:
                    outcome = await self._write_session(http, ctx, slot, None, SLOT_ACTION_TIMEOUT_SECONDS)
                except Exception as exc:
                    self.events.emit(SaveFailed(slot, describe_save_error(slot, exc)))
                    continue
                self.events.emit(SessionSaved(save_summary(slot, "left running", outcome)))

    def _save_failed(self, slot: int, message: str) -> None:
        delay = self._policy.save_failed(slot, time.monotonic())
        log.warning("saving slot %s failed (next try in %.0f s): %s", slot, delay, message)
        self.events.emit(SaveFailed(slot, message))

    async def save_changed_slots_async(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                                       reason: str = "shutdown") -> SavesReport:
        """Save every changed slot within ``timeout`` seconds in all: idle slots first, then the ones
        still generating (llama-server holds a save until the slot is idle). Nothing is saved for a
        model whose restores never help."""
        if self._saves_never_help():
            self._say_saves_never_help()
            return SavesReport()
        try:
            self._policy.observe(await self.loop.run_io(self._client().slots), time.monotonic())
        except (ServerUnavailable, ServerError) as exc:
            self.events.emit(WarningRaised(f"could not reach llama-server to save the slots: {exc}"))
            return SavesReport(unsaved=tuple(self._policy.changed_slots()))
        slots = sorted(self._policy.changed_slots(), key=lambda s: self._policy.watch(s).processing)
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
                self._set_activity(Activity("saving", f"slot {slot}", i, len(slots)))
                out = await self._save(slot, reason=reason, timeout=remaining)
                if out:
                    saved.append(out)
                else:
                    unsaved.append(slot)
        finally:
            self._set_activity(Activity(None, "", len(slots), len(slots)))
        return SavesReport(tuple(saved), tuple(unsaved))

    async def _prune(self) -> None:
        try:
            outcome = await self.loop.run_io(self.sessions.prune, quick=True)
        except (OSError, ValueError) as exc:
            self.events.emit(WarningRaised(f"could not keep the saved sessions under the budget: {exc}"))
            return
        result = outcome.result
        for sid in (result.deleted if result else []):
            self._index_forget(sid)
        if result and result.deleted:
            freed = sum(c.size_bytes for c in outcome.plan.delete if c.id in result.deleted)
            self.events.emit(SessionsPruned(tuple(result.deleted), freed))

    # -- polling --------------------------------------------------------------------------
    def _start_poller(self) -> None:
        self._stop_poller()
        self._poller = self.loop.spawn(self._poll_loop(), "slots poller")

    def _stop_poller(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    async def _poll_loop(self) -> None:
        first = self.supervisor.adopted
        http = self._client()
        delay = 0.0  # the first poll at once: the faces show the slots as soon as we are ready
        while True:
            try:
                await asyncio.wait_for(self._poll_wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            self._poll_wake.clear()
            # Often while a slot works or waits for its idle save; a few times a minute otherwise.
            delay = POLL_SECONDS if self._policy_active() else IDLE_POLL_SECONDS
            if self._abandoned:
                # llama-server notices that a non-streamed request's client left only after a
                # second without news of any task: every /slots poll is news, so poll less.
                delay = max(delay, ABANDONED_POLL_SECONDS)
            self._polling_slowly = delay > POLL_SECONDS
            try:
                slots = await self.loop.run_io(http.slots)
            except (ServerUnavailable, ServerError):
                continue
            now = time.monotonic()
            for info in slots:
                if not info.is_processing or now - self._abandoned.get(info.id, now) > ABANDONED_GIVE_UP_SECONDS:
                    self._abandoned.pop(info.id, None)
            self._policy.observe(slots, now, first=first)
            first = False
            self._slots.observe(slots)
            self._publish_slots()
            for slot in self._policy.due(now):
                if slot not in self._idle_saves:  # not again while one waits for its turn
                    self._idle_saves.add(slot)
                    self.loop.spawn(self._idle_save(slot), f"idle save of slot {slot}")

    def _policy_active(self) -> bool:
        return any(w.changed or w.processing or w.in_request or w.busy_with for w in self._policy.slots.values())

    def quiet_polls_while_abandoned(self, slot: int) -> None:
        """A request on ``slot`` lost its client before its reply began: poll /slots slowly until
        llama-server has stopped it (on the loop)."""
        self._abandoned[slot] = time.monotonic()

    def wake_poller(self) -> None:
        """A request is starting (on the loop): a poller waiting its long interval looks now (and
        often until the slot is saved); one already looking often keeps its pace."""
        if self._polling_slowly:
            self._poll_wake.set()

    async def _idle_save(self, slot: int) -> None:
        try:
            await self._save(slot, reason="idle")
        finally:
            self._idle_saves.discard(slot)

    # -- per-request figures from the server log ------------------------------------------
    # -- the front desk's hooks (on the loop) ----------------------------------------------
    def facts_now(self) -> ServerFacts | None:
        return self._facts

    def slot_watch(self, slot: int):
        return self._policy.watch(slot)

    def slot_lock(self, slot: int) -> asyncio.Lock:
        return self._slot_locks[slot]

    def serving_now(self) -> bool:
        """The server takes requests right now (on the loop: no waiting)."""
        return self._serving.is_set() and not self._closed

    async def wait_serving(self, timeout: float) -> None:
        """Until the server takes requests; FrontDeskError when it is stopped or does not come."""
        deadline = time.monotonic() + timeout
        while not self._serving.is_set():
            state = self.supervisor.state
            if self._closed or state in (ServerState.STOPPED, ServerState.FAILED):
                why = f": {self.supervisor.message}" if state is ServerState.FAILED and self.supervisor.message else ""
                raise FrontDeskError(503, f"llama-server is not running{why}")
            if self._crashed:  # not a request's to wait through: the client retries when it is back
                raise FrontDeskError(503, "llama-server stopped unexpectedly and is being restarted; "
                                          "try again shortly", retry_after=self._restart_eta())
            if time.monotonic() > deadline:
                raise FrontDeskError(503, "llama-server is not ready yet; try again shortly",
                                     retry_after=self._restart_eta())
            try:
                await asyncio.wait_for(self._serving.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    def _restart_eta(self) -> float:
        """Seconds until llama-server should take requests again: the restart's delay, and as long
        as its last launch took to load."""
        now = time.monotonic()
        return max(1.0, self._restart_at - now) + self._load_seconds

    async def save_before_switching(self, slot: int) -> bool:
        """Save what ``slot`` holds before another conversation takes it (its lock is held).
        False: it could not be saved, so it must not be replaced.

        Only llama-server's write waits: once the file is whole (its size and token list
        checked), the other conversation may take the slot, and the rest of the save (hash,
        fsync, lineage, title, commit) runs beside the request. A request that could use the
        session being committed waits for it (``await_commits``), and so does a stop."""
        if self._saves_never_help():  # nothing worth keeping in it
            return await self._save_locked(slot, SWITCH_REASON) is None
        facts, model = self._facts, self._model
        if facts is None or model is None:
            return False
        w = self._policy.watch(slot)
        generation, current_id = w.generation, w.session_id
        n_prompt = self.desk.content(slot).n_prompt
        known = 0 < n_prompt < UNKNOWN and restore_mode(facts) == families.RESTORE_WORKS
        ctx = SaveContext(facts, model.info.arch, self._llama_build)
        http = self._client()
        w.busy_with = "saving"
        self._set_slot(slot, state="saving")
        try:
            written, save_ms = await self._write_slot(http, slot, SLOT_ACTION_TIMEOUT_SECONDS)
        except Exception as exc:  # not written: the conversation stays in its slot
            self._save_failed(slot, describe_save_error(slot, exc))
            return False
        finally:
            w.busy_with = None
            self._set_slot(slot, state="idle")
        # The slot is about to hold another conversation (a restore names it; a new one has none yet).
        self._policy.mark_saved(slot, None, generation)
        w.session_id = None  # the slot's view and the sessions in slots say the same
        self._set_slot(slot, session_id=None, detached=False)
        if written is not None:
            commit = asyncio.ensure_future(self._finish_switch_save(http, ctx, written, current_id, save_ms,
                                                                    n_prompt if known else None))
            self._commits[commit] = as_tokens(written.tokens)
            commit.add_done_callback(lambda done: self._commits.pop(done, None))
        return True

    async def _finish_switch_save(self, http: LlamaClient, ctx: SaveContext, written: Written,
                                  current_id: str | None, save_ms: float, n_prompt: int | None) -> None:
        slot = written.slot
        try:
            outcome = await self._commit_written(http, ctx, written, current_id, save_ms, n_prompt)
        except Exception as exc:  # the slot holds another conversation by now
            message = describe_save_error(slot, exc)
            log.warning("the save of the conversation slot %s held before a switch failed: %s", slot, message)
            self.events.emit(SaveFailed(slot, f"{message} (the conversation it held before the switch keeps "
                                              "its previous save)"))
            return
        self._index_saved(outcome)
        self.events.emit(SessionSaved(save_summary(slot, SWITCH_REASON, outcome)))
        if outcome.kind in ("new", "update", "fork"):
            await self._prune()

    async def await_commits(self, tokens: TokenArray | None = None, beat: int = 0) -> None:
        """Until the saves committing after a switch are done: every one, or (``tokens``) those
        sharing more than ``beat`` tokens with them (the ones a route could choose)."""
        while True:
            waits = [c for c, held in self._commits.items()
                     if tokens is None or common_prefix_len(tokens, held) > beat]
            if not waits:
                return
            await asyncio.wait(waits)

    async def restore_for_request(self, session_id: str, slot: int) -> RestoreSummary | None:
        facts = self._facts
        if facts is None:
            return None
        return await self._restore_locked(session_id, slot, facts)

    async def recompute(self, slot: int, reason: str) -> None:
        """Empty ``slot`` so llama-server computes the request from scratch (its lock is held)."""
        try:
            await self.loop.run_io(self._client().erase_slot, slot)
        except (ServerError, ServerUnavailable) as exc:
            log.warning("could not erase slot %s: %s", slot, exc)
        self.desk.erased(slot)
        session_id = self._policy.watch(slot).session_id
        log.info("slot %s recomputed: %s", slot, reason)
        self.events.emit(SlotRecomputed(slot, session_id, reason))
        pending = self._slots.pending.pop(slot, None)
        if pending is not None:  # the restore was not used, on purpose: not the restore's failure
            why = f"not judged: recomputed because {reason}"
            self.loop.in_background(record_reuse, self.store, pending.session_id, 0, 0, None, why,
                                    what="recording the restore's reuse")
            self.events.emit(RestoreReused(slot, pending.session_id, 0, 0, pending.n_restored, None, why))

    async def best_saved_prefix(self, tokens, beat: int = 0) -> tuple[str, int, int] | None:
        """The saved session sharing the longest prefix with ``tokens``: (id, tokens shared,
        its length), when it is healthy and compatible with the running server. None at once
        (nothing read from disk) when no session can share more than ``beat`` tokens."""
        facts = self._facts
        if facts is None:
            return None
        for hit in self.index.longest_prefix(tokens, facts.model_sha256, limit=2):
            if min(len(tokens), hit.at_most) <= beat:
                return None
            try:
                entry = await self.loop.run_io(self.store.get, hit.session_id)
                if entry.problems or entry.sidecar is None or check_compatible(entry.sidecar, facts):
                    continue
                saved = await self.loop.run_io(self.store.tokens, entry)
            except (OSError, SessionNotFound, ValueError):
                self.index.remove(hit.session_id)  # gone or changed behind our back
                continue
            return hit.session_id, common_prefix_len(tokens, saved), len(saved)
        return None

    def _index_saved(self, outcome: SaveOutcome) -> None:
        if outcome.sidecar is not None:  # the save told the store's index; keep it on disk too
            self._index_changed()

    def _index_forget(self, session_id: str) -> None:
        self.index.forget(session_id)  # the store's delete did; a no-op then
        self._index_changed()

    def _index_changed(self) -> None:
        """Keep the index on disk too, a moment after the last change (one write for a burst)."""
        if self._index_dirty:
            return
        self._index_dirty = True

        async def write_later() -> None:
            await asyncio.sleep(INDEX_WRITE_DELAY_SECONDS)
            self._index_dirty = False
            self.loop.in_background(self.store.save_index, what="saving the sessions index")

        self.loop.spawn(write_later(), "saving the sessions index")

    # -- the search index ---------------------------------------------------------------
    def complete_search(self) -> None:
        """Fill in the full text of the running model's sessions the search index holds only by
        title (on the loop; once at a time; a no-op while no server is ready)."""
        facts = self._facts
        if facts is None or (self._completing is not None and not self._completing.done()):
            return
        self._completing = self.loop.spawn(self._complete_search(facts.model_sha256), "completing the search index")

    async def complete_search_async(self) -> None:
        """``complete_search`` for other threads: ``engine.post(engine.complete_search_async())``."""
        self.complete_search()

    async def _complete_search(self, model_sha256: str) -> None:
        http = self._client()

        def still_serving() -> bool:  # an I/O thread: reads a flag only
            return self._serving.is_set() and self._facts is not None
        try:
            done = await self.loop.run_io(complete_partial, self.search, self.store, http, model_sha256, still_serving)
        except (sqlite3.Error, SearchUnavailable) as exc:
            log.warning("could not complete the search index: %s", exc)
            return
        if done:
            self.events.emit(SearchIndexRepaired(completed=done))

    def session_size(self, session_id: str) -> int:
        entry = self.index.get(session_id)
        return entry.size if entry else 0

    def request_done(self, slot: int, held: int, fig: Figures | None) -> None:
        """A request through the front door finished on ``slot``, which holds ``held`` tokens now."""
        now = time.monotonic()
        self._policy.request_done(slot, now)
        if fig is None:
            self._set_slot(slot, running=False, n_tokens=held)
            return
        at = time.time()
        before = self._slots.view(slot)
        shown: dict[str, Any] = {}
        if before.session_id and 2 * fig.cache_n < before.n_tokens:
            # Another conversation (or a rollback far back, which may be the same one sent again from
            # its start) in this slot: its old title no longer describes it, and the old badge goes
            # with it; the session stays the slot's own (a save, a Resume and the in-slot guard still
            # treat it so) until the next save names what it holds now.
            shown = {"detached": True, "warning": None}
        self._set_slot(slot, running=False, n_prompt=fig.n_prompt, cache_n=fig.cache_n, prompt_n=fig.prompt_n,
                       n_tokens=held, **shown)
        record = RequestRecord(at=at, slot=slot, n_prompt=fig.n_prompt, cache_n=fig.cache_n, prompt_n=fig.prompt_n,
                               prompt_ms=fig.prompt_ms, source=fig.source, saved_ms=fig.saved_ms)
        self.loop.in_background(self.history.append, record, what="recording the request history")
        self.events.emit(RequestDone(slot, 0, fig.n_prompt, fig.cache_n, fig.prompt_n, fig.prompt_ms, at,
                                     fig.source, fig.saved_ms))
        pending = self._slots.pending.pop(slot, None)
        if pending is not None:
            verdict = judge_reuse(pending, fig.cache_n, fig.shared)
            if verdict.reason and (verdict.effective is False or verdict.warn):
                self._set_slot(slot, warning=verdict.reason)  # not judged (another conversation): no badge
            if verdict.warn:
                self.events.emit(WarningRaised(verdict.reason or ""))
            self.loop.in_background(record_reuse, self.store, pending.session_id, fig.cache_n, fig.n_prompt,
                                    verdict.effective, verdict.reason, what="recording the restore's reuse")
            self.events.emit(RestoreReused(slot, pending.session_id, fig.cache_n, fig.n_prompt,
                                           pending.n_restored, verdict.effective, verdict.reason))

    # -- publishing -----------------------------------------------------------------------
    def _client(self) -> LlamaClient:
        """Slotkeeper's own client of llama-server (its private address and key)."""
        if self._http is None:
            url, key = self._upstream()
            self._http = LlamaClient(url, timeout=10.0, api_key=key or None,
                                     slot_action_timeout=SLOT_ACTION_TIMEOUT_SECONDS)
        return self._http

    def _running_profile(self) -> ServerProfile:
        return self._launched or self._settings.profile

    def _close_http(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            self.loop.in_background(http.close, what="closing the HTTP client")

    def _set_activity(self, activity: Activity) -> None:
        self._activity = activity
        self._publish()
        self.events.emit(ActivityChanged(activity))

    def _set_slot(self, slot: int, **changes: Any) -> None:
        self._slots.set(slot, **changes)
        self._publish_slots()

    def _publish_slots(self) -> None:
        self._publish()
        slots = self._snapshot.slots
        if slots != self._emitted_slots:  # a poll that changed nothing wakes no face
            self._emitted_slots = slots
            self.events.emit(SlotsChanged(slots))
        in_slots = self._snapshot.in_slots
        if self._launched is not None and in_slots != self._published_in_slots:
            self._published_in_slots = in_slots
            self.loop.in_background(publish_in_slots, self.paths.in_slots_file, in_slots,
                                    what="recording the sessions in slots")

    def _held_sessions(self) -> frozenset[str]:
        """The saved sessions a slot holds now: the in-slot guard keeps them from being deleted. A
        slot that went on with another conversation (its view detached) no longer holds its old
        session, which may then be deleted (to free a full disk, say); its next save names what
        it holds."""
        return frozenset(w.session_id for w in self._policy.slots.values()
                         if w.session_id and not self._slots.view(w.slot).detached)

    def _publish(self) -> None:
        self._snapshot = EngineSnapshot(
            state=self._server_state,
            state_message=self._state_message,
            ready=self._ready,
            settings=self._settings,
            launched_profile=self._launched,
            model=self._model,
            facts=self._facts,
            slots=self._slots.views(),
            in_slots=self._held_sessions() if self._launched is not None else frozenset(),
            activity=self._activity,
            started_at=self.supervisor.started_at if self._server_state is ServerState.READY else None,
            swa_note=self._swa_note,
        )


def save_summary(slot: int, reason: str, outcome: SaveOutcome) -> SaveSummary:
    sc = outcome.sidecar
    return SaveSummary(slot=slot, kind=outcome.kind, id=sc.id if sc else None, reason=reason,
                       n_tokens=outcome.n_tokens, ms=outcome.save_ms, size_bytes=sc.size_bytes if sc else 0,
                       title=sc.title if sc else "")


def describe_save_error(slot: int | None, exc: BaseException) -> str:
    """A save failure in words; an error we did not expect is logged with its traceback too."""
    if isinstance(exc, (SaveError, ServerUnavailable, ServerError, OSError)):
        return str(exc)
    log.error("saving slot %s failed", slot, exc_info=exc)
    return f"unexpected error: {exc}"


def describe(http: LlamaClient, tokens: list[int]) -> tuple[str, str]:
    """Title and preview of a conversation (a title is nice to have; a save never fails for it)."""
    return Described(http)(tokens)

