"""The safe save protocol, after llama-server has written a slot to ``incoming-<rand>.kv`` in the
staging folder (``staging``: in memory where the system allows).

1. Check ``n_written > 0`` and that it equals the file size (a failed write can answer 200 with
   ``n_written: 0``); read the token list from the file header. Keep the state as pieces
   (``pieces.put``): only the cells no state of the conversation (its previous version, its
   restore points, its parent) holds are written, synced; the manifest that names them is written
   as ``incoming-<rand>.kvm`` in the sessions folder, synced, and hashed.
2. Lineage against saved sessions of the same model: tokens that extend a session update it;
   tokens diverging inside one fork a new session with ``parent``; anything else is new.
   Continuing a pinned session forks it (a pin is a snapshot); the continuation takes the pin
   with it (``continues``), and its own later saves update it in place.
3. Title and preview from the detokenized tokens (``describe``, given by the engine: the store
   knows files, not HTTP), outside the folder lock.
4. Under the folder lock: re-read the session being updated (another save or a CLI command may
   have changed it meanwhile; then decide again), and hand the file to the store
   (``SessionStore.commit``, the one writer of the folder): it renames the manifest to
   ``<id>.<gen>.kvm``, fsyncs the folder, writes ``<id>.json`` atomically (only now does the new
   version exist) and removes the previous version. Pieces nothing names any more are collected
   later (``SessionStore.collect_pieces``).

The staged file and the incoming manifest are this protocol's until then: it removes them
whatever happens (the manifest is gone after a commit, renamed).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from slotkeeper.core.basics.faults import FAULT_ENV, fault_point
from slotkeeper.core.basics.fsutil import NotARegularFile, regular_size
from slotkeeper.core.basics.tokens import TokenArray
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.sessions import kvfile, lineage, pieces
from slotkeeper.core.sessions.compat import ServerFacts, media_mismatch
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.naming import MANIFEST_SUFFIX, new_incoming_name, new_kv_name
from slotkeeper.core.sessions.points import DEFAULT_POINT_SPACING_TOKENS
from slotkeeper.core.sessions.sidecar import (
    RestorePoint,
    Sidecar,
    format_utc,
    new_session_id,
    tokens_digest,
    utc_now,
)
from slotkeeper.core.sessions.staging import cache_state
from slotkeeper.core.sessions.stamps import hash_with_stamp
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore, unlink_quietly
from slotkeeper.core.sessions.transcripts import Transcript

log = logging.getLogger(__name__)

__all__ = ["FAULT_ENV", "SaveContext", "SaveError", "SaveOutcome", "Written", "check_written",
           "commit_point", "commit_written", "server_refused"]

LOW_DISK_BYTES = 256 * 1024 * 1024  # below this, a failed save is explained as a full disk

Describe = Callable[[list[int]], tuple[str, str]]  # tokens -> (title, preview)


class SaveError(Exception):
    """A save that did not produce a complete file; the previous version is untouched."""


@dataclass(frozen=True)
class SaveContext:
    """What a save needs to know about the running server, beyond the slot itself."""

    facts: ServerFacts
    arch: str
    llama_build: str


@dataclass
class SaveOutcome:
    kind: str  # "new", "update", "fork", "unchanged", "contained" (in a longer session), "empty"
    sidecar: Sidecar | None
    n_tokens: int = 0
    save_ms: float = 0.0
    written_bytes: int = 0  # pieces written to disk for it


@dataclass(frozen=True)
class _Incoming:
    path: Path  # the manifest, in the sessions folder
    tokens: list[int]
    size: int  # the manifest's
    content_hash: str  # the manifest's
    n_media: int = 0
    hashed: os.stat_result | None = None  # the file as it was hashed (None: it changed meanwhile)
    state_bytes: int = 0  # the state llama-server wrote (what a restore reads)
    written_bytes: int = 0  # pieces written for it (the rest was there)
    claimed: tuple[str, ...] = ()  # the pieces it names, spared by collections until it is committed


def space_hint(directory: Path) -> str:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return ""
    if free < LOW_DISK_BYTES:
        return f". The disk is full: only {human_bytes(free)} free in {directory}"
    return ". The server log may say more"


def server_refused(store: SessionStore, slot: int, message: str) -> SaveError:
    """The error for a save llama-server answered with an error."""
    return SaveError(f"llama-server could not save slot {slot}: {message}{space_hint(store.dir)}")


@dataclass(frozen=True)
class Written:
    """A slot llama-server has written to an incoming file, its size and token list checked: the
    rest of the save (``commit_written``) may follow later; until then that file is the only copy."""

    path: Path
    tokens: list[int]
    size: int
    n_media: int
    slot: int


def check_written(store: SessionStore, path: Path, n_written: int, slot: int) -> Written | None:
    """Step 1's quick part: llama-server wrote the whole file (``path``, in its save folder), and
    its token list reads. None: the slot was empty. The file is gone unless it is returned. Raises
    SaveError."""
    try:
        fault_point("after_server_write")
        written = _check(store, path, n_written, slot)
    except (kvfile.KvFileError, OSError) as exc:
        unlink_quietly(path)
        raise SaveError(f"saving slot {slot} failed: {exc}") from exc
    except BaseException:
        unlink_quietly(path)
        raise
    if written is None:
        unlink_quietly(path)
    return written


def commit_written(store: SessionStore, written: Written, ctx: SaveContext, describe: Describe,
                   current_id: str | None = None, save_ms: float = 0.0, n_prompt: int | None = None,
                   transcript: Transcript | None = None, rolls_back: bool = True) -> SaveOutcome:
    """The rest of the save (step 1's pieces, steps 2-4); the staged file is gone afterwards
    whatever happens. ``transcript``: the conversation in words, kept with the new version.
    ``rolls_back``: the server's restored states can be rolled back (a shorter save held in a
    longer one is nothing new). Raises SaveError."""
    outcome = None
    try:
        outcome = _commit(store, written, ctx, describe, current_id, save_ms, n_prompt, transcript,
                          rolls_back)
        return outcome
    except (kvfile.KvFileError, pieces.PieceError, OSError) as exc:
        raise SaveError(f"saving slot {written.slot} failed: {exc}{space_hint(store.dir)}") from exc
    finally:
        new_state = outcome is not None and outcome.kind not in ("unchanged", "contained")
        kept = outcome.sidecar if outcome is not None and new_state else None
        if kept is not None:
            cache_state(written.path, kept.content_hash)  # the next restore of it reads it whole
        else:
            unlink_quietly(written.path)


def keep_state(store: SessionStore, written: Written, candidates: list[str], what: str = "") -> _Incoming:
    """The state llama-server wrote, kept as pieces: the cells the states ``candidates`` (KV files of
    the sessions folder) do not hold are written, then the manifest (an incoming file, synced,
    hashed; the caller commits or removes it)."""
    manifest = store.dir / new_incoming_name(MANIFEST_SUFFIX)
    claimed: list[str] = []

    def claim(piece_id: str) -> None:
        store.states.claim(piece_id)
        claimed.append(piece_id)

    try:
        fault_point(f"{what}after_server_write")
        result = pieces.put(written.path, store.pieces_dir,
                            [store.dir / c for c in candidates if c.endswith(MANIFEST_SUFFIX)], manifest,
                            claim)
        fault_point(f"{what}after_pieces")
        content_hash, hashed = hash_with_stamp(manifest)
        fault_point(f"{what}after_hash")
    except BaseException:
        unlink_quietly(manifest)
        store.states.release(claimed)
        raise
    return _Incoming(manifest, written.tokens, manifest.stat().st_size, content_hash, written.n_media, hashed,
                     written.size, result.written_bytes, tuple(claimed))


def _check(store: SessionStore, path: Path, n_written: int, slot: int) -> Written | None:
    try:
        size = regular_size(path)  # lstat: a link or a FIFO in its place is never followed
    except FileNotFoundError:
        size = -1
    except NotARegularFile as exc:
        raise SaveError(f"saving slot {slot} failed: {exc}") from None
    if n_written <= 0 or size != n_written:
        raise SaveError(
            f"llama-server wrote {max(n_written, 0)} bytes for slot {slot} but the file "
            f"has {max(size, 0)}; the previous save is kept{space_hint(store.dir)}"
        )
    header = kvfile.read_tokens(path)
    if header.n_tokens == 0:
        return None
    return Written(path, header.tokens, size, header.n_media, slot)


LINEAGE_FINALISTS = 8  # sessions whose token lists a save compares (chosen by the index's hashes)


def _candidates(store: SessionStore, tokens: list[int], facts: ServerFacts, prefer: str | None,
                n_prompt: int | None) -> list[tuple[SessionEntry, TokenArray]]:
    """The saved sessions lineage compares with ``tokens``: the few the sessions index says can
    share enough with them (``SessionsIndex.lineage_candidates``), whatever the number of sessions;
    the slot's own session first, then the most recently used."""
    store.index_tokens(only_model=facts.model_sha256)  # sessions that came in behind our back
    index = store.index
    out = []
    for sid in index.lineage_candidates(tokens, facts.model_sha256, prefer, n_prompt, LINEAGE_FINALISTS,
                                        index.newest_first):
        entry = store.indexed(sid)
        sc = entry.sidecar if entry is not None else None
        # A session marked corrupt is still a candidate when its token list reads: a good
        # save of the same conversation then replaces it (and clears the mark). One whose images
        # another projector read is not: this save must not overwrite what only that one restores.
        if entry is None or sc is None or sc.model_sha256 != facts.model_sha256 or media_mismatch(sc, facts):
            continue
        try:
            out.append((entry, store.tokens(entry)))
        except (ValueError, OSError) as exc:  # one bad session never stops a save: skip it
            log.debug("lineage skips session %s: %s", entry.id, exc)
            continue
    return out


def _classify(store: SessionStore, tokens: list[int], facts: ServerFacts,
              current_id: str | None, n_prompt: int | None = None,
              rolls_back: bool = True) -> tuple[str, SessionEntry | None]:
    candidates = _candidates(store, tokens, facts, current_id, n_prompt)
    match = lineage.classify(tokens,
                             [(e.id, t, e.sidecar.n_prompt if e.sidecar else None) for e, t in candidates],
                             new_n_prompt=n_prompt, rolls_back=rolls_back)
    previous = next((e for e, _ in candidates if e.id == match.session_id), None)
    return _refine(match.kind, previous, tokens)


def _refine(kind: str, previous: SessionEntry | None, tokens: list[int]) -> tuple[str, SessionEntry | None]:
    if kind == "update" and previous is not None and not previous.problems:
        assert previous.sidecar is not None
        if previous.sidecar.tokens_digest == tokens_digest(tokens):
            return "unchanged", previous
        if previous.sidecar.pinned and not previous.sidecar.continues:
            return "continue", previous  # a pinned session is a snapshot: its continuation is a child
    return kind, previous


def _commit(store: SessionStore, written: Written, ctx: SaveContext, describe: Describe,
            current_id: str | None, save_ms: float, n_prompt: int | None,
            transcript: Transcript | None = None, rolls_back: bool = True) -> SaveOutcome:
    facts = ctx.facts
    kind, previous = _classify(store, written.tokens, facts, current_id, n_prompt, rolls_back)
    if kind in ("unchanged", "contained") and previous is not None:
        inc = _Incoming(written.path, written.tokens, written.size, "", written.n_media)  # nothing to keep
    else:
        inc = keep_state(store, written, related_states(store, previous, current_id))
    try:
        described = None if kind in ("unchanged", "contained") else describe(inc.tokens)
        while True:
            outcome = _commit_locked(store, inc, ctx, described, kind, previous, current_id, save_ms,
                                     n_prompt, transcript, rolls_back)
            if outcome is not None:
                return outcome
            # Decided again under the lock, it needs its state kept and a title after all: made
            # outside the lock (describe asks llama-server), then decided once more.
            if not inc.content_hash:
                inc = keep_state(store, written, related_states(store, previous, current_id))
            if described is None:
                described = describe(inc.tokens)
    finally:
        if inc.path != written.path:
            unlink_quietly(inc.path)  # renamed by a commit; else removed
        store.states.release(inc.claimed)


def related_states(store: SessionStore, previous: SessionEntry | None, current_id: str | None) -> list[str]:
    """KV files of states likely to share the new one's cells: the session it continues or forks
    from, the slot's own session, their restore points and parents."""
    out: list[str] = []
    seen: set[str] = set()
    queue = [e for e in (previous,) if e is not None]
    for sid in (current_id,):
        if sid is not None:
            try:
                queue.append(store.get(sid))
            except (SessionNotFound, ValueError, OSError):
                pass
    while queue and len(seen) < 8:
        entry = queue.pop(0)
        sc = entry.sidecar
        if sc is None or entry.id in seen:
            continue
        seen.add(entry.id)
        out.append(sc.kv_file)
        out.extend(p.kv_file for p in sc.points)
        if sc.parent:
            try:
                queue.append(store.get(sc.parent))
            except (SessionNotFound, ValueError, OSError):
                pass
    return out


def _commit_locked(store: SessionStore, inc: _Incoming, ctx: SaveContext, described: tuple[str, str] | None,
                   kind: str, previous: SessionEntry | None, current_id: str | None, save_ms: float,
                   n_prompt: int | None, transcript: Transcript | None,
                   rolls_back: bool = True) -> SaveOutcome | None:
    """Step 4 under the folder lock; None when the save needs a title (``described``) it lacks."""
    facts = ctx.facts
    with store.exclusive():
        if previous is not None:
            try:
                fresh = store.get(previous.id)
            except SessionNotFound:
                fresh = None
            if fresh is None or fresh.sidecar is None or fresh.kv_path != previous.kv_path:
                # Changed while we were away (another save, a delete): decide again, now under the lock.
                kind, previous = _classify(store, inc.tokens, facts, current_id, n_prompt, rolls_back)
            elif kind != "contained":
                kind, previous = _refine("update" if kind in ("unchanged", "continue") else kind, fresh,
                                         inc.tokens)
        now = format_utc(utc_now())
        if kind in ("unchanged", "contained") and previous is not None:
            # Nothing new to keep: the session holds it already. It was used now.
            sc = store.update(previous.id, lambda s: replace(s, last_used_at=now))
            return SaveOutcome(kind, sc, len(inc.tokens), save_ms)
        if described is None or not inc.content_hash:
            return None  # (decided again: its pieces were not kept, as nothing looked new)
        title, preview = described
        continues = False
        replaces = None  # the previous version's KV file, which the store removes (an update's)
        points: tuple[RestorePoint, ...] = ()
        drops: list[str] = []
        if kind == "update" and previous is not None:
            sc0 = previous.sidecar
            assert sc0 is not None
            sid, created, pinned, parent, last_restore = (sc0.id, sc0.created_at, sc0.pinned, sc0.parent,
                                                          sc0.last_restore)
            continues = sc0.continues
            replaces = sc0.kv_file
            # Its restore points stay while the new version still starts with their tokens.
            points = tuple(p for p in sc0.points if p.n_tokens < len(inc.tokens)
                           and tokens_digest(inc.tokens[:p.n_tokens]) == p.tokens_digest)
            drops = [p.kv_file for p in sc0.points if p not in points]
        elif kind == "continue" and previous is not None:
            # The pinned snapshot stays as it is; the conversation (and its pin) goes on here.
            sid, created, pinned, parent, last_restore = new_session_id(), now, True, previous.id, None
            continues = True
        else:
            sid, created, pinned, last_restore = new_session_id(), now, False, None
            parent = previous.id if (kind == "fork" and previous) else None
        final_name = new_kv_name(sid)
        sidecar = Sidecar(
            id=sid, kv_file=final_name, title=title, preview=preview,
            model_path=facts.model_path, model_sha256=facts.model_sha256, arch=ctx.arch,
            swa=facts.swa, swa_full=facts.swa_full, flash_attn=facts.flash_attn,
            cache_type_k=facts.cache_type_k, cache_type_v=facts.cache_type_v,
            n_parallel=facts.n_parallel, kv_unified=False, n_ctx_slot=facts.n_ctx_slot,
            n_tokens=len(inc.tokens), tokens_digest=tokens_digest(inc.tokens), size_bytes=inc.size,
            state_bytes=inc.state_bytes,
            content_hash=inc.content_hash, llama_build=ctx.llama_build, created_at=created,
            last_used_at=now, pinned=pinned, parent=parent, kv_args=list(facts.kv_args),
            n_prompt=n_prompt if n_prompt is not None and n_prompt <= len(inc.tokens) else None,
            last_restore=last_restore, restore_mode=facts.restore_mode, n_media=inc.n_media,
            mmproj_sha256=facts.mmproj_sha256, continues=continues, points=points,
        )  # fmt: skip
        # The store renames, writes the sidecar and removes the previous version (step 4); its
        # ``verified`` stamp is carried over from the hash above.
        sidecar = store.commit(inc.path, sidecar, inc.tokens, hashed=inc.hashed, replaces=replaces,
                               step=fault_point, transcript=transcript.to_bytes() if transcript else None,
                               drops=drops)
    return SaveOutcome("fork" if kind == "continue" else kind, sidecar, len(inc.tokens), save_ms,
                       inc.written_bytes)


def commit_point(store: SessionStore, written: Written, session_id: str, kind: str,
                 spacing: int = DEFAULT_POINT_SPACING_TOKENS, share: float | None = None) -> Sidecar | None:
    """A slot llama-server wrote while it held a prefix of the session's conversation becomes one
    of its restore points (``sessions.points``): kept as pieces like a save (only what the
    conversation's states do not hold is written), then committed by the store
    (``SessionStore.add_point``). None when the session no longer starts with those tokens. The
    staged file is gone afterwards whatever happens. Raises SaveError."""
    inc = None
    try:
        try:
            entry = store.get(session_id)
        except (SessionNotFound, ValueError):
            return None
        inc = keep_state(store, written, related_states(store, entry, None), what="point_")
        point = RestorePoint(kv_file=inc.path.name, n_tokens=len(written.tokens),
                             tokens_digest=tokens_digest(written.tokens), size_bytes=inc.size,
                             content_hash=inc.content_hash, kind=kind, made_at=format_utc(utc_now()),
                             state_bytes=inc.state_bytes)
        committed = store.points.add(session_id, inc.path, point, inc.hashed, spacing,
                                    step=lambda name: fault_point(f"point_{name}"), share=share)
        if committed is not None and any(p.content_hash == inc.content_hash for p in committed.points):
            cache_state(written.path, inc.content_hash)
        return committed
    except (kvfile.KvFileError, pieces.PieceError, OSError) as exc:
        raise SaveError(f"saving a restore point of slot {written.slot} failed: {exc}") from exc
    finally:
        unlink_quietly(written.path)
        if inc is not None:
            unlink_quietly(inc.path)
            store.states.release(inc.claimed)
