"""Saved sessions by the token blocks they start with.

The front door asks, for every completion request, which saved session shares the longest
prefix with the prompt. Comparing the prompt with every session's tokens would cost more with
every session kept; instead each session's tokens are cut into blocks of ``BLOCK`` tokens and
each block gets a hash chained on the ones before it, so a chain hash names a whole prefix. A
lookup walks the prompt's chain and stops at the first hash no session has: its cost depends on
the prompt, not on how many sessions there are.

The index lives in memory in the running engine and is kept on disk (``load``/``save``), keyed
on each KV file's name, size and mtime, so a restart reads only the token headers of sessions
that are new or changed since (``sync`` repairs it from the folder, whoever changed it).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from slotkeeper.core.fsutil import atomic_write_text

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per block: prefixes are found to the block, then measured exactly
INDEX_VERSION = 1


@dataclass(frozen=True)
class IndexedSession:
    id: str
    model_sha256: str
    kv_file: str
    size: int
    mtime_ns: int
    n_tokens: int
    hashes: tuple[int, ...]  # one chain hash per whole block


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


def chain_hashes(tokens: Sequence[int] | np.ndarray) -> list[int]:
    """The chain hash of every whole block of ``tokens``."""
    arr = np.asarray(tokens, dtype="<i4")
    out: list[int] = []
    h = 0
    for i in range(len(arr) // BLOCK):
        h = xxhash.xxh3_64_intdigest(arr[i * BLOCK:(i + 1) * BLOCK].tobytes(), seed=h)
        out.append(h)
    return out


class TokenIndex:
    def __init__(self) -> None:
        self._sessions: dict[str, IndexedSession] = {}
        self._by_hash: dict[int, set[str]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> IndexedSession | None:
        return self._sessions.get(session_id)

    def put(self, entry: IndexedSession) -> None:
        self.remove(entry.id)
        self._sessions[entry.id] = entry
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(entry.id)

    def add_tokens(self, session_id: str, model_sha256: str, kv_file: str, size: int, mtime_ns: int,
                   tokens: Sequence[int] | np.ndarray) -> IndexedSession:
        entry = IndexedSession(session_id, model_sha256, kv_file, size, mtime_ns, len(tokens),
                               tuple(chain_hashes(tokens)))
        self.put(entry)
        return entry

    def remove(self, session_id: str) -> None:
        old = self._sessions.pop(session_id, None)
        if old is None:
            return
        for h in old.hashes:
            ids = self._by_hash.get(h)
            if ids is not None:
                ids.discard(session_id)
                if not ids:
                    del self._by_hash[h]

    def longest_prefix(self, tokens: Sequence[int] | np.ndarray, model_sha256: str, limit: int = 4) -> list[PrefixHit]:
        """Sessions of this model sharing the most whole blocks with ``tokens`` (best first)."""
        best: list[PrefixHit] = []
        for depth, h in enumerate(chain_hashes(tokens), start=1):
            ids = [i for i in self._by_hash.get(h, ()) if self._sessions[i].model_sha256 == model_sha256]
            if not ids:
                break
            best = [PrefixHit(i, depth) for i in sorted(ids)]
        return best[:limit]

    # -- keeping it true to the folder ----------------------------------------------------
    def sync(self, sessions: Iterable[tuple[str, str, str, int, int]],
             read_tokens: Callable[[str], Sequence[int]]) -> int:
        """Make the index match the folder: ``sessions`` are (id, model_sha256, kv_file, size,
        mtime_ns) of every healthy session; tokens are read only for the ones new or changed.
        Returns how many were (re)read."""
        seen = set()
        read = 0
        for sid, sha, kv_file, size, mtime_ns in sessions:
            seen.add(sid)
            have = self._sessions.get(sid)
            if have and (have.kv_file, have.size, have.mtime_ns, have.model_sha256) == (kv_file, size, mtime_ns, sha):
                continue
            try:
                tokens = read_tokens(sid)
            except Exception as exc:  # an unreadable session is simply not offered
                log.debug("not indexing %s: %s", sid, exc)
                self.remove(sid)
                continue
            self.add_tokens(sid, sha, kv_file, size, mtime_ns, tokens)
            read += 1
        for sid in [s for s in self._sessions if s not in seen]:
            self.remove(sid)
        return read

    # -- on disk --------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"version": INDEX_VERSION, "block": BLOCK, "sessions": {
            s.id: {"model_sha256": s.model_sha256, "kv_file": s.kv_file, "size": s.size, "mtime_ns": s.mtime_ns,
                   "n_tokens": s.n_tokens,
                   "hashes": base64.b64encode(np.asarray(s.hashes, dtype="<u8").tobytes()).decode("ascii")}
            for s in self._sessions.values()}}

    def save(self, path: Path) -> None:
        write_index(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> TokenIndex:
        """The index kept on disk; an empty one when it is missing, damaged or of another layout
        (``sync`` then rebuilds what is needed)."""
        index = cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != INDEX_VERSION or data.get("block") != BLOCK:
                return index
            for sid, d in data["sessions"].items():
                hashes = np.frombuffer(base64.b64decode(d["hashes"]), dtype="<u8")
                index.put(IndexedSession(str(sid), str(d["model_sha256"]), str(d["kv_file"]), int(d["size"]),
                                         int(d["mtime_ns"]), int(d["n_tokens"]), tuple(int(h) for h in hashes)))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.info("rebuilding the sessions index (%s)", exc)
            return cls()
        return index


def write_index(path: Path, data: dict) -> None:
    """Write an index's JSON (``TokenIndex.to_json``), atomically."""
    atomic_write_text(path, json.dumps(data))
