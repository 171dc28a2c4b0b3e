"""The sessions folder: list, read, save (safely), verify, restore-check, delete.

Layout of ``<data dir>/sessions/`` (0700):
- ``<id>.json``            the sidecar (written last, atomically)
- ``<id>.<gen>.kv``        the KV file llama-server wrote; ``gen`` changes on every save, so a
                           new version never overwrites the old one before its sidecar exists
- ``incoming-<rand>.kv``   a save in progress (llama-server writes files in place, not atomically)

Safe save: the server writes ``incoming-*``; we check ``n_written`` against the size, read the
token list, hash and fsync the file, rename it to ``<id>.<gen>.kv``, write the sidecar, and only
then remove the previous version. A crash at any step leaves the previous complete session (its
sidecar still names the old file) plus leftovers that ``sweep()`` removes at start: ``incoming-*``
files, and ``<id>.<gen>.kv`` files in our own naming that no sidecar claims while ``<id>.json`` is
absent or names another file. Any other file is *unmanaged*: listed, never deleted automatically.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slotkeeper.core.client import LlamaClient, RestoreResult, ServerError
from slotkeeper.core.fsutil import fsync_dir, fsync_file
from slotkeeper.core.sessions import kvfile, lineage
from slotkeeper.core.sessions.sidecar import (
    RestoreRecord,
    ServerFacts,
    Sidecar,
    SidecarError,
    check_compatible,
    content_hash_file,
    format_utc,
    load_sidecar,
    new_session_id,
    parse_utc,
    tokens_digest,
    utc_now,
    write_sidecar_atomic,
)
from slotkeeper.core.sessions.titles import title_and_preview
from slotkeeper.core.units import human_bytes

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".json"
KV_SUFFIX = ".kv"
INCOMING_PREFIX = "incoming-"
_OWN_KV_RE = re.compile(r"^([0-9a-f]{12})\.([0-9a-f]{8})\.kv$")
_SIDECAR_NAME_RE = re.compile(r"^([A-Za-z0-9_-]{1,64})\.json$")
# Test-only fault injection: SLOTKEEPER_FAULT=<step> ends the process at that step of a save,
# as a power cut or kill -9 would, so the crash-safety tests exercise the real code path.
FAULT_ENV = "SLOTKEEPER_FAULT"
LOW_DISK_BYTES = 256 * 1024 * 1024
LOCK_NAME = ".lock"  # hidden: never listed as an unmanaged file  # below this, a failed save is explained as a full disk


def _fault_point(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault injection: dying at %s", step)
        os._exit(86)


class SessionNotFound(KeyError):
    def __str__(self) -> str:
        return f"no saved session with id {self.args[0]!r}"


class SaveError(Exception):
    """A save that did not produce a complete file; the previous version is untouched."""


class RestoreRefused(Exception):
    """A session that must not reach the server; ``reasons`` say why, in plain words."""

    def __init__(self, session_id: str, reasons: Sequence[str]) -> None:
        super().__init__(f"session {session_id} not restored: " + "; ".join(reasons))
        self.session_id = session_id
        self.reasons = list(reasons)


@dataclass
class SessionEntry:
    """A sidecar as listed: with the problems a cheap look (or a verify) found."""

    id: str
    sidecar: Sidecar | None  # None when the sidecar itself cannot be read
    kv_path: Path | None
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "corrupt" if self.problems else "ok"

    @property
    def size_bytes(self) -> int:
        if self.sidecar is not None:
            return self.sidecar.size_bytes
        try:
            return self.kv_path.stat().st_size if self.kv_path else 0
        except OSError:
            return 0

    def to_json(self) -> dict[str, Any]:
        """The stable shape of `sessions list --json` (users' scripts rely on these names)."""
        s = self.sidecar
        if s is None:
            base: dict[str, Any] = {k: None for k in _LIST_KEYS}
            base.update(id=self.id, size_bytes=self.size_bytes, pinned=False)
        else:
            base = {
                "id": s.id, "title": s.title, "preview": s.preview, "model_path": s.model_path,
                "model_sha256": s.model_sha256, "arch": s.arch, "swa": s.swa,
                "swa_full": s.swa_full, "flash_attn": s.flash_attn,
                "cache_type_k": s.cache_type_k, "cache_type_v": s.cache_type_v,
                "n_parallel": s.n_parallel, "kv_unified": s.kv_unified,
                "n_ctx_slot": s.n_ctx_slot, "n_tokens": s.n_tokens, "size_bytes": s.size_bytes,
                "content_hash": s.content_hash, "llama_build": s.llama_build,
                "created_at": s.created_at, "last_used_at": s.last_used_at, "pinned": s.pinned,
                "parent": s.parent, "kv_file": s.kv_file,
                "last_restore": s.last_restore.to_json() if s.last_restore else None,
            }  # fmt: skip
        base["status"] = self.status
        base["problems"] = list(self.problems)
        return base


_LIST_KEYS = (
    "id", "title", "preview", "model_path", "model_sha256", "arch", "swa", "swa_full",
    "flash_attn", "cache_type_k", "cache_type_v", "n_parallel", "kv_unified", "n_ctx_slot",
    "n_tokens", "size_bytes", "content_hash", "llama_build", "created_at", "last_used_at",
    "pinned", "parent", "kv_file", "last_restore",
)  # fmt: skip


@dataclass(frozen=True)
class UnmanagedFile:
    name: str
    size_bytes: int


@dataclass
class Listing:
    sessions: list[SessionEntry]
    unmanaged: list[UnmanagedFile]

    @property
    def total_bytes(self) -> int:
        return sum(e.size_bytes for e in self.sessions) + self.unmanaged_bytes

    @property
    def unmanaged_bytes(self) -> int:
        return sum(u.size_bytes for u in self.unmanaged)


@dataclass(frozen=True)
class SaveContext:
    """What a save needs to know about the running server, beyond the slot itself."""

    facts: ServerFacts
    arch: str
    llama_build: str


@dataclass
class SaveOutcome:
    kind: str  # "new", "update", "fork", "unchanged", "empty"
    sidecar: Sidecar | None
    n_tokens: int = 0
    save_ms: float = 0.0
    removed: str | None = None


def _lock_file(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.name == "nt":
            import msvcrt

            while True:
                try:
                    msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for ~10 s, then raises
                    break
                except OSError:
                    continue
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)  # per open file: excludes other processes and fds
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlock_file(fd: int) -> None:
    try:
        if os.name == "nt":
            import msvcrt

            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class SessionStore:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.RLock()
        self._depth = 0
        self._lock_fd: int | None = None

    @contextmanager
    def _exclusive(self):
        """Exclusive use of the folder: across threads (RLock) and across processes (a file lock),
        so `slotkeeper sessions pin` cannot write back a sidecar the app is replacing. Re-entrant:
        only the outermost level takes the file lock."""
        with self._lock:
            self._depth += 1
            try:
                if self._depth == 1:
                    self._lock_fd = _lock_file(self.dir / LOCK_NAME)
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_fd is not None:
                    _unlock_file(self._lock_fd)
                    self._lock_fd = None

    # -- reading --------------------------------------------------------------------------
    def sidecar_path(self, session_id: str) -> Path:
        return self.dir / f"{session_id}{SIDECAR_SUFFIX}"

    def _entry(self, sidecar_path: Path) -> SessionEntry:
        sid = sidecar_path.name[: -len(SIDECAR_SUFFIX)]
        try:
            sc = load_sidecar(sidecar_path)
        except (SidecarError, OSError) as exc:
            return SessionEntry(sid, None, None, [f"unreadable sidecar: {exc}"])
        kv = self.dir / sc.kv_file
        problems: list[str] = []
        if sc.id != sid:
            problems.append(f"sidecar {sidecar_path.name} claims id {sc.id}")
        if sc.corrupt:
            problems.append(f"damaged: {sc.corrupt['reason']}")
        try:
            size = kv.stat().st_size
        except FileNotFoundError:
            problems.append(f"KV file {sc.kv_file} is missing")
        else:
            if size != sc.size_bytes and not sc.corrupt:
                problems.append(f"KV file is {size} bytes; {sc.size_bytes} were saved")
        return SessionEntry(sc.id if sc.id == sid else sid, sc, kv, problems)

    def listing(self) -> Listing:
        with self._exclusive():
            names = sorted(os.listdir(self.dir)) if self.dir.exists() else []
            entries: list[SessionEntry] = []
            claimed: set[str] = set()
            for name in names:
                if _SIDECAR_NAME_RE.match(name):
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
                    unmanaged.append(UnmanagedFile(name, (self.dir / name).stat().st_size))
                except OSError:
                    continue
        entries.sort(key=lambda e: e.sidecar.last_used_at if e.sidecar else "", reverse=True)
        return Listing(entries, unmanaged)

    def sessions(self) -> list[SessionEntry]:
        return self.listing().sessions

    def get(self, session_id: str) -> SessionEntry:
        path = self.sidecar_path(session_id)
        if not _SIDECAR_NAME_RE.match(path.name) or not path.exists():
            raise SessionNotFound(session_id)
        return self._entry(path)

    def tokens(self, entry: SessionEntry) -> list[int]:
        assert entry.kv_path is not None
        return kvfile.read_tokens(entry.kv_path).tokens

    # -- housekeeping ---------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Remove what an interrupted save left behind; never touches unmanaged files."""
        removed = []
        with self._exclusive():
            names = os.listdir(self.dir)
            claims: dict[str, str | None] = {}
            for name in names:
                m = _SIDECAR_NAME_RE.match(name)
                if m:
                    try:
                        claims[m.group(1)] = load_sidecar(self.dir / name).kv_file
                    except (SidecarError, OSError):
                        claims[m.group(1)] = None  # unreadable: leave its files alone
            for name in names:
                path = self.dir / name
                leftover = name.startswith(INCOMING_PREFIX) or (
                    name.startswith(".") and name.endswith(".tmp")
                )
                m = _OWN_KV_RE.match(name)
                if m and m.group(1) in claims:
                    leftover = claims[m.group(1)] is not None and claims[m.group(1)] != name
                elif m:
                    leftover = True  # a first save that died before its sidecar was written
                if leftover:
                    _unlink(path)
                    removed.append(name)
        if removed:
            log.info("removed leftovers of interrupted saves: %s", ", ".join(removed))
        return removed

    def update(self, session_id: str, change: Callable[[Sidecar], Sidecar]) -> Sidecar:
        with self._exclusive():
            path = self.sidecar_path(session_id)
            if not path.exists():
                raise SessionNotFound(session_id)
            sc = change(load_sidecar(path))
            write_sidecar_atomic(path, sc)
            return sc

    def set_pinned(self, session_id: str, pinned: bool) -> Sidecar:
        return self.update(session_id, lambda s: replace(s, pinned=pinned))

    def mark_corrupt(self, session_id: str, reason: str) -> None:
        try:
            self.update(session_id, lambda s: replace(s, corrupt={"at": format_utc(utc_now()), "reason": reason}))
        except (SidecarError, SessionNotFound):
            pass  # an unreadable sidecar already lists as corrupt

    def delete(self, session_id: str) -> None:
        with self._exclusive():
            entry = self.get(session_id)
            kv_names = {entry.sidecar.kv_file} if entry.sidecar else set()
            kv_names |= {n for n in os.listdir(self.dir) if (m := _OWN_KV_RE.match(n)) and m.group(1) == session_id}
            _unlink(self.sidecar_path(session_id))  # sidecar first: a half-deleted session is a leftover, not a session
            fsync_dir(self.dir)
            for name in kv_names:
                _unlink(self.dir / name)

    def verify(self, session_id: str) -> SessionEntry:
        """Size and full content hash; a failure is recorded so the session shows as corrupt."""
        entry = self.get(session_id)
        if entry.sidecar is None or entry.kv_path is None:
            return entry
        problems = self._integrity_problems(entry)
        if problems:
            self.mark_corrupt(session_id, problems[0])
            return self.get(session_id)
        return entry

    def _integrity_problems(self, entry: SessionEntry) -> list[str]:
        sc = entry.sidecar
        assert sc is not None and entry.kv_path is not None
        if sc.corrupt:
            return [f"damaged: {sc.corrupt['reason']}"]
        try:
            size = entry.kv_path.stat().st_size
        except FileNotFoundError:
            return [f"KV file {sc.kv_file} is missing"]
        if size != sc.size_bytes:
            return [f"KV file is {size} bytes; {sc.size_bytes} were saved (cut short or appended to)"]
        if content_hash_file(entry.kv_path) != sc.content_hash:
            return ["KV file content does not match its hash (damaged on disk)"]
        return []

    # -- the safe save protocol -----------------------------------------------------------
    def save_slot(
        self,
        client: LlamaClient,
        slot: int,
        ctx: SaveContext,
        current_id: str | None = None,
    ) -> SaveOutcome:
        incoming = f"{INCOMING_PREFIX}{secrets.token_hex(8)}{KV_SUFFIX}"
        path = self.dir / incoming
        try:
            try:
                result = client.save_slot(slot, incoming)
            except ServerError as exc:
                raise SaveError(f"llama-server could not save slot {slot}: {exc.message}{self._space_hint()}") from exc
            _fault_point("after_server_write")
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = -1
            if result.n_written <= 0 or size != result.n_written:
                raise SaveError(
                    f"llama-server wrote {max(result.n_written, 0)} bytes for slot {slot} but the file "
                    f"has {max(size, 0)}; the previous save is kept{self._space_hint()}"
                )
            header = kvfile.read_tokens(path)
            if header.n_tokens == 0:
                return SaveOutcome("empty", None)
            content_hash = content_hash_file(path)
            fsync_file(path)
            _fault_point("after_hash")
            with self._exclusive():
                return self._commit(client, path, header.tokens, size, content_hash, result.save_ms, ctx, current_id)
        except (kvfile.KvFileError, OSError) as exc:
            raise SaveError(f"saving slot {slot} failed: {exc}") from exc
        finally:
            _unlink(path)

    def _space_hint(self) -> str:
        try:
            free = shutil.disk_usage(self.dir).free
        except OSError:
            return ""
        if free < LOW_DISK_BYTES:
            return f". The disk is full: only {human_bytes(free)} free in {self.dir}"
        return ". The server log may say more"

    def _candidates(self, model_sha256: str, prefer: str | None) -> list[tuple[SessionEntry, list[int]]]:
        out = []
        for entry in self.sessions():  # most recently used first
            sc = entry.sidecar
            # A session marked corrupt is still a candidate when its token list reads: a good
            # save of the same conversation then replaces it (and clears the mark).
            if sc is None or sc.model_sha256 != model_sha256:
                continue
            try:
                out.append((entry, self.tokens(entry)))
            except (kvfile.KvFileError, OSError):
                continue
        out.sort(key=lambda item: item[0].id != prefer)  # the slot's own session first
        return out

    def _commit(
        self,
        client: LlamaClient,
        incoming: Path,
        tokens: list[int],
        size: int,
        content_hash: str,
        save_ms: float,
        ctx: SaveContext,
        current_id: str | None,
    ) -> SaveOutcome:
        facts = ctx.facts
        digest = tokens_digest(tokens)
        candidates = self._candidates(facts.model_sha256, current_id)
        match = lineage.classify(tokens, [(e.id, t) for e, t in candidates])
        by_id = {e.id: e for e, _ in candidates}
        previous = by_id.get(match.session_id) if match.session_id else None
        now = format_utc(utc_now())
        if match.kind == "update" and previous and not previous.problems and previous.sidecar.tokens_digest == digest:
            self.update(previous.id, lambda s: replace(s, last_used_at=now))
            return SaveOutcome("unchanged", previous.sidecar, len(tokens), save_ms)
        kind = match.kind
        if kind == "update" and previous and previous.sidecar.pinned and not previous.problems:
            kind = "fork"  # a pinned session is a snapshot: its continuation becomes a child
        title, preview = self._describe(client, tokens)
        if kind == "update" and previous:
            sc0 = previous.sidecar
            sid, created, pinned, parent = previous.id, sc0.created_at, sc0.pinned, sc0.parent
        else:
            sid, created, pinned = new_session_id(), now, False
            parent = previous.id if (kind == "fork" and previous) else None
        final_name = f"{sid}.{secrets.token_hex(4)}{KV_SUFFIX}"
        os.replace(incoming, self.dir / final_name)
        fsync_dir(self.dir)
        _fault_point("after_rename")
        sidecar = Sidecar(
            id=sid, kv_file=final_name, title=title, preview=preview,
            model_path=facts.model_path, model_sha256=facts.model_sha256, arch=ctx.arch,
            swa=facts.swa, swa_full=facts.swa_full, flash_attn=facts.flash_attn,
            cache_type_k=facts.cache_type_k, cache_type_v=facts.cache_type_v,
            n_parallel=facts.n_parallel, kv_unified=facts.kv_unified, n_ctx_slot=facts.n_ctx_slot,
            n_tokens=len(tokens), tokens_digest=digest, size_bytes=size, content_hash=content_hash,
            llama_build=ctx.llama_build, created_at=created, last_used_at=now, pinned=pinned,
            parent=parent, kv_args=list(facts.kv_args),
            last_restore=previous.sidecar.last_restore if (kind == "update" and previous) else None,
        )  # fmt: skip
        write_sidecar_atomic(self.sidecar_path(sid), sidecar)
        _fault_point("after_sidecar")
        removed = None
        if kind == "update" and previous and previous.sidecar.kv_file != final_name:
            removed = previous.sidecar.kv_file
            _unlink(self.dir / removed)
        return SaveOutcome(kind, sidecar, len(tokens), save_ms, removed)

    @staticmethod
    def _describe(client: LlamaClient, tokens: list[int]) -> tuple[str, str]:
        try:
            text = client.detokenize(tokens)
        except Exception as exc:  # a title is nice to have; the save must not fail for it
            log.warning("could not detokenize for a title: %s", exc)
            return f"Conversation of {len(tokens)} tokens", ""
        return title_and_preview(text)

    # -- restoring ------------------------------------------------------------------------
    def check_restorable(self, session_id: str, facts: ServerFacts) -> SessionEntry:
        """Compatibility and full integrity; raises RestoreRefused (nothing reaches the server)."""
        entry = self.get(session_id)
        if entry.sidecar is None:
            raise RestoreRefused(session_id, entry.problems)
        reasons = check_compatible(entry.sidecar, facts)
        if reasons:
            raise RestoreRefused(session_id, reasons)
        problems = self._integrity_problems(entry)
        if problems:
            self.mark_corrupt(session_id, problems[0])
            raise RestoreRefused(session_id, problems)
        return entry

    def restore_into(
        self, client: LlamaClient, slot: int, session_id: str, facts: ServerFacts
    ) -> tuple[RestoreResult, Sidecar]:
        """Checks, restores, records; returns the server's result and the updated sidecar."""
        entry = self.check_restorable(session_id, facts)
        assert entry.sidecar is not None
        try:
            result = client.restore_slot(slot, entry.sidecar.kv_file)
        except ServerError as exc:
            raise RestoreRefused(session_id, [f"llama-server refused it: {exc.message}"]) from exc
        now = format_utc(utc_now())
        record = RestoreRecord(at=now, slot=slot, n_restored=result.n_restored)
        sidecar = self.update(session_id, lambda s: replace(s, last_used_at=now, last_restore=record))
        return result, sidecar

    def record_reuse(self, session_id: str, cache_n: int, prompt_n: int, effective: bool, reason: str | None) -> None:
        def change(s: Sidecar) -> Sidecar:
            if s.last_restore is None:
                return s
            rec = replace(s.last_restore, cache_n=cache_n, prompt_n=prompt_n, effective=effective, reason=reason)
            return replace(s, last_restore=rec)

        try:
            self.update(session_id, change)
        except (SessionNotFound, SidecarError):
            pass

    def touch(self, session_id: str) -> None:
        now = format_utc(utc_now())
        self.update(session_id, lambda s: replace(s, last_used_at=now))


def most_recent_first(entries: Iterable[SessionEntry]) -> list[SessionEntry]:
    return sorted(
        (e for e in entries if e.sidecar is not None),
        key=lambda e: parse_utc(e.sidecar.last_used_at),
        reverse=True,
    )
