"""Starting llama-server: the one way it is run, by the supervisor, by `serve`'s head start, for the
flash-attention probe and for its --help, and the state file a server's start writes for it (how a
later run recognises a server left running).

Light on purpose (the standard library and the log-file helpers): ``headstart`` calls
it before the rest of Slotkeeper is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.child_env import child_environment, server_environment
from slotkeeper.core.server import logfile


def launch_environment(private_key: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """llama-server's environment: ours, with the private key only Slotkeeper knows."""
    return {**server_environment(os.environ if environ is None else environ), "LLAMA_API_KEY": private_key}


# winbase.h's process creation flags (subprocess has them on Windows only; the values let the tests
# that fake Windows run anywhere).
CREATE_NEW_PROCESS_GROUP: int = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x00000200)
CREATE_NO_WINDOW: int = getattr(subprocess, "CREATE_NO_WINDOW", 0x08000000)


def popen_options(own_group: bool) -> dict[str, Any]:
    """This platform's Popen options for llama-server: never a console window on Windows (the
    packaged app has none, so each run would open one, the shortest --help too); ``own_group``: a
    process group of its own, stopped with its children."""
    if sys.platform == "win32":
        return {"creationflags": CREATE_NO_WINDOW | (CREATE_NEW_PROCESS_GROUP if own_group else 0)}
    return {"start_new_session": True} if own_group else {}


_dll_directory_lock = threading.Lock()


@contextlib.contextmanager
def _without_our_dll_directory() -> Iterator[None]:
    """The packaged app's DLL folder kept from the child started in this block.

    PyInstaller's bootloader on Windows calls SetDllDirectoryW(sys._MEIPASS), and a child process
    inherits it: a user's own llama-server.exe then loads the app's DLLs (the MSVC runtime among
    them) before its own, and crashes. PyInstaller's advice ("Launching external programs") is
    SetDllDirectoryW(NULL) first; ours is put back after the start, as the app goes on importing
    modules whose DLLs may need it (one start at a time: the setting is the process's)."""
    if sys.platform != "win32" or not getattr(sys, "frozen", False):
        yield
        return
    import ctypes

    kernel32 = ctypes.windll.kernel32
    with _dll_directory_lock:
        ours = ctypes.create_unicode_buffer(32768)
        kept = kernel32.GetDllDirectoryW(len(ours), ours)
        kernel32.SetDllDirectoryW(None)
        try:
            yield
        finally:
            if kept:
                kernel32.SetDllDirectoryW(ours.value)


def start(argv: Sequence[str], env: Mapping[str, str] | None, own_group: bool,
          **options: Any) -> subprocess.Popen:
    """Start llama-server (a server, a probe, --help): every run of it starts here, with ``env``
    (default: ours) cleaned for a child, this platform's options (``popen_options``) and no DLL
    folder of the packaged app; ``options`` are Popen's (the standard streams). OSError when it
    cannot run."""
    with _without_our_dll_directory():
        return subprocess.Popen(list(argv), env=child_environment(None if env is None else dict(env)),
                                **options, **popen_options(own_group))


def kill_now(proc: subprocess.Popen) -> None:
    """Stop at once a run ``start`` began in a group of its own (a probe, a measuring server): its
    group killed (Windows: the process), waited for (10 s at most), its output pipe closed."""
    if proc.poll() is None:
        try:
            if sys.platform == "win32":
                proc.kill()
            else:
                os.killpg(proc.pid, signal.SIGKILL)  # started in its own session: its group is its pid
        except OSError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout is not None:
        proc.stdout.close()


def output_of(argv: Sequence[str], timeout: float) -> str:
    """What a short run of llama-server (``--help``) writes, both streams; OSError when it cannot
    run, subprocess.TimeoutExpired (stopped) when it outlasts ``timeout``."""
    proc = start(argv, None, False, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True, errors="replace")
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return out


def spawn_server(argv: Sequence[str], env: Mapping[str, str] | None, log_path: Path) -> subprocess.Popen:
    """Run ``argv`` in its own process group (so it can be stopped with its children), writing to
    ``log_path`` (rotated first), with ``env`` (default: ours) cleaned for a child. OSError when it cannot
    run."""
    logfile.rotate(log_path, force=True)
    out = logfile.open_for_child(log_path)
    # What llama-server writes (slot saves, a crash's leftovers) is private.
    private = {} if sys.platform == "win32" else {"umask": 0o077}
    try:
        return start(argv, env, True, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                     **private)
    finally:
        out.close()


def write_state_file(path: Path, pid: int, create_time: float, argv: Sequence[str], host: str, port: int,
                     launch: Mapping[str, Any] | None = None, early: bool = False) -> None:
    """Record a running llama-server (``create_time`` as psutil gives it: with the pid, it tells
    this process from a later one with a reused pid). ``early``: started by the head start and
    not yet taken over, so it has never been sent a conversation. OSError when it cannot be written."""
    from slotkeeper.core.basics.fsutil import atomic_write_text

    data = {"pid": pid, "create_time": create_time, "argv": list(argv), "host": host, "port": port,
            "started_at": time.time(), "launch": dict(launch or {})}
    if early:
        data["early"] = True
    atomic_write_text(path, json.dumps(data, indent=2))
