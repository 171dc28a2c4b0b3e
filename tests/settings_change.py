"""Tests change a running engine's settings in place, as the settings use case does after saving
them (``services.switching.apply_settings``: ``update_settings_async`` on the engine's loop)."""

from __future__ import annotations

from slotkeeper.core.engine import Engine
from slotkeeper.core.settings import Settings


def update_settings(engine: Engine, settings: Settings) -> None:
    engine.loop.call(engine.update_settings_async(settings))
