"""A saved session's restore points (``sessions.points``) and the pieces its states are made of
(``pieces``), as files in the store's folder: a point added as a save commits a version, points
dropped, and the files and pieces nothing names any more removed. Part of the store (``store.points``),
under its folder lock."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from slotkeeper.core.basics.fsutil import fsync_dir, remove_file, replace_file
from slotkeeper.core.sessions.entries import SessionNotFound
from slotkeeper.core.sessions.naming import OWN_KV_RE, new_kv_name, validate_session_id
from slotkeeper.core.sessions.points import DEFAULT_POINT_SPACING_TOKENS, POINTS_SHARE, keep_points
from slotkeeper.core.sessions.rows import stamp_of
from slotkeeper.core.sessions.sidecar import (
    RestorePoint,
    Sidecar,
    SidecarError,
    tokens_digest,
    write_sidecar_atomic,
)
from slotkeeper.core.sessions.stamps import carried_over

if TYPE_CHECKING:
    from slotkeeper.core.sessions.store import SessionStore

log = logging.getLogger(__name__)


def _no_step(name: str) -> None:
    """A step of a store change, for the test-only fault hook (``core.basics.faults``)."""


def unlink_quietly(path: Path) -> None:
    """Remove ``path`` if it is there (``remove_file``: on Windows, tried again while another
    program holds it open)."""
    try:
        remove_file(path)
    except FileNotFoundError:
        pass


def remove_superseded(path: Path) -> bool:
    """Remove a file a written sidecar no longer names (the previous version, a dropped restore
    point): the change is made already, so a file that will not go (Windows: another program
    keeps it open) is only a leftover for ``sweep`` at the next start, not a failed save. False
    then."""
    try:
        unlink_quietly(path)
    except OSError as exc:
        log.warning("could not remove %s from the sessions folder (%s); it is removed at the next start",
                    path.name, exc)
        return False
    return True


class PointFiles:
    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def add(self, session_id: str, incoming: Path, point: RestorePoint, hashed: os.stat_result | None,
                  spacing: int = DEFAULT_POINT_SPACING_TOKENS, step: Callable[[str], None] = _no_step,
                  share: float | None = None) -> Sidecar | None:
        """Make ``incoming`` (a slot llama-server wrote, holding ``point.n_tokens`` tokens) a restore
        point of the session (``sessions.points``), as a save commits a version: under the folder
        lock, renamed to a new ``<id>.<gen>.kv``, the folder fsynced, then the sidecar written with
        the points it keeps (``keep_points``), then the points it no longer keeps removed. None (and
        ``incoming`` left to the caller) when the session is gone, damaged, or no longer starts with
        the point's tokens (a save changed it meanwhile)."""
        validate_session_id(session_id)
        with self.store.exclusive():
            try:
                entry = self.store.get(session_id)
            except SessionNotFound:
                return None
            sc = entry.sidecar
            if sc is None or entry.problems or entry.kv_path is None:
                return None
            if (point.n_tokens >= sc.n_tokens
                    or tokens_digest(self.store.tokens(entry)[:point.n_tokens]) != point.tokens_digest):
                return None
            name = new_kv_name(session_id)
            final = self.store.dir / name
            replace_file(incoming, final)
            fsync_dir(self.store.dir)
            step("after_rename")
            st = os.lstat(final)
            point = replace(point, kv_file=name, verified=carried_over(hashed, st, point.content_hash))
            kept, dropped = keep_points((*sc.points, point), sc.n_tokens, spacing=spacing,
                                        allowance=int((POINTS_SHARE if share is None else share)
                                                      * self.store.states.stored_bytes(sc.kv_file)),
                                        cost=self.store.states.cost_of_points(sc.kv_file))
            before = set(sc.pieces)
            sc = replace(sc, points=kept, pieces=self.pieces_for(sc.kv_file, kept))
            write_sidecar_atomic(self.store.sidecar_path(session_id), sc)
            step("after_sidecar")
            self.store.note_sidecar(session_id, sc)
            self.store.index.note_files({name: stamp_of(st)})
            self.remove(session_id, [p.kv_file for p in dropped])
            self.drop_pieces(before - set(sc.pieces))
            return sc

    def drop(self, session_id: str, kv_files: Sequence[str]) -> None:
        """Forget restore points of the session (a check found them damaged, or a prune)."""
        validate_session_id(session_id)
        gone = set(kv_files)
        with self.store.exclusive():
            before = self.pieces_now(session_id)

            def drop(s: Sidecar) -> Sidecar:
                kept = tuple(p for p in s.points if p.kv_file not in gone)
                return replace(s, points=kept, pieces=self.pieces_for(s.kv_file, kept))

            try:
                after = self.store.update(session_id, drop)
            except (SessionNotFound, SidecarError):
                return
            self.remove(session_id, list(gone))
            self.drop_pieces(before - set(after.pieces))

    def pieces_for(self, kv_file: str, points: Iterable[RestorePoint]) -> dict[str, int]:
        """The pieces a version's states (its save and its points) are made of, with their sizes."""
        return self.store.states.pieces_of([kv_file, *(p.kv_file for p in points)])

    def pieces_now(self, session_id: str) -> set[str]:
        """The pieces the session's sidecar names now (none when it has none that reads)."""
        try:
            sc = self.store.get(session_id).sidecar
        except (SessionNotFound, SidecarError, ValueError):
            return set()
        return set(sc.pieces) if sc is not None else set()

    def drop_pieces(self, candidates: set[str]) -> None:
        """Remove at once the pieces of ``candidates`` (ones a sidecar just stopped naming) that no
        sidecar names now and no state being kept claims, so that a conversation saved turn after
        turn takes its own size on disk, not one per turn; ``sweep`` collects whatever this leaves
        (when some sidecar does not read, nothing is removed here)."""
        if not candidates:
            return
        named = self.store.index.pieces_named()
        if named is None:
            return
        removed, freed = self.store.states.drop_unused(candidates, named)
        if removed:
            log.debug("removed %d pieces no conversation uses any more (%d bytes)", removed, freed)

    def remove_files_of(self, session_id: str, names: Sequence[str]) -> None:
        """Remove states of the session its sidecar no longer names (takes the folder lock)."""
        with self.store.exclusive():
            self.remove(session_id, names)

    def remove(self, session_id: str, names: Sequence[str], keep: Iterable[str] = ()) -> None:
        """Remove restore points' files: only the session's own, and never one its sidecar still
        names (its save, a point it keeps; ``keep``)."""
        kept = set(keep)
        try:
            current = self.store.get(session_id).sidecar
        except (SessionNotFound, SidecarError):
            current = None
        if current is not None:
            kept |= {current.kv_file, *(p.kv_file for p in current.points)}
        for name in names:
            m = OWN_KV_RE.match(name)
            if (m and m.group(1) == session_id and name not in kept
                    and remove_superseded(self.store.dir / name)):  # only its own files
                self.store.index.note_files({name: None})
