"""The states the sessions folder keeps, as the rest of Slotkeeper sees them: a KV file name
(``<id>.<gen>.kvm``, a manifest over shared pieces; or ``<id>.<gen>.kv``, a whole state of the
layout before pieces) becomes the file llama-server restores from (``materialize``); the pieces a
conversation's states use, with their sizes (``pieces_of``, what its sidecar records); pieces nothing
names any more are collected (``collect``), never younger than a save takes to commit.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from slotkeeper.core.basics.fsutil import creating
from slotkeeper.core.sessions import pieces
from slotkeeper.core.sessions.kvfile import KvFileError
from slotkeeper.core.sessions.naming import (
    INCOMING_PREFIX,
    MANIFEST_SUFFIX,
    OWN_KV_RE,
    PIECES_DIR,
)
from slotkeeper.core.sessions.sidecar import RestorePoint
from slotkeeper.core.sessions.statefile import StateLayoutError, read_layout

log = logging.getLogger(__name__)

__all__ = ["COLLECT_GRACE_SECONDS", "States"]

# A save writes its new pieces and touches those it uses again, then writes its manifest, then
# commits: pieces written or touched this recently may belong to one under way (in this process or
# another) and are never collected.
COLLECT_GRACE_SECONDS = 120.0


class States:
    def __init__(self, folder: Path) -> None:
        self.dir = Path(folder)
        self.pieces_dir = self.dir / PIECES_DIR
        self._sizes: dict[str, int] = {}  # pieces never change: their sizes are kept once seen
        self._claimed: Counter[str] = Counter()  # pieces states not committed yet name (this process)
        self._lock = threading.Lock()

    # -- the pieces of states being kept ----------------------------------------------------------
    def claim(self, piece_id: str) -> None:
        """A state being kept names ``piece_id``: no collection here takes it until ``release``."""
        with self._lock:
            self._claimed[piece_id] += 1

    def release(self, piece_ids: Iterable[str]) -> None:
        with self._lock:
            for piece_id in piece_ids:
                left = self._claimed[piece_id] - 1
                if left > 0:
                    self._claimed[piece_id] = left
                else:
                    self._claimed.pop(piece_id, None)

    def drop_unused(self, candidates: Iterable[str], named: set[str]) -> tuple[int, int]:
        """Remove the pieces of ``candidates`` (ones a state no longer names) that no sidecar names
        (``named``) and no state being kept here claims: (pieces, bytes)."""
        removed = freed = 0
        for piece_id in candidates:
            with self._lock:
                if piece_id in named or self._claimed.get(piece_id):
                    continue
                path = pieces.piece_path(self.pieces_dir, piece_id)
                try:
                    size = os.lstat(path).st_size
                    os.unlink(path)
                except OSError:
                    continue
            removed += 1
            freed += size
            self._sizes.pop(piece_id, None)
        return removed, freed

    def materialize(self, kv_file: str, out: Path) -> int:
        """Write the state ``kv_file`` names to ``out`` (created, 0600): assembled from its pieces
        (each checked against its name), or copied when it is a whole state. PieceError or OSError
        says why not; nothing is left at ``out`` then. Returns its size."""
        path = self.dir / kv_file
        if kv_file.endswith(MANIFEST_SUFFIX):
            manifest = pieces.read_manifest(path)
            ids = manifest.piece_ids()
            for piece_id in ids:  # a save that stops naming them meanwhile leaves them until this is done
                self.claim(piece_id)
            try:
                # A save removes a state it supersedes before its pieces: while the manifest is
                # there, every piece it names is (FileNotFoundError: superseded meanwhile).
                os.stat(path)
                return pieces.assemble(manifest, self.pieces_dir, out)
            finally:
                self.release(ids)
        try:  # a whole state (the layout before pieces): only one that reads as a state reaches llama-server
            read_layout(path)
        except (StateLayoutError, KvFileError) as exc:
            raise pieces.PieceError(f"{kv_file} is not a state llama-server wrote: {exc}") from None
        with creating(out) as fd, open(path, "rb") as src, os.fdopen(fd, "wb", closefd=False) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            return dst.tell()

    def pieces_of(self, kv_files: Iterable[str]) -> dict[str, int]:
        """Every piece the states ``kv_files`` are made of, with its size on disk (a whole state uses
        none; a manifest that cannot be read names none)."""
        out: dict[str, int] = {}
        for kv_file in kv_files:
            if not kv_file.endswith(MANIFEST_SUFFIX):
                continue
            try:
                ids = pieces.read_manifest(self.dir / kv_file).piece_ids()
            except (pieces.PieceError, OSError, ValueError):
                continue
            for piece_id in ids:
                out[piece_id] = self.size_of(piece_id)
        return out

    def size_of(self, piece_id: str) -> int:
        size = self._sizes.get(piece_id)
        if size is None:
            try:
                size = os.stat(pieces.piece_path(self.pieces_dir, piece_id)).st_size
            except OSError:
                return 0
            self._sizes[piece_id] = size
        return size

    def stored_bytes(self, kv_file: str) -> int:
        """What the state ``kv_file`` keeps on disk: its manifest and its pieces (or its whole file)."""
        try:
            own = os.stat(self.dir / kv_file).st_size
        except OSError:
            return 0
        return own + sum(self.pieces_of([kv_file]).values())

    def cost_of_points(self, kv_file: str) -> Callable[[Sequence[RestorePoint]], int]:
        """For ``points.keep_points``: the bytes a set of the state ``kv_file``'s restore points adds
        to it (their manifests, and the pieces they use that it does not), each manifest read once."""
        main = set(self.pieces_of([kv_file]))
        named: dict[str, set[str]] = {}

        def cost(points: Sequence[RestorePoint]) -> int:
            extra: set[str] = set()
            for p in points:
                if p.kv_file not in named:
                    named[p.kv_file] = set(self.pieces_of([p.kv_file]))
                extra |= named[p.kv_file]
            return sum(p.size_bytes for p in points) + sum(self.size_of(i) for i in extra - main)

        return cost

    def points_only(self, kv_file: str, points: Iterable[str]) -> int:
        """The bytes of the pieces the states ``points`` use and the state ``kv_file`` does not:
        what dropping those restore points frees (their manifests aside)."""
        main = self.pieces_of([kv_file])
        return sum(size for piece_id, size in self.pieces_of(points).items() if piece_id not in main)

    def problems(self, kv_file: str) -> list[str]:
        """What keeps the state ``kv_file`` from being assembled: a manifest that does not read, a
        piece missing or damaged (each piece read whole and hashed)."""
        if not kv_file.endswith(MANIFEST_SUFFIX):
            return []
        try:
            manifest = pieces.read_manifest(self.dir / kv_file)
        except (pieces.PieceError, OSError, ValueError) as exc:
            return [str(exc)]
        found = []
        for piece_id in sorted(manifest.piece_ids()):
            problem = pieces.check_piece(self.pieces_dir, piece_id)
            if problem:
                found.append(problem)
        return found

    def referenced(self) -> set[str]:
        """The pieces any manifest in the folder names (the sessions', their points', a save's being
        committed): what ``collect`` keeps, whatever the sidecars say."""
        named: set[str] = set()
        try:
            names = os.listdir(self.dir)
        except OSError:
            return named
        for name in names:
            ours = OWN_KV_RE.match(name) or name.startswith(INCOMING_PREFIX)
            if not name.endswith(MANIFEST_SUFFIX) or not ours:
                continue
            try:
                named |= pieces.read_manifest(self.dir / name).piece_ids()
            except (pieces.PieceError, OSError, ValueError) as exc:
                # Unreadable: its pieces cannot be told apart, so none is collected this time.
                log.warning("not collecting pieces: %s does not read (%s)", name, exc)
                return {"*"}
        return named

    def collect(self, grace_seconds: float = COLLECT_GRACE_SECONDS) -> tuple[int, int]:
        """Remove the pieces no manifest names, older than ``grace_seconds``: (pieces, bytes)."""
        named = self.referenced()
        if "*" in named:
            return 0, 0
        with self._lock:
            named |= set(self._claimed)
        removed, freed = pieces.collect(self.pieces_dir, named, time.time() - grace_seconds)
        for piece_id in list(self._sizes):
            if piece_id not in named:
                self._sizes.pop(piece_id, None)
        if removed:
            log.info("collected %d pieces no conversation uses (%d bytes)", removed, freed)
        return removed, freed
