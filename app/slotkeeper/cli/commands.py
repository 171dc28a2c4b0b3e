"""The command table: every `slotkeeper` command once (its name, help, arguments, whether it uses
the data folder or starts llama-server, and what runs it), feeding the parser, the dispatch and
`__main__`'s head start. Light on purpose: what runs a command is imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slotkeeper import __version__
from slotkeeper.cli import failure
from slotkeeper.cli.options import (
    SessionsActionParser,
    add_global_options,
    add_server_options,
    command_word,
    count,
    data_folder_problem,
    defaults_from_root,
    size,
    split_extra,
)
from slotkeeper.core.basics import applog


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: str  # "module:function", called with (args, extra) and returning the exit code
    data_folder: bool = True  # works on the data folder: refused with a reason when it cannot be used
    launches: bool = False  # starts llama-server: gets the head start; arguments after `--` go to it

    def __call__(self, args: argparse.Namespace, extra: list[str]) -> int:
        module, function = self.run.split(":")
        return getattr(importlib.import_module(module), function)(args, extra)


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    add_global_options(serve)
    add_server_options(serve)
    defaults_from_root(serve)


def _model_info_arguments(info: argparse.ArgumentParser) -> None:
    from slotkeeper.cli.model_info import add_arguments

    add_arguments(info)
    add_global_options(info)


def _sessions_arguments(sess: argparse.ArgumentParser) -> None:
    add_global_options(sess)
    ssub = sess.add_subparsers(dest="action", metavar="ACTION", required=True,
                               parser_class=SessionsActionParser)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        a = ssub.add_parser(name, help=text)
        add_global_options(a)
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
    action("verify", "check size and content hash (all saved conversations, or one); while Slotkeeper runs a "
                     "conversation's model it is asked, through its address (the key from Settings or "
                     "LLAMA_API_KEY), whether the transcript still matches").add_argument(
        "id", metavar="ID", nargs="?", help=id_help)
    p = action("prune", "delete the least recently used saved conversations until under the budget")
    p.add_argument("--budget", type=size, metavar="SIZE", help="budget to prune to (default: the setting)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    p = action("search", "saved conversations by anything said in them, with the matching passage")
    p.add_argument("words", nargs="+", help="words to find (each as a word or the start of one)")
    p.add_argument("--limit", type=count, default=20, metavar="N", help="at most N results (default 20)")
    p.add_argument("--json", action="store_true")



def _models_arguments(models: argparse.ArgumentParser) -> None:
    from slotkeeper.cli.models import DEFAULT_CTX

    add_global_options(models)
    msub = models.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = msub.add_parser("list-curated", help="a few well-known instruct models, small to large")
    listing.add_argument("--ctx", type=int, default=DEFAULT_CTX, metavar="N",
                         help=f"context to estimate memory at (default {DEFAULT_CTX})")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_global_options(listing)

    dl = msub.add_parser(
        "download",
        help="download a model file (a curated id, or REPO FILE) and print its path",
        description="Download a GGUF from the Hugging Face Hub into its cache and print the file's path on "
        "stdout (progress goes to stderr). MODEL is a curated id (see `models list-curated`) or a "
        "repository such as Qwen/Qwen3-4B-GGUF followed by the file name.",
    )
    dl.add_argument("model", metavar="MODEL", help="curated id, or owner/name of a repository")
    dl.add_argument("file", metavar="FILE", nargs="?", help="file in the repository (with a repository)")
    dl.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    dl.add_argument("--cache-dir", metavar="DIR", help="Hugging Face cache to use (default: the shared one)")
    dl.add_argument("--quiet", action="store_true", help="no progress, only the path")
    add_global_options(dl)


def _sessions_description() -> str:
    from slotkeeper.core.sessions.naming import MIN_ID_PREFIX

    return ("Works on the same folder as the app, with or without a running server. ID is a session id as "
            "`sessions list` shows it, or its start when no other id starts so (at least "
            f"{MIN_ID_PREFIX} characters, as git takes commits). An id that starts with '-' goes after --: "
            "`slotkeeper sessions show -- -abc`.")


def commands() -> tuple[Command, ...]:
    from slotkeeper.core.settings import ServerProfile, connect_url

    defaults = ServerProfile()  # what the settings start with: the app's and serve's defaults
    address = connect_url(defaults.host, defaults.port)
    return (
        Command("serve", "run llama-server headless (no Qt) until SIGINT/SIGTERM",
                "Run and supervise llama-server without the desktop app and serve its API at "
                f"--host/--port (by default {address}). Prints `ready http://HOST:PORT` (the address for "
                "clients) once the server answers and the launch restores are done. Arguments after `--` go "
                "to llama-server.",
                _serve_arguments, "slotkeeper.cli.run:cmd_serve", launches=True),
        Command("model-info", "describe a GGUF model and the KV cache memory llama-server will allocate",
                "Reads GGUF metadata only (never the weights).",
                _model_info_arguments, "slotkeeper.cli.model_info:run", data_folder=False),
        Command("sessions", "list, search, inspect, verify, pin, delete and prune saved conversations",
                _sessions_description(), _sessions_arguments, "slotkeeper.cli.sessions_list:run"),
        Command("models", "curated models to start with, and downloads from the Hugging Face Hub",
                "Downloads go to the Hugging Face cache other tools share ($HF_HUB_CACHE, $HF_HOME/hub or "
                "~/.cache/huggingface/hub); $HF_ENDPOINT selects a mirror. An interrupted download continues "
                "where it stopped; the file's SHA-256 is checked against the Hub's before it is used.",
                _models_arguments, "slotkeeper.cli.models:run", data_folder=False),
    )


# With no command: the desktop app, which takes the server options as `serve` does.
DESKTOP = Command("", "", "", lambda _p: None, "slotkeeper.cli.run:cmd_gui", launches=True)


def build_parser(table: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    from slotkeeper.core.settings import ServerProfile, connect_url

    defaults = ServerProfile()
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
    add_global_options(parser, root=True)
    add_server_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands() if table is None else table:
        command.arguments(sub.add_parser(command.name, help=command.help, description=command.description))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command_line = list(argv)
    table = {c.name: c for c in commands()}
    parser = build_parser(tuple(table.values()))
    extra: list[str] = []
    if table.get(command_word(parser, argv) or "", DESKTOP).launches:
        # Arguments after `--` go to llama-server; the other commands take `--` as argparse
        # does (`sessions show -- -abc`: an id that starts with "-").
        argv, extra = split_extra(argv)
    args = parser.parse_args(argv)
    args.command_line = command_line
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=applog.FORMAT,
        # A windowed .exe has no stderr: its records go to the app's log file only (below).
        handlers=[logging.StreamHandler(sys.stderr) if sys.stderr is not None else logging.NullHandler()],
    )
    if not args.verbose:
        # The Hub downloads' HTTP clients log every request at INFO: hub_download's own (httpx) and
        # huggingface_hub's (httpx2). Naming a logger imports nothing.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    from slotkeeper.core.settings import SettingsError

    command = table.get(args.command or "", DESKTOP)
    desktop = command is DESKTOP
    if command.data_folder:
        problem = data_folder_problem(args.data_dir)
        if problem:
            failure.tell(problem, desktop)
            return 2
    log_file = None
    if command.launches:  # the long runs: serve and the app keep a log of their own
        from slotkeeper.core.basics.paths import app_paths

        log_file = applog.attach(app_paths(args.data_dir).app_log)
    try:
        return command(args, extra)
    except SettingsError as exc:
        failure.tell(str(exc), desktop)
        return 2
    except Exception as exc:
        if not desktop or log_file is None:
            raise
        # The app would vanish without a word: say it, and keep the traceback in the log.
        logging.getLogger("slotkeeper").exception("the desktop app stopped on an error")
        failure.tell(f"Slotkeeper stopped on an error: {exc}. The details are in {log_file.baseFilename}.",
                     desktop)
        return 1
    finally:
        applog.detach(log_file)
