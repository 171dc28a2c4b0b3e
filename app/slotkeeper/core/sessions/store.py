"""The sessions folder as files: list, read, commit, update, delete, verify, sweep.

The store is the one writer of the folder's sessions and of the sessions index (``index``), which
it changes only through the index's own methods. The store knows files, not HTTP: the save
protocol (``saving``) decides what a file llama-server wrote is and hands it to ``commit``; the
restore checks (``restoring``) build on it too, and the engine does the talking to llama-server.
Names are in ``naming``, the folder lock in ``folder_lock``.

A crash at any step of a save leaves the previous complete session (its sidecar still names the
old file) plus leftovers that ``sweep()`` removes at start: ``incoming-*`` files, and
``<id>.<gen>.kv`` files in our own naming that no sidecar claims. Any other file is *unmanaged*:
listed, never deleted automatically.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.basics.faults import fault_point
from slotkeeper.core.basics.fsutil import (
    atomic_write_bytes,
    ensure_private_folder,
    fsync_dir,
    open_regular,
    replace_file,
)
from slotkeeper.core.basics.tokens import TYPECODE, TokenArray
from slotkeeper.core.sessions.entries import (
    Listing,
    SessionEntry,
    SessionNotFound,
)
from slotkeeper.core.sessions.file_checks import StatOf, file_integrity, integrity_problems, sidecar_problems
from slotkeeper.core.sessions.folder_lock import LOCK_TIMEOUT_SECONDS, FolderLock, FolderReadOnly
from slotkeeper.core.sessions.index import SessionsIndex, SidecarRecord
from slotkeeper.core.sessions.index_file import index_bytes, load_index, write_index
from slotkeeper.core.sessions.listing import list_folder, list_rows
from slotkeeper.core.sessions.naming import (
    INCOMING_PREFIX,
    LOCK_NAME,
    OWN_KV_RE,
    OWN_TRANSCRIPT_RE,
    SIDECAR_NAME_RE,
    InvalidSessionId,
    owns_kv_file,
    sidecar_name,
    transcript_name,
    validate_session_id,
)
from slotkeeper.core.sessions.point_files import PointFiles, remove_superseded, unlink_quietly
from slotkeeper.core.sessions.rows import Stamp, scan, stamp_of
from slotkeeper.core.sessions.sidecar import (
    Sidecar,
    SidecarError,
    format_utc,
    load_sidecar,
    parse_utc,
    utc_now,
    write_sidecar_atomic,
)
from slotkeeper.core.sessions.stamps import FileStamp, carried_over
from slotkeeper.core.sessions.states import States
from slotkeeper.core.sessions.token_lists import TokenLists
from slotkeeper.core.sessions.transcripts import Transcript

log = logging.getLogger(__name__)

__all__ = ["InvalidSessionId", "SessionNotFound", "SessionStore", "most_recent_first", "unlink_quietly"]


class SessionStore:
    def __init__(self, directory: Path, lock_timeout: float = LOCK_TIMEOUT_SECONDS,
                 index_file: Path | None = None) -> None:
        """``index_file``: where the sessions index is kept between processes (read on first use)."""
        self.dir = Path(directory)
        self.ensure_folder()
        self.lock = FolderLock(self.dir / LOCK_NAME, lock_timeout)
        self.index_file = index_file
        self._index: SessionsIndex | None = None
        self._index_loading = threading.Lock()
        self.token_lists = TokenLists()
        self.states = States(self.dir)
        self.points = PointFiles(self)  # restore points, and the pieces the states are made of

    @property
    def pieces_dir(self) -> Path:
        return self.states.pieces_dir

    def ensure_folder(self) -> None:
        """Create the folder again (0700) if it was deleted, and check that it is still private:
        UnsafeFolder if it became a symbolic link, another user's, or writable by others. Call it
        before asking llama-server to save: it cannot write into a missing folder."""
        ensure_private_folder(self.dir, "sessions folder")

    @contextmanager
    def exclusive(self, reading: bool = False):
        """Exclusive use of the folder (threads and processes); see ``folder_lock``. ``reading``:
        a read-only folder is read without the lock (a write raises FolderReadOnly)."""
        with self.lock.held(reading):
            yield

    # -- the index ------------------------------------------------------------------------
    @property
    def index(self) -> SessionsIndex:
        """The sessions index (``core.sessions.index``), loaded from ``index_file`` on first use."""
        if self._index is None:
            with self._index_loading:
                if self._index is None:
                    self._index = load_index(self.index_file, self.dir)
        return self._index

    def save_index(self) -> bool:
        """Keep the index on disk for the next process, if it changed. True when written."""
        index = self._index
        if self.index_file is None or index is None or not index.dirty:
            return False
        write_index(self.index_file, index_bytes(index))
        return True

    def scan(self) -> dict[str, Stamp]:
        """Every entry of the folder with its lstat (never followed): one look, no file read."""
        return scan(self.dir)

    def _read_record(self, session_id: str, stamp: Stamp) -> SidecarRecord:
        try:
            return SidecarRecord.read(stamp, load_sidecar(self.dir / sidecar_name(session_id)))
        except (SidecarError, OSError, ValueError, RecursionError) as exc:
            return SidecarRecord.read(stamp, None, str(exc))

    def refresh(self, files: dict[str, Stamp] | None = None) -> dict[str, Stamp]:
        """Bring the index up to the folder (as ``files``, a ``_scan`` just made, says, or a new
        look): sidecars new, changed (by their stat) or too recent to trust are read; those gone
        are forgotten. Returns the folder's entries."""
        files = self.scan() if files is None else files
        sidecars = {m.group(1): st for name, st in files.items() if (m := SIDECAR_NAME_RE.match(name))}
        self.index.refresh(files, sidecars, self._read_record)
        return files

    def entry_of(self, sid: str, rec: SidecarRecord, stat_of: StatOf) -> SessionEntry:
        """One session as listed, from its record and the folder's stat (``stat_of(name)``).
        Never raises for what is in the folder: a file that cannot be read safely is the
        entry's problem."""
        if rec.error is not None or rec.data is None:
            return SessionEntry(sid, None, None, [f"unreadable sidecar: {rec.error}"])
        try:
            sc = rec.sidecar()
        except SidecarError:  # the index's copy is not usable: read the file itself
            rec = self._read_record(sid, rec.stamp)
            self.index.set_record(sid, rec)
            return self.entry_of(sid, rec, stat_of)
        data = rec.data
        assert sc is not None and data is not None  # a sidecar is made from its JSON
        size, problems = sidecar_problems(self.dir, sid, data, stat_of)
        return SessionEntry(sc.id if sc.id == sid else sid, sc, self.dir / sc.kv_file, problems, size)

    # -- reading --------------------------------------------------------------------------
    def sidecar_path(self, session_id: str) -> Path:
        """``<dir>/<id>.json``; raises InvalidSessionId for anything that is not an id."""
        return self.dir / sidecar_name(session_id)

    def listing(self) -> Listing:
        """Every session and every other file, as the folder holds them now (``listing.list_folder``)."""
        return list_folder(self)

    def sessions(self) -> list[SessionEntry]:
        return self.listing().sessions

    def listing_rows(self) -> list[bytes]:
        """`sessions list --json`'s rows as JSON (``listing.list_rows``)."""
        return list_rows(self)

    def get(self, session_id: str) -> SessionEntry:
        """One session as the folder holds it now (its sidecar read again only if it changed)."""
        path = self.sidecar_path(validate_session_id(session_id))
        index = self.index
        try:
            st = stamp_of(os.lstat(path))
        except FileNotFoundError:
            index.forget(session_id)
            raise SessionNotFound(session_id) from None
        rec = index.fresh_record(session_id, st, self._read_record)
        seen: dict[str, Stamp | None] = {}
        recheck = None
        kv_file = facts.get("kv_file") if (facts := rec.facts()) else None
        if isinstance(kv_file, str):
            seen[kv_file] = kv_st = self._lstat(kv_file)
            if kv_st is not None:
                recheck = session_id  # its token part is compared with the file again
        seen[path.name] = st
        index.note_files(seen, recheck)
        return self.entry_of(session_id, rec, seen.get)

    def indexed(self, session_id: str) -> SessionEntry | None:
        """A session as the index saw it last (no file looked at), or None if it is not indexed."""
        index = self.index
        rec = index.record(session_id)
        return None if rec is None else self.entry_of(session_id, rec, index.file_stat)

    def _lstat(self, name: str) -> Stamp | None:
        try:
            return stamp_of(os.lstat(self.dir / name))
        except OSError:
            return None

    def tokens(self, entry: SessionEntry) -> TokenArray:
        """The token list at the front of the session's KV file (``token_lists``: read once per file
        version, the most recently used kept)."""
        assert entry.kv_path is not None
        return self.token_lists.read(entry.kv_path)

    def index_tokens(self, only_model: str | None = None) -> int:
        """Read the token headers the index lacks (sessions new or changed since they were
        indexed, e.g. behind the store's back), so routing and lineage see them. Returns how many
        were read; one that cannot be read is not offered (and not tried again until it changes)."""
        index = self.index
        read = 0
        for sid, sha, (kv_file, size, mtime_ns) in index.tokens_to_read(only_model):
            try:
                entry = self.indexed(sid)
                if entry is None or entry.kv_path is None:
                    continue
                tokens = self.tokens(entry)
            except Exception as exc:  # an unreadable session is simply not offered
                log.debug("not indexing %s: %s", sid, exc)
                index.tokens_unreadable(sid, (kv_file, size, mtime_ns))
                continue
            index.add_tokens(sid, sha, kv_file, size, mtime_ns, tokens)
            read += 1
        return read

    def unroute(self, session_id: str) -> None:
        """A session routing found gone or changed behind the store's back: its token part is
        taken out of the index (read again once a look at the folder finds it changed)."""
        self.index.remove(session_id)

    def usage_bytes(self) -> int:
        """The saved sessions' bytes on disk as the index saw them last (no file looked at):
        enough to know that a prune has nothing to do. A listing looks again."""
        usage = self.index.usage_bytes()
        return self.listing().total_bytes if usage is None else usage

    # -- writing --------------------------------------------------------------------------
    def commit(self, incoming: Path, sidecar: Sidecar, tokens: Sequence[int] | None,
               hashed: os.stat_result | None = None, replaces: str | None = None,
               step: Callable[[str], None] = lambda step: None, transcript: bytes | None = None,
               drops: Sequence[str] = ()) -> Sidecar:
        """The last step of a save (``saving``), which has decided what the file llama-server
        wrote is: make ``incoming`` the new version of the session ``sidecar`` describes. Under
        the folder lock: rename it to ``sidecar.kv_file`` (a new name every save), fsync the
        folder, write ``<id>.json`` atomically (only now does the new version exist), remove
        ``replaces`` (the previous version's KV file), and the index learns it all from what the
        save knows (``tokens``: what the file holds), with a stat of the two files.

        ``hashed``: the incoming file's stat when its content hash was computed; the sidecar
        records the stamp that lets a restore skip the hash while the file keeps it
        (``stamps.carried_over``). ``step(name)`` after the rename ("after_rename") and after the
        sidecar ("after_sidecar"): the save protocol's test-only fault hook. A crash at any step
        leaves the previous version (``sweep`` removes the rest). ``transcript``: the conversation
        in words (``transcripts``), written as ``<id>.<gen>.chat`` before the sidecar, so it exists
        exactly when this version does. ``drops``: restore points of the previous version the new
        one no longer keeps (removed after the sidecar). Returns the sidecar written."""
        validate_session_id(sidecar.id)
        if not ((m := OWN_KV_RE.match(sidecar.kv_file)) and m.group(1) == sidecar.id):
            raise ValueError(f"{sidecar.kv_file!r} is not a KV file name of session {sidecar.id}")
        final = self.dir / sidecar.kv_file
        with self.exclusive():
            before = self.points.pieces_now(sidecar.id)
            replace_file(incoming, final)
            chat = transcript_name(sidecar.kv_file)
            if transcript is not None and chat is not None:
                atomic_write_bytes(self.dir / chat, transcript)  # 0600, fsynced, renamed into place
            fsync_dir(self.dir)
            step("after_rename")
            # Verified by the save's hash: a restore trusts the file while it keeps this stamp.
            kv_st = os.lstat(final)  # the file stays as it is until the index has learnt it
            sidecar = replace(sidecar, verified=carried_over(hashed, kv_st, sidecar.content_hash),
                              pieces=self.points.pieces_for(sidecar.kv_file, sidecar.points))
            write_sidecar_atomic(self.sidecar_path(sidecar.id), sidecar)
            step("after_sidecar")
            gone = None
            if replaces is not None and replaces != sidecar.kv_file:
                gone = replaces
                remove_superseded(self.dir / gone)
                old_chat = transcript_name(gone)
                if old_chat is not None and remove_superseded(self.dir / old_chat):
                    self.index.note_files({old_chat: None})
                self.token_lists.forget(gone)
            self.points.remove(sidecar.id, drops)
            self._record_saved(sidecar, stamp_of(kv_st), tokens, gone)
            self.points.drop_pieces(before - set(sidecar.pieces))
        return sidecar

    def _record_saved(self, sidecar: Sidecar, kv_st: Stamp, tokens: Sequence[int] | None,
                      gone_kv: str | None) -> None:
        """A save wrote ``sidecar`` and its KV file (whose stat is ``kv_st``; ``gone_kv`` removed):
        the index learns it from what the save knows, with a stat of the sidecar."""
        name = sidecar_name(sidecar.id)
        st = self._lstat(name)
        record = None if st is None else (name, SidecarRecord.read(st, sidecar))
        if self.index.note_save(sidecar.id, sidecar.model_sha256, record, sidecar.kv_file, kv_st, gone_kv,
                                tokens):
            assert tokens is not None
            self.token_lists.keep(sidecar.kv_file, kv_st, array(TYPECODE, tokens))  # a copy

    def note_sidecar(self, session_id: str, sidecar: Sidecar) -> None:
        """The index learns a sidecar just written (under the folder lock)."""
        name = sidecar_name(session_id)
        st = self._lstat(name)
        if st is not None:
            self.index.note_sidecar(session_id, name, SidecarRecord.read(st, sidecar))

    # -- housekeeping ---------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Remove what an interrupted save left behind; never touches unmanaged files."""
        removed = []
        with self.exclusive():
            files = self.refresh()
            # An unreadable sidecar (None) claims nothing known: its files are left alone.
            claims = self.index.kv_claims()
            for name in files:
                path = self.dir / name
                leftover = name.startswith(INCOMING_PREFIX) or (
                    name.startswith(".") and name.endswith(".tmp")
                )
                m = OWN_KV_RE.match(name) or OWN_TRANSCRIPT_RE.match(name)
                if m and m.group(1) in claims:
                    # a KV file or a transcript of a version its sidecar no longer names (its
                    # restore points are named too)
                    claim = claims[m.group(1)]
                    leftover = claim is not None and name not in claim
                elif m:
                    leftover = True  # a first save that died before its sidecar was written
                if leftover:
                    try:
                        unlink_quietly(path)  # a link itself, never its target
                    except OSError as exc:  # e.g. a directory of that name: one bad file stops nothing
                        log.warning("could not remove %s from the sessions folder: %s", name, exc)
                        continue
                    removed.append(name)
            self.index.note_files(dict.fromkeys(removed))
        if removed:
            log.info("removed leftovers of interrupted saves: %s", ", ".join(removed))
        self.states.collect()  # pieces nothing names any more (superseded versions, deleted sessions)
        return removed

    def update(self, session_id: str, change: Callable[[Sidecar], Sidecar]) -> Sidecar:
        validate_session_id(session_id)
        with self.exclusive():
            path = self.sidecar_path(session_id)
            if not path.exists():
                raise SessionNotFound(session_id)
            sc = change(load_sidecar(path))
            write_sidecar_atomic(path, sc)
            self.note_sidecar(session_id, sc)
            return sc

    def set_pinned(self, session_id: str, pinned: bool) -> Sidecar:
        validate_session_id(session_id)
        return self.update(session_id, lambda s: replace(s, pinned=pinned))

    def mark_corrupt(self, session_id: str, reason: str) -> None:
        validate_session_id(session_id)
        try:
            self.update(session_id,
                        lambda s: replace(s, corrupt={"at": format_utc(utc_now()), "reason": reason}))
        except (SidecarError, SessionNotFound):
            pass  # an unreadable sidecar already lists as corrupt

    def delete(self, session_id: str) -> None:
        validate_session_id(session_id)
        with self.exclusive():
            entry = self.get(session_id)
            # Only this session's own files: a sidecar copied under another id must not take
            # another session's conversation with it.
            sc = entry.sidecar
            kv_names = {sc.kv_file} if sc is not None and owns_kv_file(session_id, sc.kv_file) else set()
            kv_names |= {n for n in os.listdir(self.dir)
                         if (m := OWN_KV_RE.match(n) or OWN_TRANSCRIPT_RE.match(n))
                         and m.group(1) == session_id}
            # sidecar first: a half-deleted session is a leftover
            unlink_quietly(self.sidecar_path(session_id))
            fsync_dir(self.dir)
            fault_point("delete_after_sidecar")
            index = self.index
            index.forget(session_id)
            index.note_files({sidecar_name(session_id): None})
            for name in kv_names:  # the session is gone already: what will not go is a leftover
                self.token_lists.forget(name)
                if remove_superseded(self.dir / name):
                    index.note_files({name: None})
            fault_point("delete_after_files")
            self.points.drop_pieces(set(sc.pieces) if sc is not None else set())

    def transcript(self, entry: SessionEntry) -> Transcript | None:
        """The conversation a saved session holds, in words (None: saved without one);
        TranscriptError for a file that is not a transcript."""
        sc = entry.sidecar
        name = transcript_name(sc.kv_file) if sc is not None and owns_kv_file(entry.id, sc.kv_file) else None
        return None if name is None else Transcript.read_file(self.dir / name)

    def transcript_bytes(self, kv_file: str) -> bytes | None:
        """The transcript file of the version ``kv_file`` names, as it is (None: none that reads)."""
        chat = transcript_name(kv_file)
        if chat is None:
            return None
        try:
            with open_regular(self.dir / chat) as f:
                return f.read()
        except OSError:
            return None

    # -- integrity ------------------------------------------------------------------------
    def verify(self, session_id: str) -> SessionEntry:
        """Size and full content hash; a failure is recorded so the session shows as corrupt. Its
        restore points are hashed too; a damaged one is dropped."""
        entry = self.get(validate_session_id(session_id))
        if entry.sidecar is None or entry.kv_path is None:
            return entry
        damaged = [p.kv_file for p in entry.sidecar.points
                   if file_integrity(self.dir / p.kv_file, p.size_bytes, p.content_hash, None)[0]
                   or self.states.problems(p.kv_file)]
        if damaged:  # a damaged restore point is only a point less: the conversation is whole
            log.warning("restore points of %s damaged on disk, dropped: %s", session_id, ", ".join(damaged))
            self.points.drop(session_id, damaged)
            entry = self.get(session_id)
        problems = self.integrity_problems(entry)
        if not problems and entry.sidecar is not None:
            problems = self.states.problems(entry.sidecar.kv_file)
        if problems:
            try:
                self.mark_corrupt(session_id, problems[0])
            except FolderReadOnly:  # found, but it cannot be recorded: say so all the same
                return replace(entry, problems=list(dict.fromkeys(entry.problems + problems)))
            return self.get(session_id)
        return entry

    def integrity_problems(self, entry: SessionEntry, trust_stamp: bool = False) -> list[str]:
        """``file_checks.integrity_problems``; a full check that passes records the file's stamp."""
        problems, stamp = integrity_problems(entry, trust_stamp)
        if stamp is not None:
            assert entry.sidecar is not None
            self._remember_verified(entry.id, entry.sidecar.kv_file, stamp)
        return problems

    def _remember_verified(self, session_id: str, kv_file: str, stamp: FileStamp) -> None:
        """Record a verified stamp (best effort: without it the next restore hashes again)."""

        def change(s: Sidecar) -> Sidecar:
            return (replace(s, verified=stamp) if (s.kv_file, s.content_hash) == (kv_file, stamp.content_hash)
                    else s)

        try:
            self.update(session_id, change)
        # FolderBusy, FolderReadOnly
        except (SessionNotFound, SidecarError, InvalidSessionId, OSError) as exc:
            log.debug("not recording the verified stamp of %s: %s", session_id, exc)


def most_recent_first(entries: Iterable[SessionEntry]) -> list[SessionEntry]:
    saved = [(parse_utc(e.sidecar.last_used_at), e) for e in entries if e.sidecar is not None]
    return [e for _, e in sorted(saved, key=lambda pair: pair[0], reverse=True)]
