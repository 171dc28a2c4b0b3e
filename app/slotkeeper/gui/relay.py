"""Core events -> the GUI thread: one queued Qt signal, handlers by event type, log lines in batches.

The engine emits typed events on its loop (and the supervisor on its thread). The relay turns
each one into one queued Qt signal, so every handler runs on the GUI thread; widgets subscribe by
type through the bridge (``bridge.on(SessionSaved, self._on_saved)``). It keeps what the events
said last (on the GUI thread they are the truth, in the order they came: the engine's snapshot may
already be further along) and Slotkeeper's own actions in words (the journal). The server log's
lines come in batches: one wake-up of the GUI thread per burst, llama-server's idle heartbeat
dropped before it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import shiboken6
from PySide6.QtCore import QObject, Qt, Signal, Slot

from slotkeeper.core import events as ev
from slotkeeper.core.journal import JournalEntry, journal_entry
from slotkeeper.core.views import STOPPED_STATES, Activity, ServerState, SlotView, is_idle_heartbeat

if TYPE_CHECKING:
    from slotkeeper.core.engine import Engine

log = logging.getLogger(__name__)

E = TypeVar("E", bound=ev.Event)

JOURNAL_KEPT = 2000  # entries of the activity list kept in memory (the oldest go first)


class _HandlerRef:
    """A handler the relay calls; a bound method of a QObject is dropped once its object is gone."""

    def __init__(self, handler: Callable[[Any], None]) -> None:
        owner = getattr(handler, "__self__", None)
        if isinstance(owner, QObject) and hasattr(handler, "__func__"):
            self._method: weakref.WeakMethod | None = weakref.WeakMethod(handler)
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


class EventRelay(QObject):
    eventArrived = Signal(object)  # every core event, on the GUI thread, after the typed handlers
    logLines = Signal(object)  # [str], batched
    journalAdded = Signal(object)  # JournalEntry: one of Slotkeeper's own actions, in words

    _eventQueued = Signal(object)
    _logWake = Signal()

    def __init__(self, engine: Engine, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._remove_log_listener = engine.remove_log_listener
        # What the events said last.
        self.state: ServerState = engine.state
        self.state_message: str = engine.snapshot.state_message
        self.slots: tuple[SlotView, ...] = ()
        self.waiting = 0  # requests waiting for a slot
        self.activity: Activity = Activity()
        # Slotkeeper's own actions since the app started (the Server tab's activity list).
        self.journal: list[JournalEntry] = []
        self.last_warning: str | None = None  # the newest WarningRaised's message

        self._handlers: list[tuple[type[ev.Event], _HandlerRef]] = []
        self._before: list[Callable[[ev.Event], None]] = []
        self._after: list[Callable[[ev.Event], None]] = []
        self._closed = False
        self._emit_lock = threading.Lock()
        self._log_buffer: list[str] = []

        self._eventQueued.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._logWake.connect(self._drain_log, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe = engine.events.subscribe(self.core_event)
        engine.add_log_listener(self.log_line)

    def on(self, event_type: type[E], handler: Callable[[E], None]) -> None:
        """Call ``handler`` on the GUI thread for every event of ``event_type`` (a subclass of
        ``Event``). A bound method of a QObject stops being called once its object is deleted."""
        if not (isinstance(event_type, type) and issubclass(event_type, ev.Event)):
            raise TypeError(f"{event_type!r} is not an event type")
        self._handlers.append((event_type, _HandlerRef(handler)))

    def before_handlers(self, fn: Callable[[ev.Event], None]) -> None:
        """Call ``fn`` with every event once the relay's own record is up to date, before the
        journal and the typed handlers (bookkeeping the handlers may read)."""
        self._before.append(fn)

    def after_handlers(self, fn: Callable[[ev.Event], None]) -> None:
        """Call ``fn`` with every event after the typed handlers, before ``eventArrived``."""
        self._after.append(fn)

    # -- any thread -----------------------------------------------------------------------
    def core_event(self, event: ev.Event) -> None:
        with self._emit_lock:
            if not self._closed:
                self._eventQueued.emit(event)

    def log_line(self, line: str) -> None:  # the log tailer's thread
        if is_idle_heartbeat(line):  # twice a second at -lv 4: not worth waking the GUI for
            return
        with self._emit_lock:
            if self._closed:
                return
            wake = not self._log_buffer
            self._log_buffer.append(line)
            if wake:
                self._logWake.emit()

    # -- the GUI thread -------------------------------------------------------------------
    def announce(self, event: ev.Event) -> None:
        """An event the GUI concludes itself (a start the engine refused before llama-server ran:
        FAILED with the reason), handled as the engine's own are. On the GUI thread."""
        self._dispatch(event)

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
                self.slots, self.waiting = (), 0
        elif isinstance(event, ev.SlotsChanged):
            self.slots, self.waiting = event.slots, event.waiting
        elif isinstance(event, ev.ActivityChanged):
            self.activity = event.activity
        elif isinstance(event, ev.WarningRaised):
            self.last_warning = event.message  # for a window built after it
        for fn in self._before:
            fn(event)
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
        for fn in self._after:
            fn(event)
        self.eventArrived.emit(event)

    def close(self) -> None:
        """Stop listening; no signal is emitted afterwards."""
        with self._emit_lock:
            if self._closed:
                return
            self._closed = True
        self._unsubscribe()
        self._remove_log_listener(self.log_line)
