"""Whether a saved session may be restored into the running llama-server.

A slot save file carries no model identity and no settings, and llama-server restores a
mismatched file either with an opaque 400 or, worse, "successfully" with garbage. Each rule
below mirrors a measured llama-server behaviour; the facts on both sides come from the
sidecar (what the session was saved with) and ``ServerFacts`` (what the server runs with).
"""

from __future__ import annotations

from dataclasses import dataclass

from slotkeeper.core.sessions.sidecar import Sidecar

__all__ = ["ServerFacts", "check_compatible", "media_mismatch", "model_file_name", "swa_mode"]


@dataclass(frozen=True)
class ServerFacts:
    """What the running llama-server was started with, as far as a KV file cares."""

    model_sha256: str
    model_path: str
    flash_attn: bool
    cache_type_k: str
    cache_type_v: str
    swa_full: bool
    n_parallel: int
    n_ctx_slot: int
    swa: bool
    kv_args: tuple[str, ...] = ()
    restore_mode: str = "works"  # core.model.families: works, exact, never, unknown
    mmproj_sha256: str | None = None  # the projector llama-server runs with (--mmproj), if any


def check_compatible(sidecar: Sidecar, facts: ServerFacts) -> list[str]:
    """Why this saved session cannot be restored into that server; empty = it can.

    Each rule mirrors a measured llama-server behaviour: a mismatched file either fails
    with an opaque 400 or, worse, restores "fine" and is then used with wrong results.
    """
    reasons: list[str] = []
    model = _model_mismatch(sidecar, facts)
    if model:
        reasons.append(model)
    # Flash attention is no reason: a file of the other V layout is carried over when it is
    # restored (``carry_over``), the same values laid out as the server reads them.
    for which, saved, running in (
        ("K", sidecar.cache_type_k, facts.cache_type_k),
        ("V", sidecar.cache_type_v, facts.cache_type_v),
    ):
        if saved != running:
            reasons.append(f"saved with {which} cache type {saved}; the server uses {running}")
    media = media_mismatch(sidecar, facts)
    if media:
        reasons.append(media)
    if sidecar.kv_unified:
        # Slotkeeper always runs llama-server with a per-slot cache (an explicit --parallel);
        # a file saved from a unified one (by another tool) has another stream layout.
        reasons.append("saved with a unified KV cache; the server's is per slot")
    if sidecar.n_parallel != facts.n_parallel:
        # The KV stream count is baked in ("n_stream mismatch" in the server log).
        reasons.append(
            f"saved with {sidecar.n_parallel} slots (-np {sidecar.n_parallel}); "
            f"the server runs {facts.n_parallel}"
        )
    if sidecar.n_tokens > facts.n_ctx_slot:
        # Restore needs one cell per saved token in the slot's cache; a larger cache than
        # the one saved from is fine, so the bound is the token count, not n_ctx_slot.
        reasons.append(
            f"needs {sidecar.n_tokens} tokens of context per slot; "
            f"the server's slots have {facts.n_ctx_slot}"
        )
    if tuple(sidecar.kv_args) != tuple(facts.kv_args):
        reasons.append(
            f"saved with llama-server arguments {' '.join(sidecar.kv_args) or '(none)'}; "
            f"the server runs with {' '.join(facts.kv_args) or '(none)'}"
        )
    # Only sliding-window layers are stored differently with --swa-full.
    if sidecar.swa and sidecar.swa_full != facts.swa_full:
        reasons.append(
            f"saved {_with_without(sidecar.swa_full)} --swa-full; "
            f"the server runs {_with_without(facts.swa_full)} it"
        )
    return reasons


def _model_mismatch(sidecar: Sidecar, facts: ServerFacts) -> str | None:
    if sidecar.model_sha256 == facts.model_sha256:
        return None
    saved_name = model_file_name(sidecar.model_path)
    running_name = model_file_name(facts.model_path)
    running = running_name
    if running_name == saved_name:  # same name, different bytes: show both hashes
        running = f"{running_name} (sha256 {_short_hash(facts.model_sha256)})"
    return (
        f"saved for a different model ({saved_name}, sha256 "
        f"{_short_hash(sidecar.model_sha256)}); the server runs {running}"
    )


def media_mismatch(sidecar: Sidecar, facts: ServerFacts) -> str | None:
    """A session holding images or audio needs the projector that read them. llama-server refuses
    such a file without a projector (and empties the slot doing so); with another projector of the
    same shape it restores it and reuses image cells that projector never computed (measured in
    tests/e2e/test_mmproj_server.py), so the projector's hash decides. Text-only sessions restore
    with or without a projector."""
    if not sidecar.n_media:
        return None
    items = f"{sidecar.n_media} image{'s' if sidecar.n_media != 1 else ''}"
    if facts.mmproj_sha256 is None:
        return f"holds {items}; the server runs without a projector (--mmproj)"
    if sidecar.mmproj_sha256 != facts.mmproj_sha256:
        saved = _short_hash(sidecar.mmproj_sha256) if sidecar.mmproj_sha256 else "unknown"
        return (f"holds {items} read by another projector (sha256 {saved}); "
                f"the server runs {_short_hash(facts.mmproj_sha256)}")
    return None


def model_file_name(model_path: str) -> str:
    """The file name of a model path written on any OS."""
    # Sidecars may come from another OS; treat both separators as separators.
    return model_path.replace("\\", "/").rsplit("/", 1)[-1] or model_path


def _short_hash(sha256: str) -> str:
    return f"{sha256[:8]}…"


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _with_without(flag: bool) -> str:
    return "with" if flag else "without"



def swa_mode(sidecar: Sidecar) -> str:
    """How the session's sliding-window layers were stored, in words."""
    if not sidecar.swa:
        return "full attention"
    return "sliding window + swa-full" if sidecar.swa_full else "sliding window"
