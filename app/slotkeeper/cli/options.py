"""The command line's shared pieces: argument types with clear refusals, the options every command
takes (before or after its name), the server options `serve` and the desktop app share, and how a
command line is split (its command word; llama-server's arguments after `--`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def on_off(value: str) -> bool:
    v = value.lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError("expected on or off")


def on_off_auto(value: str) -> bool | str:
    """on, off, or "auto" (llama-server's own choice, resolved at launch)."""
    if value.lower() == "auto":
        return "auto"
    try:
        return on_off(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("expected on, off or auto") from None


def number(parse, what: str, minimum: float):
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


positive_int = number(int, "a whole number", 1)
count = number(int, "a whole number", 0)
seconds = number(float, "a number of seconds", 0)


def port(value: str) -> int:
    n = positive_int(value)
    if n > 65535:
        raise argparse.ArgumentTypeError("a port is at most 65535")
    return n


def add_server_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `serve` and the desktop app; they override saved settings for one run."""
    from slotkeeper.core.basics.units import human_bytes
    from slotkeeper.core.settings import DEFAULT_BUDGET_BYTES, DEFAULT_IDLE_SAVE_SECONDS, ServerProfile

    defaults = ServerProfile()  # what the settings hold until changed
    g = p.add_argument_group("server", "Each option overrides the saved setting for this run; the defaults "
                             "are what the settings start with. llama-server's own spellings work too "
                             "(-m, -c/--ctx-size, -np, -fa, -ctk, -ctv, -mm).")
    m = g.add_mutually_exclusive_group()
    m.add_argument("-m", "--model", metavar="PATH", help="GGUF model to serve")
    m.add_argument("--demo", action="store_true",
                   help="serve the starter model, SmolLM2 135M Instruct (98 MB; fetched once if this "
                        "installation lacks it)")
    g.add_argument("-mm", "--mmproj", metavar="PATH",
                   help="multimodal projector (mmproj GGUF) for a model that reads images")
    g.add_argument("--server-bin", metavar="PATH",
                   help="llama-server binary to run (default: found automatically)")
    g.add_argument("--host", help=f"address to bind (default {defaults.host})")
    g.add_argument("--port", type=port, help=f"port to listen on (default {defaults.port})")
    g.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=positive_int, metavar="N",
                   help=f"total context size, split between slots (default {defaults.ctx})")
    g.add_argument("-np", "--parallel", type=positive_int, metavar="N",
                   help=f"number of slots (default {defaults.parallel})")
    g.add_argument("-fa", "--flash-attn", type=on_off_auto, metavar="on|off|auto",
                   help="flash attention (default auto: what llama-server's auto chooses for the model on "
                        "this machine, passed as on or off)")
    g.add_argument("-ctk", "--cache-type-k", metavar="T", help="K cache type (f16, q8_0, ...)")
    g.add_argument("-ctv", "--cache-type-v", metavar="T", help="V cache type (f16, q8_0, ...)")
    g.add_argument("--swa-full", action=argparse.BooleanOptionalAction, default=None,
                   help="full-size cache for sliding-window layers (needed to restore conversations of SWA "
                        "models)")
    s = p.add_argument_group("sessions")
    s.add_argument("--idle-save", type=seconds, metavar="S",
                   help=f"save a slot S seconds after its reply ends (default {DEFAULT_IDLE_SAVE_SECONDS:g}; "
                        "0 = at once)")
    s.add_argument("--restore", type=count, metavar="N",
                   help="restore the N most recent compatible saved conversations at launch (default: one "
                        "per slot)")
    s.add_argument("--resume", metavar="ID",
                   help="restore this saved conversation (its session id) into slot 0 first")
    s.add_argument("--budget", type=size, metavar="SIZE",
                   help="disk budget for saved conversations, e.g. 20G (default "
                        f"{human_bytes(DEFAULT_BUDGET_BYTES)})")


def size(value: str) -> int:
    from slotkeeper.core.basics.units import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_global_options(p: argparse.ArgumentParser, root: bool = False) -> None:
    """Options every command takes, before or after its name: `slotkeeper --data-dir X sessions list`,
    `slotkeeper sessions --data-dir X list` and `slotkeeper sessions list --data-dir X` agree (a
    command's copy sets the option only when given, so the root's value stands otherwise)."""
    g = p.add_argument_group("global")
    unset: dict[str, Any] = {} if root else {"default": argparse.SUPPRESS}
    g.add_argument("-v", "--verbose", action="store_true", help="more logging on stderr", **unset)
    g.add_argument("--data-dir", metavar="DIR",
                   help="keep every file Slotkeeper writes under DIR (also $SLOTKEEPER_HOME)", **unset)


def defaults_from_root(sub: argparse.ArgumentParser) -> None:
    """A subcommand's copy of a root option sets it only when given (the root's value stands otherwise)."""
    for action in sub._actions:
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


class SessionsActionParser(argparse.ArgumentParser):
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


def command_word(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
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


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []





def data_folder_problem(data_dir: str | None) -> str | None:
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
