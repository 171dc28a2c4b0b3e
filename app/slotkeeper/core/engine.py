"""The engine: supervisor + client + model facts (+ sessions, later), with events for any face.

`slotkeeper serve` runs it headless; the GUI drives the same object through its bridge.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from slotkeeper.core import gguf_info, modelgen
from slotkeeper.core.client import LlamaClient
from slotkeeper.core.events import EventBus
from slotkeeper.core.paths import AppPaths
from slotkeeper.core.server.command import CommandError, build_argv
from slotkeeper.core.server.locate import ServerBinaryNotFound, locate_server
from slotkeeper.core.server.supervisor import LaunchSpec, ServerState, Supervisor, SupervisorError
from slotkeeper.core.settings import ServerProfile, Settings, SettingsError

log = logging.getLogger(__name__)

DEMO_MODEL = ":demo:"  # the profile's model_path value that means "the embedded demo model"


class EngineError(Exception):
    """A problem a person can act on (bad model, missing binary, ...)."""


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    info: gguf_info.ModelInfo
    is_demo: bool


class Engine:
    def __init__(self, paths: AppPaths, settings: Settings, events: EventBus | None = None) -> None:
        self.paths = paths.ensure()
        self.settings = settings
        self.events = events or EventBus()
        self.model: ModelChoice | None = None
        self._lock = threading.RLock()
        self.supervisor = Supervisor(
            spec_factory=self._launch_spec,
            log_path=paths.server_log,
            state_file=paths.server_state_file,
            events=self.events,
        )
        self.events.subscribe(self._on_server_state, "server.state")
        self.ready = threading.Event()

    @property
    def profile(self) -> ServerProfile:
        return self.settings.profile

    @property
    def base_url(self) -> str:
        return self.profile.base_url

    def client(self, timeout: float = 10.0) -> LlamaClient:
        return LlamaClient(self.base_url, timeout=timeout)

    # -- model ----------------------------------------------------------------------------
    def resolve_model(self) -> ModelChoice:
        """The model to run: the profile's path, or the embedded demo model when none is set."""
        raw = self.profile.model_path
        if not raw:
            raise EngineError("No model chosen: pick a GGUF file (--model PATH) or use --demo.")
        is_demo = raw == DEMO_MODEL
        if is_demo:
            path = modelgen.ensure_demo_model(self.paths.models_dir)
        else:
            path = Path(raw).expanduser()
        try:
            info = gguf_info.read_model_info(path)
        except gguf_info.ModelFileError as exc:
            raise EngineError(str(exc)) from exc
        choice = ModelChoice(path.resolve(), info, is_demo)
        self.model = choice
        return choice

    def _launch_spec(self) -> LaunchSpec:
        try:
            model = self.resolve_model()
            binary = locate_server(self.profile.server_bin)
            argv = build_argv(binary.argv_prefix, self.profile, model.path, self.paths.sessions_dir)
        except (EngineError, ServerBinaryNotFound, CommandError, SettingsError) as exc:
            raise SupervisorError(str(exc)) from exc
        return LaunchSpec(tuple(argv), self.profile.host, self.profile.port)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.ready.clear()
        self.supervisor.start()

    def _on_server_state(self, event) -> None:
        state = event.data["state"]
        if state is ServerState.READY:
            # Launch work (restores) runs off the supervisor's thread, which must keep watching
            # the process; "ready" is announced only after it, so a client that waits for ready
            # hits the cache.
            threading.Thread(target=self._after_server_ready, name="engine-ready", daemon=True).start()
        else:
            self.ready.clear()

    def _after_server_ready(self) -> None:
        self.ready.set()
        self.events.emit("engine.ready", url=self.base_url)

    def wait_ready(self, timeout: float | None = None) -> ServerState:
        return self.supervisor.wait_for((ServerState.READY, ServerState.FAILED, ServerState.STOPPED), timeout)

    def stop(self) -> None:
        self.supervisor.stop()

    def update_settings(self, settings: Settings) -> None:
        with self._lock:
            self.settings = settings

    def with_profile(self, **changes: object) -> None:
        self.update_settings(replace(self.settings, profile=replace(self.profile, **changes)))
