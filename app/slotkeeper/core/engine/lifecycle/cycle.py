"""A launch's life once planned, in two steps the engine commands.

``ready``: once llama-server answers /health, before "ready" is said, the running server's facts
are worked out, the saved conversations due are restored, the poller starts, and only then is the
serving gate opened and ``EngineReady`` said (a client that waits for ready hits the cache). It
runs as a task, given up when the server goes away (``gone``). The engine hears ``EngineReady``
first, before any face, and publishes.

``stop``: every changed slot saved (with progress), the restore points each conversation still
owes made in bounded time, then llama-server stopped (a launch still being planned never runs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.paths import AppPaths
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity
from slotkeeper.core.engine.lifecycle.launcher import Launcher
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import resolve_model, swa_note
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.engine.slots.actions import SlotActions
from slotkeeper.core.engine.slots.board import SlotBoard
from slotkeeper.core.engine.slots.points import RestorePoints
from slotkeeper.core.engine.slots.polling import SlotPoller
from slotkeeper.core.engine.slots.saves import SlotSaves
from slotkeeper.core.engine.stored.library import Library
from slotkeeper.core.events import EngineReady, EventBus, ServerStateChanged, WarningRaised
from slotkeeper.core.history import LaunchRecord, RequestHistory
from slotkeeper.core.server.client import ServerError, ServerUnavailable
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.server.supervisor import Supervisor
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import RestoreSummary, SavesReport

log = logging.getLogger(__name__)

LAUNCH_ATTEMPTS = 3
POINTS_AT_STOP_SECONDS = 60.0  # at most this long for the restore points owed when the server stops


class LaunchCycle:
    def __init__(self, paths: AppPaths, supervisor: Supervisor, launcher: Launcher, link: ServerLink,
                 board: SlotBoard, identity: ModelIdentity, library: Library, actions: SlotActions,
                 saves: SlotSaves, points: RestorePoints, poller: SlotPoller, history: RequestHistory,
                 loop: EngineLoop, events: EventBus, model_facts: FileFactsCache) -> None:
        self.paths = paths
        self.board = board
        self.launcher = launcher
        self.saves = saves
        self.points = points
        self.supervisor = supervisor
        self.link = link
        self.identity = identity
        self.library = library
        self.actions = actions
        self.poller = poller
        self.history = history
        self.loop = loop
        self.events = events
        self.model_facts = model_facts
        self.swa_note: str | None = None  # what to say of the running launch's sliding window
        self._ready: asyncio.Task[None] | None = None

    def starting(self) -> None:
        """A launch begins: what described the last one is forgotten (the faces forget its slots)."""
        self.link.serving.clear()
        self.link.facts = None  # facts describe one running server; a new launch works them out again
        self.board.forget_published()
        self.link.crashed = False

    def on_state(self, event: ServerStateChanged, settings: Settings, resume_id: str | None) -> None:
        """The supervisor's state changed (on the loop): what it means to the parts."""
        self.link.on_state(event.state, event.delay)
        if event.state is ServerState.READY:
            # The launch's work (restores) runs as a task; "ready" is said only after it.
            self._ready = self.loop.spawn(self._run(settings, resume_id), "launch restores")
            return
        # the link closed its serving gate (link.on_state)
        if event.state in (ServerState.CRASHED, ServerState.STOPPED, ServerState.FAILED):
            self.gone()
        if event.state is not ServerState.STOPPING:
            self.link.facts = None  # stale once the server is gone (or is being replaced)
        if event.state is not ServerState.STARTING:
            self.poller.stop()
        if event.state in (ServerState.STOPPED, ServerState.FAILED):
            self.link.close_client()
            self.board.clear()

    def gone(self) -> None:
        """The server went away: the launch's work under way is given up."""
        self.swa_note = None
        self._give_up_ready()

    def _give_up_ready(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()

    async def stop(self, save: bool, timeout: float) -> SavesReport:
        """Save every changed slot (with progress) and make the restore points owed, then stop the
        server. The report says which changed slots could not be saved (their conversations are
        lost when the server stops)."""
        self.link.serving.clear()
        self.points.stopping = True  # restore points under way stop after their current step
        self.poller.stop()
        await self.saves.await_commits()  # saves finishing after a switch: before llama-server stops
        self._give_up_ready()
        report = SavesReport()
        try:
            if save and self.supervisor.state is ServerState.READY and self.link.facts is not None:
                began = time.monotonic()
                report = await self.saves.save_changed(timeout, "shutdown")
                # The restore points every conversation still owes, in bounded time.
                left = min(POINTS_AT_STOP_SECONDS, timeout - (time.monotonic() - began))
                await self.points.at_stop(time.monotonic() + max(0.0, left))
        finally:
            await self.loop.run_io(self.supervisor.stop)
            await self.launcher.stopped()  # a launch still being planned ends, and never runs
            self.points.stopping = False
        self.link.launched = None
        self.link.close_client()
        return report

    async def _run(self, settings: Settings, resume_id: str | None) -> None:
        restored: list[RestoreSummary] = []
        api_ok = False
        profile = self.link.running_profile(settings.profile)
        try:
            for attempt in range(LAUNCH_ATTEMPTS):
                try:
                    self.link.facts = await self._server_facts(settings)
                    restored = await self._restores(settings, resume_id)
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
            self.library.complete_search(self.link.facts, self.link.client, self.link.serving_with_facts)
        self.swa_note = swa_note(self.link.model, profile)
        self.link.serving.set()  # ready: requests pass, and the snapshot says so
        # Every face's History marks the launches (a relaunch's too) and what each restored.
        # On the bookkeeping thread: the first append reads the whole history file.
        self.loop.in_background(self.history.append,
                                LaunchRecord(self.supervisor.started_at or time.time(),
                                             tuple(r.slot for r in restored)),
                                what="recording the launch")
        self.events.emit(EngineReady(profile.base_url, tuple(restored)))

    async def _server_facts(self, settings: Settings) -> ServerFacts:
        model = self.link.model
        if model is None:
            model = self.link.model = await self.loop.run_io(resolve_model, settings.profile.model_path,
                                                             self.paths.models_dir, self.model_facts)
        launched = replace(self.link.running_profile(settings.profile), flash_attn=self.link.flash_attn)
        facts, self.link.llama_build = await self.identity.facts(model, launched, self.link.client())
        return facts

    async def _restores(self, settings: Settings, resume_id: str | None) -> list[RestoreSummary]:
        # the folder tidied and the index up to date (a prelaunch does it meanwhile)
        await self.library.sweep_once()
        await self.library.prewarmed()  # the states it restores, assembled while the model loaded
        done = await self.actions.at_launch(self.supervisor.adopted, settings.idle_save_seconds,
                                            settings.restore_on_start, resume_id)
        if done:
            note = swa_note(self.link.model, self.link.running_profile(settings.profile))
            if note:
                self.events.emit(WarningRaised(note))
        return done
