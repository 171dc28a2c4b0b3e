"""Typed events and a small thread-safe bus.

Every event is a frozen dataclass; subscribers pick the types they want
(``bus.subscribe(handler, SessionSaved, SaveFailed)``) or take them all. A misspelt type is an
import error, not an event nobody hears. The engine emits on its own loop; the supervisor emits
server events on its thread. Handlers run on the emitting thread, so they must be quick: the Qt
bridge re-emits each event as one queued signal, `serve` logs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from slotkeeper.core.views import Activity, RestoreSummary, SaveSummary, ServerState, SlotView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """Base of every event."""


# -- the server process (from the supervisor) ------------------------------------------------
@dataclass(frozen=True)
class ServerStateChanged(Event):
    state: ServerState
    message: str = ""
    log_tail: tuple[str, ...] = ()  # the last log lines, on CRASHED and FAILED
    pid: int | None = None
    delay: float | None = None  # seconds until the restart, on RESTARTING


@dataclass(frozen=True)
class LaunchFellBack(Event):
    """llama-server ended with ``exit_code`` during start-up: the launch's fallback (``argv``) runs."""

    exit_code: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class ServerLoading(Event):
    elapsed: float  # seconds since launch
    detail: str  # the last log line


@dataclass(frozen=True)
class ServerAdopted(Event):
    pid: int


# -- the engine ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineReady(Event):
    """Launch work is done (model identified, sessions restored): requests hit the cache now."""

    url: str
    restored: tuple[RestoreSummary, ...] = ()


@dataclass(frozen=True)
class LaunchPlanned(Event):
    """A launch of llama-server begins: what it runs is known (the server link has it)."""

    model_path: str | None


@dataclass(frozen=True)
class ActivityChanged(Event):
    activity: Activity


@dataclass(frozen=True)
class FlashAttnMeasured(Event):
    """Flash attention was measured on this machine for a model (``words`` say the figures);
    ``value`` is passed from the next launch on, ``running`` is what the server runs with now."""

    model: str
    value: bool
    running: bool
    words: str


@dataclass(frozen=True)
class WarningRaised(Event):
    message: str


@dataclass(frozen=True)
class NoticeRaised(Event):
    message: str


@dataclass(frozen=True)
class SlotsChanged(Event):
    slots: tuple[SlotView, ...]
    waiting: int = 0  # requests waiting for a slot (all busy, or a busy one that holds their conversation)


@dataclass(frozen=True)
class SlotRecomputed(Event):
    """A slot was emptied so llama-server recomputes a request from scratch: reusing its restored
    state would have given a different answer than a cold server."""

    slot: int
    session_id: str | None
    reason: str


@dataclass(frozen=True)
class RequestDone(Event):
    slot: int
    task: int
    n_prompt: int
    cache_n: int
    prompt_n: int
    prompt_ms: float
    at: float  # unix time
    source: str = ""  # where the cache came from: slot, restored, ram, recomputed, none
    saved_ms: float = 0.0  # prefill time the cached tokens saved


# -- sessions --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionSaved(Event):
    summary: SaveSummary


@dataclass(frozen=True)
class SaveFailed(Event):
    slot: int
    message: str


@dataclass(frozen=True)
class SessionRestored(Event):
    summary: RestoreSummary


@dataclass(frozen=True)
class SessionRefused(Event):
    id: str
    slot: int | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class RestoreReused(Event):
    """How much of a restored session the next request on its slot reused."""

    slot: int
    id: str
    cache_n: int
    n_prompt: int
    n_restored: int
    effective: bool | None  # None: not judged (the request did not continue the restored conversation)
    reason: str | None = None


@dataclass(frozen=True)
class SessionsPruned(Event):
    ids: tuple[str, ...]
    bytes_freed: int


@dataclass(frozen=True)
class FolderTidied(Event):
    """Files an interrupted save left in the sessions folder were removed (at the first start, and after
    llama-server crashed mid-save)."""

    removed: tuple[str, ...]


@dataclass(frozen=True)
class SearchIndexRepaired(Event):
    """The search index was brought back in step with the sessions folder: entries of deleted
    sessions dropped, missing ones added from their titles (``added``), or completed with the
    conversation's full text by the running server (``completed``)."""

    added: int = 0
    dropped: int = 0
    completed: int = 0


E = TypeVar("E", bound=Event)
Handler = Callable[[Event], None]


class EventBus:
    def __init__(self, held: bool = False) -> None:
        """``held``: events wait in order until ``release()`` (for listeners that arrive later)."""
        self._lock = threading.Lock()
        self._handlers: list[tuple[tuple[type[Event], ...], Handler]] = []
        self._firsts = 0  # the handlers subscribed ``first`` lead the list
        self._held: list[Event] | None = [] if held else None

    def release(self) -> None:
        """Deliver the events held so far, in order, then every event as it comes."""
        while True:
            with self._lock:
                if not self._held:
                    self._held = None
                    return
                batch, self._held = self._held, []
            for event in batch:
                self._deliver(event)

    def subscribe(self, handler: Callable[[E], None], *types: type[E],
                  first: bool = False) -> Callable[[], None]:
        """Call ``handler`` for events of ``types`` (every event when none). Returns an unsubscribe.
        ``first``: before the handlers that are not (the engine's own snapshot is brought up to date
        before any face hears of a change and reads it)."""
        for t in types:
            if not (isinstance(t, type) and issubclass(t, Event)):
                raise TypeError(f"{t!r} is not an event type")
        entry = (tuple(types) or (Event,), handler)
        with self._lock:
            # A handler of E is kept with the handlers of every event: only events of its types reach it.
            if first:
                self._handlers.insert(self._firsts, entry)  # type: ignore[arg-type]
                self._firsts += 1
            else:
                self._handlers.append(entry)  # type: ignore[arg-type]

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._handlers:
                    if self._handlers.index(entry) < self._firsts:
                        self._firsts -= 1
                    self._handlers.remove(entry)

        return unsubscribe

    def emit(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"{event!r} is not an event")
        with self._lock:
            if self._held is not None:
                self._held.append(event)
                return
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        with self._lock:
            handlers = [h for types, h in self._handlers if isinstance(event, types)]
        for handler in handlers:
            try:
                handler(event)
            except Exception:  # a broken listener must not break the engine
                log.exception("event handler failed for %s", type(event).__name__)
