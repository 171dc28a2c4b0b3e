"""Keep saved sessions within a disk budget: plan deletions, then apply them.

Planning is pure so the GUI can show exactly what a prune would delete (a dry run)
before anything is touched, and ``apply`` deletes exactly that plan.

Rules: a conversation's stale branches first (a Regenerate or an edit not used since the
conversation it branched from was), then least recently used first; never a pinned session;
never a protected one (the caller passes the sessions currently loaded in a slot, whose files may
be rewritten at any moment). Sizes are the files' sizes on disk (``SessionEntry.size_bytes``), never
what a sidecar claims; pieces several conversations share count once and are freed with the last
of them. Only saved sessions count towards the budget: files Slotkeeper did
not write (``unmanaged_bytes``, e.g. junk a local user made llama-server write into the
folder) are reported on the plan but never cause a session to be pruned, and are never
deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime

from .entries import SessionEntry
from .naming import owns_kv_file
from .sidecar import parse_utc

__all__ = ["PruneCandidate", "PruneError", "PrunePlan", "PruneResult", "apply", "plan", "plan_points"]


class PruneError(RuntimeError):
    """One or more planned deletions failed (see ``PruneResult.failed``)."""


@dataclass(frozen=True)
class PruneCandidate:
    """A saved session as the pruner sees it. Timestamps are sidecar UTC strings."""

    id: str
    title: str
    size_bytes: int
    last_used_at: str
    pinned: bool
    created_at: str = ""  # tie-break between equal last_used_at; "" sorts first
    kv_file: str = ""  # the KV file it names ("": its own, not shared)
    owns_kv_file: bool = True  # deleting it deletes that file (a copied sidecar does not own it)
    # The pieces its states use (id -> bytes; ``size_bytes`` holds its share of them): a piece is
    # freed once every conversation using it is deleted.
    pieces: Mapping[str, int] = field(default_factory=dict)
    parent: str | None = None  # the conversation it branched from (a Regenerate, an edit)

    @classmethod
    def from_entry(cls, entry: SessionEntry) -> PruneCandidate:
        """A listed session, sized by its KV file on disk (``entry.size_bytes``)."""
        sidecar = entry.sidecar
        if sidecar is None:
            raise ValueError(f"session {entry.id}: its sidecar cannot be read")
        return cls(
            id=entry.id,
            title=sidecar.title,
            size_bytes=entry.size_bytes,
            last_used_at=sidecar.last_used_at,
            pinned=sidecar.pinned,
            created_at=sidecar.created_at,
            kv_file=sidecar.kv_file,
            owns_kv_file=owns_kv_file(entry.id, sidecar.kv_file),
            pieces=dict(sidecar.pieces),
            parent=sidecar.parent,
        )


@dataclass
class PrunePlan:
    """What a prune would delete, and the usage before and after.

    Usage counts saved sessions only. ``over_budget_after`` is True when deleting everything
    allowed still leaves usage above the budget (pinned and protected sessions alone exceed
    it). ``unmanaged_bytes`` is for the reader: files that are not ours, outside the count.
    """

    delete: list[PruneCandidate]
    bytes_freed: int
    bytes_before: int
    bytes_after: int
    budget: int
    over_budget_after: bool
    unmanaged_bytes: int = 0


@dataclass
class PruneResult:
    """What ``apply`` did: ids deleted in order, and (id, error) for those that failed."""

    deleted: list[str] = field(default_factory=list)
    failed: list[tuple[str, Exception]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def raise_for_failures(self) -> None:
        """Raise ``PruneError`` if any deletion failed, chained to the first error."""
        if not self.failed:
            return
        summary = "; ".join(f"{session_id}: {error}" for session_id, error in self.failed)
        raise PruneError(
            f"{len(self.failed)} session(s) could not be deleted: {summary}"
        ) from self.failed[0][1]


def plan(
    sessions: Iterable[PruneCandidate],
    budget_bytes: int,
    protected_ids: AbstractSet[str] = frozenset(),
    unmanaged_bytes: int = 0,
) -> PrunePlan:
    """Choose the least recently used deletable sessions until the sessions fit the budget.

    ``unmanaged_bytes`` (files that are not ours) is recorded on the plan, never counted: a
    local user who fills the folder with junk must not get real conversations pruned.
    """
    sessions = list(sessions)
    _check_inputs(sessions, budget_bytes, unmanaged_bytes)
    # Pieces several conversations share count once, and are freed with the last of them: each
    # session's size is its own files plus its share of its pieces (as a listing counts it).
    users: dict[str, int] = {}
    piece_bytes: dict[str, int] = {}
    for s in sessions:
        for piece_id, size in s.pieces.items():
            users[piece_id] = users.get(piece_id, 0) + 1
            piece_bytes[piece_id] = size
    # A KV file counts once, however many sidecars name it (a sidecar copied by hand), and only
    # deleting the session that owns it frees it.
    sizes = {_file_key(s): s.size_bytes - sum(piece_bytes[p] // users[p] for p in s.pieces) for s in sessions}
    bytes_before = sum(sizes.values()) + sum(piece_bytes.values())
    # A conversation's stale branches (not used since the conversation they branched from was)
    # go before any conversation, then the least recently used.
    last_used = {s.id: _moment(s, s.last_used_at) for s in sessions}
    stale = {s.id for s in sessions
             if s.parent in last_used and last_used[s.id] < last_used[s.parent]}
    deletable = sorted(
        (s for s in sessions if not s.pinned and s.id not in protected_ids),
        key=lambda s: (s.id not in stale, _least_recently_used_first(s)),
    )
    usage = bytes_before
    chosen: list[PruneCandidate] = []
    for session in deletable:
        if usage <= budget_bytes:
            break
        chosen.append(session)
        if session.owns_kv_file:
            usage -= sizes.pop(_file_key(session), 0)
        for piece_id in session.pieces:
            users[piece_id] -= 1
            if users[piece_id] == 0:
                usage -= piece_bytes[piece_id]
    return PrunePlan(
        delete=chosen,
        bytes_freed=bytes_before - usage,
        bytes_before=bytes_before,
        bytes_after=usage,
        budget=budget_bytes,
        over_budget_after=usage > budget_bytes,
        unmanaged_bytes=unmanaged_bytes,
    )


def plan_points(entries: Iterable[SessionEntry], usage: int, budget_bytes: int,
                pieces_only: Callable[[SessionEntry], int] = lambda e: 0) -> list[tuple[str, list[str], int]]:
    """Restore points go before whole conversations: the points of the least recently used
    conversations first (pinned ones last), until ``usage`` fits the budget. Returns (session id,
    its point files, their bytes) to drop, in order; nothing when it fits already.
    ``pieces_only(entry)``: the bytes of pieces only its points use (freed with them)."""
    e_by_id = {e.id: e for e in entries}
    with_points = [(e.id, e.sidecar) for e in e_by_id.values() if e.sidecar is not None and e.sidecar.points]
    with_points.sort(key=lambda pair: (pair[1].pinned, parse_utc(pair[1].last_used_at), pair[0]))
    out = []
    for session_id, sc in with_points:
        if usage <= budget_bytes:
            break
        freed = sum(p.size_bytes for p in sc.points) + pieces_only(e_by_id[session_id])
        out.append((session_id, [p.kv_file for p in sc.points], freed))
        usage -= freed
    return out


def _file_key(session: PruneCandidate) -> str:
    return session.kv_file or f"<{session.id}>"


def apply(prune_plan: PrunePlan, delete_fn: Callable[[str], None]) -> PruneResult:
    """Delete the planned sessions in order; a failure does not stop the rest.

    Failures are collected, not swallowed: check ``result.ok`` or call
    ``result.raise_for_failures()``.
    """
    result = PruneResult()
    for candidate in prune_plan.delete:
        try:
            delete_fn(candidate.id)
        except Exception as error:  # noqa: BLE001 - reported in the result
            result.failed.append((candidate.id, error))
        else:
            result.deleted.append(candidate.id)
    return result


def _least_recently_used_first(session: PruneCandidate) -> tuple[datetime, datetime, str]:
    # Parsed, not compared as strings: "…:00Z" sorts after "…:00.5Z" as text.
    return (
        _moment(session, session.last_used_at),
        _moment(session, session.created_at) if session.created_at else datetime.min,
        session.id,
    )


def _moment(session: PruneCandidate, timestamp: str) -> datetime:
    try:
        # Naive UTC so it compares with datetime.min (the "no created_at" stand-in).
        return parse_utc(timestamp).replace(tzinfo=None)
    except ValueError as exc:
        raise ValueError(f"session {session.id}: {exc}") from None


def _check_inputs(sessions: list[PruneCandidate], budget_bytes: int, unmanaged_bytes: int) -> None:
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must not be negative, got {budget_bytes}")
    if unmanaged_bytes < 0:
        raise ValueError(f"unmanaged_bytes must not be negative, got {unmanaged_bytes}")
    seen: set[str] = set()
    for session in sessions:
        if session.size_bytes < 0:
            raise ValueError(f"session {session.id}: negative size {session.size_bytes}")
        if session.id in seen:
            raise ValueError(f"session {session.id} is listed twice")
        seen.add(session.id)
