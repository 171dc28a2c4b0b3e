"""`slotkeeper sessions ...`: the same store as the app, usable with or without a server."""

from __future__ import annotations

import argparse
import json
import sys

from slotkeeper.core.paths import app_paths
from slotkeeper.core.sessions import pruner
from slotkeeper.core.sessions.sidecar import SidecarError
from slotkeeper.core.sessions.store import SessionEntry, SessionNotFound, SessionStore
from slotkeeper.core.settings import SettingsError, load_settings
from slotkeeper.core.units import human_bytes


def _swa_mode(entry: SessionEntry) -> str:
    s = entry.sidecar
    if s is None:
        return "?"
    if not s.swa:
        return "full attention"
    return "sliding window + swa-full" if s.swa_full else "sliding window"


def _print_table(entries: list[SessionEntry], unmanaged_count: int, total: int) -> None:
    if not entries:
        print("No saved sessions.")
    for e in entries:
        s = e.sidecar
        flag = "*" if s and s.pinned else " "
        status = "" if e.status == "ok" else "  [CORRUPT]"
        if s is None:
            print(f"{flag} {e.id:<12}  {'?':>8}  {human_bytes(e.size_bytes):>10}  (unreadable){status}")
            continue
        print(f"{flag} {e.id:<12}  {s.n_tokens:>8}  {human_bytes(s.size_bytes):>10}  {s.last_used_at[:19]}  "
              f"{_swa_mode(e):<26}  {s.title[:50]}{status}")
    extra = f", {unmanaged_count} unmanaged file(s)" if unmanaged_count else ""
    print(f"{len(entries)} session(s), {human_bytes(total)} on disk{extra}  (* = pinned)")


def _show(entry: SessionEntry) -> None:
    data = entry.to_json()
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        print(f"{key:<{width}}  {value}")


def run_sessions_command(args: argparse.Namespace) -> int:
    paths = app_paths(args.data_dir).ensure()
    store = SessionStore(paths.sessions_dir)
    try:
        if args.action == "list":
            listing = store.listing()
            if args.json:
                print(json.dumps([e.to_json() for e in listing.sessions], indent=2))
            else:
                _print_table(listing.sessions, len(listing.unmanaged), listing.total_bytes)
            return 0
        if args.action == "show":
            entry = store.get(args.id)
            print(json.dumps(entry.to_json(), indent=2)) if args.json else _show(entry)
            return 0
        if args.action == "delete":
            from slotkeeper.core.engine import sessions_in_running_slots

            if args.id in sessions_in_running_slots(paths):
                print(f"slotkeeper: {args.id} is loaded in a slot of the running server; it can be deleted "
                      "once another conversation replaces it", file=sys.stderr)
                return 1
            store.delete(args.id)
            print(f"deleted {args.id}")
            return 0
        if args.action in ("pin", "unpin"):
            store.set_pinned(args.id, args.action == "pin")
            print(f"{args.action}ned {args.id}")
            return 0
        if args.action == "verify":
            ids = [args.id] if args.id else [e.id for e in store.sessions()]
            bad = 0
            for sid in ids:
                entry = store.verify(sid)
                if entry.problems:
                    bad += 1
                    print(f"{sid}  CORRUPT  {'; '.join(entry.problems)}")
                else:
                    print(f"{sid}  ok")
            return 1 if bad else 0
        if args.action == "prune":
            return _prune(args, paths, store)
    except SessionNotFound as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 1
    except (SidecarError, OSError) as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 1
    except SettingsError as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2
    return 2


def _prune(args: argparse.Namespace, paths, store: SessionStore) -> int:
    budget = args.budget if args.budget is not None else load_settings(paths.settings_file).budget_bytes
    listing = store.listing()
    cands = [pruner.PruneCandidate.from_sidecar(e.sidecar) for e in listing.sessions if e.sidecar]
    from slotkeeper.core.engine import sessions_in_running_slots

    in_slots = sessions_in_running_slots(paths)
    plan = pruner.plan(cands, budget, protected_ids=in_slots, unmanaged_bytes=listing.unmanaged_bytes)
    verb = "would delete" if args.dry_run else "deleting"
    for c in plan.delete:
        print(f"{verb} {c.id}  {human_bytes(c.size_bytes):>10}  {c.title}")
    print(f"{'would free' if args.dry_run else 'freed'} {human_bytes(plan.bytes_freed)} "
          f"({plan.bytes_freed} bytes); budget {human_bytes(budget)}")
    if plan.over_budget_after:
        print("still over budget: the rest is pinned or unmanaged", file=sys.stderr)
    if args.dry_run:
        return 0
    result = pruner.apply(plan, store.delete)
    for sid, err in result.failed:
        print(f"could not delete {sid}: {err}", file=sys.stderr)
    return 0 if result.ok else 1
