"""A sessions folder of the layout before pieces, carried over once.

Versions before sidecar schema 3 kept each state whole, as llama-server wrote it (``<id>.<gen>.kv``).
``carry_over_folder`` keeps each such state as pieces (``pieces.put``: a conversation's branches and
points share theirs), parents before their forks, and commits each conversation like a save: its
pieces and manifests synced, then its sidecar, then the whole files removed. A state that does not
pass its integrity check is left as it is (a restore refuses it, as before); a failure leaves that
conversation whole-file, still restorable, and is said. Sessions already carried over are skipped, so
an interrupted run goes on where it stopped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from slotkeeper.core.basics.fsutil import replace_file
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.file_checks import file_integrity
from slotkeeper.core.sessions.kvfile import read_tokens
from slotkeeper.core.sessions.naming import MANIFEST_SUFFIX, new_kv_name
from slotkeeper.core.sessions.pieces import PieceError
from slotkeeper.core.sessions.saving import Written, keep_state, related_states
from slotkeeper.core.sessions.sidecar import RestorePoint, SidecarError
from slotkeeper.core.sessions.stamps import FileStamp
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, unlink_quietly

log = logging.getLogger(__name__)

__all__ = ["CarriedOver", "carry_over_folder", "needs_carrying_over"]

Progress = Callable[[int, int, str], None]  # (done, total, the conversation in hand)


@dataclass
class CarriedOver:
    done: int = 0
    skipped: list[tuple[str, str]] | None = None  # (session id, why it stays whole)
    bytes_before: int = 0  # the whole files it replaced
    bytes_written: int = 0  # the pieces and manifests written


def needs_carrying_over(entry: SessionEntry) -> bool:
    sc = entry.sidecar
    return sc is not None and (not sc.kv_file.endswith(MANIFEST_SUFFIX)
                               or any(not p.kv_file.endswith(MANIFEST_SUFFIX) for p in sc.points))


def carry_over_folder(store: SessionStore,
                      progress: Progress = lambda done, total, what: None) -> CarriedOver:
    """Every conversation still kept whole, kept as pieces (oldest first, so a fork finds its parent's
    pieces); what was done."""
    todo = sorted((e for e in store.sessions() if needs_carrying_over(e)),
                  key=lambda e: (e.sidecar.created_at if e.sidecar else "", e.id))
    result = CarriedOver(skipped=[])
    for i, entry in enumerate(todo):
        progress(i, len(todo), entry.sidecar.title if entry.sidecar else entry.id)
        try:
            before, written = _carry_over(store, entry.id)
        except (OSError, PieceError, SidecarError, ValueError) as exc:
            log.warning("conversation %s stays as it was saved (a whole file): %s", entry.id, exc)
            result.skipped.append((entry.id, str(exc)))  # type: ignore[union-attr]
            continue
        result.done += 1
        result.bytes_before += before
        result.bytes_written += written
    if todo:
        progress(len(todo), len(todo), "")
        store.states.collect()
    return result


def _carry_over(store: SessionStore, session_id: str) -> tuple[int, int]:
    with store.exclusive():
        try:
            entry = store.get(session_id)
        except SessionNotFound:
            return 0, 0
        sc = entry.sidecar
        if sc is None or not needs_carrying_over(entry):
            return 0, 0
        if entry.problems or store.integrity_problems(entry, trust_stamp=True):
            raise ValueError("; ".join(entry.problems) or "its file does not match its hash")
        made: list[str] = []
        claimed: list[str] = []  # the pieces the new states name (spared until committed)
        before = written = 0
        related = related_states(store, entry, None)
        try:
            tokens = list(store.tokens(entry))
            main = sc.kv_file
            if not main.endswith(MANIFEST_SUFFIX):
                whole = Written(store.dir / main, tokens, sc.size_bytes, sc.n_media, -1)
                inc = keep_state(store, whole, related)
                claimed.extend(inc.claimed)
                made.append(inc.path.name)
                before += sc.size_bytes
                written += inc.written_bytes + inc.size
            points: list[RestorePoint] = []
            for p in sc.points:
                if p.kv_file.endswith(MANIFEST_SUFFIX):
                    points.append(p)
                    continue
                path = store.dir / p.kv_file
                bad, _stamp = file_integrity(path, p.size_bytes, p.content_hash, p.verified, trust_stamp=True)
                if bad:
                    continue  # a damaged point is only a point less
                point_tokens = read_tokens(path).tokens
                pin = keep_state(store, Written(path, point_tokens, p.size_bytes, 0, -1), related)
                claimed.extend(pin.claimed)
                final = new_kv_name(session_id)
                replace_file(pin.path, store.dir / final)
                made.append(final)
                st = os.lstat(store.dir / final)
                points.append(replace(p, kv_file=final, size_bytes=st.st_size, content_hash=pin.content_hash,
                                      verified=FileStamp.of(st, pin.content_hash), state_bytes=p.size_bytes))
                before += p.size_bytes
                written += pin.written_bytes + pin.size
            if main.endswith(MANIFEST_SUFFIX):
                kept = tuple(points)
                pieces = store.points.pieces_for
                store.update(session_id, lambda s: replace(s, points=kept, pieces=pieces(s.kv_file, kept)))
                store.points.remove_files_of(session_id, [p.kv_file for p in sc.points if p not in kept])
            else:
                transcript = store.transcript_bytes(sc.kv_file)
                new = replace(sc, kv_file=new_kv_name(session_id), size_bytes=inc.size,
                              content_hash=inc.content_hash, verified=None, points=tuple(points),
                              state_bytes=sc.size_bytes)
                store.commit(inc.path, new, tokens, hashed=inc.hashed, replaces=sc.kv_file,
                             transcript=transcript, drops=[p.kv_file for p in sc.points])
            made.clear()
        finally:
            for name in made:
                unlink_quietly(store.dir / name)
            store.states.release(claimed)
        return before, written
