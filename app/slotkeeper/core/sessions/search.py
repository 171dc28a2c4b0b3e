"""Saved conversations by what was said in them: a private full-text index (SQLite FTS5).

Each saved session's conversation text (its tokens detokenized by the server that saved it) is
kept in ``search.sqlite3`` in the data folder, 0600 like every file Slotkeeper writes, and
searched with FTS5 (word prefixes, ranked by bm25, the matching passage by ``snippet``).

The index is a convenience kept beside the files, never the truth: the sessions folder is.
- The engine puts a session's text in after every save that changed it and the sessions service
  drops it on every delete and prune (the app's, the CLI's).
- Anything else that changed the folder (a CLI delete while the app runs, files copied in, an
  index deleted or damaged) is repaired by ``reconcile``: entries of sessions that are gone are
  dropped; sessions missing from the index are put in from their sidecar's title and preview
  (marked partial); a search reconciles first whenever the folder changed since the last time.
- Only llama-server can turn tokens back into text, and only for its own model: partial entries
  are completed (``partial`` -> ``put``) by the engine while a server of that model runs.
The text is stored in the index itself (FTS5's own content), not beside the sessions: the index
is rebuilt from the files without a server (titles and previews), and made whole with one.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import stat
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.fsutil import PRIVATE_FILE_MODE, remove_file

log = logging.getLogger(__name__)

__all__ = ["MARK_END", "MARK_START", "IndexedText", "Reconciled", "SearchHit", "SearchIndex",
           "SearchUnavailable", "fts_query"]

SCHEMA_VERSION = 2  # 2: a prefix index
MARK_START, MARK_END = "\x02", "\x03"  # around matched words in a snippet (never in indexed text)
SNIPPET_TOKENS = 24  # words of context in a passage
MAX_TEXT_CHARS = 2_000_000  # a conversation's text beyond this is not indexed (its start is)
MAX_QUERY_WORDS = 16
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORD = re.compile(r"\w+", re.UNICODE)
BUSY_TIMEOUT_MS = 5000


class SearchUnavailable(Exception):
    """The index file cannot be used (not a regular file, or not ours); the message says why."""


@dataclass(frozen=True)
class SearchHit:
    id: str
    title: str
    snippet: str  # the matching passage, matched words between MARK_START and MARK_END
    complete: bool  # False: only the title and preview are indexed yet (no server of its model ran)
    score: float  # bm25: lower is better

    def parts(self) -> list[tuple[str, bool]]:
        """The passage as (text, matched) pieces, for a face to highlight."""
        out: list[tuple[str, bool]] = []
        for i, piece in enumerate(re.split(f"[{MARK_START}{MARK_END}]", self.snippet)):
            if piece:
                out.append((piece, i % 2 == 1))
        return out

    def plain(self, before: str = "[", after: str = "]") -> str:
        return "".join(f"{before}{t}{after}" if hit else t for t, hit in self.parts())

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "passage": self.plain("", ""),
                "matches": [t for t, hit in self.parts() if hit], "complete": self.complete}


@dataclass(frozen=True)
class IndexedText:
    """What a session's entry should hold (for ``reconcile``: from its sidecar)."""

    id: str
    kv_file: str
    model_sha256: str
    title: str
    preview: str


@dataclass(frozen=True)
class Reconciled:
    added: int = 0
    dropped: int = 0

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped)


def clean_text(text: str) -> str:
    """Text safe to index: no control characters (the snippet markers among them), bounded."""
    return _CONTROL.sub(" ", text[:MAX_TEXT_CHARS])


def fts_query(text: str) -> str | None:
    """The words typed, as an FTS5 query that matches every word, the last one also as the start
    of a word (it may still be being typed). Every word is quoted, so nothing typed is ever FTS5
    syntax (AND, NEAR, quotes, *, columns ...)."""
    words = _WORD.findall(text)[:MAX_QUERY_WORDS]
    if not words:
        return None
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    quoted[-1] += "*"
    return " ".join(quoted)


class SearchIndex:
    """The full-text index of one data folder; safe to share between threads (one lock), and
    between processes (SQLite's own locking)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    # -- opening --------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is not None and not os.path.lexists(self.path):  # deleted under us: start again
            self._db.close()
            self._db = None
        if self._db is None:
            self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        self._create_private()
        try:
            db = self._connect()
        except sqlite3.DatabaseError as exc:  # damaged: start again from the files
            log.warning("the search index %s is damaged (%s); rebuilding it from the sessions", self.path,
                        exc)
            self._remove_files()
            self._create_private()
            db = self._connect()
        return db

    def _create_private(self) -> None:
        """The file exists, is a regular file of ours and is 0600 before SQLite opens it (its
        journal files take the database's mode)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE_MODE)
        except OSError as exc:
            raise SearchUnavailable(f"cannot open the search index {self.path}: "
                                    f"{exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SearchUnavailable(f"the search index {self.path} is not a regular file; remove it")
            if sys.platform != "win32":  # Windows has neither uids nor modes to check
                if st.st_uid != os.getuid():
                    raise SearchUnavailable(f"the search index {self.path} belongs to another user; "
                                            "remove it")
                if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:
                    os.fchmod(fd, PRIVATE_FILE_MODE)
        finally:
            os.close(fd)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False,
                             isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                db.executescript("DROP TABLE IF EXISTS docs; DROP TABLE IF EXISTS texts; DROP TABLE IF "
                                 "EXISTS meta;")
            db.executescript(f"""
                BEGIN;
                CREATE TABLE IF NOT EXISTS docs (
                    rowid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, kv_file TEXT NOT NULL,
                    model_sha256 TEXT NOT NULL, complete INTEGER NOT NULL);
                CREATE VIRTUAL TABLE IF NOT EXISTS texts USING fts5(
                    title, body, tokenize = 'unicode61 remove_diacritics 2', prefix = '2 3');
                CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
                PRAGMA user_version = {SCHEMA_VERSION};
                COMMIT;
            """)
            db.execute("SELECT count(*) FROM texts").fetchone()  # a damaged file fails here, not later
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                remove_file(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- keeping it in step ---------------------------------------------------------------
    def put(self, session_id: str, kv_file: str, model_sha256: str, title: str, text: str,
            complete: bool = True) -> None:
        """The text of a session (replacing what it had)."""
        with self._lock:
            db = self._conn()
            with _transaction(db):
                self._put(db, session_id, kv_file, model_sha256, title, text, complete)

    @staticmethod
    def _put(db: sqlite3.Connection, session_id: str, kv_file: str, model_sha256: str, title: str,
             text: str, complete: bool) -> None:
        SearchIndex._remove(db, session_id)
        cur = db.execute("INSERT INTO docs (id, kv_file, model_sha256, complete) VALUES (?, ?, ?, ?)",
                         (session_id, kv_file, model_sha256, int(complete)))
        db.execute("INSERT INTO texts (rowid, title, body) VALUES (?, ?, ?)",
                   (cur.lastrowid, clean_text(title), clean_text(text)))

    def complete(self, session_id: str, kv_file: str, text: str) -> bool:
        """The full text of a session indexed partially, unless its entry changed meanwhile (a
        newer save put its own text in, a delete took it out). True when it was completed."""
        with self._lock:
            db = self._conn()
            with _transaction(db):
                row = db.execute("SELECT rowid, model_sha256 FROM docs WHERE id = ? AND kv_file = ? AND "
                                 "complete = 0",
                                 (session_id, kv_file)).fetchone()
                if row is None:
                    return False
                title = db.execute("SELECT title FROM texts WHERE rowid = ?", (row[0],)).fetchone()
                self._put(db, session_id, kv_file, row[1], title[0] if title else "", text, True)
                return True

    def remove(self, session_id: str) -> None:
        with self._lock:
            db = self._conn()
            with _transaction(db):
                self._remove(db, session_id)

    @staticmethod
    def _remove(db: sqlite3.Connection, session_id: str) -> None:
        row = db.execute("SELECT rowid FROM docs WHERE id = ?", (session_id,)).fetchone()
        if row is not None:
            db.execute("DELETE FROM texts WHERE rowid = ?", row)
            db.execute("DELETE FROM docs WHERE rowid = ?", row)

    def entries(self) -> dict[str, tuple[str, bool]]:
        """id -> (kv_file, complete) of every session indexed."""
        with self._lock:
            rows = self._conn().execute("SELECT id, kv_file, complete FROM docs").fetchall()
        return {sid: (kv, bool(c)) for sid, kv, c in rows}

    def partial(self, model_sha256: str) -> list[tuple[str, str]]:
        """(id, kv_file) of the sessions of this model indexed from their title and preview only."""
        with self._lock:
            return self._conn().execute("SELECT id, kv_file FROM docs WHERE complete = 0 AND model_sha256 = "
                                        "?",
                                        (model_sha256,)).fetchall()

    def reconcile(self, sessions: Iterable[IndexedText], folder: Path | None = None) -> Reconciled:
        """Make the index agree with the folder's sessions: drop entries of sessions that are gone,
        put in (from title and preview, partial) the ones missing or of another version.
        ``folder``: where the KV files are; an indexed version whose file still exists is newer
        than a listing taken before it was saved, and is kept."""

        def exists(kv_file: str) -> bool:
            return folder is not None and os.path.lexists(folder / kv_file)

        wanted = {s.id: s for s in sessions}
        added = dropped = 0
        with self._lock:
            db = self._conn()
            have = {sid: kv for sid, kv in db.execute("SELECT id, kv_file FROM docs")}
            with _transaction(db):
                for sid, kv in have.items():
                    if sid not in wanted and not exists(kv):
                        self._remove(db, sid)
                        dropped += 1
                for sid, s in wanted.items():
                    kv = have.get(sid)
                    if kv == s.kv_file or (kv is not None and exists(kv)):
                        continue
                    preview = s.preview if s.preview != s.title else ""
                    self._put(db, sid, s.kv_file, s.model_sha256, s.title, preview, complete=False)
                    added += 1
        return Reconciled(added, dropped)

    def folder_stamp(self) -> str | None:
        with self._lock:
            row = self._conn().execute("SELECT value FROM meta WHERE key = 'folder'").fetchone()
        return row[0] if row else None

    def set_folder_stamp(self, stamp: str) -> None:
        with self._lock:
            self._conn().execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('folder', ?)", (stamp,))

    # -- searching ------------------------------------------------------------------------
    def count(self, text: str) -> int:
        """How many sessions match (all of them, not only the ones ``search`` returns)."""
        query = fts_query(text)
        if query is None:
            return 0
        with self._lock:
            return self._conn().execute("SELECT count(*) FROM texts WHERE texts MATCH ?",
                                        (query,)).fetchone()[0]

    def search(self, text: str, limit: int = 20) -> list[SearchHit]:
        """Sessions whose text has every word typed (as a word or the start of one), best first."""
        query = fts_query(text)
        if query is None:
            return []
        # Rank first, then make passages for the best only: a snippet reads the whole text, and a
        # sorter would make one for every match (a common word matches every conversation).
        with self._lock:
            db = self._conn()
            top = db.execute("SELECT rowid, bm25(texts, 4.0, 1.0) AS score FROM texts WHERE texts MATCH ?"
                             " ORDER BY score LIMIT ?", (query, limit)).fetchall()
            if not top:
                return []
            marks = ",".join("?" * len(top))
            rows = db.execute(
                f"SELECT t.rowid, d.id, t.title, snippet(texts, 1, '{MARK_START}', '{MARK_END}', '…', "
                f"{SNIPPET_TOKENS}), d.complete FROM texts AS t JOIN docs AS d ON d.rowid = t.rowid"
                f" WHERE texts MATCH ? AND t.rowid IN ({marks})", (query, *(r for r, _ in top))).fetchall()
        by_rowid = {r[0]: r[1:] for r in rows}
        return [SearchHit(sid, title, snip, bool(c), score)
                for rowid, score in top if rowid in by_rowid
                for sid, title, snip, c in [by_rowid[rowid]]]

    def __len__(self) -> int:
        with self._lock:
            return self._conn().execute("SELECT count(*) FROM docs").fetchone()[0]


class _transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
