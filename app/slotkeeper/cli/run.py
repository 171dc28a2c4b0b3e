"""`slotkeeper serve` and the desktop app: this run's settings (the saved ones with the command
line's overrides), the headless engine loop with its signals and log, and the GUI's start."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("slotkeeper")


def run_overrides(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """This run's command-line settings, by dotted name (never written to the settings file)."""
    from slotkeeper.core.engine import DEMO_MODEL

    out: dict[str, Any] = {}
    if getattr(args, "demo", False):
        out["profile.model_path"] = DEMO_MODEL
    elif getattr(args, "model", None):
        out["profile.model_path"] = args.model
    if getattr(args, "mmproj", None):
        out["profile.mmproj_path"] = args.mmproj
    for name in ("server_bin", "host", "port", "ctx", "parallel", "flash_attn", "cache_type_k",
                 "cache_type_v", "swa_full"):
        if getattr(args, name, None) is not None:
            value = getattr(args, name)
            out[f"profile.{name}"] = None if value == "auto" else value
    if extra:
        out["profile.extra_args"] = tuple(extra)
    for arg, name in (("idle_save", "idle_save_seconds"), ("restore", "restore_on_start"),
                      ("budget", "budget_bytes")):
        if getattr(args, arg, None) is not None:
            out[name] = getattr(args, arg)
    return out


def load_run_settings(args: argparse.Namespace, extra: list[str]):
    """The folders, the settings service (saved settings + this run's overrides) and this run's settings."""
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.services.settings import SettingsService

    paths = app_paths(args.data_dir).ensure()
    service = SettingsService(paths.settings_file, run_overrides(args, extra))
    return paths, service, service.effective()


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    """Headless: the engine loop runs on this thread until SIGINT/SIGTERM, then saves and stops."""
    from slotkeeper.core.engine import prelaunch

    paths, _service, settings = load_run_settings(args, extra)
    # llama-server loads the model while the rest of Slotkeeper is imported and built.
    pre = prelaunch(paths, settings, getattr(args, "command_line", None))

    import asyncio

    from slotkeeper.core import events as ev
    from slotkeeper.core.basics import session_end
    from slotkeeper.core.engine import Engine, EngineError
    from slotkeeper.core.server.command import is_loopback
    from slotkeeper.core.server.state import ServerState

    try:
        engine = Engine(paths, settings, own_thread=False, prelaunched=pre)
    except BaseException as exc:
        if pre is not None:  # never leave the server it started behind
            pre.abandon()
        if isinstance(exc, EngineError):
            print(f"slotkeeper: {exc}", file=sys.stderr)
            return 1
        raise
    engine.events.subscribe(ServeLog().on_event)  # the demo's notice among them, once

    async def main() -> int:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        closing: asyncio.Future | None = None
        exit_code = 0
        signals = 0

        def on_state(event: ev.ServerStateChanged) -> None:  # any thread
            nonlocal exit_code
            if event.state is ServerState.FAILED:
                print(f"slotkeeper: llama-server failed: {event.message}", file=sys.stderr, flush=True)
                exit_code = 1
                loop.call_soon_threadsafe(done.set)

        def on_ready(event: ev.EngineReady) -> None:
            if event.restored:
                tokens = sum(r.n_restored for r in event.restored)
                log.info("restored %d conversation(s), %d tokens", len(event.restored), tokens)
            profile = engine.running_profile
            where = "" if is_loopback(profile.host) else (
                f" (listening on {profile.host} port {profile.port}: other machines can reach it)")
            print(f"ready {event.url}{where}", flush=True)

        def on_signal(signum: int) -> None:  # on the loop
            stop_requested(signal.Signals(signum).name)

        def stop_requested(name: str) -> None:  # on the loop
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info("received %s; saving the conversations and stopping (%s again: stop without saving)",
                         name, name)
                done.set()
            else:
                log.warning("received %s again; stopping without waiting for the saves", name)
                if closing is not None:
                    closing.cancel()

        engine.events.subscribe(on_state, ev.ServerStateChanged)
        engine.events.subscribe(on_ready, ev.EngineReady)
        restore_signals = _on_signals(loop, on_signal)
        stopped = threading.Event()  # the saves are done: a closing console may go

        def on_console_end(why: str) -> None:  # Windows' handler thread
            loop.call_soon_threadsafe(stop_requested, why)

        undo_console = session_end.on_console_end(on_console_end, stopped)
        try:
            try:
                await engine.start_async(resume_id=args.resume)
            except EngineError as exc:
                print(f"slotkeeper: {exc}", file=sys.stderr, flush=True)
                exit_code = 1
                done.set()
            await done.wait()
        finally:
            closing = asyncio.ensure_future(engine.close_async())
            try:
                report = await closing
                if not report.ok:
                    print(f"slotkeeper: {len(report.unsaved)} conversation(s) could not be saved before "
                          "stopping (see the messages above)", file=sys.stderr, flush=True)
                    exit_code = 1
            except asyncio.CancelledError:
                print("slotkeeper: stopped without saving every conversation", file=sys.stderr, flush=True)
                exit_code = 1
            except Exception:  # the server must not outlive us, whatever went wrong while saving
                log.exception("saving before shutdown failed")
                exit_code = 1
            finally:
                await loop.run_in_executor(None, engine.stop_server_now)
                restore_signals()
                stopped.set()
                undo_console()
        return exit_code

    return engine.run(main())


def _on_signals(loop, handler: Callable[[int], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM (and Windows' SIGBREAK, Ctrl+Break) call ``handler(signum)`` on the loop; returns
    a function that undoes it."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    if sys.platform == "win32":
        sigs.append(signal.SIGBREAK)
    try:
        for sig in sigs:
            loop.add_signal_handler(sig, handler, sig)
    except (NotImplementedError, RuntimeError):  # Windows: Python handlers, which post to the loop
        previous = {sig: signal.signal(sig, lambda n, _f: loop.call_soon_threadsafe(handler, n))
                    for sig in sigs}

        def restore_handlers() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore_handlers

    def remove_handlers() -> None:
        for sig in sigs:
            loop.remove_signal_handler(sig)

    return remove_handlers


class ServeLog:
    """What `serve` writes to its log for each engine event: every action Slotkeeper takes, in the
    words of the app's activity list (``core.journal``), plus the model's loading progress (and the
    starter model's download, and the model's hashing)."""

    LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

    def __init__(self) -> None:
        self._loading_reported = 0

    def on_event(self, event) -> None:
        from slotkeeper.core import events as ev
        from slotkeeper.core.journal import journal_entry
        from slotkeeper.core.server.state import ServerState
        from slotkeeper.core.views import BYTE_ACTIVITIES

        match event:
            case ev.ServerLoading(elapsed=elapsed, detail=detail):
                step = int(elapsed // 5)
                if step > self._loading_reported:
                    self._loading_reported = step
                    log.info("loading the model (%.0f s): %s", elapsed, detail[-100:])
                return
            case ev.ActivityChanged(activity=a) if a.activity in BYTE_ACTIVITIES and a.total:
                log.info("%s", a.describe())  # "Downloading the starter model: 40% of 93.8 MiB"
                return
            case ev.ServerStateChanged(state=state) if state is ServerState.FAILED:
                return  # serve says it on its own, and exits
            case ev.EngineReady():
                return  # "ready URL" goes to stdout
        entry = journal_entry(event)
        if entry is not None:
            log.log(self.LEVELS[entry.level], "%s", entry.text)


def cmd_gui(args: argparse.Namespace, extra: list[str]) -> int:
    """The desktop app; the same options as serve override the saved settings for this run."""
    paths, service, settings = load_run_settings(args, extra)
    if (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")):
        print("slotkeeper: no display to open the desktop app on (DISPLAY and WAYLAND_DISPLAY are unset). "
              "`slotkeeper serve` runs without one.", file=sys.stderr)
        return 1
    start_now = bool(args.model or args.demo)
    pre = None
    if (start_now or settings.start_server_on_launch) and settings.profile.model_path:
        from slotkeeper.core.engine import prelaunch

        # The model loads while Qt starts; the app's engine takes the launch over.
        pre = prelaunch(paths, settings, getattr(args, "command_line", None))
    try:
        from slotkeeper.gui.application import run_gui
    except ImportError as exc:  # e.g. Qt's system libraries are missing
        if pre is not None:
            pre.abandon()
        from slotkeeper.cli import failure

        failure.tell(f"the desktop app cannot start: {exc}. `slotkeeper serve` runs without it.",
                     desktop=True)
        return 1
    return run_gui(args, paths, service, settings, start_now=start_now, prelaunched=pre)
