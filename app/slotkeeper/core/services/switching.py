"""Changing what the engine runs, one use case for every face: saved settings handed to the engine
(and the server restarted with them), and a switch to another model with its remembered settings.

The coroutines run on the engine loop (a face posts them: ``engine.post(switch_model(engine,
service, path))``). The engine sits above the services, so they take it as the few things they use
(``EngineCommands``, which ``core.engine.Engine`` is) and never import it; the unit tests hand
them a stand-in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from slotkeeper.core.model.model_choice import DEMO_MODEL
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import ModelMemory, Settings
from slotkeeper.core.views import RUNNING_STATES, SavesReport, ServerState

__all__ = ["EngineCommands", "SwitchOutcome", "apply_settings", "model_files", "resolved_model_file",
           "switch_model"]

T = TypeVar("T")


class RunsIO(Protocol):
    async def run_io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class EngineCommands(Protocol):
    """What these use cases need of the engine: its state, and the commands they await."""

    @property
    def state(self) -> ServerState: ...

    @property
    def facts(self) -> ServerFacts | None: ...

    @property
    def loop(self) -> RunsIO: ...  # blocking work (the settings file) off the loop

    async def save_changed_slots_async(self, timeout: float = ..., reason: str = ...) -> SavesReport: ...

    async def switch_model_async(self, settings: Settings, resume_id: str | None = None) -> SavesReport: ...

    async def update_settings_async(self, settings: Settings) -> None: ...

    async def restart_async(self) -> None: ...


@dataclass(frozen=True)
class SwitchOutcome:
    """What a model switch did: ``switched`` (the settings in use now), or why not: changed
    conversations that could not be saved (``report.unsaved``) or an ``error``."""

    model_path: str
    switched: bool
    report: SavesReport
    settings: Settings | None
    error: str | None = None


def resolved_model_file(model_path: str | None, models_dir: Path) -> str | None:
    """The file a profile's model path names, links resolved, as sidecars record it (disk)."""
    if not model_path:
        return None
    if model_path == DEMO_MODEL:
        from slotkeeper.core.model.starter_model import STARTER_FILENAME, find_starter_model

        return os.path.realpath(find_starter_model(models_dir) or models_dir / STARTER_FILENAME)
    return os.path.realpath(os.path.expanduser(model_path))


def model_files(model_path: str | None, remembered: Iterable[ModelMemory],
                models_dir: Path) -> tuple[str | None, dict[str, str]]:
    """The chosen model's file (links resolved), and the remembered models by their resolved files
    -> the name each was chosen by (a Hugging Face snapshot link, not the blob it points to). Disk."""
    return (resolved_model_file(model_path, models_dir),
            {resolved_model_file(m.model_path, models_dir) or m.model_path: m.model_path for m in remembered})


async def apply_settings(engine: EngineCommands, service: SettingsService, settings: Settings,
                         *, restart: bool = False, persist: bool = True) -> Settings:
    """Save ``settings`` to the settings file (``persist``; this run's command-line values stay
    out of it), hand the result to the engine, and restart a running server if asked. Returns the
    settings in use."""
    applied = await engine.loop.run_io(service.save, settings) if persist else settings
    await engine.update_settings_async(applied)  # may prune (disk) under a smaller budget
    if restart and engine.state in RUNNING_STATES:
        await engine.restart_async()
    return applied


async def switch_model(engine: EngineCommands, service: SettingsService, model_path: str, /,
                       resume_id: str | None = None, force: bool = False, start: bool = True,
                       **changes: Any) -> SwitchOutcome:
    """Switch to ``model_path`` with its remembered settings (``changes`` on top, e.g.
    ``swa_full=True``): every changed slot is saved first, then the server restarts on it (a
    stopped one starts, unless ``start`` is False), resuming ``resume_id`` if given. When a
    changed slot cannot be saved nothing is switched unless ``force``: the outcome says which."""
    report = SavesReport()
    if engine.state is ServerState.READY and engine.facts is not None:
        report = await engine.save_changed_slots_async(reason="before switching models")
        if report.unsaved and not force:
            return SwitchOutcome(model_path, False, report, None)
    applied = await engine.loop.run_io(lambda: service.choose_model(model_path, **changes))
    if start or engine.state in RUNNING_STATES:
        more = await engine.switch_model_async(applied, resume_id)
        report = SavesReport(report.saved + more.saved, more.unsaved)
    else:
        await engine.update_settings_async(applied)
    return SwitchOutcome(model_path, True, report, applied)
