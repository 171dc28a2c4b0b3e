"""Core events -> Qt signals, and widget actions -> engine calls run as background jobs.

The engine emits events on its own threads (supervisor, poller, log tailer). The bridge turns
each one into a queued Qt signal, so every widget slot runs on the GUI thread, and it runs every
engine call that can block (HTTP, disk) through ``JobRunner``. It also watches the sessions
folder with watchdog so sessions saved, deleted or copied in by anything else (the CLI, a file
manager, another machine's sync) show up without a refresh button.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from slotkeeper.core import history as core_history
from slotkeeper.core.engine import Engine
from slotkeeper.core.events import Event
from slotkeeper.core.server.supervisor import ServerState
from slotkeeper.core.sessions.sidecar import ServerFacts
from slotkeeper.core.sessions.store import INCOMING_PREFIX, Listing
from slotkeeper.core.settings import Settings, save_settings
from slotkeeper.gui.jobs import JobRunner, describe_error

log = logging.getLogger(__name__)

# Coalesces the burst of file events one save makes (KV rename, sidecar temp, replace).
SESSIONS_DEBOUNCE_MS = 200
LOG_BACKLOG_LINES = 400
HISTORY_SHOWN = 500

# States in which the server process exists (or is being brought up) and can be stopped.
RUNNING_STATES = frozenset(
    {ServerState.STARTING, ServerState.READY, ServerState.CRASHED, ServerState.RESTARTING}
)


class EngineBridge(QObject):
    # -- core events, re-emitted on the GUI thread ----------------------------------------
    serverStateChanged = Signal(object, object)  # ServerState, event data
    serverLoading = Signal(float, str)  # seconds since launch, last log line
    engineReady = Signal(str, object)  # url, [ {id, slot, n_restored, ms, title} ]
    activityChanged = Signal(object)  # {activity, detail, done, total}
    slotsChanged = Signal(object)  # [SlotView]
    requestDone = Signal(object)  # {slot, task, n_prompt, cache_n, prompt_n, prompt_ms, at}
    sessionSaved = Signal(object)
    sessionRestored = Signal(object)
    sessionRefused = Signal(object)  # {id, slot, reasons}
    restoreReuse = Signal(object)  # {slot, id, cache_n, n_prompt, n_restored, effective, reason}
    warningRaised = Signal(str)
    noticeRaised = Signal(str)
    sessionsPruned = Signal(object)  # {ids, bytes_freed}
    saveFailed = Signal(object)  # {slot, message}
    coreEvent = Signal(str, object)  # every event (kind, data), after the specific signal
    logLines = Signal(object)  # [str], batched

    # -- derived --------------------------------------------------------------------------
    sessionsChanged = Signal()  # something in the sessions folder changed (debounced)
    sessionsListed = Signal(object, object)  # Listing, ServerFacts | None (None: not ready)
    historyLoaded = Signal(object)  # [RequestRecord], oldest first
    settingsChanged = Signal(object)  # Settings, after they were saved and applied
    resumeFinished = Signal(str, object)  # session id, restore summary (None: refused)
    sessionVerified = Signal(object)  # SessionEntry after a verify
    errorOccurred = Signal(str, str)  # what failed, why (for a message box or a notification)
    busyChanged = Signal(bool)  # background jobs running

    _coreEventQueued = Signal(str, object)
    _logWake = Signal()
    _fsChanged = Signal()

    def __init__(self, engine: Engine, parent: QObject | None = None, watch_sessions: bool = True) -> None:
        super().__init__(parent)
        self.engine = engine
        self.jobs = JobRunner(self)
        self.jobs.jobFailed.connect(self.errorOccurred)
        self.jobs.busyChanged.connect(self.busyChanged)

        self.state: ServerState = engine.supervisor.state
        self.state_message: str = engine.supervisor.message
        self.slots: list = []
        self.activity: dict[str, Any] = {"activity": None, "detail": "", "done": 0, "total": 0}
        self.listing: Listing | None = None
        self.history: list = []
        self.quitting = False

        self._closed = False
        self._emit_lock = threading.Lock()
        self._log_buffer: list[str] = []
        self._listing_running = False
        self._listing_again = False

        self._coreEventQueued.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._logWake.connect(self._drain_log, Qt.ConnectionType.QueuedConnection)
        self._fsChanged.connect(self._on_fs_changed, Qt.ConnectionType.QueuedConnection)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(SESSIONS_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._sessions_settled)

        self._unsubscribe = engine.events.subscribe(self._on_core_event)
        engine.supervisor.add_log_listener(self._on_log_line)
        self._history_file = engine.history  # the engine records every request; we only read

        self._observer = None
        if watch_sessions:
            self._observer = _start_observer(engine.paths.sessions_dir, self._notify_fs_change)

    # -- facts for widgets ----------------------------------------------------------------
    @property
    def launched_profile(self):
        """The profile the running server was launched with (settings may have changed since)."""
        return self.engine.running_profile if self.state in RUNNING_STATES else None

    @property
    def facts(self) -> ServerFacts | None:
        """The running server's facts once the engine is ready; None otherwise."""
        if self.state is ServerState.READY and self.engine.ready.is_set():
            return self.engine.facts
        return None

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def settings(self) -> Settings:
        return self.engine.settings

    @property
    def base_url(self) -> str:
        return self.engine.base_url

    def model_name(self) -> str:
        from slotkeeper.core.engine import DEMO_MODEL

        m = self.engine.model
        if m is not None:
            return "demo model" if m.is_demo else m.path.name
        raw = self.engine.settings.profile.model_path
        if not raw:
            return "no model chosen"
        return "demo model" if raw == DEMO_MODEL else Path(raw).name

    # -- core events ----------------------------------------------------------------------
    def _on_core_event(self, event: Event) -> None:  # any thread
        with self._emit_lock:
            if not self._closed:
                self._coreEventQueued.emit(event.kind, event.data)

    def _on_log_line(self, line: str) -> None:  # the log tailer's thread
        with self._emit_lock:
            if self._closed:
                return
            wake = not self._log_buffer
            self._log_buffer.append(line)
            if wake:
                self._logWake.emit()

    @Slot()
    def _drain_log(self) -> None:
        with self._emit_lock:
            lines, self._log_buffer = self._log_buffer, []
        if lines and not self._closed:
            self.logLines.emit(lines)

    @Slot(str, object)
    def _dispatch(self, kind: str, data: dict[str, Any]) -> None:
        if self._closed:
            return
        if kind == "server.state":
            state = data.get("state")
            if not isinstance(state, ServerState):
                state = ServerState(state)
            self.state = state
            self.state_message = data.get("message", "")
            if state is not ServerState.READY:
                self.slots = [] if state in (ServerState.STOPPED, ServerState.FAILED) else self.slots
            self.serverStateChanged.emit(state, data)
            if state in (ServerState.STOPPED, ServerState.FAILED):
                self.slotsChanged.emit(self.slots)
            self._relist_cached()
        elif kind == "server.loading":
            self.serverLoading.emit(float(data.get("elapsed", 0.0)), str(data.get("detail", "")))
        elif kind == "engine.ready":
            self.engineReady.emit(str(data.get("url", "")), list(data.get("restored") or []))
            self._relist_cached()
            self.refresh_sessions()
        elif kind == "engine.activity":
            self.activity = {
                "activity": data.get("activity"), "detail": data.get("detail", ""),
                "done": int(data.get("done") or 0), "total": int(data.get("total") or 0),
            }  # fmt: skip
            self.activityChanged.emit(dict(self.activity))
        elif kind == "slots":
            self.slots = list(data.get("slots") or [])
            self.slotsChanged.emit(self.slots)
        elif kind == "request.done":
            self.requestDone.emit(dict(data))
            self._append_history(data)
        elif kind == "session.saved":
            self.sessionSaved.emit(dict(data))
        elif kind == "session.restored":
            self.sessionRestored.emit(dict(data))
        elif kind == "session.refused":
            self.sessionRefused.emit(dict(data))
        elif kind == "restore.reuse":
            self.restoreReuse.emit(dict(data))
        elif kind == "engine.warning":
            self.warningRaised.emit(str(data.get("message", "")))
        elif kind == "engine.notice":
            self.noticeRaised.emit(str(data.get("message", "")))
        elif kind == "sessions.pruned":
            self.sessionsPruned.emit(dict(data))
        elif kind == "save.failed":
            self.saveFailed.emit(dict(data))
        self.coreEvent.emit(kind, data)

    # -- the sessions folder --------------------------------------------------------------
    def _notify_fs_change(self) -> None:  # watchdog's thread
        with self._emit_lock:
            if not self._closed:
                self._fsChanged.emit()

    @Slot()
    def _on_fs_changed(self) -> None:
        if not self._closed:
            self._debounce.start()

    @Slot()
    def _sessions_settled(self) -> None:
        if self._closed:
            return
        self.sessionsChanged.emit()
        self.refresh_sessions()

    def refresh_sessions(self) -> None:
        """List the sessions folder off the GUI thread; answers with ``sessionsListed``."""
        if self._closed:
            return
        if self._listing_running:
            self._listing_again = True
            return
        self._listing_running = True

        def done(listing: Listing) -> None:
            self._listing_running = False
            self.listing = listing
            self.sessionsListed.emit(listing, self.facts)
            if self._listing_again:
                self._listing_again = False
                self.refresh_sessions()

        def failed(exc: BaseException) -> None:
            self._listing_running = False
            self.errorOccurred.emit("Listing saved sessions", describe_error(exc))

        self.jobs.run(self.engine.store.listing, on_success=done, on_failure=failed,
                      description="Listing saved sessions")

    def _relist_cached(self) -> None:
        """Compatibility depends on the running server: re-announce the listing we have."""
        if self.listing is not None:
            self.sessionsListed.emit(self.listing, self.facts)

    # -- history --------------------------------------------------------------------------
    def load_history(self) -> None:
        def load() -> list:
            return list(self._history_file.recent(HISTORY_SHOWN))

        def done(records: list) -> None:
            # Requests recorded while the file was being read are kept, not lost.
            last = records[-1].at if records else float("-inf")
            newer = [r for r in self.history if r.at > last]
            self.history = [*records, *newer][-HISTORY_SHOWN:]
            self.historyLoaded.emit(self.history)

        self.jobs.run(load, on_success=done, description="Reading the request history")

    def _append_history(self, data: dict[str, Any]) -> None:
        record = core_history.RequestRecord(
            at=float(data.get("at") or time.time()), slot=int(data.get("slot", 0)),
            n_prompt=int(data.get("n_prompt", 0)), cache_n=int(data.get("cache_n", 0)),
            prompt_n=int(data.get("prompt_n", 0)), prompt_ms=float(data.get("prompt_ms") or 0.0),
        )  # fmt: skip
        self.history = [*self.history, record][-HISTORY_SHOWN:]
        self.historyLoaded.emit(self.history)

    # -- server actions -------------------------------------------------------------------
    def needs_restart(self, settings: Settings) -> bool:
        """Whether ``settings`` change how the running server was launched."""
        return self.launched_profile is not None and settings.profile != self.launched_profile

    def start_server(self, resume_id: str | None = None) -> None:
        if not self.engine.settings.profile.model_path:
            self.errorOccurred.emit("Starting llama-server",
                                    "No model chosen yet: pick one in Settings, or use the demo model.")
            return
        self.jobs.run(self.engine.start, resume_id, description="Starting llama-server")

    def stop_server(self, save: bool = True, on_done: Callable[[], None] | None = None) -> None:
        def done(_: Any) -> None:
            if on_done is not None:
                on_done()

        self.jobs.run(self.engine.stop, save, on_success=done,
                      description="Saving conversations and stopping llama-server")

    def restart_server(self) -> None:
        """Save changed slots, stop, start again with the current settings."""
        self.stop_server(save=True, on_done=self.start_server)

    def resume_session(self, session_id: str, slot: int | None = None) -> None:
        """Restore a saved session into a free slot (saving that slot first if it changed)."""

        def done(summary: dict | None) -> None:
            self.resumeFinished.emit(session_id, summary)

        def failed(exc: BaseException) -> None:
            self.resumeFinished.emit(session_id, None)
            self.errorOccurred.emit("Resuming a conversation", describe_error(exc))

        if self.facts is None:
            self.errorOccurred.emit("Resuming a conversation",
                                    "The server is not ready yet: start it first.")
            return
        self.jobs.run(self.engine.restore, session_id, slot, on_success=done, on_failure=failed,
                      description="Resuming a conversation")

    def save_slot(self, slot: int) -> None:
        self.jobs.run(self.engine.save_slot, slot, description=f"Saving slot {slot}")

    # -- session actions ------------------------------------------------------------------
    def set_pinned(self, session_id: str, pinned: bool) -> None:
        self.jobs.run(self.engine.store.set_pinned, session_id, pinned,
                      on_success=lambda _: self.refresh_sessions(),
                      description="Pinning a session" if pinned else "Unpinning a session")

    def delete_session(self, session_id: str) -> None:
        self.jobs.run(self.engine.delete_session, session_id, on_success=lambda _: self.refresh_sessions(),
                      description="Deleting a session")

    def verify_session(self, session_id: str) -> None:
        def done(entry: Any) -> None:
            self.sessionVerified.emit(entry)
            self.refresh_sessions()

        self.jobs.run(self.engine.store.verify, session_id, on_success=done,
                      description="Verifying a session")

    def preview_prune(self, budget: int, on_done: Callable[[Any], None],
                      on_failure: Callable[[BaseException], None] | None = None) -> None:
        """What a prune at ``budget`` would delete right now (nothing is deleted)."""
        self.jobs.run(self.engine.prune, budget, True, on_success=on_done, on_failure=on_failure,
                      description="Working out what the budget would delete")

    # -- settings -------------------------------------------------------------------------
    def apply_settings(self, settings: Settings, restart: bool = False,
                       persist: bool = True, on_done: Callable[[], None] | None = None) -> None:
        """Save to the settings file, hand to the engine, and restart the server if asked."""
        settings.profile.validate()
        path = self.engine.paths.settings_file

        def apply() -> None:
            if persist:
                save_settings(path, settings)
            self.engine.update_settings(settings)  # may prune (disk) under a smaller budget
            if restart and self.engine.supervisor.state in RUNNING_STATES:
                self.engine.stop(save=True)
                self.engine.start()

        def done(_: Any) -> None:
            self.settingsChanged.emit(settings)
            if on_done is not None:
                on_done()

        self.jobs.run(apply, on_success=done, description="Saving settings")

    # -- shutdown -------------------------------------------------------------------------
    def shutdown(self, on_done: Callable[[], None]) -> None:
        """Quit: save every changed slot, stop the server; then ``on_done`` on the GUI thread."""
        self.quitting = True

        def finished(_: Any = None) -> None:
            on_done()

        def failed(exc: BaseException) -> None:
            log.error("stopping on quit failed: %s", exc)
            self.errorOccurred.emit("Stopping llama-server", describe_error(exc))
            on_done()

        self.jobs.run(self.engine.close, True, on_success=finished, on_failure=failed,
                      description="Saving conversations and stopping llama-server")

    def close(self) -> None:
        """Stop watching, stop timers, wait for jobs; no signal is emitted afterwards."""
        if self._closed:
            return
        with self._emit_lock:
            self._closed = True
        self._unsubscribe()
        self.engine.supervisor.remove_log_listener(self._on_log_line)
        self._debounce.stop()
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=5)
            except Exception:  # the folder may be gone; nothing left to stop then
                log.debug("stopping the sessions watcher failed", exc_info=True)
            self._observer = None
        self.jobs.shutdown()


def initial_log(engine: Engine, n: int = LOG_BACKLOG_LINES) -> list[str]:
    """The last lines of the server log (disk: call it from a job)."""
    return engine.supervisor.log_tail(n)


# -- watchdog ------------------------------------------------------------------------------
def _start_observer(directory: Path, notify: Callable[[], None]):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    watched = os.path.normcase(os.path.abspath(directory))

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            if event.event_type in ("opened", "closed_no_write"):
                return
            paths = [os.fsdecode(p) for p in (event.src_path, event.dest_path) if p]
            if event.is_directory and all(os.path.normcase(os.path.abspath(p)) == watched for p in paths):
                return  # the folder's own mtime: the file event that caused it is enough
            names = [os.path.basename(p) for p in paths]
            if names and all(n.startswith((INCOMING_PREFIX, ".")) for n in names):
                return  # a save in progress or an atomic write's temp file
            notify()

    directory.mkdir(parents=True, exist_ok=True)
    for factory in (Observer, lambda: PollingObserver(timeout=2)):
        observer = factory()
        try:
            observer.schedule(Handler(), str(directory), recursive=False)
            observer.daemon = True
            observer.start()
            return observer
        except OSError as exc:  # e.g. out of inotify watches: poll instead
            log.warning("watching %s with %s failed (%s); polling instead", directory,
                        type(observer).__name__, exc)
    return None
