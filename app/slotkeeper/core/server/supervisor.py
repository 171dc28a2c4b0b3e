"""Runs llama-server as a supervised child: visible states, health wait, graceful stop, restarts.

States: STOPPED -> STARTING -> READY; a crash goes CRASHED -> RESTARTING -> STARTING (under the
restart policy) or FAILED (limit reached, or the server could not start). Only processes this
app started are ever signalled: a pid is trusted only when its start time matches the one we
recorded in the state file.

Commands down, events up: whoever plans a launch says so (``preparing``), then hands the
supervisor the launch (``launch``, or ``fail`` when it cannot be planned); a crash restarts that
same launch, and a start-up that ends with the exit code the launch names runs its fallback
(``LaunchFellBack``). The supervisor owns its state machine and never asks anyone above it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from slotkeeper.core.basics.ports import port_in_use
from slotkeeper.core.events import EventBus, LaunchFellBack, ServerAdopted, ServerLoading, ServerStateChanged
from slotkeeper.core.server import logfile
from slotkeeper.core.server.restart import RestartPolicy
from slotkeeper.core.server.spawn import spawn_server, write_state_file
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import connect_url

__all__ = ["LaunchSpec", "PortInUse", "ServerState", "Supervisor", "SupervisorError", "port_user"]

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_SECONDS = 300.0  # without any answer; while /health says "loading" we keep waiting
# /health is polled often at first (a small model is ready in tens of milliseconds) and less as
# loading goes on: the wait past readiness stays under HEALTH_POLL_SHARE of the load time, and at
# most HEALTH_POLL_SECONDS (a refused connection or a 503 costs both sides next to nothing).
HEALTH_POLL_SECONDS = 0.1
HEALTH_POLL_MIN_SECONDS = 0.005
HEALTH_POLL_SHARE = 0.05
STOP_GRACE_SECONDS = 10.0
LOG_TAIL_ON_FAILURE = 20


class SupervisorError(Exception):
    """Why the server could not be started; safe to show a person."""


class PortInUse(SupervisorError):
    pass


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    host: str
    port: int
    env: dict[str, str] | None = None
    # Kept in the state file, so a later run can tell what a server left running holds (no secrets).
    record: dict[str, Any] | None = None
    # (exit code, launch): when llama-server ends with that code during start-up, that launch is run
    # instead (said with ``LaunchFellBack``).
    fallback: tuple[int, LaunchSpec] | None = None

    @property
    def base_url(self) -> str:
        return connect_url(self.host, self.port)


# What a signal that ended llama-server usually means, in words.
_SIGNAL_WORDS = {
    "SIGKILL": "was killed (SIGKILL: the system ran out of memory, or another program killed it)",
    "SIGSEGV": "crashed (SIGSEGV, a segmentation fault)",
    "SIGABRT": "aborted (SIGABRT: llama-server stopped itself on an error; its log says why)",
    "SIGTERM": "was asked to stop by another program (SIGTERM)",
    "SIGBUS": "crashed (SIGBUS: a file it had mapped, such as the model, changed or went away)",
    "SIGILL": "crashed (SIGILL: this build uses processor instructions this machine lacks)",
}
# Windows NTSTATUS codes llama-server ends with most often.
_WINDOWS_CODES = {
    0xC0000005: "crashed (an access violation)",
    0xC000001D: "crashed (an illegal instruction: this build uses processor instructions this machine lacks)",
    0xC0000409: "aborted (a fatal error inside llama-server; its log says why)",
    0xC0000017: "ran out of memory",
}


# How an adopted llama-server ended is not known: it is not our child, so its exit status is
# its parent's to read (never a signal number, which would name a signal it did not get).
EXIT_NOT_KNOWN = -(1 << 30)


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: "was killed (SIGKILL: ...)" rather than "code -9"."""
    if code is None:
        return "stopped"
    if code == EXIT_NOT_KNOWN:
        return ("ended (how is not known: an earlier Slotkeeper started it, so its exit status is not ours "
                "to read)")
    if code == 0:
        return "exited without an error"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"was stopped by signal {-code}"
        return _SIGNAL_WORDS.get(name, f"was stopped by signal {-code} ({name})")
    if code in _WINDOWS_CODES or (code & 0xFFFFFFFF) in _WINDOWS_CODES:
        return _WINDOWS_CODES[code & 0xFFFFFFFF]
    return f"exited with error code {code}"


def port_user(host: str, port: int) -> str | None:
    """None when ``host:port`` is free; else a description of who holds it (best effort)."""
    try:
        if not port_in_use(host, port):  # the strict rule, whatever this platform's bind allows
            return None
    except OSError as exc:  # not the port: the address (not this machine's, say)
        return f"cannot use {host or '0.0.0.0'}:{port}: {exc.strerror or exc}"
    who = "another program"
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                try:
                    who = f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
                except psutil.Error:
                    who = f"pid {conn.pid}"
                break
    except (psutil.Error, OSError):
        pass
    return who


class _Child:
    """A process we started (Popen) or adopted (psutil); same small interface for both."""

    def __init__(self, popen: subprocess.Popen | None, proc: psutil.Process) -> None:
        self.popen = popen
        self.proc = proc
        self.pid = proc.pid
        self.create_time = proc.create_time()

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        try:
            if self.proc.status() == psutil.STATUS_ZOMBIE:
                return EXIT_NOT_KNOWN
            return None if self.proc.is_running() else EXIT_NOT_KNOWN
        except psutil.NoSuchProcess:
            return EXIT_NOT_KNOWN

    def wait(self, timeout: float | None) -> int | None:
        try:
            if self.popen is not None:
                return self.popen.wait(timeout)
            code = self.proc.wait(timeout)
            # psutil returns None for a process that is not our child once it has gone.
            return EXIT_NOT_KNOWN if code is None else code
        except (subprocess.TimeoutExpired, psutil.TimeoutExpired):
            return None
        except psutil.NoSuchProcess:
            return EXIT_NOT_KNOWN

    def signal_group(self, sig: int) -> None:
        if sys.platform == "win32":
            procs = [self.proc, *self._children()]
            for p in procs:
                try:
                    p.kill() if sig == getattr(signal, "SIGKILL", 9) else p.terminate()
                except psutil.Error:
                    pass
            return
        try:
            os.killpg(self.pid, sig)  # started with start_new_session: pgid == pid
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(self.pid, sig)

    def _children(self) -> list[psutil.Process]:
        try:
            return self.proc.children(recursive=True)
        except psutil.Error:
            return []


class Supervisor:
    def __init__(
        self,
        log_path: Path,
        state_file: Path,
        events: EventBus | None = None,
        policy: RestartPolicy | None = None,
        health_timeout: float = HEALTH_TIMEOUT_SECONDS,
        stop_grace: float = STOP_GRACE_SECONDS,
    ) -> None:
        self.log_path = log_path
        self.state_file = state_file
        self.events = events or EventBus()
        self.policy = policy or RestartPolicy()
        self.health_timeout = health_timeout
        self.stop_grace = stop_grace
        self._lock = threading.RLock()
        self._state = ServerState.STOPPED
        self._message = ""
        self._child: _Child | None = None
        self._spec: LaunchSpec | None = None
        self._first_child: subprocess.Popen | None = None  # the launch already running (a head start)
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self.tailer: logfile.LogTailer | None = None
        self._log_listeners: list[Callable[[str], None]] = []
        self.started_at: float | None = None
        self.adopted = False
        self.last_exit_code: int | None = None

    # -- observable state -----------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """A stop was asked for since the last start (a launch under way gives up)."""
        return self._stop_requested.is_set()

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def message(self) -> str:
        return self._message

    @property
    def spec(self) -> LaunchSpec | None:
        return self._spec

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    def add_log_listener(self, fn: Callable[[str], None]) -> None:
        self._log_listeners.append(fn)
        if self.tailer:
            self.tailer.add_listener(fn)

    def remove_log_listener(self, fn: Callable[[str], None]) -> None:
        if fn in self._log_listeners:
            self._log_listeners.remove(fn)
        if self.tailer:
            self.tailer.remove_listener(fn)

    def log_tail(self, n: int = LOG_TAIL_ON_FAILURE) -> list[str]:
        if self.tailer:
            self.tailer.poll()  # catch up first: a server that just exited wrote its last words now
            return self.tailer.lines(n)
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
        except OSError:
            return []

    def _set_state(self, state: ServerState, message: str = "", log_tail: Sequence[str] = (),
                   pid: int | None = None, delay: float | None = None) -> None:
        with self._lock:
            self._state = state
            self._message = message
        if state is ServerState.READY and message:
            # Its own address answers only Slotkeeper (a private port and key): the address clients
            # use is the front door's, said when the launch is ready.
            log.info("llama-server ready on its private address %s (Slotkeeper's own: clients use "
                     "Slotkeeper's address)", message)
        else:
            log.info("server %s%s", state.value, f": {message}" if message else "")
        self.events.emit(ServerStateChanged(state, message, tuple(log_tail), pid, delay))

    # -- lifecycle ------------------------------------------------------------------------
    def preparing(self, message: str = "preparing") -> bool:
        """A launch is being planned (STARTING, ``message``); False when the server runs or starts
        already. A message said again while preparing says how the planning goes on."""
        with self._lock:
            if self._thread and self._thread.is_alive():
                return False
            if self._state in (ServerState.READY, ServerState.RESTARTING):
                return False
            if self._state is not ServerState.STARTING:
                self._stop_requested.clear()
                self.policy.reset()
            self._set_state(ServerState.STARTING, message)
            return True

    def launch(self, spec: LaunchSpec, child: subprocess.Popen | None = None) -> None:
        """Run ``spec`` in the background (after ``preparing``; a crash restarts it); watch ``state``
        and the events. ``child``: llama-server already started for it (by ``spawn_server``). Nothing
        starts when a stop came since ``preparing``."""
        with self._lock:
            if self._thread and self._thread.is_alive():
                return
            if self._stop_requested.is_set() or self._state is not ServerState.STARTING:
                if child is not None:
                    child.kill()
                    child.wait()
                return
            self._spec = spec
            self._first_child = child
            self._thread = threading.Thread(target=self._run, name="llama-supervisor", daemon=True)
            self._thread.start()

    def start(self, spec: LaunchSpec, child: subprocess.Popen | None = None) -> None:
        """``preparing`` and ``launch`` at once: a launch planned already."""
        if self.preparing():
            self.launch(spec, child)

    def fail(self, message: str) -> None:
        """The launch being prepared cannot run (``message`` says why, to a person)."""
        with self._lock:
            if self._state is not ServerState.STARTING or self._stop_requested.is_set():
                return
            if self._thread and self._thread.is_alive():
                return
            self._set_state(ServerState.FAILED, message, log_tail=self.log_tail())

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server we started (terminate, then kill after the grace period)."""
        with self._lock:  # the launch checks the flag under this lock: no child starts after it
            self._stop_requested.set()
            child = self._child
            if self._state in (ServerState.STOPPED, ServerState.FAILED) and child is None:
                return
            self._set_state(ServerState.STOPPING, "stopping")
        grace = self.stop_grace if timeout is None else timeout
        if child is not None:
            self._terminate(child, grace)
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=grace + 5)
        with self._lock:
            late, self._child = self._child, None
        if late is not None and late is not child:
            self._terminate(late, grace)
        with self._lock:
            if self._state != ServerState.FAILED:
                self._set_state(ServerState.STOPPED, "stopped")
        self._clear_state_file()
        if self.tailer:
            self.tailer.stop()

    def _terminate(self, child: _Child, grace: float) -> None:
        if child.poll() is not None:
            return
        child.signal_group(signal.SIGTERM)
        if child.wait(grace) is None:
            log.warning("llama-server did not stop within %.0f s; killing it", grace)
            child.signal_group(getattr(signal, "SIGKILL", signal.SIGTERM))
            child.wait(5)

    # -- the supervising thread -----------------------------------------------------------
    def _run(self) -> None:
        try:
            self._run_inner()
        except Exception as exc:  # never die silently: the state says what happened
            log.exception("supervisor failed")
            self._set_state(ServerState.FAILED, f"unexpected error: {exc}")

    def _run_inner(self) -> None:
        while not self._stop_requested.is_set():
            try:
                if not self._launch_or_adopt():
                    return
                self._wait_healthy()
            except SupervisorError as exc:
                self._kill_quietly()
                code, self.last_exit_code = self.last_exit_code, None
                fallback = self._spec.fallback if self._spec is not None else None
                if code is not None and fallback is not None and fallback[0] == code:
                    self._spec = fallback[1]
                    self.events.emit(LaunchFellBack(code, self._spec.argv))
                    continue
                self._set_state(ServerState.FAILED, str(exc), log_tail=self.log_tail())
                return
            if self._stop_requested.is_set():
                return
            self.started_at = time.time()
            self._set_state(ServerState.READY, self._spec.base_url if self._spec else "")
            code = self._watch()
            if self._stop_requested.is_set():
                return
            self.last_exit_code = code
            tail = self.log_tail()
            self._set_state(ServerState.CRASHED, f"llama-server {describe_exit(code)}", log_tail=tail)
            self._clear_state_file()
            decision = self.policy.on_crash()
            if not decision.restart:
                self._set_state(ServerState.FAILED, decision.reason, log_tail=tail)
                return
            self._set_state(
                ServerState.RESTARTING,
                f"{decision.reason}, in {decision.delay_seconds:g} s",
                delay=decision.delay_seconds,
            )
            if self._stop_requested.wait(decision.delay_seconds):
                return
            self._set_state(ServerState.STARTING, "restarting after a crash")

    def _watch(self) -> int:
        child = self._child
        assert child is not None
        while True:
            code = child.wait(0.25)
            if code is not None:
                return code
            if self._stop_requested.is_set():
                return 0

    def _kill_quietly(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            self._terminate(child, 3)
        self._clear_state_file()

    def _launch_or_adopt(self) -> bool:
        spec = self._spec
        assert spec is not None
        started, self._first_child = self._first_child, None
        if started is None:
            if self._try_adopt(spec):
                return True
            who = port_user(spec.host, spec.port)
            if who is not None:
                raise PortInUse(
                    f"Port {spec.port} on {spec.host} is already in use by {who}. "
                    "Choose another port in Settings (or --port); Slotkeeper does not stop programs it did "
                    "not start."
                )
        try:
            with self._lock:
                if self._stop_requested.is_set():
                    if started is not None:
                        started.kill()
                        started.wait()
                    return False  # stopped while preparing: never start a server nobody wants
                popen = started or spawn_server(spec.argv, spec.env, self.log_path)
                self._child = _Child(popen, psutil.Process(popen.pid))
        except OSError as exc:
            raise SupervisorError(f"could not run {spec.argv[0]}: {exc.strerror or exc}") from exc
        self._start_tailer(from_end=False)  # the log was rotated before the spawn: all of it is this run's
        self.adopted = False
        self._write_state_file(spec)
        self._set_state(ServerState.STARTING, "loading the model", pid=popen.pid)
        return True

    def _start_tailer(self, from_end: bool) -> None:
        if self.tailer:
            self.tailer.stop()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch(exist_ok=True)
        self.tailer = logfile.LogTailer(self.log_path, start_at_end=from_end)
        for fn in self._log_listeners:
            self.tailer.add_listener(fn)
        self.tailer.start()

    def _wait_healthy(self) -> None:
        spec = self._spec
        child = self._child
        assert spec is not None and child is not None
        deadline = time.monotonic() + self.health_timeout
        started = time.monotonic()
        last_report = 0.0
        # imported here: llama-server starts sooner
        from slotkeeper.core.server.client import LlamaClient, ServerUnavailable

        with LlamaClient(spec.base_url, timeout=2.0) as client:
            while True:
                if self._stop_requested.is_set():
                    return
                code = child.poll()
                if code is not None:
                    self.last_exit_code = code
                    tail = self.log_tail(LOG_TAIL_ON_FAILURE)
                    raise SupervisorError(
                        f"llama-server {describe_exit(code)} during start-up. "
                        + _explain_startup_failure(tail)
                    )
                try:
                    health = client.health()
                except ServerUnavailable:
                    health = None
                if health is not None and health.ok:
                    return
                now = time.monotonic()
                if health is not None and health.loading:
                    # 503 "loading": the server is alive and reading the model; a big model on a
                    # slow disk may take longer than the timeout, which is for a server that never answers.
                    deadline = now + self.health_timeout
                if now > deadline:
                    raise SupervisorError(
                        f"llama-server did not become ready within {self.health_timeout:.0f} s"
                    )
                if now - last_report >= 0.5:
                    last_report = now
                    lines = self.log_tail(1)
                    self.events.emit(ServerLoading(now - started, lines[-1] if lines else ""))
                time.sleep(health_poll_interval(now - started))

    # -- the state file: recognising a server we left running -----------------------------
    def _write_state_file(self, spec: LaunchSpec) -> None:
        child = self._child
        assert child is not None
        write_state_file(self.state_file, child.pid, child.create_time, spec.argv, spec.host, spec.port,
                         spec.record)

    def _clear_state_file(self) -> None:
        clear_record(self.state_file)

    def leftover_port(self, ours: int | None = None) -> int | None:
        """The port of a server an earlier run left running (still alive), if any. ``ours``: the
        pid of the server this process's head start began, which is not a leftover."""
        found = recorded_server(self.state_file)
        if found is None or found[0].pid == ours:
            return None
        try:
            return int(found[1]["port"])
        except (KeyError, TypeError, ValueError):
            return None

    def leftover_to_replace(self, spec: LaunchSpec) -> dict[str, Any] | None:
        """What an earlier run recorded of the server it left running (Slotkeeper was killed), when
        launching ``spec`` will stop it: the chance to save its conversations first. None when there
        is none, or it will be adopted, or it holds no conversation (a head start nobody took)."""
        found = recorded_server(self.state_file)
        if found is None:
            return None
        early, adoptable = leftover_fits(found[1], spec)
        return None if early or adoptable else found[1]

    def _try_adopt(self, spec: LaunchSpec) -> bool:
        found = recorded_server(self.state_file)
        if found is None:
            return False
        proc, data = found
        child = _Child(None, proc)
        early, adoptable = leftover_fits(data, spec)
        if adoptable:
            with self._lock:
                if self._stop_requested.is_set():
                    return False
                self._child = child
            self.adopted = True
            self._start_tailer(from_end=True)
            log.info("adopted llama-server pid %s left running by an earlier session", proc.pid)
            self.events.emit(ServerAdopted(proc.pid))
            return True
        log.info("stopping llama-server pid %s left by an earlier session (%s)", proc.pid,
                 "started early and never taken over" if early else "settings changed")
        self._set_state(ServerState.STARTING, "stopping a server left by an earlier session")
        self._terminate(child, self.stop_grace)
        self._clear_state_file()
        return False


def clear_record(state_file: Path) -> None:
    try:
        state_file.unlink()
    except FileNotFoundError:
        pass


def recorded_server(state_file: Path) -> tuple[psutil.Process, dict] | None:
    """The llama-server the state file records, with what it records, while that very process
    runs (its pid and start time match); else None, and the record is cleared."""
    try:
        data = json.loads(state_file.read_text(encoding="utf-8"))
        pid, ctime = int(data["pid"]), float(data["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        clear_record(state_file)
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - ctime) > 0.01 or not proc.is_running():
            raise psutil.NoSuchProcess(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            raise psutil.NoSuchProcess(pid)
    except psutil.Error:
        clear_record(state_file)  # gone, or the pid now belongs to someone else
        return None
    return proc, data


def leftover_fits(data: dict[str, Any], spec: LaunchSpec) -> tuple[bool, bool]:
    """Of a server an earlier run left (``data``, its record): (started early by a head start, runs
    ``spec`` and answers healthy)."""
    # Started early by a head start nobody took over: it holds no conversation, and a launch of
    # our own restores the saved ones (an adopted server's slots are taken as they are).
    early = bool(data.get("early"))
    if early or list(data.get("argv", [])) != list(spec.argv):
        return early, False
    from slotkeeper.core.server.client import LlamaClient, ServerUnavailable

    try:
        with LlamaClient(spec.base_url, timeout=2.0) as client:
            return False, client.health().ok
    except ServerUnavailable:
        return False, False


def health_poll_interval(elapsed: float) -> float:
    """Seconds until the next /health poll, ``elapsed`` seconds into a launch."""
    return min(HEALTH_POLL_SECONDS, max(HEALTH_POLL_MIN_SECONDS, elapsed * HEALTH_POLL_SHARE))


def _explain_startup_failure(tail: list[str]) -> str:
    text = "\n".join(tail)
    low = text.lower()
    hints = [
        ("failed to load model", "The model file could not be loaded (is it a valid GGUF?)."),
        ("invalid magic", "The model file is not a GGUF file."),
        ("couldn't bind", "The port could not be bound."),
        ("address already in use", "The port is already in use."),
        ("error while loading shared libraries", "The llama-server binary is missing libraries."),
        ("out of memory", "Not enough memory for this model and context size."),
        ("failed to allocate", "Not enough memory for this model and context size."),
    ]
    for needle, hint in hints:
        if needle in low:
            return f"{hint}\nLast log lines:\n{text}"
    return f"Last log lines:\n{text}" if text else "It printed nothing."
