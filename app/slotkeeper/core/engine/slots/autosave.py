"""When to save: turn-end and idle detection from /slots polls. Pure decisions, no I/O.

Each slot's record (``slots.Slot``) has a ``SlotWatch``: a poll of /slots updates it
(``SlotWatch.observe``) and ``AutosavePolicy.due()`` says which slots to save now. A slot is due
when its last task has finished, it has stayed idle for ``idle_save_seconds`` and its content
changed since it was last saved or restored. A save blocks
llama-server's task loop, so while another slot is generating we wait, but at most
``max_defer_seconds`` past the idle point, so a busy server still gets its conversations saved.

A save that fails is retried with a growing delay (``RETRY_FIRST_SECONDS`` doubling up to
``RETRY_MAX_SECONDS``), never every poll: each attempt makes llama-server write a whole file.
A change seen while a save runs (the next request began) keeps the slot marked changed: the save
records the ``generation`` it started from and only a save of the latest one clears the mark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slotkeeper.core.server.client import SlotInfo

MAX_DEFER_SECONDS = 60.0
POLL_SECONDS = 0.5
# While no slot is busy or waiting to be saved: a request through the front door wakes the poller.
IDLE_POLL_SECONDS = 2.0
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0


@dataclass
class SlotWatch:
    """What autosave decides by, for one slot (part of the slot's record, ``slots.Slot``)."""

    slot: int
    processing: bool = False
    last_task: int | None = None
    changed: bool = False
    idle_since: float | None = None
    acting: str | None = None  # "saving" / "restoring" while Slotkeeper acts on the slot
    leased: bool = False  # a request through the front door runs on it
    generation: int = 0  # counts the changes seen; a save clears ``changed`` only if none came since
    failures: int = 0  # saves that failed in a row
    retry_at: float | None = None  # no save attempt before this (after a failure)

    def touch(self) -> None:
        self.changed = True
        self.generation += 1

    def saved(self, generation: int | None = None) -> None:
        """The slot was saved as of ``generation`` (None: whatever it holds now)."""
        self.changed = generation is not None and self.generation != generation
        self.failures, self.retry_at = 0, None

    def restored(self) -> None:
        """It holds exactly a saved session now: nothing to save."""
        self.changed = False

    def request_done(self, now: float) -> None:
        """A request through the front door finished on the slot: its turn ended now."""
        self.touch()
        self.idle_since = now

    def save_failed(self, now: float) -> float:
        """Back off: returns the seconds until the next attempt."""
        self.failures += 1
        delay = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** (self.failures - 1))
        self.retry_at = now + delay
        return delay

    def observe(self, info: SlotInfo, now: float, first: bool = False) -> bool:
        """Update from the slot's line of one /slots poll; True when its turn just ended.

        Every request comes through the front door, which marks the slot changed itself
        (``request_done``): a poll can only be late, and a late one would mark a slot changed again
        right after its save. Only a server Slotkeeper did not start (``first`` poll of an adopted
        one) may hold changes no request told of."""
        new_task = info.id_task is not None and info.id_task != self.last_task
        ended = False
        if first:
            if info.id_task is not None:
                self.touch()
            self.idle_since = None if info.is_processing else now
        elif info.is_processing:
            self.idle_since = None
        elif self.processing or new_task:
            # The turn ended (or a whole short request ran between two polls).
            self.idle_since = now
            ended = True
        self.processing = info.is_processing
        self.last_task = info.id_task
        return ended


class AutosavePolicy:
    """When to save, decided over the slots' watches it is given (the slot board keeps them)."""

    def __init__(self, idle_save_seconds: float, max_defer_seconds: float = MAX_DEFER_SECONDS) -> None:
        self.idle_save_seconds = max(0.0, float(idle_save_seconds))
        self.max_defer_seconds = max_defer_seconds

    def due(self, watches: Iterable[SlotWatch], now: float) -> list[int]:
        watches = list(watches)
        anyone_busy = any(w.processing or w.leased for w in watches)
        out = []
        for w in watches:
            if not w.changed or w.processing or w.idle_since is None or w.acting or w.leased:
                continue
            if w.retry_at is not None and now < w.retry_at:
                continue
            idle_for = now - w.idle_since
            if idle_for < self.idle_save_seconds:
                continue
            if anyone_busy and idle_for < self.idle_save_seconds + self.max_defer_seconds:
                continue
            out.append(w.slot)
        return out
