"""What the GUI reads off its thread, and keeps for the widgets: the sessions listing (listed again
when the folder changes), searches by content, the request history, the model files the settings
name and the models found on this computer.

Each read is a job (``JobRunner``); its answer comes back as a signal on the GUI thread, so the GUI
thread never waits on disk. A watchdog observer on the sessions folder (debounced) makes sessions
saved, deleted or copied in by anything else (the CLI, a file manager, a sync tool) show up without
a refresh button.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from slotkeeper.core import events as ev
from slotkeeper.core.history import RequestRecord
from slotkeeper.core.services.sessions import SessionChanges
from slotkeeper.core.services.switching import model_files
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.entries import Listing
from slotkeeper.core.sessions.naming import is_hidden_or_in_progress
from slotkeeper.core.settings import Settings
from slotkeeper.gui.jobs import JobRunner, describe_error

if TYPE_CHECKING:
    from slotkeeper.core.engine import Engine

log = logging.getLogger(__name__)

# Coalesces the burst of file events one save makes (KV rename, sidecar temp, replace).
SESSIONS_DEBOUNCE_MS = 200
HISTORY_SHOWN = 500


class Feeds(QObject):
    sessionsChanged = Signal()  # something in the sessions folder changed (debounced)
    sessionsListed = Signal(object, object)  # Listing, ServerFacts | None (None: not ready)
    sessionsFound = Signal(object)  # SearchResult of the latest search by content (older answers dropped)
    historyLoaded = Signal(object)  # [RequestRecord], oldest first
    modelFileResolved = Signal()  # model_file / model_aliases are up to date with the settings
    modelsFound = Signal(object)  # [FoundModel]: GGUF files on this computer (core.model.discovery)
    errorOccurred = Signal(str, str)  # what failed, why

    _fsChanged = Signal()

    def __init__(self, engine: Engine, jobs: JobRunner, *, facts: Callable[[], ServerFacts | None],
                 settings: Callable[[], Settings],
                 command: Callable[[Coroutine[Any, Any, Any], str], None],
                 watch_sessions: bool = True, parent: QObject | None = None) -> None:
        """``facts``: the running server's once ready (compatibility depends on them); ``settings``:
        the settings in use; ``command``: posts an engine command (completing the search index)."""
        super().__init__(parent)
        self._engine = engine
        self._jobs = jobs
        self._facts, self._settings, self._command = facts, settings, command

        self.listing: Listing | None = None
        # When each session last changed (its KV file's time): "last used" also moves when a launch
        # restores it or a quit finds it unchanged, so it cannot tell conversations apart.
        self.saved_at: dict[str, float] = {}
        self.history: list[RequestRecord] = []
        # The chosen model's file with links resolved (as sidecars record it), and the remembered
        # models by their resolved files: worked out off the GUI thread when the settings change.
        self.model_file: str | None = None
        self.model_aliases: dict[str, str] = {}
        self.found_models: list | None = None  # None until the first search has answered
        self.model_search_dirs: list[tuple[str, Path]] | None = None  # None: the usual places

        self._closed = False
        self._lock = threading.Lock()
        # Sessions a use case of this app is changing (id -> how many changes): their files'
        # events do not list the folder again, the use case's SessionChanges say what changed.
        self._own: dict[str, int] = {}
        self._listing_running = False
        self._listing_again = False
        self._search_seq = 0
        self._searching_models = False

        self._fsChanged.connect(self._on_fs_changed, Qt.ConnectionType.QueuedConnection)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(SESSIONS_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._sessions_settled)
        self._observer = None
        if watch_sessions:
            self._observer = _start_observer(engine.paths.sessions_dir, self._notify_fs_change)

    # -- the sessions folder --------------------------------------------------------------
    def _notify_fs_change(self, names: list[str]) -> None:  # watchdog's thread
        with self._lock:
            if self._closed:
                return
            # <id>.json, <id>.<gen>.kv, <id>.<gen>.chat and an atomic write's .<id>.json.<x>.tmp
            if names and all(name.lstrip(".").split(".", 1)[0] in self._own for name in names):
                return  # our own change: applied from what the use case returned
            self._fsChanged.emit()

    # -- changes made here ------------------------------------------------------------------
    def expect(self, session_ids: Iterable[str]) -> None:
        """A use case is about to change these sessions (on the GUI thread, before it runs)."""
        with self._lock:
            for sid in session_ids:
                self._own[sid] = self._own.get(sid, 0) + 1

    def done_with(self, session_ids: Iterable[str]) -> None:
        """The use case ended; its files' events may still be on their way (debounce's time)."""
        ids = list(session_ids)

        def release() -> None:
            with self._lock:
                for sid in ids:
                    left = self._own.get(sid, 0) - 1
                    if left > 0:
                        self._own[sid] = left
                    else:
                        self._own.pop(sid, None)

        QTimer.singleShot(2 * SESSIONS_DEBOUNCE_MS, self, release)

    def apply_changes(self, changes: SessionChanges) -> None:
        """Show what a use case changed without listing the folder (``sessionsListed``)."""
        if self._closed:
            return
        if self.listing is None:
            self.refresh_sessions()
            return
        if self._listing_running:  # it may have listed the folder before the change
            self._listing_again = True
        self.listing = changes.apply(self.listing)
        for sid in changes.removed:
            self.saved_at.pop(sid, None)
        self.saved_at.update(saved_times(Listing(list(changes.changed), [])))
        self.sessionsListed.emit(self.listing, self._facts())

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
            listing = self._engine.sessions.listing()
            return listing, saved_times(listing)

        def done(result: tuple[Listing, dict[str, float]]) -> None:
            listing, self.saved_at = result
            self._listing_running = False
            self.listing = listing
            self.sessionsListed.emit(listing, self._facts())
            if self._listing_again:
                self._listing_again = False
                self.refresh_sessions()

        def failed(exc: BaseException) -> None:
            self._listing_running = False
            self.errorOccurred.emit("Listing saved conversations", describe_error(exc))

        self._jobs.run(list_folder, on_success=done, on_failure=failed,
                       description="Listing saved conversations")

    def relist_cached(self) -> None:
        """Compatibility depends on the running server: re-announce the listing we have."""
        if self.listing is not None:
            self.sessionsListed.emit(self.listing, self._facts())

    def after_event(self, event: ev.Event) -> None:
        """After the widgets' handlers: the server changed, so did what restores."""
        if isinstance(event, ev.ServerStateChanged):
            self.relist_cached()
        elif isinstance(event, ev.EngineReady):
            self.relist_cached()
            self.refresh_sessions()

    # -- searching by content ---------------------------------------------------------------
    def search_sessions(self, text: str) -> None:
        """Search the saved conversations by what was said in them (a job); answers with
        ``sessionsFound`` for the latest call only. Entries the index has by title only are
        completed by the running server, when it runs their model."""
        self._search_seq += 1
        seq = self._search_seq
        if self._closed:
            return
        engine = self._engine

        def done(result: Any) -> None:
            if seq != self._search_seq or self._closed:
                return  # a newer search was asked for meanwhile
            self.sessionsFound.emit(result)
            if result.partial and self._facts() is not None:
                self._command(engine.complete_search_async(), "Indexing saved conversations")

        def failed(exc: BaseException) -> None:
            if seq == self._search_seq:
                self.errorOccurred.emit("Searching saved conversations", describe_error(exc))

        self._jobs.run(engine.search_sessions, text, on_success=done, on_failure=failed,
                       description="Searching saved conversations")

    # -- history --------------------------------------------------------------------------
    def load_history(self) -> None:
        def load() -> list:
            return self._engine.recent_requests(HISTORY_SHOWN)

        def done(records: list) -> None:
            # Requests recorded while the file was being read are kept, not lost.
            last = records[-1].at if records else float("-inf")
            newer = [r for r in self.history if r.at > last]
            self.history = [*records, *newer][-HISTORY_SHOWN:]
            self.historyLoaded.emit(self.history)

        self._jobs.run(load, on_success=done, description="Reading the request history")

    def before_event(self, event: ev.Event) -> None:
        """Before the widgets' handlers: a request's figures join the history."""
        if isinstance(event, ev.RequestDone):
            record = RequestRecord(at=event.at, slot=event.slot, n_prompt=event.n_prompt,
                                   cache_n=event.cache_n, prompt_n=event.prompt_n, prompt_ms=event.prompt_ms,
                                   source=event.source, saved_ms=event.saved_ms)
            self.history = [*self.history, record][-HISTORY_SHOWN:]
            self.historyLoaded.emit(self.history)

    # -- models ---------------------------------------------------------------------------
    def resolve_model_files(self, *_args) -> None:
        """Work out ``model_file`` and ``model_aliases`` (links resolved) as a job."""
        settings = self._settings()
        models_dir = self._engine.paths.models_dir

        def resolve() -> tuple[str | None, dict[str, str]]:
            return model_files(settings.profile.model_path, settings.models, models_dir)

        def done(result: tuple[str | None, dict[str, str]]) -> None:
            self.model_file, self.model_aliases = result
            self.modelFileResolved.emit()

        self._jobs.run(resolve, on_success=done, description="Finding the model files")

    def discover_models(self) -> None:
        """Look for GGUF models on this computer (a job); answers with ``modelsFound``."""
        if self._closed or self._searching_models:
            return
        self._searching_models = True
        dirs = self.model_search_dirs

        def find() -> list:
            from slotkeeper.core.model import discovery

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

        self._jobs.run(find, on_success=done, on_failure=failed, description="Looking for models")

    def close(self) -> None:
        """Stop watching and the timer; no signal is emitted afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._debounce.stop()
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=5)
            except Exception:  # the folder may be gone; nothing left to stop then
                log.debug("stopping the sessions watcher failed", exc_info=True)
            self._observer = None


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


# -- watchdog ------------------------------------------------------------------------------
def _start_observer(directory: Path, notify: Callable[[list[str]], None]):
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
            notify(names)

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
