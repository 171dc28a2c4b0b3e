"""The use cases every face offers, in one table (as Electrum's ``known_commands``), each returning
one change type (``Changes``, as Anki's ``OpChanges``) that a face applies in one place: the GUI's
bridge (``EngineBridge.use``) and the command line (`slotkeeper sessions pin|unpin|delete|verify`)
run the same entries.

Two kinds, by where they run:
- ``SessionUseCase``: the sessions folder through the sessions service (blocking: a job of the
  GUI's pool, or the command line's own thread): pin, unpin, delete, verify.
- ``EngineUseCase``: the engine's commands (coroutines on its loop): apply settings, switch model,
  resume a conversation, restore one into a slot.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from slotkeeper.core.services.sessions import SessionChanges, SessionsService
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.services.switching import EngineCommands, SwitchOutcome, apply_settings, switch_model
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import RestoreSummary

__all__ = ["ENGINE_USE_CASES", "SESSION_USE_CASES", "Changes", "EngineUseCase", "SessionUseCase"]


@dataclass(frozen=True)
class Changes:
    """What a use case changed, for a face to apply: the saved conversations (entries as they are
    now, ids gone), the settings in use now, a model switch's outcome, a restore's summary. Empty
    parts changed nothing."""

    sessions: SessionChanges = field(default_factory=SessionChanges)
    settings: Settings | None = None
    switch: SwitchOutcome | None = None
    restored: RestoreSummary | None = None


@dataclass(frozen=True)
class SessionUseCase:
    name: str
    doing: str  # what a face says while it runs ("Pinning a conversation")
    done: str  # what the command line prints after it, of one session ("pinned")
    run: Callable[[SessionsService, str], Changes]


def _pin(pinned: bool) -> Callable[[SessionsService, str], Changes]:
    return lambda service, session_id: Changes(sessions=service.set_pinned(session_id, pinned))


def _delete(service: SessionsService, session_id: str) -> Changes:
    return Changes(sessions=service.delete(session_id))


def _verify(service: SessionsService, session_id: str) -> Changes:
    """Size and hash (restore points too); a problem found is recorded so it lists as corrupt."""
    return Changes(sessions=SessionChanges(changed=(service.verify(session_id),)))


SESSION_USE_CASES: dict[str, SessionUseCase] = {u.name: u for u in (
    SessionUseCase("pin", "Pinning a conversation", "pinned", _pin(True)),
    SessionUseCase("unpin", "Unpinning a conversation", "unpinned", _pin(False)),
    SessionUseCase("delete", "Deleting a conversation", "deleted", _delete),
    SessionUseCase("verify", "Verifying a conversation", "verified", _verify),
)}


class EngineFaceCommands(EngineCommands, Protocol):
    """The engine's commands the engine use cases await, besides those of ``switching``."""

    async def start_async(self, resume_id: str | None = None) -> None: ...

    async def restore_async(self, session_id: str, slot: int | None = None) -> RestoreSummary | None: ...


@dataclass(frozen=True)
class EngineUseCase:
    name: str
    doing: str
    run: Callable[..., Coroutine[Any, Any, Changes]]  # (engine, settings service, *args): on its loop


async def _apply_settings(engine: EngineFaceCommands, service: SettingsService, settings: Settings,
                          **kwargs: Any) -> Changes:
    return Changes(settings=await apply_settings(engine, service, settings, **kwargs))


async def _switch(engine: EngineFaceCommands, service: SettingsService, model_path: str,
                  **kwargs: Any) -> Changes:
    outcome = await switch_model(engine, service, model_path, **kwargs)
    return Changes(settings=outcome.settings, switch=outcome)


async def _resume(engine: EngineFaceCommands, service: SettingsService, session_id: str) -> Changes:
    """Start the server with ``session_id`` restored first (a running one restores it on demand)."""
    await engine.start_async(session_id)
    return Changes()


async def _restore(engine: EngineFaceCommands, service: SettingsService, session_id: str,
                   slot: int | None = None) -> Changes:
    return Changes(restored=await engine.restore_async(session_id, slot))


ENGINE_USE_CASES: dict[str, EngineUseCase] = {u.name: u for u in (
    EngineUseCase("settings", "Saving settings", _apply_settings),
    EngineUseCase("switch", "Switching models", _switch),
    EngineUseCase("resume", "Starting llama-server", _resume),
    EngineUseCase("restore", "Restoring a conversation", _restore),
)}
