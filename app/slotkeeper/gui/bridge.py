"""Core events -> the GUI thread, and widget actions -> engine commands and services.

The engine emits typed events on its loop (and the supervisor on its thread). The bridge turns
each one into one queued Qt signal (``eventArrived``), so every handler runs on the GUI thread;
widgets subscribe by type with ``bridge.on(SessionSaved, self._on_saved)``. Widget actions post
engine commands to the engine loop (``engine.post``) or run service calls as jobs, so the GUI
thread never waits on HTTP or disk. The bridge also watches the sessions folder with watchdog, so
sessions saved, deleted or copied in by anything else (the CLI, a file manager, a sync tool) show
up without a refresh button.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from slotkeeper.core import events as ev
from slotkeeper.core.engine import Engine, EngineSnapshot
from slotkeeper.core.history import RequestRecord
from slotkeeper.core.journal import JournalEntry, journal_entry
from slotkeeper.core.services import switching
from slotkeeper.core.services.resume import ResumeVerdict, resume_verdict
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.services.switching import SwitchOutcome, model_files, resolved_model_file
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.entries import Listing, SessionEntry
from slotkeeper.core.sessions.naming import is_hidden_or_in_progress, sidecar_name
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import (
    RUNNING_STATES,
    STOPPED_STATES,
    Activity,
    SavesReport,
    ServerState,
    SlotView,
    is_idle_heartbeat,
)
from slotkeeper.gui.jobs import JobRunner, describe_error

log = logging.getLogger(__name__)

__all__ = ["EngineBridge", "SwitchOutcome", "initial_log", "resolved_model_file"]

E = TypeVar("E", bound=ev.Event)

# Coalesces the burst of file events one save makes (KV rename, sidecar temp, replace).
SESSIONS_DEBOUNCE_MS = 200
LOG_BACKLOG_LINES = 400
HISTORY_SHOWN = 500
JOURNAL_KEPT = 2000  # entries of the activity list kept in memory (the oldest go first)


class _HandlerRef:
    """A handler the bridge calls; a bound method of a QObject is dropped once its object is gone."""

    def __init__(self, handler: Callable[[Any], None]) -> None:
        owner = getattr(handler, "__self__", None)
        if isinstance(owner, QObject) and hasattr(handler, "__func__"):
            self._method: weakref.WeakMethod | None = weakref.WeakMethod(handler)  # type: ignore[arg-type]
            self._strong = None
        else:
            self._method, self._strong = None, handler

    def get(self) -> Callable[[Any], None] | None:
        if self._strong is not None:
            return self._strong
        fn = self._method() if self._method is not None else None
        owner = getattr(fn, "__self__", None)
        if fn is None or (isinstance(owner, QObject) and not shiboken6.isValid(owner)):
            return None
        return fn


class EngineBridge(QObject):
    eventArrived = Signal(object)  # every core event, on the GUI thread, after the typed handlers
    logLines = Signal(object)  # [str], batched

    # -- derived --------------------------------------------------------------------------
    sessionsChanged = Signal()  # something in the sessions folder changed (debounced)
    sessionsListed = Signal(object, object)  # Listing, ServerFacts | None (None: not ready)
    historyLoaded = Signal(object)  # [RequestRecord], oldest first
    settingsChanged = Signal(object)  # Settings, after they were saved and applied
    resumeFinished = Signal(str, object)  # session id, RestoreSummary (None: refused)
    modelSwitched = Signal(object)  # SwitchOutcome: the model (and its settings) in use now, or why not
    modelFileResolved = Signal()  # model_file / model_aliases are up to date with the settings
    modelsFound = Signal(object)  # [FoundModel]: GGUF files on this computer (core.discovery)
    sessionVerified = Signal(object)  # SessionEntry after a verify
    errorOccurred = Signal(str, str)  # what failed, why (for a message box or a notification)
    busyChanged = Signal(bool)  # background jobs running
    journalAdded = Signal(object)  # JournalEntry: one of Slotkeeper's own actions, in words
    sessionsFound = Signal(object)  # SearchResult of the latest search by content (older answers dropped)

    _eventQueued = Signal(object)
    _logWake = Signal()
    _fsChanged = Signal()

    def __init__(self, engine: Engine, settings_service: SettingsService | None = None,
                 parent: QObject | None = None, watch_sessions: bool = True) -> None:
        super().__init__(parent)
        self.engine = engine
        self.settings_service = settings_service or SettingsService(engine.paths.settings_file)
        self.jobs = JobRunner(self)
        self.jobs.jobFailed.connect(self.errorOccurred)
        self.jobs.busyChanged.connect(self.busyChanged)

        # What the events said last: on the GUI thread they are the truth, in the order they came
        # (the engine's snapshot may already be further along).
        self.state: ServerState = engine.state
        self.state_message: str = engine.snapshot.state_message
        self.slots: tuple[SlotView, ...] = ()
        self.activity: Activity = Activity()
        self.listing: Listing | None = None
        # When each session last changed (its KV file's time): "last used" also moves when a launch
        # restores it or a quit finds it unchanged, so it cannot tell conversations apart.
        self.saved_at: dict[str, float] = {}
        self.history: list[RequestRecord] = []
        self.quitting = False
        # The chosen model's file with links resolved (as sidecars record it), and the remembered
        # models by their resolved files: worked out off the GUI thread when the settings change.
        self.model_file: str | None = None
        self.model_aliases: dict[str, str] = {}
        self.found_models: list | None = None  # None until the first search has answered
        self.model_search_dirs: list[tuple[str, Path]] | None = None  # None: the usual places
        self._searching_models = False

        self._handlers: list[tuple[type[ev.Event], _HandlerRef]] = []
        self._closed = False
        self._emit_lock = threading.Lock()
        self._log_buffer: list[str] = []
        self._listing_running = False
        self._listing_again = False
        # Slotkeeper's own actions since the app started (the Server tab's activity list).
        self.journal: list[JournalEntry] = []
        self.last_warning: str | None = None  # the newest WarningRaised's message
        self._search_seq = 0

        self._eventQueued.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._logWake.connect(self._drain_log, Qt.ConnectionType.QueuedConnection)
        self._fsChanged.connect(self._on_fs_changed, Qt.ConnectionType.QueuedConnection)

        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(SESSIONS_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._sessions_settled)

        self._unsubscribe = engine.events.subscribe(self._on_core_event)
        engine.add_log_listener(self._on_log_line)

        self._observer = None
        if watch_sessions:
            self._observer = _start_observer(engine.paths.sessions_dir, self._notify_fs_change)
        self.settingsChanged.connect(self.resolve_model_files)
        self.resolve_model_files()

    # -- facts for widgets ----------------------------------------------------------------
    @property
    def snapshot(self) -> EngineSnapshot:
        """The engine's latest published state (settings, model, facts, ...)."""
        return self.engine.snapshot

    @property
    def paths(self):
        return self.engine.paths

    @property
    def launched_profile(self):
        """The profile the running server was launched with (settings may have changed since)."""
        return self.snapshot.running_profile if self.state in RUNNING_STATES else None

    @property
    def facts(self) -> ServerFacts | None:
        """The running server's facts once the engine is ready; None otherwise."""
        if self.state is ServerState.READY and self.snapshot.ready:
            return self.snapshot.facts
        return None

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def settings(self) -> Settings:
        return self.snapshot.settings

    @property
    def base_url(self) -> str:
        return self.snapshot.base_url

    def model_name(self) -> str:
        return self.snapshot.model_name

    def resolve_model_files(self, *_args) -> None:
        """Work out ``model_file`` and ``model_aliases`` (links resolved) as a job."""
        settings = self.settings
        models_dir = self.paths.models_dir

        def resolve() -> tuple[str | None, dict[str, str]]:
            return model_files(settings.profile.model_path, settings.models, models_dir)

        def done(result: tuple[str | None, dict[str, str]]) -> None:
            self.model_file, self.model_aliases = result
            self.modelFileResolved.emit()

        self.jobs.run(resolve, on_success=done, description="Finding the model files")

    def discover_models(self) -> None:
        """Look for GGUF models on this computer (a job); answers with ``modelsFound``."""
        if self._closed or self._searching_models:
            return
        self._searching_models = True
        dirs = self.model_search_dirs

        def find() -> list:
            from slotkeeper.core import discovery

            return discovery.find_models(dirs if dirs is not None else discovery.default_search_dirs())

        def done(models: list) -> None:
            self._searching_models = False
            self.found_models = [m for m in models if m.usable]
            self.modelsFound.emit(self.found_models)

        def failed(exc: BaseException) -> None:
            self._searching_models = False
            log.warning("looking for models failed: %s", exc)
            self.found_models = self.found_models or []
            self.modelsFound.emit(self.found_models)

        self.jobs.run(find, on_success=done, on_failure=failed, description="Looking for models")

    def resume_verdict(self, entry: SessionEntry) -> ResumeVerdict:
        """Whether ``entry`` can be resumed now, or by switching to its model (one rule, every face)."""
        return resume_verdict(entry, self.state, self.facts, bool(self.settings.profile.model_path),
                              self.model_file, self.model_aliases)

    def session_file(self, entry: SessionEntry) -> Path:
        """The file to show for a session in a file manager."""
        return entry.kv_path or self.paths.sessions_dir / sidecar_name(entry.id)

    # -- core events ----------------------------------------------------------------------
    def on(self, event_type: type[E], handler: Callable[[E], None]) -> None:
        """Call ``handler`` on the GUI thread for every event of ``event_type`` (a subclass of
        ``Event``). A bound method of a QObject stops being called once its object is deleted."""
        if not (isinstance(event_type, type) and issubclass(event_type, ev.Event)):
            raise TypeError(f"{event_type!r} is not an event type")
        self._handlers.append((event_type, _HandlerRef(handler)))

    def _on_core_event(self, event: ev.Event) -> None:  # any thread
        with self._emit_lock:
            if not self._closed:
                self._eventQueued.emit(event)

    def _on_log_line(self, line: str) -> None:  # the log tailer's thread
        if is_idle_heartbeat(line):  # twice a second at -lv 4: not worth waking the GUI for
            return
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

    @Slot(object)
    def _dispatch(self, event: ev.Event) -> None:
        if self._closed:
            return
        if isinstance(event, ev.ServerStateChanged):
            self.state, self.state_message = event.state, event.message
            if event.state in STOPPED_STATES:
                self.slots = ()
        elif isinstance(event, ev.SlotsChanged):
            self.slots = event.slots
        elif isinstance(event, ev.ActivityChanged):
            self.activity = event.activity
        elif isinstance(event, ev.RequestDone):
            self._append_history(event)
        elif isinstance(event, ev.WarningRaised):
            self.last_warning = event.message  # for a window built after it
        entry = journal_entry(event)
        if entry is not None:
            self.journal.append(entry)
            del self.journal[:-JOURNAL_KEPT]
            self.journalAdded.emit(entry)
        alive = []
        for event_type, ref in self._handlers:
            handler = ref.get()
            if handler is None:
                continue
            alive.append((event_type, ref))
            if isinstance(event, event_type):
                try:
                    handler(event)
                except Exception:
                    log.exception("handling %s failed", type(event).__name__)
        self._handlers = alive
        if isinstance(event, ev.ServerStateChanged):
            self._relist_cached()
        elif isinstance(event, ev.EngineReady):
            self._relist_cached()
            self.refresh_sessions()
        self.eventArrived.emit(event)

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

        def list_folder() -> tuple[Listing, dict[str, float]]:
            listing = self.engine.sessions.listing()
            return listing, saved_times(listing)

        def done(result: tuple[Listing, dict[str, float]]) -> None:
            listing, self.saved_at = result
            self._listing_running = False
            self.listing = listing
            self.sessionsListed.emit(listing, self.facts)
            if self._listing_again:
                self._listing_again = False
                self.refresh_sessions()

        def failed(exc: BaseException) -> None:
            self._listing_running = False
            self.errorOccurred.emit("Listing saved sessions", describe_error(exc))

        self.jobs.run(list_folder, on_success=done, on_failure=failed, description="Listing saved sessions")

    def _relist_cached(self) -> None:
        """Compatibility depends on the running server: re-announce the listing we have."""
        if self.listing is not None:
            self.sessionsListed.emit(self.listing, self.facts)

    # -- searching by content ---------------------------------------------------------------
    def search_sessions(self, text: str) -> None:
        """Search the saved conversations by what was said in them (a job); answers with
        ``sessionsFound`` for the latest call only. Entries the index has by title only are
        completed by the running server, when it runs their model."""
        self._search_seq += 1
        seq = self._search_seq
        if self._closed:
            return

        def done(result: Any) -> None:
            if seq != self._search_seq or self._closed:
                return  # a newer search was asked for meanwhile
            self.sessionsFound.emit(result)
            if result.partial and self.facts is not None:
                self._command(self.engine.complete_search_async(), "Indexing saved conversations")

        def failed(exc: BaseException) -> None:
            if seq == self._search_seq:
                self.errorOccurred.emit("Searching saved conversations", describe_error(exc))

        self.jobs.run(self.engine.sessions.search, text, on_success=done, on_failure=failed,
                      description="Searching saved conversations")

    # -- history --------------------------------------------------------------------------
    def load_history(self) -> None:
        def load() -> list:
            return list(self.engine.history.recent(HISTORY_SHOWN))

        def done(records: list) -> None:
            # Requests recorded while the file was being read are kept, not lost.
            last = records[-1].at if records else float("-inf")
            newer = [r for r in self.history if r.at > last]
            self.history = [*records, *newer][-HISTORY_SHOWN:]
            self.historyLoaded.emit(self.history)

        self.jobs.run(load, on_success=done, description="Reading the request history")

    def _append_history(self, event: ev.RequestDone) -> None:
        record = RequestRecord(at=event.at, slot=event.slot, n_prompt=event.n_prompt, cache_n=event.cache_n,
                               prompt_n=event.prompt_n, prompt_ms=event.prompt_ms, source=event.source,
                               saved_ms=event.saved_ms)
        self.history = [*self.history, record][-HISTORY_SHOWN:]
        self.historyLoaded.emit(self.history)

    # -- engine commands ------------------------------------------------------------------
    def _command(self, coro: Coroutine[Any, Any, Any], description: str,
                 on_success: Callable[[Any], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Post an engine command to its loop; its outcome comes back on the GUI thread."""
        try:
            future = self.engine.post(coro)
        except RuntimeError as exc:  # the engine has shut down (quitting)
            log.info("%s skipped: %s", description, exc)
            return
        self.jobs.watch(future, on_success=on_success, on_failure=on_failure, description=description)

    def needs_restart(self, settings: Settings) -> bool:
        """Whether ``settings`` change how the running server was launched."""
        return self.launched_profile is not None and settings.profile != self.launched_profile

    def start_server(self, resume_id: str | None = None) -> None:
        if not self.settings.profile.model_path:
            self.errorOccurred.emit("Starting llama-server",
                                    "No model chosen yet: pick one in Settings, or use the demo model.")
            return
        self._command(self.engine.start_async(resume_id), "Starting llama-server")

    def stop_server(self, save: bool = True, on_done: Callable[[], None] | None = None) -> None:
        self._command(self.engine.stop_async(save), "Saving conversations and stopping llama-server",
                      on_success=lambda _: on_done() if on_done is not None else None)

    def restart_server(self) -> None:
        """Save changed slots, stop, start again with the current settings."""
        self._command(self.engine.restart_async(), "Restarting llama-server")

    def resume_session(self, session_id: str, slot: int | None = None) -> None:
        """Restore a saved session into a free slot (saving that slot first if it changed)."""

        def done(summary: Any) -> None:
            self.resumeFinished.emit(session_id, summary)

        def failed(exc: BaseException) -> None:
            self.resumeFinished.emit(session_id, None)
            self.errorOccurred.emit("Resuming a conversation", describe_error(exc))

        if self.facts is None:
            self.errorOccurred.emit("Resuming a conversation", "The server is not ready yet: start it first.")
            return
        self._command(self.engine.restore_async(session_id, slot), "Resuming a conversation",
                      on_success=done, on_failure=failed)

    def save_slot(self, slot: int) -> None:
        self._command(self.engine.save_slot_async(slot), f"Saving slot {slot}")

    # -- session actions (the sessions service, as jobs) ----------------------------------
    def set_pinned(self, session_id: str, pinned: bool) -> None:
        self.jobs.run(self.engine.sessions.set_pinned, session_id, pinned,
                      on_success=lambda _: self.refresh_sessions(),
                      description="Pinning a session" if pinned else "Unpinning a session")

    def delete_session(self, session_id: str) -> None:
        self.jobs.run(self.engine.sessions.delete, session_id, on_success=lambda _: self.refresh_sessions(),
                      description="Deleting a session")

    def verify_session(self, session_id: str) -> None:
        def done(entry: Any) -> None:
            self.sessionVerified.emit(entry)
            self.refresh_sessions()

        self.jobs.run(self.engine.sessions.verify, session_id, on_success=done, description="Verifying a session")

    def preview_prune(self, budget: int, on_done: Callable[[Any], None],
                      on_failure: Callable[[BaseException], None] | None = None) -> None:
        """What a prune at ``budget`` would delete right now (nothing is deleted)."""
        self.jobs.run(self.engine.sessions.plan_prune, budget, on_success=on_done, on_failure=on_failure,
                      description="Working out what the budget would delete")

    # -- settings -------------------------------------------------------------------------
    def apply_settings(self, settings: Settings, restart: bool = False,
                       persist: bool = True, on_done: Callable[[], None] | None = None) -> None:
        """Save to the settings file (this run's command-line values stay out of it), hand the
        result to the engine, and restart the server if asked."""
        settings.profile.validate()

        def done(applied: Settings) -> None:
            self.settingsChanged.emit(applied)
            if on_done is not None:
                on_done()

        self._command(switching.apply_settings(self.engine, self.settings_service, settings, restart=restart,
                                               persist=persist), "Saving settings", on_success=done)

    def choose_model(self, model_path: str, start: bool = True) -> None:
        """Use ``model_path`` from now on (this run's settings, and the saved ones, with the settings
        remembered for it) and start the server on it (see ``switch_model``)."""
        self.switch_model(model_path, start=start)

    def switch_model(self, model_path: str, resume_id: str | None = None, force: bool = False,
                     start: bool = True, on_done: Callable[[SwitchOutcome], None] | None = None,
                     **changes: Any) -> None:
        """Switch to ``model_path`` with its remembered settings (``changes`` on top, e.g.
        ``swa_full=True``): every changed slot is saved first, then the server restarts on it
        (a stopped one starts, unless ``start`` is False), resuming ``resume_id`` if given. When
        a changed slot cannot be saved nothing is switched unless ``force``: the outcome says
        which (``switching.switch_model``). Answers with ``modelSwitched`` (and ``on_done``)."""
        def done(outcome: SwitchOutcome) -> None:
            if outcome.settings is not None:
                self.settingsChanged.emit(outcome.settings)
            self.modelSwitched.emit(outcome)
            if on_done is not None:
                on_done(outcome)

        def failed(exc: BaseException) -> None:
            outcome = SwitchOutcome(model_path, False, SavesReport(), None, describe_error(exc))
            self.errorOccurred.emit("Switching models", outcome.error or "")
            self.modelSwitched.emit(outcome)
            if on_done is not None:
                on_done(outcome)

        self._command(switching.switch_model(self.engine, self.settings_service, model_path, resume_id=resume_id,
                                             force=force, start=start, **changes),
                      "Switching models", on_success=done, on_failure=failed)

    def plan_model(self, model_path: str, **changes: Any):
        """What choosing ``model_path`` would run (``ModelPlan``; reads the disk: call it from a job)."""
        return self.settings_service.plan_model(model_path, **changes)

    def known_model_sha256(self, model_path: str) -> str | None:
        """The model's SHA-256 when it was hashed before (reads a small file: from a job)."""
        return self.engine.known_model_sha256(model_path)

    # -- shutdown -------------------------------------------------------------------------
    def shutdown(self, on_done: Callable[[SavesReport], None]) -> None:
        """Quit: save every changed slot, stop the server, end the engine loop; then
        ``on_done(report)`` with what could not be saved."""
        self.quitting = True

        def finished(report: SavesReport | None = None) -> None:
            self.engine.dispose()
            on_done(report or SavesReport())

        def failed(exc: BaseException) -> None:
            log.error("stopping on quit failed: %s", exc)
            self.errorOccurred.emit("Stopping llama-server", describe_error(exc))
            finished()

        try:
            future = self.engine.post(self.engine.close_async(True))
        except RuntimeError:  # already shut down
            on_done(SavesReport())
            return
        self.jobs.watch(future, on_success=finished, on_failure=failed,
                        description="Saving conversations and stopping llama-server")

    def close(self) -> None:
        """Stop watching, stop timers, wait for jobs; no signal is emitted afterwards."""
        if self._closed:
            return
        with self._emit_lock:
            self._closed = True
        self._unsubscribe()
        self.engine.remove_log_listener(self._on_log_line)
        self._debounce.stop()
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=5)
            except Exception:  # the folder may be gone; nothing left to stop then
                log.debug("stopping the sessions watcher failed", exc_info=True)
            self._observer = None
        self.jobs.shutdown()


def saved_times(listing: Listing) -> dict[str, float]:
    """Session id -> when its KV file was written (a save that changed it); absent when unknown."""
    out: dict[str, float] = {}
    for e in listing.sessions:
        if e.kv_path is not None:
            try:
                out[e.id] = os.lstat(e.kv_path).st_mtime
            except OSError:
                pass
    return out


def initial_log(engine: Engine, n: int = LOG_BACKLOG_LINES) -> list[str]:
    """The last lines of the server log (disk: call it from a job)."""
    return engine.log_tail(n)


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
            if names and all(is_hidden_or_in_progress(n) for n in names):
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
