"""A tiny thread-safe publish/subscribe bus.

The engine emits events from worker threads; the GUI bridge re-emits them as Qt signals and
`slotkeeper serve` logs them. Handlers run on the emitting thread, so they must be quick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: list[tuple[str | None, Handler]] = []

    def subscribe(self, handler: Handler, kind: str | None = None) -> Callable[[], None]:
        """Call ``handler`` for events of ``kind`` (all events when None). Returns an unsubscribe."""
        entry = (kind, handler)
        with self._lock:
            self._handlers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._handlers:
                    self._handlers.remove(entry)

        return unsubscribe

    def emit(self, kind: str, /, **data: Any) -> None:
        event = Event(kind, data)
        with self._lock:
            handlers = [h for k, h in self._handlers if k is None or k == kind]
        for handler in handlers:
            try:
                handler(event)
            except Exception:  # a broken listener must not break the engine
                log.exception("event handler failed for %s", kind)
