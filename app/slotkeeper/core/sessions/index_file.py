"""The sessions index kept on disk between processes: its file's layout (a header line, then a
line per session), written whole and atomically, read back only when it describes this folder
under this layout."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson

from slotkeeper.core.basics.fsutil import atomic_write_bytes
from slotkeeper.core.sessions.index import (
    BLOCK,
    FACT_KEYS,
    HEAD_TOKENS,
    INDEX_VERSION,
    TAIL_SLACK,
    SessionsIndex,
    SidecarRecord,
    tokens_json,
)
from slotkeeper.core.sessions.naming import SESSION_ID_RE
from slotkeeper.core.sessions.rows import RACY_NS
from slotkeeper.core.sessions.sidecar import SCHEMA_VERSION

log = logging.getLogger(__name__)


def index_bytes(index: SessionsIndex) -> bytes:
    """The index file: a header line, then one line per session of four tab-separated JSON
    parts (stat and facts, the sidecar, its list row, its token part), so that loading it
    decodes the small first part only (orjson never writes a raw tab or newline).

    Encoding thousands of sessions takes a while, so the lock (which routing and every
    change take) is held only to take a consistent copy: references to the records and
    token parts, which are never changed, only replaced. Encoding follows outside it."""
    with index.lock:
        records = list(index.records.items())
        sessions = index._sessions.copy()
        pending = index._pending_tokens.copy()
        folder = index.folder
        index.dirty = False  # a change from now on is not in this copy: it makes the index dirty again
    head = orjson.dumps({"version": INDEX_VERSION, "block": BLOCK, "head": HEAD_TOKENS,
                         "slack": TAIL_SLACK, "sidecar_schema": SCHEMA_VERSION, "folder": folder})
    lines = [head]
    for sid, rec in records:
        meta = orjson.dumps({"id": sid, "stamp": rec.stamp, "error": rec.error, "facts": rec.facts()})
        tok = sessions.get(sid)
        tokens = pending.get(sid, b"") if tok is None else orjson.dumps(tokens_json(tok))
        lines.append(b"\t".join((meta, rec.raw() or b"", rec.row() or b"", tokens)))
    return b"\n".join(lines) + b"\n"

def load_index(path: Path | None, folder: Path | None = None) -> SessionsIndex:
    """The index kept on disk for ``folder``; an empty one when it is missing, damaged, of
    another layout or of another folder (the store then reads the folder again)."""
    index = SessionsIndex(folder)
    if path is None:
        return index
    try:
        lines = path.read_bytes().split(b"\n")
        data = orjson.loads(lines[0])
        if (not isinstance(data, dict) or data.get("version") != INDEX_VERSION
            or data.get("block") != BLOCK
                or data.get("head") != HEAD_TOKENS or data.get("slack") != TAIL_SLACK
                or data.get("sidecar_schema") != SCHEMA_VERSION or data.get("folder") != index.folder):
            return index
        now = time.time_ns()
        for line in lines[1:]:
            if line:
                try:
                    _load_one(index, line, now)
                except (ValueError, KeyError, TypeError, IndexError):
                    pass  # that one is read again from the folder
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        log.info("rebuilding the sessions index (%s)", exc)
        return SessionsIndex(folder)
    index.dirty = False
    return index


def _load_one(index: SessionsIndex, line: bytes, now: int) -> None:
    meta_b, raw, row, tokens = line.split(b"\t")
    meta = orjson.loads(meta_b)
    sid = meta["id"]
    if not isinstance(sid, str) or not SESSION_ID_RE.fullmatch(sid):
        raise ValueError(f"not a session id: {sid!r}")
    stamp = tuple(int(v) for v in meta["stamp"])
    if len(stamp) != 5:
        raise ValueError("bad stamp")
    error, facts = meta["error"], meta["facts"]
    # A sidecar is checked when it is first used (``Sidecar.from_index``; the file is read again
    # if it does not pass); the facts a listing uses are checked there too (``check_index_paths``).
    if error is None:
        if not raw or not row or not isinstance(facts, dict) or set(facts) != set(FACT_KEYS):
            raise ValueError("neither a sidecar nor an error")
        rec = SidecarRecord(stamp, None, None, raw=raw, facts=facts, row=row)
    elif isinstance(error, str):
        rec = SidecarRecord(stamp, None, error)
    else:
        raise ValueError("neither a sidecar nor an error")
    rec.racy = now - stamp[2] < RACY_NS
    index.records[sid] = rec
    index.unindexed.add(sid)
    if tokens:
        index._pending_tokens[sid] = tokens

def write_index(path: Path, data: bytes) -> None:
    """Write an index file (``index_bytes``), atomically and private (0600)."""
    atomic_write_bytes(path, data)
