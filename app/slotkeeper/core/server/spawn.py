"""Starting llama-server: the one way it is spawned, by the supervisor and by `serve`'s head start,
and the state file each writes for it (how a later run recognises a server left running).

Light on purpose (the standard library and the log-file helpers): ``headstart`` calls
it before the rest of Slotkeeper is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.child_env import child_environment, server_environment
from slotkeeper.core.server import logfile


def launch_environment(private_key: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """llama-server's environment: ours, with the private key only Slotkeeper knows."""
    return {**server_environment(os.environ if environ is None else environ), "LLAMA_API_KEY": private_key}


def own_group() -> dict[str, Any]:
    """Popen options that start llama-server in a process group of its own (stopped with its
    children), with no console window on Windows."""
    if sys.platform == "win32":
        return {"creationflags": (subprocess.CREATE_NEW_PROCESS_GROUP
                                  | getattr(subprocess, "CREATE_NO_WINDOW", 0))}
    return {"start_new_session": True}


def spawn_server(argv: Sequence[str], env: Mapping[str, str] | None, log_path: Path) -> subprocess.Popen:
    """Run ``argv`` in its own process group (so it can be stopped with its children), writing to
    ``log_path`` (rotated first), with ``env`` (default: ours) cleaned for a child. OSError when it cannot
    run."""
    logfile.rotate(log_path, force=True)
    out = logfile.open_for_child(log_path)
    kwargs = own_group()
    if sys.platform != "win32":
        kwargs["umask"] = 0o077  # what llama-server writes (slot saves, a crash's leftovers) is private
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=child_environment(None if env is None else dict(env)), **kwargs)
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
