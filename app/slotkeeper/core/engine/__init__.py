"""The engine: one owner (an event loop) for everything Slotkeeper does to llama-server.

- ``loop``      the event loop and its executors (who may touch what)
- ``engine``    Engine: launch, restores, saves, polling, per-request figures; EngineSnapshot
- ``planning``  which sessions go into which slot at launch (pure)
- ``slots``     slot views and the judgement of a restore's reuse (pure rules)
- ``model``     the model a profile names, and the server facts
- ``resume``    whether a saved session can be resumed now, and why not (for every face)
"""

from slotkeeper.core.engine.engine import Engine, EngineSnapshot
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.model import DEMO_MODEL, ModelChoice

__all__ = ["DEMO_MODEL", "Engine", "EngineError", "EngineSnapshot", "ModelChoice"]
