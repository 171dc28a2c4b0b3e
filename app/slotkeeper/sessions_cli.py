"""`slotkeeper sessions ...`: the same store as the app, usable with or without a server.

`sessions search` reads the app's search index (repairing it from the folder first when the folder
changed); without a running server of a session's model, a session the index has not seen yet is
found by its title and preview only, which the result marks."""

from __future__ import annotations

import argparse
import json
import os
import sys

from slotkeeper.core.paths import app_paths
from slotkeeper.core.services.sessions import SearchResult, SessionInUse, SessionsService
from slotkeeper.core.sessions.compat import swa_mode
from slotkeeper.core.sessions.entries import SessionEntry, UnmanagedFile
from slotkeeper.core.sessions.folder_lock import LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_SECONDS
from slotkeeper.core.sessions.in_slots import read_in_slots
from slotkeeper.core.sessions.naming import InvalidSessionId
from slotkeeper.core.sessions.search import SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.sidecar import SidecarError
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore
from slotkeeper.core.settings import SettingsError, load_settings
from slotkeeper.core.units import human_bytes
from slotkeeper.sessions_list import list_json, print_bytes

UNMANAGED_NOTE = ("not Slotkeeper's: they do not count towards the budget and are never deleted "
                  "automatically")


def _print_table(entries: list[SessionEntry], unmanaged: list[UnmanagedFile], total: int) -> None:
    if not entries:
        print("No saved sessions.")
    for e in entries:
        s = e.sidecar
        flag = "*" if s and s.pinned else " "
        status = "" if e.status == "ok" else "  [CORRUPT]"
        if s is None:
            print(f"{flag} {e.id:<12}  {'?':>8}  {human_bytes(e.size_bytes):>10}  (unreadable){status}")
            continue
        print(f"{flag} {e.id:<12}  {s.n_tokens:>8}  {human_bytes(e.size_bytes):>10}  {s.last_used_at[:19]}  "
              f"{swa_mode(s):<26}  {s.title[:50]}{status}")
    print(f"{len(entries)} session(s), {human_bytes(total)} on disk  (* = pinned)")
    _print_unmanaged(unmanaged)


def _print_unmanaged(unmanaged: list[UnmanagedFile] | tuple[UnmanagedFile, ...]) -> None:
    if not unmanaged:
        return
    size = human_bytes(sum(u.size_bytes for u in unmanaged))
    print(f"{len(unmanaged)} unmanaged file(s), {size}, {UNMANAGED_NOTE}:")
    for u in unmanaged:
        what = human_bytes(u.size_bytes) if u.kind == "file" else u.kind
        print(f"  {u.name!r:<40}  {what}")


def _show(entry: SessionEntry) -> None:
    data = entry.to_json()
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        print(f"{key:<{width}}  {value}")


def sessions_service(paths, timeout: float = LOCK_TIMEOUT_SECONDS) -> SessionsService:
    """The same rules as the app: a running engine's in-slot sessions are kept, the budget is the setting."""
    store = SessionStore(paths.sessions_dir, lock_timeout=timeout, index_file=paths.sessions_index_file)
    return SessionsService(store, in_slots=lambda: read_in_slots(paths.in_slots_file),
                           budget=lambda: load_settings(paths.settings_file).budget_bytes,
                           search=SearchIndex(paths.search_index_file))


def lock_timeout() -> float:
    """How long to wait for the folder lock: $SLOTKEEPER_LOCK_TIMEOUT seconds, default 30."""
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not text:
        return LOCK_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{LOCK_TIMEOUT_ENV}={text!r} is not a number of seconds above 0")
    return seconds


def run_sessions_command(args: argparse.Namespace) -> int:
    try:
        timeout = lock_timeout()
    except ValueError as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2
    try:
        # Refuses (UnsafeFolder, an OSError) a data or sessions folder other users could write to.
        paths = app_paths(args.data_dir).ensure()
        service = sessions_service(paths, timeout)
        try:
            return _run(args, service)
        finally:
            _keep_index(service)
    except (SessionNotFound, SessionInUse, InvalidSessionId, SidecarError, OSError, SearchUnavailable) as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 1
    except SettingsError as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2


def _keep_index(service: SessionsService) -> None:
    """What this command learnt of the folder, for the next one (a cache: a failure costs time only)."""
    try:
        service.store.save_index()
    except OSError:
        pass


def _run(args: argparse.Namespace, service: SessionsService) -> int:
    if args.action == "list":
        if args.json:
            print_bytes(list_json(service.listing_json()))
            return 0
        listing = service.listing()
        _print_table(listing.sessions, listing.unmanaged, listing.total_bytes)
        return 0
    if args.action == "show":
        entry = service.get(args.id)
        print(json.dumps(entry.to_json(), indent=2)) if args.json else _show(entry)
        return 0
    if args.action == "delete":
        service.delete(args.id)
        print(f"deleted {args.id}")
        return 0
    if args.action in ("pin", "unpin"):
        service.set_pinned(args.id, args.action == "pin")
        print(f"{args.action}ned {args.id}")
        return 0
    if args.action == "verify":
        ids = [args.id] if args.id else [e.id for e in service.listing().sessions]
        bad = 0
        for sid in ids:
            entry = service.verify(sid)
            if entry.problems:
                bad += 1
                print(f"{sid}  CORRUPT  {'; '.join(entry.problems)}")
            else:
                print(f"{sid}  ok")
        return 1 if bad else 0
    if args.action == "prune":
        return _prune(args, service)
    if args.action == "search":
        return _search(args, service)
    return 2


def _prune(args: argparse.Namespace, service: SessionsService) -> int:
    outcome = service.prune(args.budget, dry_run=args.dry_run)
    plan = outcome.plan
    verb = "would delete" if args.dry_run else "deleting"
    for c in plan.delete:
        print(f"{verb} {c.id}  {human_bytes(c.size_bytes):>10}  {c.title}")
    print(f"{'would free' if args.dry_run else 'freed'} {human_bytes(plan.bytes_freed)} "
          f"({plan.bytes_freed} bytes); budget {human_bytes(plan.budget)}")
    if plan.over_budget_after:
        print("still over budget: the rest is pinned or loaded in a slot", file=sys.stderr)
    _print_unmanaged(outcome.unmanaged)
    if outcome.result is None:
        return 0
    for sid, err in outcome.result.failed:
        print(f"could not delete {sid}: {err}", file=sys.stderr)
    return 0 if outcome.result.ok else 1


def _search(args: argparse.Namespace, service: SessionsService) -> int:
    """Exit 0 with results, 1 when nothing matched (like grep)."""
    result: SearchResult = service.search(" ".join(args.words), limit=args.limit)
    if args.json:
        print(json.dumps([h.to_json() for h in result.hits], indent=2, ensure_ascii=False))
        return 0 if result.hits else 1
    if not result.hits:
        print(f"No saved conversation mentions {' '.join(args.words)!r}.")
        return 1
    for hit in result.hits:
        note = "" if hit.complete else "  (title and preview only so far)"
        print(f"{hit.id}  {hit.title[:70]}{note}")
        print(f"    {' '.join(hit.plain().split())}")
    n = result.total
    best = f" (the best {len(result.hits)} shown; --limit N for more)" if n > len(result.hits) else ""
    print(f"{n} conversation{'s' if n != 1 else ''} found{best}; resume one with `slotkeeper serve --resume ID` "
          "or from the app")
    if result.partial:
        print("Some sessions are indexed by title and preview only: their full text is added while a server "
              "of their model runs.", file=sys.stderr)
    return 0
