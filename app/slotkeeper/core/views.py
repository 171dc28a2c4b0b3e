"""Immutable values the engine hands to its faces (GUI, `serve`, tests) in events and snapshots.

They are frozen, so a face on another thread can keep one as long as it likes: the engine never
changes an object it has published, it publishes a new one. The server process states live here
too (the supervisor sets them, every face reads them; ``core.server.state`` re-exports them), and
the rule for the server log's lines a face does not show.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ServerState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    CRASHED = "crashed"
    RESTARTING = "restarting"
    FAILED = "failed"


# The process exists (or is being brought up) and can be stopped.
RUNNING_STATES = frozenset({ServerState.STARTING, ServerState.READY, ServerState.CRASHED,
                            ServerState.RESTARTING})
# Nothing runs and nothing is on its way: Start is what comes next.
STOPPED_STATES = frozenset({ServerState.STOPPED, ServerState.FAILED})

# What llama-server logs twice a second at -lv 4 while it has nothing to do: kept in the file,
# not shown (``is_idle_heartbeat``).
IDLE_HEARTBEAT = "update_slots: all slots are idle"


def is_idle_heartbeat(line: str) -> bool:
    """llama-server's "nothing to do" line (at -lv 4): faces hide it, the file keeps it."""
    return IDLE_HEARTBEAT in line


@dataclass(frozen=True)
class SlotView:
    """What a face shows per slot; a new one after every poll and every request."""

    id: int
    n_ctx: int = 0
    state: str = "idle"  # idle, busy, saving, restoring
    session_id: str | None = None
    n_prompt: int = 0  # last (or running) request's prompt
    cache_n: int = 0
    prompt_n: int = 0  # processed so far / in total
    n_tokens: int = 0  # tokens the slot holds after its last request
    running: bool = False
    warning: str | None = None
    # The slot went on with another conversation (or far back in this one) since ``session_id``
    # was saved or restored: that session's title no longer describes it, until the next save.
    detached: bool = False


BYTE_ACTIVITIES = ("downloading", "hashing")  # their progress counts bytes


@dataclass(frozen=True)
class Activity:
    """Long work the engine is doing (hashing the model, restoring, saving), with progress."""

    activity: str | None = None  # "downloading", "hashing", "restoring", "saving"; None = nothing
    detail: str = ""
    done: int = 0
    total: int = 0

    def describe(self) -> str:
        """The activity in words for a status line ("" when idle). Downloading and hashing count
        bytes: a share and the size ("Identifying m.gguf: 62% of 93.8 MiB"); the others count
        items, the one in hand ("Saving (1 of 2): slot 0"). Never past the total."""
        if not self.activity:
            return ""
        detail = self.detail or self.activity
        if self.activity in BYTE_ACTIVITIES:
            if not self.total:
                return detail[:1].upper() + detail[1:]
            from slotkeeper.core.basics.units import human_bytes

            share = min(100, int(100 * max(0, self.done) / self.total))
            return f"{detail[:1].upper()}{detail[1:]}: {share}% of {human_bytes(self.total)}"
        head = self.activity.capitalize()
        if self.total:
            head += f" ({min(self.total, max(0, self.done) + 1)} of {self.total})"
        return f"{head}: {self.detail}" if self.detail else head


@dataclass(frozen=True)
class RestoreSummary:
    id: str
    slot: int
    n_restored: int
    ms: float
    title: str
    already_loaded: bool = False  # the session was in a slot already: nothing was read


@dataclass(frozen=True)
class SaveSummary:
    slot: int
    kind: str  # new, update, fork, unchanged, empty
    id: str | None
    reason: str  # idle, shutdown, manual, before resume, ...
    n_tokens: int
    ms: float
    size_bytes: int
    title: str


@dataclass(frozen=True)
class SavesReport:
    """What saving every changed slot did (at shutdown, before a restart)."""

    saved: tuple[SaveSummary, ...] = ()
    unsaved: tuple[int, ...] = ()  # slots with changes that could not be saved (failed, or out of time)

    @property
    def ok(self) -> bool:
        return not self.unsaved
