"""Where Slotkeeper keeps its files.

By default the platform's own folders (platformdirs). ``SLOTKEEPER_HOME`` or ``--data-dir``
moves *every* file the app writes under one folder, which is what the tests use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "slotkeeper"
HOME_ENV = "SLOTKEEPER_HOME"


@dataclass(frozen=True)
class AppPaths:
    data_dir: Path
    config_dir: Path
    log_dir: Path
    cache_dir: Path
    state_dir: Path

    @property
    def sessions_dir(self) -> Path:
        return self.data_dir / "sessions"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def settings_file(self) -> Path:
        return self.config_dir / "settings.json"

    @property
    def server_log(self) -> Path:
        return self.log_dir / "llama-server.log"

    @property
    def server_state_file(self) -> Path:
        return self.state_dir / "server.json"

    @property
    def engine_lock_file(self) -> Path:
        return self.state_dir / "engine.lock"

    @property
    def in_slots_file(self) -> Path:
        """Sessions the running engine holds in its slots (pruning from the CLI keeps them)."""
        return self.state_dir / "in-slots.json"

    @property
    def hash_cache_file(self) -> Path:
        return self.cache_dir / "model-hashes.json"

    @property
    def history_file(self) -> Path:
        return self.data_dir / "history.jsonl"

    def ensure(self) -> AppPaths:
        for d in (self.data_dir, self.config_dir, self.log_dir, self.cache_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.sessions_dir.mkdir(mode=0o700, exist_ok=True)
        try:
            os.chmod(self.sessions_dir, 0o700)
        except OSError:
            pass
        return self


def app_paths(data_dir: str | os.PathLike[str] | None = None) -> AppPaths:
    """The folders for this run: explicit ``data_dir``, else ``$SLOTKEEPER_HOME``, else platformdirs."""
    root = data_dir or os.environ.get(HOME_ENV)
    if root:
        base = Path(root).expanduser().resolve()
        return AppPaths(
            data_dir=base,
            config_dir=base / "config",
            log_dir=base / "logs",
            cache_dir=base / "cache",
            state_dir=base / "state",
        )
    return AppPaths(
        data_dir=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        config_dir=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        log_dir=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
        cache_dir=Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        state_dir=Path(platformdirs.user_state_dir(APP_NAME, appauthor=False)),
    )
