"""SHA-256 of model files, computed once in the background and remembered.

A saved KV state is only valid for the exact model that produced it, and llama-server's save
files carry no model identity, so sessions record the model's SHA-256. Hashing a 20 GB model
takes a minute or more, so the result is cached by the resolved path and the file's stamp
(``fsutil.file_stamp``: size, mtime_ns, inode, ctime_ns): the next start reads it back without
touching the model. Size and mtime alone are
not enough: `cp -p other.gguf model.gguf` writes another model of the same size into the same
file and puts the old mtime back. It cannot put the ctime back (the kernel sets it on every
write and every utime), and a file moved into place has another inode. Entries written before
inode and ctime were recorded simply miss, and the model is hashed again once.

The cache is a small JSON file, rewritten atomically (fsutil.atomic_write_text: temp file,
fsync, os.replace) under a lock, so concurrent hashing threads and a crash mid-write never
leave it half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.file_facts import load_entries
from slotkeeper.core.basics.fsutil import atomic_write_text, file_stamp

__all__ = ["CHUNK_SIZE", "ModelChangedError", "ModelHashCache"]

log = logging.getLogger(__name__)

CHUNK_SIZE = 4 * 1024 * 1024  # bytes per read: large enough to stream at disk speed
_SCHEMA_VERSION = 1

ProgressCallback = Callable[[int, int], None]  # (bytes hashed so far, file size)


class ModelChangedError(RuntimeError):
    """The model file changed while it was being hashed; the result would be meaningless."""


class ModelHashCache:
    """Model SHA-256s cached in ``cache_file`` (JSON), keyed by path, size, mtime, inode and ctime."""

    def __init__(self, cache_file: str | Path) -> None:
        self.cache_file = Path(cache_file)
        self._lock = threading.Lock()

    # -- public API ---------------------------------------------------------------------

    def cached(self, path: str | Path) -> str | None:
        """The stored hash if the file is unchanged since it was hashed, else None.

        Never reads the model itself (one stat call), so it is safe on the GUI thread.
        """
        try:
            resolved, stamp = file_stamp(path)
        except OSError:
            return None
        with self._lock:
            entry = self._load().get(resolved)
        if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()):
            sha = entry.get("sha256")
            return sha if isinstance(sha, str) else None
        return None

    def compute(self, path: str | Path, progress: ProgressCallback | None = None) -> str:
        """The file's SHA-256, from the cache when still valid, else hashed and stored.

        Raises OSError when the file cannot be read and ModelChangedError when it changes
        while being hashed.
        """
        hit = self.cached(path)
        if hit is not None:
            if progress is not None:
                size = Path(path).stat().st_size
                progress(size, size)
            return hit
        resolved, stamp = file_stamp(path)
        sha = _sha256_file(Path(resolved), stamp["size"], progress)
        if file_stamp(path) != (resolved, stamp):
            raise ModelChangedError(f"{resolved} changed while it was being hashed; try again")
        self._store(resolved, stamp, sha)
        return sha

    # -- storage --------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        """Entries from the cache file; an unreadable file counts as empty (it is a cache)."""
        return load_entries(self.cache_file, "model hash cache", logging.WARNING)

    def _store(self, resolved: str, stamp: dict[str, int], sha: str) -> None:
        with self._lock:
            # Re-read under the lock so entries written by other threads are kept.
            entries = self._load()
            entries[resolved] = {**stamp, "sha256": sha}
            self._write({"schema_version": _SCHEMA_VERSION, "entries": entries})

    def _write(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.cache_file, json.dumps(data, indent=1, sort_keys=True))


def _sha256_file(path: Path, size: int, progress: ProgressCallback | None) -> str:
    digest = hashlib.sha256()
    done = 0
    if progress is not None:
        progress(0, size)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_SIZE):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, size)
    return digest.hexdigest()
