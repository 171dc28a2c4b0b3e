"""The sessions folder as files: list, read, update, delete, verify, sweep.

The store knows files, not HTTP: the save protocol (``saving``) and the restore checks
(``restoring``) build on it, and the engine does the talking to llama-server. Names are in
``naming``, the folder lock in ``folder_lock``.

A crash at any step of a save leaves the previous complete session (its sidecar still names the
old file) plus leftovers that ``sweep()`` removes at start: ``incoming-*`` files, and
``<id>.<gen>.kv`` files in our own naming that no sidecar claims. Any other file is *unmanaged*:
listed, never deleted automatically.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.fsutil import NotARegularFile, ensure_private_folder, file_kind, fsync_dir, regular_size
from slotkeeper.core.sessions import kvfile
from slotkeeper.core.sessions.entries import Listing, SessionEntry, UnmanagedFile
from slotkeeper.core.sessions.folder_lock import LOCK_TIMEOUT_SECONDS, FolderLock, FolderReadOnly
from slotkeeper.core.sessions.naming import (
    INCOMING_PREFIX,
    LOCK_NAME,
    OWN_KV_RE,
    SIDECAR_NAME_RE,
    InvalidSessionId,
    owns_kv_file,
    sidecar_name,
    validate_session_id,
)
from slotkeeper.core.sessions.sidecar import (
    Sidecar,
    SidecarError,
    format_utc,
    load_sidecar,
    parse_utc,
    utc_now,
    write_sidecar_atomic,
)
from slotkeeper.core.sessions.stamps import FileStamp, hash_with_stamp

log = logging.getLogger(__name__)

__all__ = ["InvalidSessionId", "SessionNotFound", "SessionStore", "most_recent_first"]


class SessionNotFound(KeyError):
    def __str__(self) -> str:
        return f"no saved session with id {self.args[0]!r}"


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class SessionStore:
    def __init__(self, directory: Path, lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.dir = Path(directory)
        self.ensure_folder()
        self.lock = FolderLock(self.dir / LOCK_NAME, lock_timeout)
        # Token lists by KV file name: a KV file is never rewritten under the same name, so the
        # list read once stays true while the file's size and mtime do.
        self._tokens: dict[str, tuple[int, int, list[int]]] = {}
        self._tokens_lock = threading.Lock()

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

    # -- reading --------------------------------------------------------------------------
    def sidecar_path(self, session_id: str) -> Path:
        """``<dir>/<id>.json``; raises InvalidSessionId for anything that is not an id."""
        return self.dir / sidecar_name(session_id)

    def _entry(self, sidecar_path: Path) -> SessionEntry:
        """One session as listed. Never raises for what is in the folder: a file that cannot be read
        safely (a symbolic link, a FIFO, JSON nested too deeply ...) is the entry's problem."""
        sid = sidecar_path.name[: -len(".json")]
        try:
            sc = load_sidecar(sidecar_path)
        except (SidecarError, OSError, ValueError, RecursionError) as exc:
            return SessionEntry(sid, None, None, [f"unreadable sidecar: {exc}"])
        kv = self.dir / sc.kv_file
        problems: list[str] = []
        if sc.id != sid:
            problems.append(f"sidecar {sidecar_path.name} claims id {sc.id}")
        if not owns_kv_file(sid, sc.kv_file):
            # A sidecar copied under another name: the file is another session's (or no one's).
            problems.append(f"its KV file {sc.kv_file} belongs to another session")
        if sc.corrupt:
            problems.append(f"damaged: {sc.corrupt['reason']}")
        size, kv_problem = kv_file_state(kv)
        if kv_problem:
            problems.append(kv_problem)
        elif size != sc.size_bytes and not sc.corrupt:
            problems.append(f"KV file is {size} bytes; {sc.size_bytes} were saved")
        return SessionEntry(sc.id if sc.id == sid else sid, sc, kv, problems, size)

    def listing(self) -> Listing:
        with self.exclusive(reading=True):
            names = sorted(os.listdir(self.dir)) if self.dir.exists() else []
            entries: list[SessionEntry] = []
            claimed: set[str] = set()
            for name in names:
                if SIDECAR_NAME_RE.match(name):
                    entry = self._entry(self.dir / name)
                    entries.append(entry)
                    claimed.add(name)
                    if entry.sidecar is not None:
                        claimed.add(entry.sidecar.kv_file)
            unmanaged = []
            for name in names:
                if name in claimed or name.startswith(".") or name.startswith(INCOMING_PREFIX):
                    continue
                try:
                    st = os.lstat(self.dir / name)  # never followed: a link is listed as a link
                except OSError:
                    continue
                kind = file_kind(st.st_mode)
                unmanaged.append(UnmanagedFile(name, st.st_size if kind == "file" else 0, kind))
        entries.sort(key=lambda e: e.sidecar.last_used_at if e.sidecar else "", reverse=True)
        return Listing(entries, unmanaged)

    def sessions(self) -> list[SessionEntry]:
        return self.listing().sessions

    def get(self, session_id: str) -> SessionEntry:
        path = self.sidecar_path(validate_session_id(session_id))
        if not os.path.lexists(path):
            raise SessionNotFound(session_id)
        return self._entry(path)

    def tokens(self, entry: SessionEntry) -> list[int]:
        """The token list at the front of the session's KV file (read once per file version)."""
        assert entry.kv_path is not None
        st = os.lstat(entry.kv_path)
        if not stat.S_ISREG(st.st_mode):
            regular_size(entry.kv_path)  # raises NotARegularFile, naming what it is
        name = entry.kv_path.name
        with self._tokens_lock:
            hit = self._tokens.get(name)
        if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
            return hit[2]
        tokens = kvfile.read_tokens(entry.kv_path).tokens
        with self._tokens_lock:
            self._tokens[name] = (st.st_size, st.st_mtime_ns, tokens)
        return tokens

    def forget_tokens(self, kv_file: str) -> None:
        with self._tokens_lock:
            self._tokens.pop(kv_file, None)

    # -- housekeeping ---------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Remove what an interrupted save left behind; never touches unmanaged files."""
        removed = []
        with self.exclusive():
            names = os.listdir(self.dir)
            claims: dict[str, str | None] = {}
            for name in names:
                m = SIDECAR_NAME_RE.match(name)
                if m:
                    try:
                        claims[m.group(1)] = load_sidecar(self.dir / name).kv_file
                    except (SidecarError, OSError, ValueError, RecursionError):
                        claims[m.group(1)] = None  # unreadable: leave its files alone
            for name in names:
                path = self.dir / name
                leftover = name.startswith(INCOMING_PREFIX) or (
                    name.startswith(".") and name.endswith(".tmp")
                )
                m = OWN_KV_RE.match(name)
                if m and m.group(1) in claims:
                    leftover = claims[m.group(1)] is not None and claims[m.group(1)] != name
                elif m:
                    leftover = True  # a first save that died before its sidecar was written
                if leftover:
                    try:
                        unlink_quietly(path)  # a link itself, never its target
                    except OSError as exc:  # e.g. a directory of that name: one bad file stops nothing
                        log.warning("could not remove %s from the sessions folder: %s", name, exc)
                        continue
                    removed.append(name)
        if removed:
            log.info("removed leftovers of interrupted saves: %s", ", ".join(removed))
        return removed

    def update(self, session_id: str, change: Callable[[Sidecar], Sidecar]) -> Sidecar:
        validate_session_id(session_id)
        with self.exclusive():
            path = self.sidecar_path(session_id)
            if not path.exists():
                raise SessionNotFound(session_id)
            sc = change(load_sidecar(path))
            write_sidecar_atomic(path, sc)
            return sc

    def set_pinned(self, session_id: str, pinned: bool) -> Sidecar:
        validate_session_id(session_id)
        return self.update(session_id, lambda s: replace(s, pinned=pinned))

    def mark_corrupt(self, session_id: str, reason: str) -> None:
        validate_session_id(session_id)
        try:
            self.update(session_id, lambda s: replace(s, corrupt={"at": format_utc(utc_now()), "reason": reason}))
        except (SidecarError, SessionNotFound):
            pass  # an unreadable sidecar already lists as corrupt

    def delete(self, session_id: str) -> None:
        validate_session_id(session_id)
        with self.exclusive():
            entry = self.get(session_id)
            # Only this session's own files: a sidecar copied under another id must not take
            # another session's conversation with it.
            kv_names = {entry.sidecar.kv_file} if entry.sidecar and owns_kv_file(session_id, entry.sidecar.kv_file) else set()
            kv_names |= {n for n in os.listdir(self.dir) if (m := OWN_KV_RE.match(n)) and m.group(1) == session_id}
            unlink_quietly(self.sidecar_path(session_id))  # sidecar first: a half-deleted session is a leftover
            fsync_dir(self.dir)
            for name in kv_names:
                unlink_quietly(self.dir / name)
                self.forget_tokens(name)

    # -- integrity ------------------------------------------------------------------------
    def verify(self, session_id: str) -> SessionEntry:
        """Size and full content hash; a failure is recorded so the session shows as corrupt."""
        entry = self.get(validate_session_id(session_id))
        if entry.sidecar is None or entry.kv_path is None:
            return entry
        problems = self.integrity_problems(entry)
        if problems:
            try:
                self.mark_corrupt(session_id, problems[0])
            except FolderReadOnly:  # found, but it cannot be recorded: say so all the same
                return replace(entry, problems=list(dict.fromkeys(entry.problems + problems)))
            return self.get(session_id)
        return entry

    def integrity_problems(self, entry: SessionEntry, trust_stamp: bool = False) -> list[str]:
        """Size, then the whole file's content hash. With ``trust_stamp`` the hash is skipped while
        the file still has the stamp recorded when its content last matched (``stamps``: same size,
        mtime, inode and ctime). A full check that passes records the file's stamp."""
        sc = entry.sidecar
        assert sc is not None and entry.kv_path is not None
        if sc.corrupt:
            return [f"damaged: {sc.corrupt['reason']}"]
        size, kv_problem = kv_file_state(entry.kv_path)
        if kv_problem:
            return [kv_problem]
        if size != sc.size_bytes:
            return [f"KV file is {size} bytes; {sc.size_bytes} were saved (cut short or appended to)"]
        if trust_stamp and sc.verified is not None:
            try:
                st = os.lstat(entry.kv_path)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and sc.verified.matches(st, sc.content_hash):
                return []
        try:
            content_hash, st = hash_with_stamp(entry.kv_path)
        except NotARegularFile as exc:  # replaced since the lstat
            return [f"KV file {exc}"]
        if content_hash != sc.content_hash:
            return ["KV file content does not match its hash (damaged on disk)"]
        if st is not None and (sc.verified is None or not sc.verified.matches(st, content_hash)):
            self._remember_verified(entry.id, sc.kv_file, FileStamp.of(st, content_hash))
        return []

    def _remember_verified(self, session_id: str, kv_file: str, stamp: FileStamp) -> None:
        """Record a verified stamp (best effort: without it the next restore hashes again)."""

        def change(s: Sidecar) -> Sidecar:
            return replace(s, verified=stamp) if (s.kv_file, s.content_hash) == (kv_file, stamp.content_hash) else s

        try:
            self.update(session_id, change)
        except (SessionNotFound, SidecarError, InvalidSessionId, OSError) as exc:  # FolderBusy, FolderReadOnly
            log.debug("not recording the verified stamp of %s: %s", session_id, exc)


def kv_file_state(path: Path) -> tuple[int, str | None]:
    """(size on disk, problem) of a session's KV file, by lstat: a symbolic link, a FIFO or any other
    non-regular file is a problem and is never followed or opened; a missing file is 0 bytes."""
    try:
        return regular_size(path), None
    except FileNotFoundError:
        return 0, f"KV file {path.name} is missing"
    except NotARegularFile as exc:
        return 0, f"KV file {exc}"
    except OSError as exc:
        return 0, f"KV file {path.name} cannot be read: {exc}"


def most_recent_first(entries: Iterable[SessionEntry]) -> list[SessionEntry]:
    return sorted(
        (e for e in entries if e.sidecar is not None),
        key=lambda e: parse_utc(e.sidecar.last_used_at),
        reverse=True,
    )
