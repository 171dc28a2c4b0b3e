"""The head start: llama-server started before the rest of Slotkeeper is imported.

Loading the model is the longest step of a relaunch, so it should begin at once. Every launch
that `serve` (or the desktop app, when it starts the server at launch) plans leaves a note
(``cache/last-launch.json``): the command line Slotkeeper was given,
llama-server's command line it planned, and what that plan was made from (Slotkeeper's version,
the working folder, the environment variables it reads, and the stamp (``fsutil.stat_stamp``) of the
settings file, the private address file and of every file on llama-server's command line: the
binary, the model, ...). When Slotkeeper runs again with the same command line and nothing of
that has changed, ``begin`` (the standard library plus the light path, lock and spawn helpers) takes
the data folder's lock and starts that llama-server, tens of milliseconds after the process began.

Nothing is trusted on the note's word: ``prelaunch`` plans the launch in full, as always, and
``take``s the early server over only when the plan's command line and environment are exactly the
ones it was started with; any other way it is stopped (``discard``) and the planned launch goes on.
``begin`` does nothing when the folder is in use, when an earlier run's server may still be
running (its state file exists) or when the private port is taken.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slotkeeper import __version__

NOTE_NAME = "last-launch.json"  # in the cache folder
NOTE_VERSION = 1
ENV_PREFIXES = ("SLOTKEEPER_", "LLAMA_")  # ... and PATH: what finding the binary and the folders read


@dataclass
class Early:
    """A llama-server started by ``begin``, not yet taken over."""

    popen: subprocess.Popen
    argv: tuple[str, ...]
    env: dict[str, str]
    port: int  # its private port
    started: float  # time.monotonic()
    state_file: Path  # names it (``early``) until the supervisor takes it over and writes its own


_early: Early | None = None


def begin(argv: Sequence[str]) -> None:
    """Start llama-server now if the note of the last launch with this command line still holds;
    never raises."""
    global _early
    if _early is not None:
        return
    try:
        _early = _start(list(argv))
    except Exception:  # a head start is a bonus: the normal launch says what is wrong, if anything
        _early = None
    if _early is not None:
        atexit.register(discard)
        if sys.platform != "win32":  # stopped before the engine listens for signals: not without its server
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _stop_with_it)


def _stop_with_it(signum: int, _frame) -> None:
    discard()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _start(argv: list[str]) -> Early | None:
    from slotkeeper.core.basics import datalock
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.server.spawn import launch_environment, spawn_server, write_state_file

    paths = app_paths(_data_dir(argv))
    try:
        note = json.loads((paths.cache_dir / NOTE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict) or note.get("version") != NOTE_VERSION or note.get("command_line") != argv:
        return None
    server_argv = note.get("server_argv")
    if (not isinstance(server_argv, list) or not server_argv
            or not all(isinstance(a, str) for a in server_argv)):
        return None
    if note.get("inputs") != inputs(paths, server_argv):
        return None
    try:
        private = json.loads(paths.private_address_file.read_text(encoding="utf-8"))
        port, key = int(private["port"]), str(private["key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if port != note.get("port") or not _port_free(port):
        return None
    try:
        datalock.acquire(paths.engine_lock_file, str(paths.data_dir))
    except (datalock.DataDirBusy, OSError):
        return None
    if paths.server_state_file.exists():
        return None  # a server an earlier run left may be alive: the engine adopts or stops it
    env = launch_environment(key)
    popen = spawn_server(server_argv, env, paths.server_log)
    found = Early(popen, tuple(server_argv), env, port, time.monotonic(), paths.server_state_file)
    try:  # recorded at once: should this process die unannounced, the next launch stops it
        import psutil

        write_state_file(found.state_file, popen.pid, psutil.Process(popen.pid).create_time(), server_argv,
                         _option(server_argv, "--host") or "127.0.0.1", port, early=True)
    except Exception:
        _stop(found)
        return None
    return found


def inputs(paths, server_argv: Sequence[str]) -> dict:
    """What a launch plan is made from, as far as a note can tell it changed."""
    from slotkeeper.core.basics.fsutil import stat_stamp

    env = "\0".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k == "PATH" or k.startswith(ENV_PREFIXES))
    files: dict[str, dict[str, int] | None] = {}
    for name in (str(paths.settings_file), str(paths.private_address_file), *server_argv):
        try:
            st = os.stat(name)
        except (OSError, ValueError):
            if name in (str(paths.settings_file), str(paths.private_address_file)):
                files[name] = None
            continue
        if st.st_mode & 0o170000 == 0o100000:  # a regular file (a folder's mtime moves with every save)
            files[name] = stat_stamp(st)
    return {"app": __version__, "python": sys.executable, "cwd": os.getcwd(),
            "env": zlib.crc32(env.encode("utf-8", "surrogateescape")), "files": files}


def remember(paths, command_line: Sequence[str], server_argv: Sequence[str], port: int) -> None:
    """Write the note for the next `serve` with ``command_line`` (when it says something new).

    A command line that carries an API key is never written down: that launch gets no head start."""
    from slotkeeper.core.basics.fsutil import atomic_write_text

    if any(a == "--api-key" or a.startswith("--api-key=") for a in command_line):
        forget(paths)
        return

    note = {"version": NOTE_VERSION, "command_line": list(command_line), "server_argv": list(server_argv),
            "port": port, "inputs": inputs(paths, server_argv)}
    path = paths.cache_dir / NOTE_NAME
    try:
        if json.loads(path.read_text(encoding="utf-8")) == note:
            return
    except (OSError, ValueError):
        pass
    try:
        atomic_write_text(path, json.dumps(note))
    except OSError:
        pass  # only the next launch's head start is lost


def forget(paths) -> None:
    """No head start next time (the launch it would repeat failed)."""
    try:
        (paths.cache_dir / NOTE_NAME).unlink()
    except OSError:
        pass


def early() -> Early | None:
    """The llama-server ``begin`` started, if it is still running."""
    if _early is not None and _early.popen.poll() is not None:
        discard()
    return _early


def take(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen | None:
    """The early llama-server, if it runs exactly ``argv`` with ``env``; otherwise it is stopped."""
    global _early
    found = early()
    if found is None:
        return None
    if found.argv != tuple(argv) or found.env != dict(env):
        discard()
        return None
    _early = None
    return found.popen


def discard() -> None:
    """Stop the early llama-server (nobody took it over)."""
    global _early
    found, _early = _early, None
    if found is not None:
        _stop(found)


def _stop(found: Early) -> None:
    if found.popen.poll() is None:
        found.popen.kill()
        try:
            found.popen.wait(10)
        except subprocess.TimeoutExpired:
            return  # still there: its state file lets the next launch stop it
    try:
        if json.loads(found.state_file.read_text(encoding="utf-8")).get("pid") == found.popen.pid:
            found.state_file.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _data_dir(argv: Sequence[str]) -> str | None:
    """``--data-dir``'s value (a global option, anywhere before ``--``)."""
    return _option(argv, "--data-dir")


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of option ``name`` (``name VALUE`` or ``name=VALUE``) before any ``--``."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _port_free(port: int) -> bool:
    from slotkeeper.core.basics.ports import port_in_use

    try:
        return not port_in_use("127.0.0.1", port)
    except OSError:
        return False
