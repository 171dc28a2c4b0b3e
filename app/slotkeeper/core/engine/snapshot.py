"""The engine's state as one immutable value, for any thread (the faces read this)."""

from __future__ import annotations

from dataclasses import dataclass

from slotkeeper.core.engine.lifecycle.model_facts import ModelChoice, profile_model_name
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.core.views import Activity, SlotView


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state as one immutable value, for any thread (the GUI reads this)."""

    state: ServerState = ServerState.STOPPED
    state_message: str = ""
    ready: bool = False  # launch work done: the server's slots hold what was restored
    settings: Settings = Settings()
    launched_profile: ServerProfile | None = None  # what the running server was started with
    model: ModelChoice | None = None
    facts: ServerFacts | None = None
    slots: tuple[SlotView, ...] = ()
    in_slots: frozenset[str] = frozenset()
    waiting: int = 0  # requests waiting for a slot
    activity: Activity = Activity()
    started_at: float | None = None  # unix time the server became ready
    swa_note: str | None = None

    @property
    def running_profile(self) -> ServerProfile:
        """What the running server was launched with; settings edited since apply at the next start."""
        return self.launched_profile or self.settings.profile

    @property
    def base_url(self) -> str:
        return self.running_profile.base_url

    @property
    def model_name(self) -> str:
        if self.model is not None:
            return self.model.display_name
        return profile_model_name(self.settings.profile.model_path)
