"""The sessions service: list, pin, delete, prune, verify and search, with one set of rules for every face.

The desktop app (through the engine), `slotkeeper serve` and `slotkeeper sessions ...` all use
this, so "never delete a session loaded in a slot" and "prune least recently used first, never a
pinned one" are written once. Only saved sessions count towards the budget, sized by their KV
files on disk; files in the folder that are not Slotkeeper's are reported, never counted.
``in_slots`` says which sessions a running engine holds right now: the engine passes its own
live set, the CLI reads the set a running engine published.

The search index (``sessions.search``) is kept in step with the folder here, and only here:
the text of every save that changed a session (``index_text``, the engine calls it), every
delete and prune made here, and a repair from the folder (``repair_search``) at the engine's
start and before a search when the folder changed since (deletes by another process, files
copied in, an index deleted). Filling in the full text of an entry indexed by title only needs
a server of its model, and is the engine's (``engine.stored.searching.complete_partial``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from slotkeeper.core.sessions import pruner
from slotkeeper.core.sessions.entries import Listing, SessionEntry, UnmanagedFile
from slotkeeper.core.sessions.naming import (
    KV_SUFFIX,
    MIN_ID_PREFIX,
    SIDECAR_NAME_RE,
    SIDECAR_SUFFIX,
    InvalidSessionId,
    is_hidden_or_in_progress,
    validate_session_id,
)
from slotkeeper.core.sessions.search import IndexedText, Reconciled, SearchHit, SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.sidecar import Sidecar
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore
from slotkeeper.core.sessions.transcripts import Transcript

__all__ = ["AmbiguousSessionId", "PruneOutcome", "SearchResult", "SessionInUse", "SessionsService",
           "reconcile_search"]

log = logging.getLogger(__name__)


class SessionInUse(Exception):
    """The session is loaded in a slot of a running server; its next save needs it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id} is loaded in a slot of the running server; it can be deleted "
                         "once another conversation replaces it")
        self.session_id = session_id


AMBIGUOUS_SHOWN = 10  # candidates an ambiguous id's message names


class AmbiguousSessionId(ValueError):
    """The start of an id given for a session is the start of several (``candidates``), or too
    short to be taken as one (no candidates)."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        if candidates:
            shown = ", ".join(candidates[:AMBIGUOUS_SHOWN])
            more = (f" and {len(candidates) - AMBIGUOUS_SHOWN} more" if len(candidates) > AMBIGUOUS_SHOWN
                    else "")
            text = (f"{prefix!r} is the start of {len(candidates)} session ids ({shown}{more}); give more "
                    "of the id")
        else:
            text = f"{prefix!r} is too short to pick a session by the start of its id: give at least " \
                   f"{MIN_ID_PREFIX} characters"
        super().__init__(text)
        self.prefix = prefix
        self.candidates = candidates


@dataclass(frozen=True)
class SessionChanges:
    """What a use case changed in the sessions folder (as Anki's ``OpChanges``): the entries as
    they are now, and the ids gone. A face applies it to the listing it shows (``apply``) instead
    of listing the folder again."""

    changed: tuple[SessionEntry, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(e.id for e in self.changed) | frozenset(self.removed)

    def apply(self, listing: Listing) -> Listing:
        """``listing`` with these changes: a changed entry replaces its old one in place (a pin or
        a check moves nothing in the order), a removed one is left out."""
        new = {e.id: e for e in self.changed}
        gone = set(self.removed)
        return Listing([new.get(e.id, e) for e in listing.sessions if e.id not in gone],
                       list(listing.unmanaged))


@dataclass(frozen=True)
class PruneOutcome:
    plan: pruner.PrunePlan
    result: pruner.PruneResult | None  # None for a dry run
    # Files in the folder that are not Slotkeeper's: shown, never counted, never deleted.
    unmanaged: tuple[UnmanagedFile, ...] = ()


@dataclass(frozen=True)
class SearchResult:
    query: str
    hits: tuple[SearchHit, ...]  # the best ones, best first
    repaired: Reconciled = Reconciled()  # what the search first brought back in step with the folder
    total: int = 0  # every session that matches (hits are the best of them)

    @property
    def partial(self) -> tuple[str, ...]:
        """Hits found by title and preview only: their full text needs a server of their model."""
        return tuple(h.id for h in self.hits if not h.complete)


def folder_stamp(directory) -> str:
    """Changes whenever a file is added, removed or replaced in the folder (its mtime). Not a file's
    stamp (``fsutil.stat_stamp``) on purpose: the reconcile compares the folder's names, which only
    the mtime follows (and the inode, for a folder replaced); a write inside a file moves neither."""
    st = os.stat(directory)
    return f"{st.st_mtime_ns}:{st.st_ino}"


def reconcile_search(search: SearchIndex, store: SessionStore, listing: Listing | None = None) -> Reconciled:
    """Bring the search index in step with the sessions folder (dropped and missing entries).
    Without a ``listing`` only the folder's names are read, and the sidecars of sessions the index
    does not hold as they are now (so a search after a save costs a directory read, not a listing)."""
    stamp = folder_stamp(store.dir)  # before reading: a change during it is seen next time
    if listing is not None:
        wanted = [IndexedText(e.id, e.sidecar.kv_file, e.sidecar.model_sha256, e.sidecar.title,
                              e.sidecar.preview)
                  for e in listing.sessions if e.sidecar is not None]
    else:
        wanted = _sessions_by_name(search, store)
    done = search.reconcile(wanted, store.dir)
    search.set_folder_stamp(stamp)
    return done


def _sessions_by_name(search: SearchIndex, store: SessionStore) -> list[IndexedText]:
    sidecars: set[str] = set()
    kv_files: dict[str, list[str]] = {}
    for name in os.listdir(store.dir):
        if is_hidden_or_in_progress(name):
            continue
        if name.endswith(SIDECAR_SUFFIX):
            sidecars.add(name[: -len(SIDECAR_SUFFIX)])
        elif name.endswith(KV_SUFFIX) and name.count(".") == 2:
            kv_files.setdefault(name.split(".", 1)[0], []).append(name)
    have = search.entries()
    out = []
    for sid in sidecars:
        indexed = have.get(sid)
        if indexed is not None and kv_files.get(sid) == [indexed[0]]:
            out.append(IndexedText(sid, indexed[0], "", "", ""))  # as indexed: nothing to read
            continue
        try:
            sc = store.get(sid).sidecar
        except (SessionNotFound, InvalidSessionId, OSError):
            continue
        if sc is not None:
            out.append(IndexedText(sid, sc.kv_file, sc.model_sha256, sc.title, sc.preview))
    return out


class SessionsService:
    def __init__(self, store: SessionStore, in_slots: Callable[[], AbstractSet[str]] | None = None,
                 budget: Callable[[], int] | None = None, search: SearchIndex | None = None,
                 budget_bytes: int = 0) -> None:
        """``in_slots`` and ``budget``: readers of what another process recorded (the command line
        reads the running app's in-slots file and the settings file); without them, the owner tells
        the service (``set_in_slots``, ``budget_bytes``), as the engine does. ``search``: the full-text
        index kept in step here. What a call changed is in what it returns (a deletion is forgotten
        by the store's index itself; a search says what it repaired): nothing is called back."""
        self.store = store
        self._read_in_slots = in_slots
        self._read_budget = budget
        self._in_slots: frozenset[str] = frozenset()
        self.budget_bytes = budget_bytes  # the disk budget, when no reader is given
        self.search_index = search

    def set_in_slots(self, session_ids: AbstractSet[str]) -> None:
        """The sessions in the slots now (never deleted nor pruned): told by the engine whenever
        they change (any thread reads the set it last told)."""
        self._in_slots = frozenset(session_ids)

    def _budget(self) -> int:
        return self._read_budget() if self._read_budget is not None else self.budget_bytes

    def listing(self) -> Listing:
        return self.store.listing()

    def listing_json(self) -> list[bytes]:
        """What `sessions list --json` prints: ``e.to_json()`` of each listed session, as JSON."""
        return self.store.listing_rows()

    def get(self, session_id: str) -> SessionEntry:
        return self.store.get(session_id)

    def resolve_id(self, given: str) -> str:
        """The id of the one saved session ``given`` names: its whole id, or (as git takes commits)
        the start of exactly one id, at least MIN_ID_PREFIX characters. Raises InvalidSessionId
        (a path, an empty string ...), AmbiguousSessionId (candidates sorted), SessionNotFound."""
        validate_session_id(given)
        if os.path.lexists(self.store.sidecar_path(given)):
            return given
        candidates = sorted(m.group(1) for name in os.listdir(self.store.dir)
                            if (m := SIDECAR_NAME_RE.match(name)) and m.group(1).startswith(given))
        if not candidates:
            raise SessionNotFound(given)
        if len(given) < MIN_ID_PREFIX:
            raise AmbiguousSessionId(given, [])
        if len(candidates) > 1:
            raise AmbiguousSessionId(given, candidates)
        return candidates[0]

    def in_slots(self) -> frozenset[str]:
        return frozenset(self._read_in_slots()) if self._read_in_slots is not None else self._in_slots

    def set_pinned(self, session_id: str, pinned: bool) -> SessionChanges:
        self.store.set_pinned(session_id, pinned)
        return SessionChanges(changed=(self.store.get(session_id),))

    def delete(self, session_id: str) -> SessionChanges:
        """Delete a saved session, unless a slot holds it right now. Raises SessionInUse, and
        InvalidSessionId for anything that is not an id (``./ID`` must not slip past the check)."""
        validate_session_id(session_id)
        if session_id in self.in_slots():
            raise SessionInUse(session_id)
        self._delete(session_id)
        self.store.states.collect()  # the pieces only it used
        return SessionChanges(removed=(session_id,))

    def transcript(self, session_id: str) -> Transcript | None:
        """The conversation a saved session holds, in words (None: saved without a transcript, by
        an older Slotkeeper or from a request that was not a conversation). Raises
        SessionNotFound, InvalidSessionId, TranscriptError (a damaged file)."""
        return self.store.transcript(self.store.get(validate_session_id(session_id)))

    def verify(self, session_id: str) -> SessionEntry:
        return self.store.verify(session_id)

    def plan_prune(self, budget: int | None = None) -> pruner.PrunePlan:
        """What a prune to ``budget`` (default: the setting) would delete; nothing is deleted."""
        return self._plan(budget)[0]

    def _plan(self, budget: int | None) -> tuple[pruner.PrunePlan, Listing]:
        # Managed sessions only, sized on disk: files that are not ours never cause a prune.
        listing = self.store.listing()
        cands = [pruner.PruneCandidate.from_entry(e) for e in listing.sessions if e.sidecar]
        plan = pruner.plan(cands, self._budget() if budget is None else budget,
                           protected_ids=self.in_slots(), unmanaged_bytes=listing.unmanaged_bytes)
        return plan, listing

    def _prune_points(self, limit: int) -> None:
        """Restore points go first: those of the least recently used conversations, until they fit."""
        listing = self.store.listing()
        usage = sum(e.size_bytes for e in listing.sessions)
        states = self.store.states

        def pieces_only(e) -> int:
            sc = e.sidecar
            return states.points_only(sc.kv_file, [p.kv_file for p in sc.points]) if sc is not None else 0

        dropped = False
        for session_id, files, _ in pruner.plan_points(listing.sessions, usage, limit, pieces_only):
            self.store.points.drop(session_id, files)
            dropped = True
        if dropped:
            self.store.states.collect()

    def prune(self, budget: int | None = None, dry_run: bool = False, quick: bool = False) -> PruneOutcome:
        """Delete the least recently used sessions until the rest fit the budget, their restore
        points first (a dry run shows the sessions only). ``quick`` (after
        a save): when the sessions index says they fit already, nothing else is looked at; only
        a prune that has something to do lists the folder (so it never acts on a stale index)."""
        if quick and not dry_run:
            limit = self._budget() if budget is None else budget
            usage = self.store.usage_bytes()
            if usage <= limit:
                return PruneOutcome(pruner.PrunePlan([], 0, usage, usage, limit, False), pruner.PruneResult())
        if not dry_run:
            self._prune_points(self._budget() if budget is None else budget)
        plan, listing = self._plan(budget)
        unmanaged = tuple(listing.unmanaged)
        if dry_run or not plan.delete:
            return PruneOutcome(plan, None if dry_run else pruner.PruneResult(), unmanaged)
        in_slots = self.in_slots()

        def delete(session_id: str) -> None:
            # The slots may have changed since the plan: check again right before each delete.
            if session_id in in_slots or session_id in self.in_slots():
                raise SessionInUse(session_id)
            self._delete(session_id)

        result = pruner.apply(plan, delete)
        self.store.states.collect()  # the pieces only they used
        return PruneOutcome(plan, result, unmanaged)

    def search(self, text: str, limit: int = 20) -> SearchResult:
        """Saved conversations by what was said in them (every word typed, as a word or its start),
        best first, each with its matching passage. The index is first repaired from the folder
        if the folder changed since it was last compared. Raises SearchUnavailable."""
        if self.search_index is None:
            raise SearchUnavailable("searching by content is not set up here")
        repaired = Reconciled()
        try:
            if self.search_index.folder_stamp() != folder_stamp(self.store.dir):
                repaired = self.repair_search()
            hits = self.search_index.search(text, limit)
            total = len(hits) if len(hits) < limit else self.search_index.count(text)
        except sqlite3.Error as exc:
            raise SearchUnavailable(f"the search index cannot be read: {exc}") from exc
        return SearchResult(text, tuple(hits), repaired, total)

    # -- the search index, kept in step with the folder -------------------------------------
    def index_text(self, sidecar: Sidecar, text: str | None) -> None:
        """A save changed the session ``sidecar`` describes: its conversation's search text (its
        transcript's, or what the save detokenized with the template's markers left out), or its
        title and preview when the server could not say (completed later, while a server of its
        model runs). A failure is repaired by the next search."""
        if self.search_index is None:
            return
        sc = sidecar
        try:
            if text is not None:
                self.search_index.put(sc.id, sc.kv_file, sc.model_sha256, sc.title, text)
            else:
                self.search_index.put(sc.id, sc.kv_file, sc.model_sha256, sc.title, sc.preview,
                                      complete=False)
        except (sqlite3.Error, SearchUnavailable) as exc:
            log.warning("could not add %s to the search index: %s", sc.id, exc)

    def partial_search_entries(self, model_sha256: str) -> list[tuple[str, str]]:
        """(session id, KV file) of this model's sessions the search index holds only by title."""
        return [] if self.search_index is None else self.search_index.partial(model_sha256)

    def complete_text(self, session_id: str, kv_file: str, text: str) -> int:
        """The full text of a session the search index held only by title (1: completed)."""
        return 0 if self.search_index is None else self.search_index.complete(session_id, kv_file, text)

    def repair_search(self, listing: Listing | None = None) -> Reconciled:
        """Bring the search index in step with the folder (``reconcile_search``; ``listing``: one
        just made). Raises SearchUnavailable, sqlite3.Error."""
        if self.search_index is None:
            raise SearchUnavailable("searching by content is not set up here")
        return reconcile_search(self.search_index, self.store, listing)

    def _delete(self, session_id: str) -> None:
        self.store.delete(session_id)  # the store's index forgets it there
        if self.search_index is not None:
            try:
                self.search_index.remove(session_id)
            except (sqlite3.Error, SearchUnavailable) as exc:  # repaired by the next search
                log.warning("could not drop %s from the search index: %s", session_id, exc)
