"""The engine: one owner (an event loop) for everything Slotkeeper does to llama-server.

``engine.Engine`` composes the parts (the front door and desk, the slot board, the slot actions and
saves, the poller, the library, the server link, the launcher) and runs the lifecycle; its state is
published as an ``EngineSnapshot``. docs/ARCHITECTURE.md maps every module of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.lifecycle.model_facts import DEMO_MODEL, ModelChoice

if TYPE_CHECKING:
    from slotkeeper.core.engine.engine import Engine, EngineSnapshot
    from slotkeeper.core.engine.lifecycle.launching import Prelaunched, prelaunch

__all__ = ["DEMO_MODEL", "Engine", "EngineError", "EngineSnapshot", "ModelChoice", "Prelaunched", "prelaunch"]


def __getattr__(name: str) -> Any:
    # The engine (the front door's HTTP stack, the search index ...) is imported on first use, so
    # `slotkeeper serve` can start llama-server first (``launching.prelaunch``).
    if name in ("Engine", "EngineSnapshot"):
        from slotkeeper.core.engine import engine

        return getattr(engine, name)
    if name in ("Prelaunched", "prelaunch"):  # llama-server started before the engine is imported
        from slotkeeper.core.engine.lifecycle import launching

        return getattr(launching, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
