"""A saved conversation carried over to the other flash-attention choice, without loss.

Flash attention decides how llama-server lays out the V cache in a save file (transposed without
it), and a server refuses a file of the other layout. When the choice changes (measured on this
machine, or set), a conversation saved under the earlier one is rewritten once, when it is next
restored: each of its states (its save, each restore point) is assembled, rewritten with the same
values in the other layout (``statefile.convert_v_layout``) in the staging folder, and kept as
pieces again; the new version is committed like a save (pieces and manifests synced, then the
sidecar, then the old manifests removed; pieces nothing names any more are collected later).
Nothing is read again by the model, no token is lost; a state that fails its integrity check is not
converted (a damaged point is dropped, a damaged save refused as a restore refuses it).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.basics.fsutil import replace_file
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.file_checks import file_integrity
from slotkeeper.core.sessions.naming import new_incoming_name, new_kv_name
from slotkeeper.core.sessions.pieces import PieceError
from slotkeeper.core.sessions.saving import Written, keep_state
from slotkeeper.core.sessions.sidecar import RestorePoint
from slotkeeper.core.sessions.stamps import FileStamp
from slotkeeper.core.sessions.statefile import StateLayoutError, convert_v_layout
from slotkeeper.core.sessions.store import SessionStore, unlink_quietly

__all__ = ["CarryOverFailed", "carry_over_flash_attn"]


class CarryOverFailed(Exception):
    """The conversation could not be rewritten for the other flash-attention choice (why, in words)."""


def carry_over_flash_attn(store: SessionStore, session_id: str, flash_attn: bool,
                          scratch: Path) -> SessionEntry:
    """The session rewritten for a server with flash attention ``flash_attn`` (the entry as it is
    when it already is); ``scratch``: a private folder for the states while they are rewritten (the
    staging folder). CarryOverFailed says why it cannot be."""
    with store.exclusive():
        entry = store.get(session_id)
        sc = entry.sidecar
        if sc is None or entry.problems:
            raise CarryOverFailed("; ".join(entry.problems) or "its sidecar cannot be read")
        if sc.flash_attn == flash_attn:
            return entry
        problems = store.integrity_problems(entry, trust_stamp=True)
        if problems:
            store.mark_corrupt(session_id, problems[0])
            raise CarryOverFailed(problems[0])
        made: list[Path] = []
        claimed: list[str] = []  # the pieces the rewritten states name (spared until committed)
        tokens = list(store.tokens(entry))
        related = [sc.kv_file, *(p.kv_file for p in sc.points)]
        try:
            main, main_size, main_hash, main_st = _converted(store, sc.kv_file, tokens, flash_attn, scratch,
                                                             related, claimed)
            made.append(main)
            points: list[RestorePoint] = []
            dropped: list[str] = []
            for p in sc.points:
                bad, _stamp = file_integrity(store.dir / p.kv_file, p.size_bytes, p.content_hash, p.verified,
                                             trust_stamp=True)
                if bad:
                    dropped.append(p.kv_file)
                    continue
                incoming, size, digest, st = _converted(store, p.kv_file, tokens[:p.n_tokens], flash_attn,
                                                        scratch, related, claimed)
                final = store.dir / new_kv_name(session_id)
                replace_file(incoming, final)
                made.append(final)
                st = os.lstat(final)
                points.append(replace(p, kv_file=final.name, size_bytes=st.st_size, content_hash=digest,
                                      verified=FileStamp.of(st, digest), state_bytes=size))
            transcript = store.transcript_bytes(sc.kv_file)
            new = replace(sc, kv_file=new_kv_name(session_id), flash_attn=flash_attn,
                          size_bytes=main_st.st_size, content_hash=main_hash, verified=None,
                          points=tuple(points), state_bytes=main_size)
            store.commit(main, new, tokens, hashed=main_st, replaces=sc.kv_file, transcript=transcript,
                         drops=[*(p.kv_file for p in sc.points)])
            made.clear()
        except PieceError as exc:  # a piece of its save missing or damaged: it cannot be restored
            if not made:
                store.mark_corrupt(session_id, str(exc))
            raise CarryOverFailed(str(exc)) from exc
        except (OSError, StateLayoutError, ValueError) as exc:
            raise CarryOverFailed(f"it could not be rewritten for flash attention "
                                  f"{'on' if flash_attn else 'off'}: {exc}") from exc
        finally:
            for path in made:
                unlink_quietly(path)
            store.states.release(claimed)
        return store.get(session_id)


def _converted(store: SessionStore, kv_file: str, tokens: list[int], flash_attn: bool, scratch: Path,
               related: list[str], claimed: list[str]) -> tuple[Path, int, str, os.stat_result]:
    """The state ``kv_file`` names, rewritten for the other V layout and kept as pieces: (its
    incoming manifest, the state's size, the manifest's hash and stat). The pieces it names are
    added to ``claimed`` (the caller releases them)."""
    scratch.mkdir(mode=0o700, exist_ok=True)
    whole = scratch / new_incoming_name()
    other = scratch / new_incoming_name()
    try:
        store.states.materialize(kv_file, whole)
        convert_v_layout(whole, other, v_trans=not flash_attn)
        unlink_quietly(whole)
        size = other.stat().st_size
        inc = keep_state(store, Written(other, tokens, size, 0, -1), related)
        claimed.extend(inc.claimed)
    finally:
        unlink_quietly(whole)
        unlink_quietly(other)
    st = inc.hashed if inc.hashed is not None else os.lstat(inc.path)
    return inc.path, size, inc.content_hash, st
