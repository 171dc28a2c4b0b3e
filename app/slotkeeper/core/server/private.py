"""llama-server's private address: a port on 127.0.0.1 and a random key only Slotkeeper knows.

Clients reach llama-server only through Slotkeeper's front door. The port and key are kept in
the state folder (``private.json``, 0600), so a server an earlier run left running is
recognised (the same command line) and reachable by the next run; a port someone else has
taken since is replaced by a free one.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.fsutil import atomic_write_text

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class PrivateAddress:
    port: int
    key: str

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def private_address(path: Path, port_taken: Callable[[int], bool]) -> PrivateAddress:
    """The address to launch llama-server on: the kept one, unless its port is ``port_taken`` by
    another program (``port_taken`` is false for a server of ours left running)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        kept = PrivateAddress(int(data["port"]), str(data["key"]))
        if not (1024 <= kept.port <= 65535) or len(kept.key) < 32:
            raise ValueError("implausible")
    except (OSError, ValueError, KeyError, TypeError):
        kept = None
    if kept is not None and not port_taken(kept.port):
        return kept
    fresh = PrivateAddress(free_port(), secrets.token_urlsafe(32))
    atomic_write_text(path, json.dumps({"port": fresh.port, "key": fresh.key}))
    return fresh
