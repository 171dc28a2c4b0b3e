"""The server process states, shared by the supervisor, the engine and every face."""

from __future__ import annotations

import enum


class ServerState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    CRASHED = "crashed"
    RESTARTING = "restarting"
    FAILED = "failed"


# The process exists (or is being brought up) and can be stopped.
RUNNING_STATES = frozenset({ServerState.STARTING, ServerState.READY, ServerState.CRASHED, ServerState.RESTARTING})
# Nothing runs and nothing is on its way: Start is what comes next.
STOPPED_STATES = frozenset({ServerState.STOPPED, ServerState.FAILED})
