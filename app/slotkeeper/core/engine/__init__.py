"""The engine: one owner (an event loop) for everything Slotkeeper does to llama-server.

- ``loop``      the event loop and its executors (who may touch what)
- ``engine``    Engine: launch, restores, saves, polling, per-request figures; EngineSnapshot
- ``planning``  which sessions go into which slot at launch (pure)
- ``slots``     slot views and the judgement of a restore's reuse (pure rules)
- ``model_facts`` the model a profile names, and the server facts
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.model_facts import DEMO_MODEL, ModelChoice

if TYPE_CHECKING:
    from slotkeeper.core.engine.engine import Engine, EngineSnapshot

__all__ = ["DEMO_MODEL", "Engine", "EngineError", "EngineSnapshot", "ModelChoice"]


def __getattr__(name: str) -> Any:
    # The engine (the front door's HTTP stack, the search index ...) is imported on first use, so
    # `slotkeeper serve` can start llama-server first (``launching.prelaunch``).
    if name in ("Engine", "EngineSnapshot"):
        from slotkeeper.core.engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
