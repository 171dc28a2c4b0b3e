"""The sessions index: what the sessions folder holds, so nothing has to read every file again.

One index serves every question asked of the saved sessions:

- listing (``SessionStore.listing``, `sessions list`, the sessions page): each sidecar as it was
  last read, keyed on its file's lstat (type, size, mtime, inode, ctime). A listing looks at every
  entry of the folder with lstat (sizes always come from the file system) and reads again only
  the sidecars whose stat changed, were added, or are too recent to trust (a write within the same
  clock tick as the read keeps the stat). Sessions gone from the folder are dropped.
- routing (the front desk): which saved session shares the longest prefix with a prompt. Each
  session's tokens are cut into blocks of ``BLOCK`` tokens and each block gets a hash chained on
  the ones before it, so a chain hash names a whole prefix; a lookup walks the prompt's chain and
  stops at the first hash no session has: its cost depends on the prompt, not on how many
  sessions there are.
- lineage on save (``lineage_candidates``): which few sessions a slot's tokens can continue or
  fork, from the block hashes, the hash of each session's first ``HEAD_TOKENS`` tokens (what a
  fork must share at least) and of all but its last ``TAIL_SLACK`` tokens (what an update must
  share); only those few have their token lists read and compared exactly.

The token part of a session is keyed on its KV file's name, size and mtime. The index lives in
memory in the running engine (inside its ``SessionStore``) and is kept on disk (``save``/``load``,
0600 in the cache folder) so the next process (the CLI, the next launch) reads only what changed.
The file is a cache: a damaged, missing or foreign one is rebuilt from the folder.
"""

from __future__ import annotations

import base64
import heapq
import logging
import stat
import sys
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import xxhash

from slotkeeper.core.sessions.entries import row_base
from slotkeeper.core.sessions.lineage import DEFAULT_MIN_FORK_PREFIX, DEFAULT_TAIL_SLACK
from slotkeeper.core.sessions.naming import KV_SUFFIX, MANIFEST_SUFFIX, transcript_name
from slotkeeper.core.sessions.rows import RACY_NS, Stamp
from slotkeeper.core.sessions.sidecar import Sidecar

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per block: prefixes are found to the block, then measured exactly
HEAD_TOKENS = DEFAULT_MIN_FORK_PREFIX  # lineage: the least a fork shares with its parent
TAIL_SLACK = DEFAULT_TAIL_SLACK  # lineage: an update may leave a session this many tokens before its end
INDEX_VERSION = 5  # 4: restore points among the facts (their files are claimed); 5: the pieces used
_BIG_ENDIAN = sys.byteorder == "big"


def _le_bytes(values: Sequence[int], code: str) -> bytes:
    arr = array(code, values)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """The token ids as little-endian i32 (what every hash here is computed over)."""
    return _le_bytes(tokens if isinstance(tokens, (list, tuple, array)) else [int(t) for t in tokens], "i")


assert array("i").itemsize == 4 and array("Q").itemsize == 8


@dataclass(frozen=True)
class IndexedSession:
    id: str
    model_sha256: str
    kv_file: str
    size: int
    mtime_ns: int
    n_tokens: int
    hashes: tuple[int, ...]  # one chain hash per whole block
    head: int = 0  # hash of the first min(n_tokens, HEAD_TOKENS) tokens
    anchor: int = 0  # chained hash of all but the last TAIL_SLACK tokens
    tail: tuple[int, ...] = ()  # those last tokens: an update's shared length, exactly


@dataclass(frozen=True)
class PrefixHit:
    session_id: str
    n_blocks: int  # whole blocks shared with the prompt

    @property
    def at_most(self) -> int:
        """The most tokens it can share: the next block differs."""
        return (self.n_blocks + 1) * BLOCK - 1

    @property
    def n_tokens(self) -> int:
        return self.n_blocks * BLOCK


def _chain(raw: bytes) -> list[int]:
    out: list[int] = []
    h = 0
    step = BLOCK * 4
    view = memoryview(raw)
    for i in range(len(raw) // step):
        h = xxhash.xxh3_64_intdigest(view[i * step:(i + 1) * step], seed=h)
        out.append(h)
    return out


def chain_hashes(tokens: Sequence[int]) -> list[int]:
    """The chain hash of every whole block of ``tokens``."""
    return _chain(token_bytes(tokens))


def _partial(raw: bytes, hashes: Sequence[int], n: int) -> int:
    """The hash of the first ``n`` tokens, chained on the whole blocks before them."""
    d = n // BLOCK
    return xxhash.xxh3_64_intdigest(memoryview(raw)[d * BLOCK * 4:n * 4], seed=hashes[d - 1] if d else 0)


def _head_len(n_tokens: int) -> int:
    return min(n_tokens, HEAD_TOKENS)


def _anchor_len(n_tokens: int) -> int:
    return max(n_tokens - TAIL_SLACK, 0)


def recency_key(last_used_at: str) -> tuple[str, float]:
    """A sort key equal in order to ``parse_utc`` of a sidecar timestamp, without strptime:
    the fixed-width seconds as text, then the fraction ("...:00Z" before "...:00.5Z")."""
    body = last_used_at[:-1] if last_used_at.endswith("Z") else last_used_at
    secs, _, frac = body.partition(".")
    try:
        return secs, float("0." + frac) if frac else 0.0
    except ValueError:
        return secs, 0.0


class TokenIndex:
    """Saved sessions by their token blocks (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._sessions: dict[str, IndexedSession] = {}
        self._by_hash: dict[int, set[str]] = {}
        self._by_head: dict[tuple[int, int], set[str]] = {}
        self._by_anchor: dict[tuple[int, int], set[str]] = {}
        self._anchor_lens: dict[int, int] = {}  # anchor length -> how many sessions have it
        self.dirty = False  # changed since it was loaded or saved

    def _tokens_ready(self) -> None:
        """Decode token parts kept aside (``SessionsIndex``); every reader of them calls this first."""

    def __len__(self) -> int:
        self._tokens_ready()
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        self._tokens_ready()
        return session_id in self._sessions

    def get(self, session_id: str) -> IndexedSession | None:
        self._tokens_ready()
        return self._sessions.get(session_id)

    def put(self, entry: IndexedSession) -> None:
        self._tokens_ready()
        with self.lock:
            self.remove(entry.id)
            self._sessions[entry.id] = entry
            for h in entry.hashes:
                self._by_hash.setdefault(h, set()).add(entry.id)
            self._by_head.setdefault((_head_len(entry.n_tokens), entry.head), set()).add(entry.id)
            a = _anchor_len(entry.n_tokens)
            self._by_anchor.setdefault((a, entry.anchor), set()).add(entry.id)
            self._anchor_lens[a] = self._anchor_lens.get(a, 0) + 1
            self.dirty = True

    def add_tokens(self, session_id: str, model_sha256: str, kv_file: str, size: int, mtime_ns: int,
                   tokens: Sequence[int]) -> IndexedSession:
        raw = token_bytes(tokens)
        n = len(raw) // 4
        hashes = _chain(raw)
        a = _anchor_len(n)
        entry = IndexedSession(session_id, model_sha256, kv_file, size, mtime_ns, n, tuple(hashes),
                               xxhash.xxh3_64_intdigest(memoryview(raw)[:_head_len(n) * 4]),
                               _partial(raw, hashes, a), tuple(int(t) for t in tokens[a:n]))
        self.put(entry)
        return entry

    def remove(self, session_id: str) -> None:
        self._tokens_ready()
        with self.lock:
            old = self._sessions.pop(session_id, None)
            if old is None:
                return
            self.dirty = True
            for h in old.hashes:
                ids = self._by_hash.get(h)
                if ids is not None:
                    ids.discard(session_id)
                    if not ids:
                        del self._by_hash[h]
            for table, key in ((self._by_head, (_head_len(old.n_tokens), old.head)),
                               (self._by_anchor, (_anchor_len(old.n_tokens), old.anchor))):
                ids = table.get(key)
                if ids is not None:
                    ids.discard(session_id)
                    if not ids:
                        del table[key]
            a = _anchor_len(old.n_tokens)
            self._anchor_lens[a] -= 1
            if not self._anchor_lens[a]:
                del self._anchor_lens[a]

    def longest_prefix(self, tokens: Sequence[int], model_sha256: str, limit: int = 4) -> list[PrefixHit]:
        """Sessions of this model sharing the most whole blocks with ``tokens`` (best first)."""
        self._tokens_ready()
        best: list[PrefixHit] = []
        with self.lock:
            for depth, h in enumerate(chain_hashes(tokens), start=1):
                ids = [i for i in self._by_hash.get(h, ()) if self._sessions[i].model_sha256 == model_sha256]
                if not ids:
                    break
                best = [PrefixHit(i, depth) for i in sorted(ids)]
        return best[:limit]

    def lineage_candidates(self, tokens: Sequence[int], model_sha256: str, prefer: str | None = None,
                           n_prompt: int | None = None, limit: int = 8,
                           order: Callable[[str], Any] | None = None) -> list[str]:
        """The few sessions of this model whose token lists lineage must compare with ``tokens``,
        found by hash lookups whose number does not grow with the number of sessions.

        - Updates: a session lineage can update agrees with ``tokens`` up to its last TAIL_SLACK
          tokens; its anchor (the chained hash of those) is looked up for every session length
          the index holds, and its kept tail says exactly how many tokens it shares.
        - Contained and forks: the more whole blocks a session shares, the more tokens; the
          sessions of the deepest block the prompt's chain reaches come first, then shallower
          ones, then (sharing no whole block) those sharing their first min(n, HEAD_TOKENS).
        Each group by the most tokens it can share; ties by ``order`` (most recently used first,
        the caller's key), the slot's own session (``prefer``) always among them. Returned in
        that order: ``prefer``, then ``order``.
        """
        self._tokens_ready()
        raw = token_bytes(tokens)
        n_new = len(raw) // 4
        if n_new == 0:
            return []
        chain = _chain(raw)
        contained_at = None if n_prompt is None else min(n_prompt, n_new)
        order = order or (lambda sid: sid)

        def key(sid: str) -> tuple[bool, Any, str]:
            return (sid != prefer, order(sid), sid)

        with self.lock:
            updates: list[tuple[int, tuple, str]] = []
            for a in self._anchor_lens:
                if a > n_new:
                    continue
                for sid in self._by_anchor.get((a, _partial(raw, chain, a)), ()):
                    s = self._sessions[sid]
                    if s.model_sha256 != model_sha256:
                        continue
                    n = 0
                    while n < len(s.tail) and a + n < n_new and s.tail[n] == tokens[a + n]:
                        n += 1
                    updates.append((-(a + n), key(sid), sid))
            seen = {u[2] for u in updates}
            others: list[tuple[bool, int, bool, Any, str]] = []
            depth = 0
            while depth < len(chain) and chain[depth] in self._by_hash:
                depth += 1
            levels = [self._by_hash[chain[d - 1]] for d in range(depth, 0, -1)]
            if len(levels) < 2:  # sharing no whole block (or one): by the head too
                head: set[str] = set()
                view = memoryview(raw)
                for k in range(1, _head_len(n_new) + 1):
                    head |= self._by_head.get((k, xxhash.xxh3_64_intdigest(view[:k * 4])), set())
                levels.append(head)
            sessions = self._sessions
            for d, ids in zip(range(depth, -1, -1), levels):
                # Every session here shares d whole blocks (a deeper one was seen before).
                most_here = d * BLOCK + BLOCK - 1
                for sid in ids:
                    if sid in seen:
                        continue
                    seen.add(sid)
                    s = sessions[sid]
                    if s.model_sha256 != model_sha256:
                        continue
                    most = min(s.n_tokens, n_new, most_here)
                    contained = (contained_at is not None and most >= contained_at
                                 and s.n_tokens > contained_at)
                    others.append((not contained, -most, sid != prefer, order(sid), sid))
                if len(others) >= limit:
                    break
            chosen = {c[-1] for c in heapq.nsmallest(max(limit // 2, 1), updates)}
            chosen |= {c[-1] for c in heapq.nsmallest(max(limit - len(chosen), 1), others)}
            if (prefer is not None and prefer in self._sessions
                    and self._sessions[prefer].model_sha256 == model_sha256):
                chosen.add(prefer)
        return sorted(chosen, key=key)


def claimed_files(facts: Mapping[str, Any]) -> frozenset[str]:
    """The files a sidecar's facts name: the KV file, its transcript, its restore points' files."""
    kv = facts.get("kv_file")
    if not isinstance(kv, str):
        return frozenset()
    names = {kv, transcript_name(kv) or kv}
    for p in facts.get("points") or ():
        if isinstance(p, Mapping) and isinstance(p.get("kv_file"), str):
            names.add(p["kv_file"])
    return frozenset(names)


# What a listing needs of each sidecar without decoding it (kept beside it in the index file).
FACT_KEYS = ("id", "kv_file", "size_bytes", "corrupt", "last_used_at", "model_sha256", "points", "pieces")


def piece_shares(pieces_of: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """What the pieces cost each session and in all: ``pieces_of`` maps a session to its sidecar's
    ``pieces`` (id -> bytes). A piece only one session uses is all its own; one several share is
    split between them; the total counts each piece once (what the disk holds)."""
    users: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for pieces in pieces_of.values():
        if isinstance(pieces, Mapping):
            for piece_id, size in pieces.items():
                users[piece_id] = users.get(piece_id, 0) + 1
                sizes[piece_id] = size if isinstance(size, int) else 0
    shares = {}
    for sid, pieces in pieces_of.items():
        if isinstance(pieces, Mapping):
            shares[sid] = sum(sizes[p] // users[p] for p in pieces)
    return shares, sum(sizes.values())


class SidecarRecord:
    """One ``<id>.json`` as it was last read: its stat and its content (or why it is unreadable).

    The content is kept three ways, each made from ``data`` (``Sidecar.to_json()`` of what was
    read) on first use and kept in the index file, so a process that loads the index decodes
    nothing it does not use: ``raw`` (the JSON), ``facts`` (FACT_KEYS: what a listing checks and
    sorts by) and ``row`` (the `sessions list --json` row without its size, status and problems).
    """

    __slots__ = ("stamp", "error", "racy", "_data", "_raw", "_facts", "_row", "_sidecar", "_recency",
                 "_newest")

    def __init__(self, stamp: Stamp, data: dict[str, Any] | None, error: str | None = None,
                 racy: bool = False, sidecar: Sidecar | None = None, *, raw: bytes | None = None,
                 facts: dict[str, Any] | None = None, row: bytes | None = None) -> None:
        self.stamp = stamp
        self.error = error
        self.racy = racy
        self._data = data
        self._raw = raw
        self._facts = facts
        self._row = row
        self._sidecar = sidecar
        self._recency: tuple[str, float] | None = None
        self._newest: tuple[int, float] | None = None

    @classmethod
    def read(cls, stamp: Stamp, sidecar: Sidecar | None, error: str | None = None) -> SidecarRecord:
        racy = time.time_ns() - stamp[2] < RACY_NS
        return cls(stamp, None if sidecar is None else sidecar.to_json(), error, racy, sidecar)

    @property
    def data(self) -> dict[str, Any] | None:
        """``Sidecar.to_json()`` of what was read (decoded from the index file on first use)."""
        if self._data is None and self._raw is not None:
            self._data = orjson.loads(self._raw)
        return self._data

    def raw(self) -> bytes | None:
        if self._raw is None and self._data is not None:
            self._raw = orjson.dumps(self._data)
        return self._raw

    def facts(self) -> dict[str, Any] | None:
        if self._facts is None and self.error is None:
            data = self.data
            if data is not None:
                self._facts = {k: data.get(k) for k in FACT_KEYS}
        return self._facts

    def row(self) -> bytes | None:
        """The list row's sidecar part (``entries.row_base``) as JSON."""
        if self._row is None and self.error is None:
            data = self.data
            if data is not None:
                self._row = orjson.dumps(row_base(data))
        return self._row

    def same_content(self, other: SidecarRecord) -> bool:
        return self.error == other.error and self.stamp == other.stamp and self.raw() == other.raw()

    def sidecar(self) -> Sidecar | None:
        """The sidecar (built from the stored JSON on first use); SidecarError if it is not one."""
        if self._sidecar is None and self.data is not None:
            self._sidecar = Sidecar.from_index(self.data)
        return self._sidecar

    def newest_first(self) -> tuple[int, float]:
        """A key that sorts the most recently used first (cached)."""
        if self._newest is None:
            secs, frac = self.recency()
            digits = "".join(c for c in secs if c.isdigit())
            self._newest = (-int(digits) if digits else 0, -frac)
        return self._newest

    def recency(self) -> tuple[str, float]:
        if self._recency is None:
            facts = self.facts()
            used = facts.get("last_used_at") if facts else None
            self._recency = recency_key(used if isinstance(used, str) else "")
        return self._recency


# (session id, its sidecar's stat) -> the sidecar as read now
ReadRecord = Callable[[str, Stamp], SidecarRecord]


class SessionsIndex(TokenIndex):
    """The token index plus every sidecar as last read and the folder's entries' stat.

    The store keeps it true (``SessionStore`` reads the folder and tells it of every change it
    makes, through the methods below); its data stays in here, under ``lock``.
    """

    def __init__(self, folder: Path | None = None) -> None:
        super().__init__()
        self.folder = str(folder) if folder is not None else ""
        self.records: dict[str, SidecarRecord] = {}
        # Every entry of the folder at the last look (lstat), kept true by the store's own changes.
        self.files: dict[str, Stamp] = {}
        self.scanned = False  # ``files`` has been filled by a look at the folder
        # Sessions whose token part may need (re)reading: new or changed since it was indexed.
        self.unindexed: set[str] = set()
        # A KV file whose token header could not be read, by session: (kv_file, size, mtime_ns).
        self.token_errors: dict[str, tuple[str, int, int]] = {}
        self._pending_tokens: dict[str, bytes] = {}  # token parts from the file, not decoded yet

    # -- sidecars -------------------------------------------------------------------------
    def record(self, session_id: str) -> SidecarRecord | None:
        """The session's sidecar as last read (None: not indexed)."""
        return self.records.get(session_id)

    def items(self) -> list[tuple[str, SidecarRecord]]:
        """Every session's record, as one consistent look (a record is never changed, only replaced)."""
        with self.lock:
            return list(self.records.items())

    def set_record(self, session_id: str, record: SidecarRecord) -> None:
        with self.lock:
            old = self.records.get(session_id)
            self.records[session_id] = record
            if old is None or not old.same_content(record):
                self.dirty = True
            self.unindexed.add(session_id)

    def fresh_record(self, session_id: str, stamp: Stamp, read: ReadRecord) -> SidecarRecord:
        """The session's record for its sidecar's stat ``stamp``: the one kept, unless it is new,
        changed (by its stat) or too recent to trust; then ``read(session_id, stamp)`` and kept."""
        with self.lock:
            rec = self.records.get(session_id)
            if rec is None or rec.racy or rec.stamp != stamp:
                rec = read(session_id, stamp)
                self.set_record(session_id, rec)
            return rec

    def refresh(self, files: dict[str, Stamp], sidecars: Mapping[str, Stamp], read: ReadRecord) -> None:
        """The folder as one look saw it: ``files`` (every entry with its lstat), ``sidecars`` (the
        sessions' ids among them, with their sidecar's stat). Sidecars new, changed or too recent
        to trust are read again (``read``); sessions gone are forgotten.

        The sidecars are read outside the lock (a first look at thousands takes a while, and
        routing takes the lock on the engine's loop); a record is replaced by what was read only
        if no other change replaced it meanwhile."""
        with self.lock:
            kept = {sid: self.records.get(sid) for sid in sidecars}
        fresh = {sid: read(sid, st) for sid, st in sidecars.items()
                 if (rec := kept[sid]) is None or rec.racy or rec.stamp != st}
        with self.lock:
            for sid, rec in fresh.items():
                if self.records.get(sid) is kept[sid]:
                    self.set_record(sid, rec)
            for sid in [s for s in self.records if s not in sidecars]:
                self.forget(sid)
            self.files = files
            self.scanned = True

    def note_sidecar(self, session_id: str, name: str, record: SidecarRecord) -> None:
        """The store wrote the session's sidecar (``name``, now as ``record.stamp`` says)."""
        with self.lock:
            self.files[name] = record.stamp
            self.set_record(session_id, record)

    def kv_claims(self) -> dict[str, frozenset[str] | None]:
        """The files each session's sidecar names: its KV file, that version's transcript and its
        restore points (None: an unreadable sidecar, which claims nothing known)."""
        with self.lock:
            return {sid: (claimed_files(facts) if (facts := rec.facts()) and rec.error is None else None)
                    for sid, rec in self.records.items()}

    def pieces_named(self) -> set[str] | None:
        """The pieces every session's sidecar names (its save's and its points'); None when that is
        not known of every sidecar (the folder not looked at yet, one that does not read)."""
        with self.lock:
            if not self.scanned:
                return None
            named: set[str] = set()
            for rec in self.records.values():
                facts = rec.facts()
                if not facts or rec.error is not None or not isinstance(facts.get("pieces"), Mapping):
                    return None
                named.update(facts["pieces"])
            return named

    def forget(self, session_id: str) -> None:
        with self.lock:
            if self.records.pop(session_id, None) is not None:
                self.dirty = True
            if self._pending_tokens:  # none decoded yet: nothing else holds its tokens
                self._pending_tokens.pop(session_id, None)
            else:
                self.remove(session_id)
            self.unindexed.discard(session_id)
            self.token_errors.pop(session_id, None)

    # -- the folder's entries -------------------------------------------------------------
    def file_stat(self, name: str) -> Stamp | None:
        """An entry of the folder as last seen (its lstat), None when it was not there."""
        return self.files.get(name)

    def note_files(self, seen: Mapping[str, Stamp | None], recheck: str | None = None) -> None:
        """Entries of the folder the store just changed or looked at (their lstat; None: gone),
        without a look at the whole folder. ``recheck``: a session whose token part is to be
        compared with its KV file again (``tokens_to_read``)."""
        with self.lock:
            for name, st in seen.items():
                if st is None:
                    self.files.pop(name, None)
                else:
                    self.files[name] = st
            if recheck is not None:
                self.unindexed.add(recheck)

    def note_save(self, session_id: str, model_sha256: str, sidecar: tuple[str, SidecarRecord] | None,
                  kv_file: str, kv_stamp: Stamp | None, gone: str | None,
                  tokens: Sequence[int] | None) -> bool:
        """A save wrote the session's sidecar (``(name, record)``; None: it could not be looked
        at) and its KV file (``kv_stamp``; None: gone already), and removed ``gone`` (the previous
        version's KV file). With ``tokens``, the token part is what the save knows. True when
        the token part was taken."""
        with self.lock:
            if sidecar is not None:
                self.note_sidecar(session_id, *sidecar)
            if gone is not None:
                self.files.pop(gone, None)
            if kv_stamp is None:
                self.files.pop(kv_file, None)
                return False
            self.files[kv_file] = kv_stamp
            if tokens is None or not stat.S_ISREG(kv_stamp[0]):
                return False
            self.add_tokens(session_id, model_sha256, kv_file, kv_stamp[1], kv_stamp[2], tokens)
            self.unindexed.discard(session_id)
            return True

    # -- token parts ----------------------------------------------------------------------
    def tokens_to_read(self, only_model: str | None = None) -> list[tuple[str, str, tuple[str, int, int]]]:
        """The sessions whose token part is missing or out of date with their KV file's stat
        (of ``only_model`` if given): ``(id, model, (kv_file, size, mtime_ns))`` each. Sessions
        that cannot have one (an unreadable sidecar, no regular KV file) are taken out of the
        token index; one whose KV file could not be read is not offered again until it changes."""
        with self.lock:
            todo: list[tuple[str, str, tuple[str, int, int]]] = []
            for sid in list(self.unindexed):
                rec = self.records.get(sid)
                data = rec.facts() if rec is not None else None
                if rec is None or data is None or rec.error is not None:
                    self.unindexed.discard(sid)
                    self.remove(sid)
                    continue
                if only_model is not None and data.get("model_sha256") != only_model:
                    continue
                self.unindexed.discard(sid)
                kv_file, sha = data.get("kv_file"), data.get("model_sha256")
                st = self.files.get(kv_file) if isinstance(kv_file, str) else None
                if (st is None or not stat.S_ISREG(st[0]) or not isinstance(sha, str)
                        or not isinstance(kv_file, str)):
                    self.remove(sid)
                    continue
                key = (kv_file, st[1], st[2])
                have = self.get(sid)
                if (have is not None
                        and (have.kv_file, have.size, have.mtime_ns, have.model_sha256) == (*key, sha)):
                    continue
                if self.token_errors.get(sid) == key:
                    continue
                todo.append((sid, sha, key))
            return todo

    def tokens_unreadable(self, session_id: str, key: tuple[str, int, int]) -> None:
        """The session's KV file (``(kv_file, size, mtime_ns)``) has no token list that reads: it
        is not offered (``tokens_to_read``) until it changes."""
        with self.lock:
            self.remove(session_id)
            self.token_errors[session_id] = key

    # -- questions ------------------------------------------------------------------------
    def newest_first(self, session_id: str) -> tuple[int, float]:
        rec = self.records.get(session_id)
        if rec is None:
            return (0, 0.0)
        return rec._newest or rec.newest_first()

    def usage_bytes(self) -> int | None:
        """What the saved sessions' KV files and restore points took at the last look (what the
        budget counts); None before the folder was looked at."""
        with self.lock:
            if not self.scanned:
                return None
            total = 0
            pieces_of = {}
            for sid, rec in self.records.items():
                facts = rec.facts()
                if not facts:
                    continue
                pieces_of[sid] = facts.get("pieces")
                for name in claimed_files(facts):
                    st = self.files.get(name)
                    if name.endswith((KV_SUFFIX, MANIFEST_SUFFIX)) and st is not None and stat.S_ISREG(st[0]):
                        total += st[1]
            return total + piece_shares(pieces_of)[1]

    # -- token parts loaded on first use -------------------------------------------------
    def _tokens_ready(self) -> None:
        """Token parts read from the file are decoded when something first asks for tokens (a
        listing never does)."""
        if self._pending_tokens:
            with self.lock:
                pending, self._pending_tokens = self._pending_tokens, {}
                dirty = self.dirty
                for sid, blob in pending.items():
                    try:
                        self.put(_tokens_entry(sid, orjson.loads(blob)))
                    except (ValueError, KeyError, TypeError):
                        self.unindexed.add(sid)  # read again from its KV file
                self.dirty = dirty


def tokens_json(s: IndexedSession) -> dict[str, Any]:
    return {"model_sha256": s.model_sha256, "kv_file": s.kv_file, "size": s.size, "mtime_ns": s.mtime_ns,
            "n_tokens": s.n_tokens, "head": s.head, "anchor": s.anchor, "tail": list(s.tail),
            "hashes": base64.b64encode(_le_bytes(s.hashes, "Q")).decode("ascii")}


def _tokens_entry(sid: str, t: dict[str, Any]) -> IndexedSession:
    raw = base64.b64decode(t["hashes"], validate=True)
    hashes = array("Q", raw)
    if _BIG_ENDIAN:
        hashes.byteswap()
    return IndexedSession(sid, str(t["model_sha256"]), str(t["kv_file"]), int(t["size"]), int(t["mtime_ns"]),
                          int(t["n_tokens"]), tuple(hashes), int(t["head"]), int(t["anchor"]),
                          tuple(int(v) for v in t["tail"]))
