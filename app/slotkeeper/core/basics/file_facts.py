"""Facts read from a file (a binary's --help, a GGUF header), remembered while the file is unchanged.

Each launch needs the flags the llama-server binary knows (running it with --help) and the model's
header facts (reading its GGUF metadata); both take time on every launch and both are fixed for a
given file. They are kept in one small JSON file (0600, written atomically) per kind, keyed by the
resolved path and valid while the file's stamp (``fsutil.file_stamp``: size, mtime_ns, inode and
ctime_ns) is the one seen when the facts were read (as ``model_hash`` does for model hashes): a
rebuilt binary, a model replaced in place or moved into place, reads again. ``version`` names the code that
produced the facts, so a Slotkeeper that reads them differently never trusts an older one's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import atomic_write_text, file_stamp

__all__ = ["FileFactsCache", "load_entries"]

log = logging.getLogger(__name__)

MAX_ENTRIES = 64  # a handful of binaries and models; the oldest go first


class FileFactsCache:
    """``get(path, key)`` -> the facts stored for that file version, or None; ``put`` stores them."""

    def __init__(self, cache_file: str | os.PathLike[str], version: str) -> None:
        self.cache_file = Path(cache_file)
        self.version = version
        self._lock = threading.Lock()

    def get(self, path: str | os.PathLike[str], key: str = "") -> Any | None:
        try:
            resolved, stamp = file_stamp(path)
        except OSError:
            return None
        with self._lock:
            entry = self._load().get(f"{resolved}\0{key}")
        if (isinstance(entry, dict) and entry.get("stamp") == stamp and entry.get("version") == self.version
                and "facts" in entry):
            return entry["facts"]
        return None

    def put(self, path: str | os.PathLike[str], facts: Any, key: str = "",
            stamp: dict[str, int] | None = None) -> None:
        """Remember ``facts`` for the file as it is now (or as ``stamp``, taken before reading it).
        A cache that cannot be written is only a slower next launch."""
        try:
            resolved, now = file_stamp(path)
        except OSError:
            return
        if stamp is not None and stamp != now:
            return  # it changed while it was read
        with self._lock:
            entries = self._load()
            entries.pop(f"{resolved}\0{key}", None)
            entries[f"{resolved}\0{key}"] = {"stamp": now, "version": self.version, "facts": facts}
            while len(entries) > MAX_ENTRIES:
                entries.pop(next(iter(entries)))
            try:
                atomic_write_text(self.cache_file, json.dumps({"schema_version": 1, "entries": entries}))
            except OSError as exc:
                log.debug("could not write %s: %s", self.cache_file, exc)

    def _load(self) -> dict[str, Any]:
        return load_entries(self.cache_file)


def load_entries(cache_file: Path, what: str = "cache", level: int = logging.DEBUG) -> dict[str, Any]:
    """The ``entries`` of a cache file written as ``{"schema_version": 1, "entries": {...}}`` (this
    module's and ``model.model_hash``'s); a file that is missing or cannot be read counts as empty
    (it is a cache), and one that cannot be read is logged at ``level`` as an unreadable ``what``."""
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.log(level, "ignoring unreadable %s %s: %s", what, cache_file, exc)
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}
