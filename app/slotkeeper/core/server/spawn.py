"""Starting llama-server: the one way it is spawned, by the supervisor and by `serve`'s head start.

Light on purpose (the standard library and the log-file helpers): ``headstart`` calls
it before the rest of Slotkeeper is imported.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from slotkeeper.core.server import logfile
from slotkeeper.core.server.child_env import child_environment


def launch_environment(private_key: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """llama-server's environment: ours, with the private key only Slotkeeper knows."""
    return {**(os.environ if environ is None else environ), "LLAMA_API_KEY": private_key}


def spawn_server(argv: Sequence[str], env: Mapping[str, str] | None, log_path: Path) -> subprocess.Popen:
    """Run ``argv`` in its own process group (so it can be stopped with its children), writing to
    ``log_path`` (rotated first), with ``env`` (default: ours) cleaned for a child. OSError when it cannot run."""
    logfile.rotate(log_path, force=True)
    out = logfile.open_for_child(log_path)
    kwargs: dict[str, object] = {}
    if os.name == "nt":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP | getattr(subprocess, "CREATE_NO_WINDOW", 0)
    else:
        kwargs["start_new_session"] = True
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=child_environment(None if env is None else dict(env)), **kwargs)
    finally:
        out.close()
