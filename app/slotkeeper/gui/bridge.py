"""The GUI's one way to the core: events in, actions out.

It composes two parts and keeps one API for every face: the event relay (``gui/relay.py``: core
events -> one queued Qt signal on the GUI thread and handlers by type, ``bridge.on(SessionSaved,
self._on_saved)``, the log lines in batches) and the feeds (``gui/feeds.py``: the sessions listing
kept up to date with the folder, searches, the request history, the model files, as jobs). Widget
actions post engine commands to the engine loop (``engine.post``) or run service calls as jobs, so
the GUI thread never waits on HTTP or disk; the use cases behind them (applying settings, switching
models, whether a session can be resumed) are the services' (``core.services``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Signal

from slotkeeper.core import events as ev
from slotkeeper.core.engine import Engine, EngineError, EngineSnapshot
from slotkeeper.core.services.resume import ResumeVerdict, resume_verdict
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.services.switching import SwitchOutcome, resolved_model_file
from slotkeeper.core.services.use_cases import ENGINE_USE_CASES, SESSION_USE_CASES, Changes
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.naming import sidecar_name
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import RUNNING_STATES, STOPPED_STATES, SavesReport, ServerState
from slotkeeper.gui.feeds import Feeds
from slotkeeper.gui.jobs import JobRunner, describe_error
from slotkeeper.gui.relay import EventRelay

__all__ = ["EngineBridge", "SwitchOutcome", "initial_log", "resolved_model_file"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=ev.Event)

LOG_BACKLOG_LINES = 400


def _kept_by(part: str, name: str) -> property:
    """The bridge's attribute ``name``, kept by its part ``part`` (the relay or the feeds)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class EngineBridge(QObject):
    eventArrived = Signal(object)  # every core event, on the GUI thread, after the typed handlers
    logLines = Signal(object)  # [str], batched

    # -- derived --------------------------------------------------------------------------
    sessionsChanged = Signal()  # something in the sessions folder changed (debounced)
    sessionsListed = Signal(object, object)  # Listing, ServerFacts | None (None: not ready)
    historyLoaded = Signal(object)  # [RequestRecord], oldest first
    settingsChanged = Signal(object)  # Settings, after they were saved and applied
    modelSwitched = Signal(object)  # SwitchOutcome: the model (and its settings) in use now, or why not
    modelFileResolved = Signal()  # model_file / model_aliases are up to date with the settings
    modelsFound = Signal(object)  # [FoundModel]: GGUF files on this computer (core.model.discovery)
    sessionVerified = Signal(object)  # SessionEntry after a verify
    errorOccurred = Signal(str, str)  # what failed, why (for a message box or a notification)
    busyChanged = Signal(bool)  # background jobs running
    journalAdded = Signal(object)  # JournalEntry: one of Slotkeeper's own actions, in words
    sessionsFound = Signal(object)  # SearchResult of the latest search by content (older answers dropped)
    # Whether llama-server serves its own web UI at the address (checked once ready).
    webUiChanged = Signal(bool)

    # What the events said last (the relay's; on the GUI thread they are the truth, in the order
    # they came: the engine's snapshot may already be further along), and Slotkeeper's own actions
    # since the app started (the journal), the newest WarningRaised's message.
    state = _kept_by("relay", "state")
    state_message = _kept_by("relay", "state_message")
    slots = _kept_by("relay", "slots")
    waiting = _kept_by("relay", "waiting")
    activity = _kept_by("relay", "activity")
    journal = _kept_by("relay", "journal")
    last_warning = _kept_by("relay", "last_warning")
    # What the feeds read and keep: the listing, when each session's KV file last changed, the
    # request history, the chosen model's file and the remembered ones by their resolved files,
    # the models found (None until the first search answered) and where to look (None: the usual).
    listing = _kept_by("feeds", "listing")
    saved_at = _kept_by("feeds", "saved_at")
    history = _kept_by("feeds", "history")
    model_file = _kept_by("feeds", "model_file")
    model_aliases = _kept_by("feeds", "model_aliases")
    found_models = _kept_by("feeds", "found_models")
    model_search_dirs = _kept_by("feeds", "model_search_dirs")
    _observer = _kept_by("feeds", "_observer")
    _debounce = _kept_by("feeds", "_debounce")

    def __init__(self, engine: Engine, settings_service: SettingsService | None = None,
                 parent: QObject | None = None, watch_sessions: bool = True) -> None:
        super().__init__(parent)
        self.engine = engine
        self.settings_service = settings_service or SettingsService(engine.paths.settings_file)
        self.jobs = JobRunner(self)
        self.jobs.jobFailed.connect(self.errorOccurred)
        self.jobs.busyChanged.connect(self.busyChanged)
        self.quitting = False
        self._closed = False

        self.relay = EventRelay(engine, self)
        self.feeds = Feeds(engine, self.jobs, facts=lambda: self.facts, settings=lambda: self.settings,
                           command=self._command, watch_sessions=watch_sessions, parent=self)
        self.relay.before_handlers(self.feeds.before_event)  # a request joins the history
        self.relay.after_handlers(self.feeds.after_event)  # the listing again, with the new facts
        for signal in ("eventArrived", "logLines", "journalAdded"):
            getattr(self.relay, signal).connect(getattr(self, signal))
        for signal in ("sessionsChanged", "sessionsListed", "sessionsFound", "historyLoaded",
                       "modelFileResolved", "modelsFound", "errorOccurred"):
            getattr(self.feeds, signal).connect(getattr(self, signal))
        self.settingsChanged.connect(self.feeds.resolve_model_files)
        self.feeds.resolve_model_files()
        self.web_ui = False  # llama-server's own chat page answers at base_url (see check_web_ui)
        self.relay.on(ev.EngineReady, self.check_web_ui)
        self.relay.on(ev.ServerStateChanged, self._web_ui_gone)

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

    def resume_verdict(self, entry: SessionEntry) -> ResumeVerdict:
        """Whether ``entry`` can be resumed now, or by switching to its model (one rule, every face)."""
        return resume_verdict(entry, self.state, self.facts, bool(self.settings.profile.model_path),
                              self.model_file, self.model_aliases)

    def session_file(self, entry: SessionEntry) -> Path:
        """The file to show for a session in a file manager."""
        return entry.kv_path or self.paths.sessions_dir / sidecar_name(entry.id)

    # -- core events (the relay) ----------------------------------------------------------
    def on(self, event_type: type[E], handler: Callable[[E], None]) -> None:
        """Call ``handler`` on the GUI thread for every event of ``event_type`` (a subclass of
        ``Event``). A bound method of a QObject stops being called once its object is deleted."""
        self.relay.on(event_type, handler)

    def _on_log_line(self, line: str) -> None:  # any thread: as the engine's log listener does
        self.relay.log_line(line)

    # -- reads (the feeds, as jobs) -------------------------------------------------------
    def refresh_sessions(self) -> None:
        """List the sessions folder off the GUI thread; answers with ``sessionsListed``."""
        self.feeds.refresh_sessions()

    def search_sessions(self, text: str) -> None:
        """Search the saved conversations by what was said in them; answers with ``sessionsFound``
        for the latest call only."""
        self.feeds.search_sessions(text)

    def load_history(self) -> None:
        """Read the request history; answers with ``historyLoaded``."""
        self.feeds.load_history()

    def resolve_model_files(self, *_args) -> None:
        """Work out ``model_file`` and ``model_aliases`` (links resolved); ``modelFileResolved``."""
        self.feeds.resolve_model_files()

    def discover_models(self) -> None:
        """Look for GGUF models on this computer; answers with ``modelsFound``."""
        self.feeds.discover_models()

    def load_conversation(self, session_id: str, on_done: Callable[[Any], None],
                          on_failure: Callable[[BaseException], None] | None = None) -> None:
        """A saved conversation as ``(SessionEntry, Transcript | None)`` (None: saved without a
        transcript), read off the GUI thread; ``on_done`` gets it on the GUI thread."""
        sessions = self.engine.sessions

        def read() -> tuple[SessionEntry, Any]:
            return sessions.get(session_id), sessions.transcript(session_id)

        self.jobs.run(read, on_success=on_done, on_failure=on_failure, description="Reading the conversation")

    def api_key(self, on_done: Callable[[str | None], None],
                on_failure: Callable[[BaseException], None] | None = None) -> None:
        """The key the front door takes now (None: none), read off the GUI thread (a key file)."""
        self.jobs.run(lambda: self.engine.api_key, on_success=on_done, on_failure=on_failure,
                      description="Reading the API key")

    def check_web_ui(self, *_args) -> None:
        """Whether llama-server serves its own web UI at the address (GET / answers 200 with HTML):
        checked once the engine is ready; answers with ``webUiChanged``."""
        if self._closed:
            return
        from slotkeeper.gui.chat.web_ui import serves_web_ui

        url = self.base_url

        def done(found: bool) -> None:
            if found != self.web_ui and self.base_url == url and self.facts is not None:
                self.web_ui = found
                self.webUiChanged.emit(found)

        self.jobs.run(serves_web_ui, url, lambda: self.engine.api_key, on_success=done,
                      on_failure=lambda exc: log.info("no web UI check: %s", exc),
                      description="Looking for llama-server's web UI")

    def _web_ui_gone(self, event: ev.ServerStateChanged) -> None:
        if event.state is not ServerState.READY and self.web_ui:
            self.web_ui = False
            self.webUiChanged.emit(False)

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
                                    "No model chosen yet: pick one in Settings, or use the starter model.")
            return
        if resume_id is not None:
            self.use("resume", resume_id,
                     on_failure=lambda exc: self._start_failed("Starting llama-server", exc))
            return
        self._command(self.engine.start_async(), "Starting llama-server",
                      on_failure=lambda exc: self._start_failed("Starting llama-server", exc))

    def _start_failed(self, what: str, exc: BaseException) -> None:
        """A start the engine refused before llama-server ran (its port is taken, a launch that
        would not fit): a failure with its reason, as one of llama-server itself is (the window's
        state, the red icon, the activity list), never a traceback."""
        message = describe_error(exc)
        log.warning("%s failed: %s", what, message)
        if isinstance(exc, EngineError) and self.state in STOPPED_STATES and not self.quitting:
            self.relay.announce(ev.ServerStateChanged(ServerState.FAILED, message))
        else:
            self.errorOccurred.emit(what, message)

    def stop_server(self, save: bool = True, on_done: Callable[[], None] | None = None) -> None:
        self._command(self.engine.stop_async(save), "Saving conversations and stopping llama-server",
                      on_success=lambda _: on_done() if on_done is not None else None)

    def restart_server(self) -> None:
        """Save changed slots, stop, start again with the current settings."""
        self._command(self.engine.restart_async(), "Restarting llama-server",
                      on_failure=lambda exc: self._start_failed("Restarting llama-server", exc))

    def save_slot(self, slot: int) -> None:
        self._command(self.engine.save_slot_async(slot), f"Saving slot {slot}")

    # -- use cases (``core.services.use_cases``: one table for every face) -----------------
    def use(self, name: str, *args: Any, on_done: Callable[[Changes], None] | None = None,
            on_failure: Callable[[BaseException], None] | None = None, **kwargs: Any) -> None:
        """Run the use case ``name`` (a session's as a job, the engine's on its loop); what it
        changed is applied in one place (``_apply``), then ``on_done(changes)``. A failure is said
        (``on_failure`` instead, when given); a session's listing then shows what is on disk."""
        if name in SESSION_USE_CASES:
            case = SESSION_USE_CASES[name]
            ids = (str(args[0]),)
            self.feeds.expect(ids)

            def done(changes: Changes) -> None:
                self.feeds.done_with(ids)
                self._apply(changes)
                if on_done is not None:
                    on_done(changes)

            def failed(exc: BaseException) -> None:
                self.feeds.done_with(ids)
                self.errorOccurred.emit(case.doing, describe_error(exc))
                self.refresh_sessions()  # what is on disk, whatever happened

            self.jobs.run(case.run, self.engine.sessions, *args, on_success=done, on_failure=failed,
                          description=case.doing)
            return
        use_case = ENGINE_USE_CASES[name]

        def applied(changes: Changes) -> None:
            self._apply(changes)
            if on_done is not None:
                on_done(changes)

        self._command(use_case.run(self.engine, self.settings_service, *args, **kwargs), use_case.doing,
                      on_success=applied, on_failure=on_failure)

    def _apply(self, changes: Changes) -> None:
        """The one hook that applies what a use case changed: the listing (the folder is not
        listed again for it), the settings in use, a model switch's outcome."""
        if changes.sessions.ids:
            self.feeds.apply_changes(changes.sessions)
        if changes.settings is not None:
            self.settingsChanged.emit(changes.settings)
        if changes.switch is not None:
            self.modelSwitched.emit(changes.switch)

    def set_pinned(self, session_id: str, pinned: bool) -> None:
        self.use("pin" if pinned else "unpin", session_id)

    def delete_session(self, session_id: str) -> None:
        self.use("delete", session_id)

    def verify_session(self, session_id: str) -> None:
        self.use("verify", session_id,
                 on_done=lambda changes: self.sessionVerified.emit(changes.sessions.changed[0]))

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
        self.use("settings", settings, restart=restart, persist=persist,
                 on_done=lambda _changes: on_done() if on_done is not None else None)

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

        def done(changed: Changes) -> None:
            if on_done is not None and changed.switch is not None:
                on_done(changed.switch)

        def failed(exc: BaseException) -> None:
            outcome = SwitchOutcome(model_path, False, SavesReport(), None, describe_error(exc))
            self._start_failed("Switching models", exc)
            self._apply(Changes(switch=outcome))
            if on_done is not None:
                on_done(outcome)

        self.use("switch", model_path, resume_id=resume_id, force=force, start=start, on_done=done,
                 on_failure=failed, **changes)

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
        self._closed = True
        self.relay.close()
        self.feeds.close()
        self.jobs.shutdown()


def initial_log(engine: Engine, n: int = LOG_BACKLOG_LINES) -> list[str]:
    """The last lines of the server log (disk: call it from a job)."""
    return engine.log_tail(n)
