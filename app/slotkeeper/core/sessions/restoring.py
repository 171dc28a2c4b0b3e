"""Before and after llama-server restores a session: the checks, and what the sidecar remembers.

Compatibility (``compat``) and then integrity (size, then the full content hash, skipped while
the file still has the stamp recorded when its content last matched: see ``stamps``) are checked
before the file name is sent to llama-server. llama-server itself has no integrity check and
aborts on a file cut short by one byte, so nothing unchecked reaches it. A failed integrity check
is recorded in the sidecar (``corrupt``), so the session lists as corrupt until a good save of
the same conversation replaces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.sessions.carry_over import CarryOverFailed, carry_over_flash_attn
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.file_checks import file_integrity
from slotkeeper.core.sessions.naming import InvalidSessionId
from slotkeeper.core.sessions.sidecar import (
    RestorePoint,
    RestoreRecord,
    Sidecar,
    SidecarError,
    format_utc,
    utc_now,
)
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore

__all__ = ["RestoreRefused", "carried_over", "check_point", "check_restorable", "record_restore",
           "record_reuse"]


class RestoreRefused(Exception):
    """A session that must not reach the server; ``reasons`` say why, in plain words."""

    def __init__(self, session_id: str, reasons: Sequence[str]) -> None:
        super().__init__(f"session {session_id} not restored: " + "; ".join(reasons))
        self.session_id = session_id
        self.reasons = list(reasons)


def check_restorable(store: SessionStore, session_id: str, facts: ServerFacts,
                     point: str | None = None) -> tuple[SessionEntry, RestorePoint | None]:
    """Compatibility and integrity; raises RestoreRefused (nothing reaches the server). The whole
    file is hashed unless nothing could have changed it since it was verified (``stamps``).
    ``point``: one of the session's restore points (its KV file) is what will be restored: its
    file is the one checked."""
    try:
        entry = store.get(session_id)
    except (SessionNotFound, InvalidSessionId) as exc:
        raise RestoreRefused(session_id, [str(exc)]) from None
    if entry.sidecar is None:
        raise RestoreRefused(session_id, entry.problems)
    reasons = check_compatible(entry.sidecar, facts)
    if reasons:
        raise RestoreRefused(session_id, reasons)
    if point is not None:
        if entry.problems:
            raise RestoreRefused(session_id, entry.problems)
        return entry, check_point(store, entry, point)
    problems = store.integrity_problems(entry, trust_stamp=True)
    if problems:
        store.mark_corrupt(session_id, problems[0])
        raise RestoreRefused(session_id, problems)
    return entry, None


def carried_over(store: SessionStore, entry: SessionEntry, point: RestorePoint | None,
                 facts: ServerFacts, scratch: Path) -> tuple[SessionEntry, RestorePoint | None]:
    """``entry`` (and its ``point``) as a server with the facts' flash attention restores them:
    carried over once when saved under the other choice (``carry_over``, its states rewritten in
    the private folder ``scratch``); RestoreRefused when that cannot be done."""
    assert entry.sidecar is not None
    if entry.sidecar.flash_attn == facts.flash_attn:
        return entry, point
    try:
        entry = carry_over_flash_attn(store, entry.id, facts.flash_attn, scratch)
    except (CarryOverFailed, SessionNotFound) as exc:
        raise RestoreRefused(entry.id, [str(exc)]) from None
    assert entry.sidecar is not None
    if point is None:
        return entry, None
    same = next((p for p in entry.sidecar.points if p.n_tokens == point.n_tokens), None)
    if same is None:
        raise RestoreRefused(entry.id, [f"its restore point at {point.n_tokens} tokens could not be "
                                        "carried over"])
    return entry, same


def check_point(store: SessionStore, entry: SessionEntry, kv_file: str) -> RestorePoint:
    """One of the session's restore points (``entry`` checked by ``check_restorable`` but for its
    own file's integrity): the point's file whole and unchanged. A damaged or missing point is
    dropped from the session (the conversation itself is not damaged by it); RestoreRefused."""
    assert entry.sidecar is not None
    point = next((p for p in entry.sidecar.points if p.kv_file == kv_file), None)
    if point is None:
        raise RestoreRefused(entry.id, [f"it has no restore point {kv_file} any more"])
    problems, stamp = file_integrity(store.dir / point.kv_file, point.size_bytes, point.content_hash,
                                     point.verified, trust_stamp=True)
    if problems:
        store.points.drop(entry.id, [point.kv_file])
        raise RestoreRefused(entry.id, [f"its restore point at {point.n_tokens} tokens: {problems[0]}"])
    return point


def record_restore(store: SessionStore, session_id: str, slot: int, n_restored: int) -> None:
    """The session was restored into ``slot``: it is the most recently used now (a session
    deleted or damaged since is left as it is)."""
    now = format_utc(utc_now())
    record = RestoreRecord(at=now, slot=slot, n_restored=n_restored)
    try:
        store.update(session_id, lambda s: replace(s, last_used_at=now, last_restore=record))
    except (SessionNotFound, SidecarError):
        pass


def record_reuse(store: SessionStore, session_id: str, cache_n: int, prompt_n: int, effective: bool,
                 reason: str | None) -> None:
    """What the first request after the restore reused (see RestoreRecord)."""

    def change(s: Sidecar) -> Sidecar:
        if s.last_restore is None:
            return s
        rec = replace(s.last_restore, cache_n=cache_n, prompt_n=prompt_n, effective=effective, reason=reason)
        return replace(s, last_restore=rec)

    try:
        store.update(session_id, change)
    except (SessionNotFound, SidecarError):
        pass
