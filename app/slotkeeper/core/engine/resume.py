"""Whether a saved session can be resumed right now, and why not: one rule for every face."""

from __future__ import annotations

from dataclasses import dataclass

from slotkeeper.core.server.state import STOPPED_STATES, ServerState
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.entries import SessionEntry


def compat_reasons(entry: SessionEntry, facts: ServerFacts | None) -> list[str] | None:
    """Why this session cannot be restored; [] = it can; None = no running server to compare with."""
    if entry.sidecar is None:
        return list(entry.problems) or ["its sidecar cannot be read"]
    if entry.problems:
        return list(entry.problems)
    if facts is None:
        return None
    return check_compatible(entry.sidecar, facts)


@dataclass(frozen=True)
class ResumeVerdict:
    enabled: bool
    why: str  # a tooltip: what Resume will do, or why it cannot
    starts_server: bool = False  # Resume starts the server first (it is stopped)


def resume_verdict(entry: SessionEntry, state: ServerState, facts: ServerFacts | None,
                   has_model: bool) -> ResumeVerdict:
    """``facts`` are the running server's once the engine is ready (None before)."""
    if entry.problems:
        return ResumeVerdict(False, "Damaged: " + "; ".join(entry.problems))
    if state in STOPPED_STATES:
        if entry.sidecar is None:
            return ResumeVerdict(False, "Its sidecar cannot be read")
        if not has_model:
            return ResumeVerdict(False, "Choose a model first")
        return ResumeVerdict(True, "Starts the server and resumes this conversation", starts_server=True)
    reasons = compat_reasons(entry, facts)
    if reasons is None:
        return ResumeVerdict(False, "Wait until the server is ready")
    if reasons:
        return ResumeVerdict(False, "Cannot be resumed: " + "; ".join(reasons))
    tokens = f"{entry.sidecar.n_tokens:,} tokens; " if entry.sidecar else ""
    return ResumeVerdict(True, f"{tokens}restores into a free slot (a changed slot is saved first)")
