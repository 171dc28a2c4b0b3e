"""`slotkeeper sessions ...`: the same store as the app, usable with or without a server.

`sessions search` reads the app's search index (repairing it from the folder first when the folder
changed); without a running server of a session's model, a session the index has not seen yet is
found by its title and preview only, which the result marks."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from slotkeeper.cli.output import list_json, print_bytes
from slotkeeper.core.basics.fsutil import atomic_write_text
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model.families import describe_restore_mode
from slotkeeper.core.server.apikey import DoorKeys
from slotkeeper.core.services.running import NotAnswered, ask_transcript_check, running_door
from slotkeeper.core.services.sessions import AmbiguousSessionId, SearchResult, SessionInUse, SessionsService
from slotkeeper.core.services.transcript_check import MISMATCH, TranscriptCheck
from slotkeeper.core.services.use_cases import SESSION_USE_CASES
from slotkeeper.core.sessions.compat import model_file_name, swa_mode
from slotkeeper.core.sessions.entries import SessionEntry, UnmanagedFile
from slotkeeper.core.sessions.folder_lock import LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_SECONDS
from slotkeeper.core.sessions.in_slots import read_in_slots
from slotkeeper.core.sessions.naming import InvalidSessionId
from slotkeeper.core.sessions.search import SearchHit, SearchIndex, SearchUnavailable
from slotkeeper.core.sessions.sidecar import RestoreRecord, Sidecar, SidecarError, parse_utc
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore
from slotkeeper.core.sessions.transcripts import Transcript, TranscriptError, media_label
from slotkeeper.core.settings import SettingsError, load_settings

UNMANAGED_NOTE = ("not Slotkeeper's: they do not count towards the budget and are never deleted "
                  "automatically")
TITLE_WIDTH = 50  # characters of a title in the list (cut with "…")
MODEL_WIDTH = 32  # characters of a model's name in the list (cut in the middle with "…")


def as_argument(session_id: str) -> str:
    """A session id as the last argument of a command line: after ``--`` if it starts with "-"."""
    return f"-- {session_id}" if session_id.startswith("-") else session_id


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an "s" unless there is one: "1 saved conversation", "3 files"."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def cut(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters; a cut one ends with "…"."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def cut_middle(text: str, width: int) -> str:
    """At most ``width`` characters, cut in the middle ("…"): a model's name differs at either end."""
    if len(text) <= width:
        return text
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "…" + text[len(text) - tail:]


def local_time(stamp: str) -> str:
    """A sidecar's UTC timestamp as this machine's local time, to the minute (as written if odd)."""
    try:
        return parse_utc(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def short_model_name(model_path: str) -> str:
    """A model's file name without ".gguf" and its quantization, case kept:
    "/m/Qwen3-8B-Q4_K_M.gguf" -> "Qwen3-8B"."""
    # The cut the model chooser makes (imported here: only the table needs it).
    from slotkeeper.core.model.discovery import model_base_name

    stem = file_stem(model_path)
    base = model_base_name(model_file_name(model_path))  # the same cut, in lower case
    return stem[: len(base)] or stem


def file_stem(model_path: str) -> str:
    name = model_file_name(model_path)
    return name[:-5] if name.lower().endswith(".gguf") else name


def model_labels(sidecars: Iterable[Sidecar]) -> dict[str, str]:
    """model_sha256 -> the model's name in the list: its short name, or where two different
    models (files of other content) would show the same, what tells them apart: their file
    names, and the start of their SHA-256 where the file names are the same too."""
    paths: dict[str, str] = {}
    for sc in sidecars:
        paths.setdefault(sc.model_sha256, sc.model_path)  # the most recent save's path
    by_short: dict[str, list[str]] = {}
    for sha, path in paths.items():
        by_short.setdefault(short_model_name(path), []).append(sha)
    labels: dict[str, str] = {}
    for short, shas in by_short.items():
        if len(shas) == 1:
            labels[shas[0]] = cut_middle(short, MODEL_WIDTH)
            continue
        stems = [file_stem(paths[sha]) for sha in shas]
        for sha, stem in zip(shas, stems):
            if stems.count(stem) == 1:
                labels[sha] = cut_middle(stem, MODEL_WIDTH)
            else:
                labels[sha] = f"{cut_middle(stem, MODEL_WIDTH - 11)} ({sha[:8]})"
    return labels


def restore_words(mode: str) -> str:
    """The restore mode in the list's words (`show` has the full sentence)."""
    return describe_restore_mode(mode).split(" (")[0]


def _print_table(entries: list[SessionEntry], unmanaged: list[UnmanagedFile], total: int) -> None:
    if not entries:
        print("No saved conversations yet." if not unmanaged else "No saved conversations.")
        _print_unmanaged(unmanaged)
        return
    labels = model_labels(e.sidecar for e in entries if e.sidecar is not None)
    rows = [("", "ID", "MODEL", "TOKENS", "SIZE", "LAST USED", "RESTORES", "TITLE")]
    for e in entries:
        s = e.sidecar
        status = "" if e.status == "ok" else "  [CORRUPT]"
        size = human_bytes(e.size_bytes)
        if s is None:
            rows.append((" ", e.id, "?", "?", size, "?", "?", "(unreadable)" + status))
            continue
        rows.append(("*" if s.pinned else " ", e.id, labels[s.model_sha256], f"{s.n_tokens:,}", size,
                     local_time(s.last_used_at), restore_words(s.restore_mode),
                     cut(s.title, TITLE_WIDTH) + status))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    right = {3, 4}  # numbers
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        print(f"{cells[0]} {'  '.join(cells[1:])}  {r[-1]}".rstrip())
    pinned = "  (* = pinned)" if any(e.sidecar is not None and e.sidecar.pinned for e in entries) else ""
    print(f"{plural(len(entries), 'saved conversation')}, {human_bytes(total)} on disk{pinned}")
    _print_unmanaged(unmanaged)


def _print_unmanaged(unmanaged: list[UnmanagedFile] | tuple[UnmanagedFile, ...]) -> None:
    if not unmanaged:
        return
    size = human_bytes(sum(u.size_bytes for u in unmanaged))
    print(f"{plural(len(unmanaged), 'unmanaged file')}, {size}, {UNMANAGED_NOTE}:")
    for u in unmanaged:
        what = human_bytes(u.size_bytes) if u.kind == "file" else u.kind
        print(f"  {u.name!r:<40}  {what}")


def points_text(s: Sidecar) -> str:
    """A conversation's restore points in words: where each starts, and what they take on disk."""
    where = ", ".join(f"{p.n_tokens:,} tokens ({'a prompt' if p.kind == 'prompt' else 'a user message'})"
                      for p in s.points)
    return f"{where}; {human_bytes(sum(p.size_bytes for p in s.points))} of the size"


def _show(entry: SessionEntry, service: SessionsService) -> None:
    """One session for a person to read; every field is in `--json`."""
    s = entry.sidecar
    rows: list[tuple[str, str]] = [("id", entry.id)]
    if s is None:
        print("(a saved conversation whose sidecar cannot be read)")
        rows.append(("size", f"{human_bytes(entry.size_bytes)} on disk"))
    else:
        print(s.title or "(untitled)")
        if s.preview and s.preview != s.title:
            rows.append(("preview", cut(s.preview, 100)))
        rows += [
            ("model", f"{s.model_path} ({s.arch}, sha256 {s.model_sha256[:8]}…)"),
            ("tokens", f"{s.n_tokens:,} of the {s.n_ctx_slot:,} its slot held"
                       + (f", {plural(s.n_media, 'image')}" if s.n_media else "")),
            ("size", f"{human_bytes(entry.size_bytes)} on disk"),
            ("first saved", local_time(s.created_at)),
            ("last used", local_time(s.last_used_at)),
            ("pinned", "yes (kept whatever the budget)" if s.pinned else "no"),
            ("restore", f"{describe_restore_mode(s.restore_mode)}; {swa_mode(s)}"),
            *([("restore points", points_text(s))] if s.points else []),
            ("saved with", f"llama-server {s.llama_build}, {plural(s.n_parallel, 'slot')}, "
                           f"K/V cache {s.cache_type_k}/{s.cache_type_v}, "
                           f"flash attention {'on' if s.flash_attn else 'off'}"
                           + (", unified KV cache" if s.kv_unified else "")),
        ]
        if s.last_restore is not None:
            rows.append(("last restore", _restore_text(s.last_restore)))
        if s.parent:
            rows.append(("continues" if s.continues else "branched from", _parent_text(s.parent, service)))
    rows.append(("status", "ok" if not entry.problems else "CORRUPT"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    for problem in entry.problems:
        print(f"  {'':<{width}}  - {problem}")
    print(f"every field: `slotkeeper sessions show --json {as_argument(entry.id)}`")


def _restore_text(r: RestoreRecord) -> str:
    text = f"{local_time(r.at)} into slot {r.slot}, {r.n_restored:,} tokens"
    if r.effective is not None:
        reused = f", {r.cache_n:,} reused" if r.cache_n is not None else ""
        text += f"{reused} ({'worth it' if r.effective else 'not worth it'})"
    return text


def _parent_text(parent: str, service: SessionsService) -> str:
    try:
        sc = service.get(parent).sidecar
    except (SessionNotFound, InvalidSessionId, OSError):
        return f"{parent} (no longer saved)"
    return f"{parent} ({cut(sc.title, TITLE_WIDTH)})" if sc is not None else parent


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
    except (SessionNotFound, SessionInUse, InvalidSessionId, AmbiguousSessionId, SidecarError, OSError,
            SearchUnavailable, TranscriptError) as exc:
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
    if args.action == "prune":
        return _prune(args, service)
    if args.action == "search":
        return _search(args, service)
    if args.action == "verify" and not args.id:
        return _verify(service, [e.id for e in service.listing().sessions], args.data_dir)
    try:
        sid = service.resolve_id(args.id)
    except AmbiguousSessionId as exc:
        _print_ambiguous(exc, service)
        return 1
    if args.action == "show" and args.transcript:
        return _show_transcript(service, sid, args.json)
    if args.action == "show":
        entry = service.get(sid)
        print(json.dumps(entry.to_json(), indent=2)) if args.json else _show(entry, service)
        return 0
    if args.action == "export":
        return _export(service, sid, args.format, args.output)
    if args.action == "verify":
        return _verify(service, [sid], args.data_dir)
    case = SESSION_USE_CASES.get(args.action)
    if case is None:
        return 2
    title = _title(service, sid)  # said after it too: a deleted session has none any more
    changes = case.run(service, sid)
    for entry in changes.sessions.changed:
        print(f"{case.done} {entry.id}  {cut(entry.sidecar.title if entry.sidecar else '', TITLE_WIDTH)}")
    for gone in changes.sessions.removed:
        print(f"{case.done} {gone}{title}")
    return 0


def _transcript(service: SessionsService, entry: SessionEntry) -> Transcript | None:
    t = service.store.transcript(entry)
    if t is None:
        print(f"slotkeeper: {entry.id} was saved without a transcript (by an older Slotkeeper, or from "
              "requests that were not a conversation): its title and preview are all there is in words",
              file=sys.stderr)
    return t


def _show_transcript(service: SessionsService, sid: str, as_json: bool) -> int:
    t = _transcript(service, service.get(sid))
    if t is None:
        return 1
    if as_json:
        print(json.dumps(t.to_json(), indent=2, ensure_ascii=False))
        return 0
    if t.kind == "text":
        print(f"--- prompt\n{t.prompt}\n--- completion\n{t.completion}")
        return 0
    for m in t.messages:
        print(f"--- {m.role}" + (f" ({m.name})" if m.name else ""))
        if m.reasoning:
            print("  (thinking) " + m.reasoning.replace("\n", "\n  (thinking) "))
        if m.content:
            print(m.content)
        for call in m.tool_calls:
            fn = call.get("function") or {}
            print(f"  [tool call {fn.get('name', '?')}({fn.get('arguments', '')})]")
        for item in m.media:
            print(f"  [{media_label(item)}]")
    return 0


def _export(service: SessionsService, sid: str, fmt: str, output: str | None) -> int:
    entry = service.get(sid)
    t = _transcript(service, entry)
    if t is None:
        return 1
    sc = entry.sidecar
    text = t.to_markdown(sc.title if sc else "") if fmt == "md" else json.dumps(t.to_openai(), indent=2,
                                                                               ensure_ascii=False) + "\n"
    if output is None:
        sys.stdout.write(text)
        return 0
    atomic_write_text(Path(output), text, mode=0o600)
    print(f"wrote {output}")
    return 0


def _verify(service: SessionsService, ids: list[str], data_dir: str | None) -> int:
    bad = 0
    running = _RunningSlotkeeper(data_dir)
    verify = SESSION_USE_CASES["verify"]
    for sid in ids:
        [entry] = verify.run(service, sid).sessions.changed
        if entry.problems:
            bad += 1
            print(f"{sid}  CORRUPT  {'; '.join(entry.problems)}")
            continue
        try:
            transcript = service.store.transcript(entry)
        except TranscriptError as exc:
            print(f"{sid}  ok; its transcript cannot be read: {exc}")
            continue
        if transcript is None:
            print(f"{sid}  ok")
            continue
        said, why_not = running.check(sid)
        if said is not None and said.verdict == MISMATCH:
            bad += 1
            print(f"{sid}  ok, but its transcript does not match: {said.words}")
        elif said is not None:
            print(f"{sid}  ok; transcript: {said.words}")
        else:
            print(f"{sid}  ok; its transcript was not checked ({why_not})")
    return 1 if bad else 0


NOT_SERVING = "only Slotkeeper serving its model can render it: start it"


class _RunningSlotkeeper:
    """The Slotkeeper running on this data folder, asked through its front door as any client asks
    (with the key the settings or LLAMA_API_KEY give) to check transcripts: only a server of a
    session's model can render and tokenize one, as the door reads requests."""

    def __init__(self, data_dir: str | None) -> None:
        paths = app_paths(data_dir)
        self.url = running_door(paths.door_file)
        self.key: str | None = None
        if self.url is not None:
            try:
                self.key = DoorKeys(load_settings(paths.settings_file).profile.extra_args).first()
            except (OSError, SettingsError):
                self.key = DoorKeys(()).first()

    def check(self, session_id: str) -> tuple[TranscriptCheck | None, str]:
        """The check, or None and why it was not made."""
        if self.url is None:
            return None, NOT_SERVING
        try:
            check = ask_transcript_check(self.url, self.key, session_id)
        except NotAnswered as exc:
            return None, str(exc)
        return check, "" if check is not None else NOT_SERVING


def _title(service: SessionsService, sid: str) -> str:
    """"  TITLE" of a session, or "" when its sidecar cannot be read (it can still be deleted)."""
    try:
        sc = service.get(sid).sidecar
    except (SessionNotFound, SidecarError, OSError):
        return ""
    return f"  {cut(sc.title, TITLE_WIDTH)}" if sc is not None else ""


def _print_ambiguous(exc: AmbiguousSessionId, service: SessionsService) -> None:
    """Which sessions the start of an id could mean, with their titles, on stderr."""
    if not exc.candidates:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return
    print(f"slotkeeper: {exc.prefix!r} could be any of {plural(len(exc.candidates), 'saved conversation')}; "
          "give more of the id:", file=sys.stderr)
    for sid in exc.candidates:
        print(f"  {sid}{_title(service, sid)}", file=sys.stderr)


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


def hit_json(hit: SearchHit) -> dict:
    """A search result in `search --json`: each matched word once (a passage often has the same
    word twice: asked, then answered), first spelling first."""
    data = hit.to_json()
    seen: dict[str, str] = {}
    for word in data["matches"]:
        seen.setdefault(word.casefold(), word)
    data["matches"] = list(seen.values())
    return data


def _search(args: argparse.Namespace, service: SessionsService) -> int:
    """Exit 0 with results, 1 when nothing matched (like grep)."""
    result: SearchResult = service.search(" ".join(args.words), limit=args.limit)
    if args.json:
        print(json.dumps([hit_json(h) for h in result.hits], indent=2, ensure_ascii=False))
        return 0 if result.hits else 1
    if not result.hits:
        print(f"No saved conversation mentions {' '.join(args.words)!r}.")
        return 1
    for hit in result.hits:
        note = "" if hit.complete else "  (title and preview only so far)"
        print(f"{hit.id}  {cut(hit.title, 70)}{note}")
        print(f"    {' '.join(hit.plain().split())}")
    n = result.total
    best = f" (the best {len(result.hits)} shown; --limit N for more)" if n > len(result.hits) else ""
    print(f"{n} conversation{'s' if n != 1 else ''} found{best}; resume one with `slotkeeper serve --resume "
          "ID` or from the app")
    if result.partial:
        print("Some conversations are indexed by title and preview only: their full text is added while a "
              "server of their model runs.", file=sys.stderr)
    return 0
