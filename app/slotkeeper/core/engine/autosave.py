"""When to save: turn-end and idle detection from /slots polls. Pure decisions, no I/O.

The engine feeds each poll of /slots to ``AutosavePolicy.observe`` and asks ``due()`` which slots
to save now. A slot is due when its last task has finished, it has stayed idle for
``idle_save_seconds`` and its content changed since it was last saved or restored. A save blocks
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
    slot: int
    processing: bool = False
    last_task: int | None = None
    changed: bool = False
    idle_since: float | None = None
    session_id: str | None = None  # the saved session whose tokens this slot holds
    busy_with: str | None = None  # "saving" / "restoring" while Slotkeeper acts on the slot
    in_request: bool = False  # a request through the front door runs on it
    generation: int = 0  # counts the changes seen; a save clears ``changed`` only if none came since
    failures: int = 0  # saves that failed in a row
    retry_at: float | None = None  # no save attempt before this (after a failure)

    def touch(self) -> None:
        self.changed = True
        self.generation += 1


class AutosavePolicy:
    def __init__(self, idle_save_seconds: float, max_defer_seconds: float = MAX_DEFER_SECONDS,
                 changes_from_polls: bool = True) -> None:
        """``changes_from_polls``: a poll that sees a task run marks its slot changed. False when
        every request comes through the front door, which says so itself (``request_done``): a
        poll can only be late, and a late one would mark a slot changed again right after its save."""
        self.idle_save_seconds = max(0.0, float(idle_save_seconds))
        self.max_defer_seconds = max_defer_seconds
        self.changes_from_polls = changes_from_polls
        self.slots: dict[int, SlotWatch] = {}

    def watch(self, slot: int) -> SlotWatch:
        return self.slots.setdefault(slot, SlotWatch(slot))

    def observe(self, slots: Iterable[SlotInfo], now: float, first: bool = False) -> list[int]:
        """Update from one /slots poll; returns the slots whose turn just ended."""
        ended = []
        for info in slots:
            w = self.watch(info.id)
            new_task = info.id_task is not None and info.id_task != w.last_task
            if first:
                # A server we did not just start (adopted) may hold unsaved conversations.
                if info.id_task is not None:
                    w.touch()
                w.idle_since = None if info.is_processing else now
            elif info.is_processing:
                if self.changes_from_polls:
                    w.touch()
                w.idle_since = None
            elif w.processing or new_task:
                # The turn ended (or a whole short request ran between two polls).
                if self.changes_from_polls:
                    w.touch()
                w.idle_since = now
                ended.append(info.id)
            w.processing = info.is_processing
            w.last_task = info.id_task
        return ended

    def due(self, now: float) -> list[int]:
        anyone_busy = any(w.processing or w.in_request for w in self.slots.values())
        out = []
        for w in self.slots.values():
            if not w.changed or w.processing or w.idle_since is None or w.busy_with or w.in_request:
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

    def changed_slots(self) -> list[int]:
        return [w.slot for w in self.slots.values() if w.changed]

    def mark_saved(self, slot: int, session_id: str | None, generation: int | None = None) -> None:
        """The slot was saved as of ``generation`` (None: whatever it holds now)."""
        w = self.watch(slot)
        w.changed = generation is not None and w.generation != generation
        w.failures, w.retry_at = 0, None
        if session_id is not None:
            w.session_id = session_id

    def request_done(self, slot: int, now: float) -> None:
        """A request through the front door finished on ``slot``: its turn ended now."""
        w = self.watch(slot)
        w.touch()
        w.idle_since = now

    def save_failed(self, slot: int, now: float) -> float:
        """Back off: returns the seconds until the next attempt."""
        w = self.watch(slot)
        w.failures += 1
        delay = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** (w.failures - 1))
        w.retry_at = now + delay
        return delay

    def mark_restored(self, slot: int, session_id: str) -> None:
        w = self.watch(slot)
        w.changed = False
        w.session_id = session_id

    def in_slots(self) -> set[str]:
        return {w.session_id for w in self.slots.values() if w.session_id}
