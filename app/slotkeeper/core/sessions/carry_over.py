"""A saved conversation carried over to the other flash-attention choice, without loss.

Flash attention decides how llama-server lays out the V cache in a save file (transposed without
it), and a server refuses a file of the other layout. When the choice changes (measured on this
machine, or set), a conversation saved under the earlier one is rewritten once, when it is next
restored: the same values in the other layout (``statefile.convert_v_layout``), for its save and
each of its restore points, committed as a new version of the session like a save (the files
written and synced first, then the sidecar, then the old files removed). Nothing is read again by
the model, no token is lost; a file that fails its integrity check is not converted (a damaged
point is dropped, a damaged save refused as a restore refuses it).
"""

from __future__ import annotations

import os
from dataclasses import replace

from slotkeeper.core.basics.fsutil import open_regular
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.file_checks import file_integrity
from slotkeeper.core.sessions.naming import new_incoming_name, new_kv_name, transcript_name
from slotkeeper.core.sessions.rows import stamp_of
from slotkeeper.core.sessions.sidecar import RestorePoint
from slotkeeper.core.sessions.stamps import FileStamp, hash_with_stamp
from slotkeeper.core.sessions.statefile import StateLayoutError, convert_v_layout
from slotkeeper.core.sessions.store import SessionStore, unlink_quietly

__all__ = ["CarryOverFailed", "carry_over_flash_attn"]


class CarryOverFailed(Exception):
    """The conversation could not be rewritten for the other flash-attention choice (why, in words)."""


def carry_over_flash_attn(store: SessionStore, session_id: str, flash_attn: bool) -> SessionEntry:
    """The session rewritten for a server with flash attention ``flash_attn`` (the entry as it is
    when it already is). CarryOverFailed says why it cannot be."""
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
        made: list[str] = []
        try:
            incoming = new_incoming_name()
            made.append(incoming)
            main_hash, main_st = _converted(store, sc.kv_file, incoming, flash_attn)
            points: list[RestorePoint] = []
            dropped: list[str] = []
            for p in sc.points:
                bad, _stamp = file_integrity(store.dir / p.kv_file, p.size_bytes, p.content_hash, p.verified,
                                             trust_stamp=True)
                if bad:
                    dropped.append(p.kv_file)
                    continue
                name = new_kv_name(session_id)
                made.append(name)
                digest, st = _converted(store, p.kv_file, name, flash_attn)
                points.append(replace(p, kv_file=name, size_bytes=st.st_size, content_hash=digest,
                                      verified=FileStamp.of(st, digest)))
            chat = transcript_name(sc.kv_file)
            transcript = None
            if chat is not None:
                try:
                    with open_regular(store.dir / chat) as f:
                        transcript = f.read()
                except OSError:
                    transcript = None
            new = replace(sc, kv_file=new_kv_name(session_id), flash_attn=flash_attn,
                          size_bytes=main_st.st_size, content_hash=main_hash, verified=None,
                          points=tuple(points))
            store.commit(store.dir / incoming, new, store.tokens(entry), hashed=main_st, replaces=sc.kv_file,
                         transcript=transcript, drops=[*(p.kv_file for p in sc.points)])
            made.clear()
            store.index.note_files({p.kv_file: stamp_of(os.lstat(store.dir / p.kv_file)) for p in points})
        except (OSError, StateLayoutError, ValueError) as exc:
            raise CarryOverFailed(f"it could not be rewritten for flash attention "
                                  f"{'on' if flash_attn else 'off'}: {exc}") from exc
        finally:
            for name in made:
                unlink_quietly(store.dir / name)
        return store.get(session_id)


def _converted(store: SessionStore, kv_file: str, name: str, flash_attn: bool) -> tuple[str, os.stat_result]:
    """``kv_file`` converted into the new file ``name``: its content hash and stat."""
    target = store.dir / name
    convert_v_layout(store.dir / kv_file, target, v_trans=not flash_attn)
    digest, st = hash_with_stamp(target)
    return digest, st if st is not None else os.lstat(target)
