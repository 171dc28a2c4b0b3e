"""Whether a saved session can be resumed right now, and why not: one rule for every face."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from slotkeeper.core.sessions.compat import ServerFacts, check_compatible, model_file_name
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.views import STOPPED_STATES, ServerState


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
    switch_to: str | None = None  # Resume switches to this model first (the session was made with it)

    @property
    def label(self) -> str:
        """The action's name: "Resume", or "Switch to <model> to resume"."""
        if self.switch_to:
            return f"Switch to {model_file_name(self.switch_to)} to resume"
        return "Resume"


def resume_verdict(entry: SessionEntry, state: ServerState, facts: ServerFacts | None,
                   has_model: bool, model_path: str | None = None,
                   aliases: Mapping[str, str] | None = None) -> ResumeVerdict:
    """``facts`` are the running server's once the engine is ready (None before); ``model_path``
    is the resolved file of the model the server runs or will run, when known: a session of
    another model is resumed by switching to its model, by the name it was chosen by when
    ``aliases`` (resolved file -> remembered model path) knows it (a Hugging Face snapshot link,
    not the blob it points to)."""
    verdict = _verdict(entry, state, facts, has_model, model_path)
    if aliases and verdict.switch_to and verdict.switch_to in aliases:
        verdict = replace(verdict, switch_to=aliases[verdict.switch_to])
    return verdict


def _verdict(entry: SessionEntry, state: ServerState, facts: ServerFacts | None,
             has_model: bool, model_path: str | None) -> ResumeVerdict:
    if entry.problems:
        return ResumeVerdict(False, "Damaged: " + "; ".join(entry.problems))
    sc = entry.sidecar
    if sc is None:
        return ResumeVerdict(False, "Its sidecar cannot be read")
    if facts is not None:
        other_model = sc.model_sha256 != facts.model_sha256
    else:  # with no model chosen, the session's own model is the one to run
        other_model = not has_model or (model_path is not None and sc.model_path != model_path)
    if other_model and state is not ServerState.STOPPING:
        name = model_file_name(sc.model_path)
        restart = "" if state in STOPPED_STATES else "saves changed conversations, restarts llama-server "
        return ResumeVerdict(True, f"Made with {name}: {restart}switches to {name} (with its remembered "
                             "settings) and resumes this conversation", starts_server=state in STOPPED_STATES,
                             switch_to=sc.model_path)
    if state in STOPPED_STATES:
        return ResumeVerdict(True, "Starts the server and resumes this conversation", starts_server=True)
    reasons = compat_reasons(entry, facts)
    if reasons is None:
        return ResumeVerdict(False, "Wait until the server is ready")
    if reasons:
        return ResumeVerdict(False, "Cannot be resumed: " + "; ".join(reasons))
    tokens = f"{entry.sidecar.n_tokens:,} tokens; " if entry.sidecar else ""
    return ResumeVerdict(True, f"{tokens}restores into a free slot (a changed slot is saved first)")
