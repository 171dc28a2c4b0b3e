"""Command line: `slotkeeper [serve|model-info|sessions|models] ...`. Qt is imported only for the GUI."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slotkeeper import __version__

log = logging.getLogger("slotkeeper")


def _on_off(value: str) -> bool:
    v = value.lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError("expected on or off")


def _number(parse, what: str, minimum: float):
    """An argparse type: ``parse`` the text, refuse values below ``minimum`` with a clear message."""

    def check(value: str):
        try:
            n = parse(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError("must not be negative" if minimum == 0
                                             else f"must be at least {minimum}")
        return n

    return check


_positive_int = _number(int, "a whole number", 1)
_count = _number(int, "a whole number", 0)
_seconds = _number(float, "a number of seconds", 0)


def _port(value: str) -> int:
    n = _positive_int(value)
    if n > 65535:
        raise argparse.ArgumentTypeError("a port is at most 65535")
    return n


def add_server_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `serve` and the desktop app; they override saved settings for one run."""
    from slotkeeper.core.basics.units import human_bytes
    from slotkeeper.core.settings import DEFAULT_BUDGET_BYTES, DEFAULT_IDLE_SAVE_SECONDS, ServerProfile

    defaults = ServerProfile()  # what the settings hold until changed
    g = p.add_argument_group("server", "Each option overrides the saved setting for this run; the defaults "
                             "are what the settings start with.")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--model", metavar="PATH", help="GGUF model to serve")
    m.add_argument("--demo", action="store_true",
                   help="serve the starter model, SmolLM2 135M Instruct (98 MB; fetched once if this "
                        "installation lacks it)")
    g.add_argument("--mmproj", metavar="PATH",
                   help="multimodal projector (mmproj GGUF) for a model that reads images")
    g.add_argument("--server-bin", metavar="PATH",
                   help="llama-server binary to run (default: found automatically)")
    g.add_argument("--host", help=f"address to bind (default {defaults.host})")
    g.add_argument("--port", type=_port, help=f"port to listen on (default {defaults.port})")
    g.add_argument("--ctx", type=_positive_int, metavar="N",
                   help=f"total context size, split between slots (default {defaults.ctx})")
    g.add_argument("--parallel", type=_positive_int, metavar="N",
                   help=f"number of slots, -np (default {defaults.parallel})")
    g.add_argument("--flash-attn", type=_on_off, metavar="on|off", help="flash attention")
    g.add_argument("--cache-type-k", metavar="T", help="K cache type (f16, q8_0, ...)")
    g.add_argument("--cache-type-v", metavar="T", help="V cache type (f16, q8_0, ...)")
    g.add_argument("--swa-full", action=argparse.BooleanOptionalAction, default=None,
                   help="full-size cache for sliding-window layers (needed to restore conversations of SWA "
                        "models)")
    s = p.add_argument_group("sessions")
    s.add_argument("--idle-save", type=_seconds, metavar="S",
                   help=f"save a slot S seconds after its reply ends (default {DEFAULT_IDLE_SAVE_SECONDS:g}; "
                        "0 = at once)")
    s.add_argument("--restore", type=_count, metavar="N",
                   help="restore the N most recent compatible saved conversations at launch (default: one "
                        "per slot)")
    s.add_argument("--resume", metavar="ID",
                   help="restore this saved conversation (its session id) into slot 0 first")
    s.add_argument("--budget", type=_size, metavar="SIZE",
                   help="disk budget for saved conversations, e.g. 20G (default "
                        f"{human_bytes(DEFAULT_BUDGET_BYTES)})")


def _size(value: str) -> int:
    from slotkeeper.core.basics.units import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_global_options(p: argparse.ArgumentParser, root: bool = False) -> None:
    """Options every command takes, before or after its name: `slotkeeper --data-dir X sessions list`,
    `slotkeeper sessions --data-dir X list` and `slotkeeper sessions list --data-dir X` agree (a
    command's copy sets the option only when given, so the root's value stands otherwise)."""
    g = p.add_argument_group("global")
    unset: dict[str, Any] = {} if root else {"default": argparse.SUPPRESS}
    g.add_argument("-v", "--verbose", action="store_true", help="more logging on stderr", **unset)
    g.add_argument("--data-dir", metavar="DIR",
                   help="keep every file Slotkeeper writes under DIR (also $SLOTKEEPER_HOME)", **unset)


def _defaults_from_root(sub: argparse.ArgumentParser) -> None:
    """A subcommand's copy of a root option sets it only when given (the root's value stands otherwise)."""
    for action in sub._actions:
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


class _SessionsActionParser(argparse.ArgumentParser):
    """A `sessions ACTION` parser. A session id may start with "-" (the sidecar schema allows it;
    Slotkeeper's own ids are hex), which argparse takes for an option: it must come after `--`,
    and an error says so instead of "arguments are required" or "unrecognized arguments"."""

    _given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if self._dashed(extras):
            self.error("")  # unrecognized: left to the root parser, which would not say why
        return parsed, extras

    def error(self, message: str):
        dashed = self._dashed(self._given)
        if dashed:
            what = "a session id" if any(a.dest == "id" for a in self._actions) else "a word to find"
            message = (f"{dashed!r} is not an option; if it is {what}, put -- before it: "
                       f"`{self.prog} -- {dashed}`")
        super().error(message)

    def _dashed(self, args: list[str]) -> str | None:
        """The first argument before any ``--`` that looks like an id but is taken for an option."""
        from slotkeeper.core.sessions.naming import SESSION_ID_RE

        options = self._option_string_actions
        shorts = {o[1] for o in options if len(o) == 2 and o[1] != "-"}
        for arg in args:
            if arg == "--":
                return None
            if not arg.startswith("-") or arg == "-" or not SESSION_ID_RE.fullmatch(arg) or arg in options:
                continue
            if arg.startswith("--") and any(o.startswith(arg) for o in options):  # an abbreviation
                continue
            if not arg.startswith("--") and set(arg[1:]) <= shorts:  # flags together: -vh
                continue
            return arg
        return None


def _command_word(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The command on a command line (`serve`, `sessions` ...), None for the desktop app: the
    first word before any ``--`` that is neither an option nor the value of one."""
    takes_value = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings}
    longs = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
        if "=" not in arg:
            matches = [arg] if arg in takes_value or arg in longs else [o for o in longs if o.startswith(arg)]
            if len(matches) == 1 and matches[0] in takes_value:
                i += 1  # its value
        i += 1
    return None


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    from slotkeeper.core.sessions.naming import MIN_ID_PREFIX
    from slotkeeper.core.settings import ServerProfile, connect_url

    defaults = ServerProfile()  # what the settings start with: the app's and serve's defaults
    address = connect_url(defaults.host, defaults.port)
    parser = argparse.ArgumentParser(
        prog="slotkeeper",
        description="Keeps a local LLM's memory warm: runs llama-server on a private port and serves "
        f"its API at your address (by default {address}), sends each request to the slot holding its "
        "conversation (brought back from disk when needed), saves each slot's KV cache and restores it after "
        "a restart. With no command, opens the desktop app (tray icon); "
        "the server and session options below apply to it as to `serve`. Arguments after `--` "
        "go to llama-server.",
    )
    parser.add_argument("--version", action="version", version=f"slotkeeper {__version__}")
    _add_global_options(parser, root=True)
    add_server_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run llama-server headless (no Qt) until SIGINT/SIGTERM",
        description="Run and supervise llama-server without the desktop app and serve its API at "
        f"--host/--port (by default {address}). Prints `ready http://HOST:PORT` (the address for "
        "clients) once the server answers and the launch restores are done. Arguments after `--` go to "
        "llama-server.",
    )
    _add_global_options(serve)
    add_server_options(serve)
    _defaults_from_root(serve)

    info = sub.add_parser(
        "model-info",
        help="describe a GGUF model and the KV cache memory llama-server will allocate",
        description="Reads GGUF metadata only (never the weights).",
    )
    info.add_argument("path", metavar="PATH")
    info.add_argument("--ctx", type=_positive_int, default=defaults.ctx, metavar="N",
                      help=f"total context (default {defaults.ctx}, the app's and serve's)")
    info.add_argument("--parallel", type=_positive_int, default=1, metavar="N", help="slots (default 1)")
    info.add_argument("--ubatch", type=_positive_int, default=512, metavar="N",
                      help="micro-batch (default 512)")
    info.add_argument("--cache-type-k", default="f16", metavar="T")
    info.add_argument("--cache-type-v", default="f16", metavar="T")
    info.add_argument("--unified", action="store_true", help="unified KV cache (-kvu)")
    info.add_argument("--flash-attn", type=_on_off, default=False, metavar="on|off",
                      help="flash attention (default off, as Slotkeeper runs llama-server)")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    _add_global_options(info)

    sess = sub.add_parser(
        "sessions",
        help="list, search, inspect, verify, pin, delete and prune saved conversations",
        description="Works on the same folder as the app, with or without a running server. ID is a "
        "session id as `sessions list` shows it, or its start when no other id starts so (at least "
        f"{MIN_ID_PREFIX} characters, as git takes commits). An id that starts with '-' goes after --: "
        "`slotkeeper sessions show -- -abc`.",
    )
    _add_global_options(sess)
    ssub = sess.add_subparsers(dest="action", metavar="ACTION", required=True,
                               parser_class=_SessionsActionParser)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        a = ssub.add_parser(name, help=text)
        _add_global_options(a)
        return a

    p = action("list", "saved conversations, most recently used first")
    p.add_argument("--json", action="store_true", help="every field of each, for scripts")
    p = action("show", "one saved conversation: a summary to read")
    id_help = "session id, or its start"
    p.add_argument("id", metavar="ID", help=id_help)
    p.add_argument("--json", action="store_true", help="every field, for scripts")
    p.add_argument("--transcript", action="store_true", help="the conversation itself, message by message")
    p = action("export", "write a saved conversation out: Markdown for people, or OpenAI-style JSON")
    p.add_argument("id", metavar="ID", help=id_help)
    p.add_argument("--format", choices=("md", "json"), default="md", help="md (default) or json")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    for name, text in (("delete", "delete a saved conversation (its KV file and sidecar)"),
                       ("pin", "keep a saved conversation whatever the budget"),
                       ("unpin", "let the budget prune a saved conversation again")):
        action(name, text).add_argument("id", metavar="ID", help=id_help)
    action("verify", "check size and content hash (all saved conversations, or one)").add_argument(
        "id", metavar="ID", nargs="?", help=id_help)
    p = action("prune", "delete the least recently used saved conversations until under the budget")
    p.add_argument("--budget", type=_size, metavar="SIZE", help="budget to prune to (default: the setting)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    p = action("search", "saved conversations by anything said in them, with the matching passage")
    p.add_argument("words", nargs="+", help="words to find (each as a word or the start of one)")
    p.add_argument("--limit", type=_count, default=20, metavar="N", help="at most N results (default 20)")
    p.add_argument("--json", action="store_true")

    from slotkeeper.models_cli import add_models_parser

    add_models_parser(sub, _add_global_options)
    return parser


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
            out[f"profile.{name}"] = getattr(args, name)
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
    from slotkeeper.core.engine.lifecycle.launching import prelaunch

    paths, _service, settings = load_run_settings(args, extra)
    # llama-server loads the model while the rest of Slotkeeper is imported and built.
    pre = prelaunch(paths, settings, getattr(args, "command_line", None))

    import asyncio

    from slotkeeper.core import events as ev
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
            nonlocal signals
            signals += 1
            name = signal.Signals(signum).name
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
        return exit_code

    return engine.run(main())


def _on_signals(loop, handler: Callable[[int], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM call ``handler(signum)`` on the loop; returns a function that undoes it."""
    sigs = [signal.SIGINT, signal.SIGTERM]
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
        from slotkeeper.core.engine.lifecycle.launching import prelaunch

        # The model loads while Qt starts; the app's engine takes the launch over.
        pre = prelaunch(paths, settings, getattr(args, "command_line", None))
    try:
        from slotkeeper.gui.application import run_gui
    except ImportError as exc:  # e.g. Qt's system libraries are missing
        if pre is not None:
            pre.abandon()
        print(f"slotkeeper: the desktop app cannot start: {exc}. `slotkeeper serve` runs without it.",
              file=sys.stderr)
        return 1
    return run_gui(args, paths, service, settings, start_now=start_now, prelaunched=pre)


def cmd_model_info(args: argparse.Namespace) -> int:
    from slotkeeper.core.model import gguf_info, gguf_memory, gguf_text

    try:
        info = gguf_info.read_model_info(args.path)
        est = gguf_memory.kv_estimate(
            info,
            n_ctx=args.ctx,
            n_parallel=args.parallel,
            ubatch=args.ubatch,
            type_k=args.cache_type_k,
            type_v=args.cache_type_v,
            unified=args.unified,
            flash_attn=args.flash_attn,
        )
    except (gguf_info.ModelFileError, ValueError) as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(gguf_text.model_info_json(info, est), indent=2))
    else:
        print(gguf_text.format_model_info(info, est))
    return 0


def _data_folder_problem(data_dir: str | None) -> str | None:
    """Why the data folder cannot be used (created where missing), in words; None when it can."""
    from slotkeeper.core.basics.fsutil import UnsafeFolder
    from slotkeeper.core.basics.paths import app_paths

    paths = app_paths(data_dir)
    try:
        paths.ensure()
    except UnsafeFolder as exc:  # says which folder, why and what to do
        return str(exc)
    except OSError as exc:
        where = exc.filename or paths.data_dir
        if isinstance(exc, FileExistsError):
            why = "it is a file, not a folder"
        elif isinstance(exc, NotADirectoryError):
            why = "a folder on its path is a file"
        else:
            why = exc.strerror or str(exc)
        return f"cannot use the data folder {where}: {why} (choose another with --data-dir)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command_line = list(argv)
    parser = build_parser()
    extra: list[str] = []
    if _command_word(parser, argv) in (None, "serve"):
        # Arguments after `--` go to llama-server; the other commands take `--` as argparse
        # does (`sessions show -- -abc`: an id that starts with "-").
        argv, extra = _split_extra(argv)
    args = parser.parse_args(argv)
    args.command_line = command_line
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        # The Hub downloads' HTTP clients log every request at INFO: hub_download's own (httpx) and
        # huggingface_hub's (httpx2). Naming a logger imports nothing.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    from slotkeeper.core.settings import SettingsError

    if args.command not in ("model-info", "models"):
        problem = _data_folder_problem(args.data_dir)
        if problem:
            print(f"slotkeeper: {problem}", file=sys.stderr)
            return 2
    try:
        if args.command == "serve":
            return cmd_serve(args, extra)
        if args.command == "model-info":
            return cmd_model_info(args)
        if args.command == "sessions":
            if args.action == "list" and args.json:
                from slotkeeper.sessions_list import print_kept_rows

                if print_kept_rows(args.data_dir):
                    return 0
            from slotkeeper.sessions_cli import run_sessions_command

            return run_sessions_command(args)
        if args.command == "models":
            from slotkeeper.models_cli import run_models_command

            return run_models_command(args)
        return cmd_gui(args, extra)
    except SettingsError as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2
