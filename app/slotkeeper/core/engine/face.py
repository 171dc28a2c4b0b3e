"""What other threads see of the engine: the published snapshot's values, a few reads that are
safe anywhere, and blocking wrappers of the loop's commands (``start()`` for ``start_async()``...).
The wrappers are refused on the loop's own thread, where they would wait for themselves."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from slotkeeper.core.engine.lifecycle.loop import EngineLoop, LoopClosed
from slotkeeper.core.engine.lifecycle.model_facts import ModelChoice
from slotkeeper.core.engine.slots.saves import SHUTDOWN_SAVE_TIMEOUT_SECONDS
from slotkeeper.core.engine.snapshot import EngineSnapshot
from slotkeeper.core.history import LaunchRecord, RequestHistory, RequestRecord
from slotkeeper.core.model.model_hash import ModelHashCache
from slotkeeper.core.server.apikey import DoorKeys
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.server.supervisor import Supervisor
from slotkeeper.core.services.sessions import SearchResult
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.index import SessionsIndex
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.core.views import RestoreSummary, SavesReport, SaveSummary

if TYPE_CHECKING:
    from slotkeeper.core.engine.lifecycle.server_link import ServerLink
    from slotkeeper.core.engine.stored.library import Library

T = TypeVar("T")
V = TypeVar("V")


class _Published(Generic[V]):
    """A face's read of the published snapshot's attribute of the same name (any thread)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, face: None, owner: type | None = None) -> _Published[V]: ...
    @overload
    def __get__(self, face: EngineFace, owner: type | None = None) -> V: ...
    def __get__(self, face: EngineFace | None, owner: type | None = None) -> V | _Published[V]:
        if face is None:
            return self
        return cast(V, getattr(face._snapshot, self.name))


class EngineFace:
    # Set by the engine (engine.py), which owns them.
    _snapshot: EngineSnapshot
    loop: EngineLoop
    supervisor: Supervisor
    library: Library
    link: ServerLink
    hashes: ModelHashCache
    history: RequestHistory
    _unsubscribe: Callable[[], None]

    # =====================================================================================
    # Reading: any thread
    # =====================================================================================
    @property
    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    # The published snapshot's values, read from the snapshot at hand (``EngineSnapshot``).
    settings: _Published[Settings] = _Published()
    running_profile: _Published[ServerProfile] = _Published()
    launched_profile: _Published[ServerProfile | None] = _Published()
    base_url: _Published[str] = _Published()
    facts: _Published[ServerFacts | None] = _Published()
    model: _Published[ModelChoice | None] = _Published()
    state: _Published[ServerState] = _Published()

    @property
    def profile(self) -> ServerProfile:
        return self._snapshot.settings.profile

    @property
    def index(self) -> SessionsIndex:
        """The sessions index (the store keeps it true; routing and lineage read it)."""
        return self.library.index

    @property
    def api_key(self) -> str | None:
        """A key the front door takes now (None: it takes none), for Slotkeeper's own clients of it."""
        return DoorKeys(self.running_profile.extra_args).first()

    def recent_requests(self, n: int) -> list[RequestRecord]:
        """The newest ``n`` requests of the history (it reads a file: call it as a job)."""
        return list(self.history.recent(n))

    def search_sessions(self, text: str, limit: int = 20) -> SearchResult:
        """Saved conversations by what was said in them, best first (reads files: call it as a job;
        raises SearchUnavailable)."""
        return self.library.find(text, limit)

    def launches(self) -> list[LaunchRecord]:
        """The launches the history keeps, this run's and earlier ones' (reads a file)."""
        return list(self.history.launches())

    def client(self, timeout: float = 10.0) -> LlamaClient:
        """A client of the front door (slot actions may take up to ``timeout``)."""
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
            if self._snapshot.ready:  # the one ready flag: the link's serving gate, as last published
                return ServerState.READY
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return state
            time.sleep(0.05 if remaining is None else min(0.05, remaining))

    def known_model_sha256(self, model_path: str | Path) -> str | None:
        """The model's SHA-256 if it was hashed before and is unchanged (a stat and a small file;
        any thread but the GUI's)."""
        facts = self._snapshot.facts
        if facts is not None and facts.model_path == os.path.realpath(model_path):
            return facts.model_sha256
        return self.hashes.cached(model_path)

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
        self.library.close()

    def stop_server_now(self) -> None:
        """Stop llama-server at once, without saving (blocking): the last resort of a face whose
        orderly stop failed, so the server never outlives it."""
        if self.supervisor.state is not ServerState.STOPPED:
            self.supervisor.stop()

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run the engine loop on this thread until ``main`` returns (`slotkeeper serve`)."""
        try:
            return self.loop.run(main)
        finally:
            self._unsubscribe()

    def save_slot(self, slot: int) -> SaveSummary | None:
        return self._call(self.save_slot_async(slot))

    def switch_model(self, settings: Settings, resume_id: str | None = None) -> SavesReport:
        return self._call(self.switch_model_async(settings, resume_id))

    def restore(self, session_id: str, slot: int | None = None) -> RestoreSummary | None:
        return self._call(self.restore_async(session_id, slot))

    # The loop's commands, defined by engine.py; declared here for the wrappers above.
    if TYPE_CHECKING:
        async def start_async(self, resume_id: str | None = None) -> None: ...
        async def stop_async(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                             keep_front_door: bool = False) -> SavesReport: ...
        async def restart_async(self, resume_id: str | None = None) -> None: ...
        async def close_async(self, save: bool = True,
                              timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport: ...
        async def restore_async(self, session_id: str, slot: int | None = None) -> RestoreSummary | None: ...
        async def save_slot_async(self, slot: int) -> SaveSummary | None: ...
        async def save_changed_slots_async(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS,
                                           reason: str = "shutdown") -> SavesReport: ...
        async def update_settings_async(self, settings: Settings) -> None: ...
        async def switch_model_async(self, settings: Settings, resume_id: str | None = None,
                                     timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> SavesReport: ...
