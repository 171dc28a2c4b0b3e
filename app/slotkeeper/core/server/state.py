"""The server process states, shared by the supervisor, the engine and every face.

They are values the faces read, so they live with the other views (``core.views``); the server
code imports them from here.
"""

from __future__ import annotations

from slotkeeper.core.views import RUNNING_STATES, STOPPED_STATES, ServerState

__all__ = ["RUNNING_STATES", "STOPPED_STATES", "ServerState"]
