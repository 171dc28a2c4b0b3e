"""Where Slotkeeper keeps its files.

By default the platform's own folders (platformdirs). ``SLOTKEEPER_HOME`` or ``--data-dir``
moves *every* file the app writes under one folder, which is what the tests use.

Folders are created 0700, and ``ensure()`` refuses (``UnsafeFolder``) a data folder or a sessions
folder that another user owns or that group or others can write (anyone who can put a file in
the sessions folder can have it restored into the model's context), and a sessions folder that
is a link (on Windows an NTFS junction too). Windows has no such modes and its owners are not
checked (why: ``fsutil.check_private_folder``): there only the link is refused. A data folder on a
disk without permissions (exFAT, FAT) is refused with that reason, not with chmod advice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from slotkeeper.core.basics.fsutil import (
    PRIVATE_DIR_MODE,
    UnsafeFolder,
    check_private_folder,
    ensure_private_folder,
)

__all__ = ["APP_NAME", "HOME_ENV", "AppPaths", "UnsafeFolder", "app_paths"]

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
    def app_log(self) -> Path:
        """Slotkeeper's own log: a windowed app has no terminal to write to."""
        return self.log_dir / "slotkeeper.log"

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
    def door_file(self) -> Path:
        """Where the running engine's front door answers, with its pid (the command line asks it)."""
        return self.state_dir / "door.json"

    @property
    def private_address_file(self) -> Path:
        """llama-server's private port and key (0600)."""
        return self.state_dir / "private.json"

    @property
    def sessions_index_file(self) -> Path:
        """The sessions' token-block index (rebuilt from the sessions folder when missing)."""
        return self.cache_dir / "sessions-index.json"

    @property
    def search_index_file(self) -> Path:
        """The saved conversations' text, for searching by content (SQLite FTS5, 0600). Data, not
        cache: without a server, a rebuild has only titles and previews."""
        return self.data_dir / "search.sqlite3"

    @property
    def hash_cache_file(self) -> Path:
        return self.cache_dir / "model-hashes.json"

    @property
    def model_facts_file(self) -> Path:
        """GGUF header facts per model file version (``file_facts``)."""
        return self.cache_dir / "model-facts.json"

    @property
    def binary_facts_file(self) -> Path:
        """The options each llama-server binary knows, per binary file version (``file_facts``)."""
        return self.cache_dir / "server-flags.json"

    @property
    def history_file(self) -> Path:
        return self.data_dir / "history.jsonl"

    def ensure(self) -> AppPaths:
        """Create the folders (0700) and check the private ones (``check_private``)."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        check_private_folder(self.data_dir, "data folder", follow_symlink=True)
        for d in (self.config_dir, self.log_dir, self.cache_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        ensure_private_folder(self.sessions_dir, "sessions folder")
        return self

    def check_private(self) -> AppPaths:
        """Raise UnsafeFolder unless the data folder (a link to a folder of ours is fine) and the
        sessions folder (never a link) are this user's own and writable by nobody else."""
        check_private_folder(self.data_dir, "data folder", follow_symlink=True)
        check_private_folder(self.sessions_dir, "sessions folder", follow_symlink=False)
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
