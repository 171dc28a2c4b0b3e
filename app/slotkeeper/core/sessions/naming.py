"""File names in the sessions folder: what is ours, what is a save in progress, what is a session id.

- ``<id>.json``            a sidecar (written last, atomically)
- ``<id>.<gen>.kv``        the KV file llama-server wrote; ``gen`` changes on every save, so a new
                           version never overwrites the old one before its sidecar exists
- ``incoming-<rand>.kv``   a save in progress (llama-server writes files in place, not atomically)
- ``.lock``, ``.*.tmp``    the folder lock and atomic writes' temporary files (hidden)
"""

from __future__ import annotations

import re
import secrets

SIDECAR_SUFFIX = ".json"
KV_SUFFIX = ".kv"
INCOMING_PREFIX = "incoming-"
LOCK_NAME = ".lock"  # hidden: never listed as an unmanaged file

OWN_KV_RE = re.compile(r"^([0-9a-f]{12})\.([0-9a-f]{8})\.kv$")
SIDECAR_NAME_RE = re.compile(r"^([A-Za-z0-9_-]{1,64})\.json$")


def sidecar_name(session_id: str) -> str:
    return f"{session_id}{SIDECAR_SUFFIX}"


def new_kv_name(session_id: str) -> str:
    """A fresh ``<id>.<gen>.kv`` name: every save of a session gets a new one."""
    return f"{session_id}.{secrets.token_hex(4)}{KV_SUFFIX}"


def new_incoming_name() -> str:
    return f"{INCOMING_PREFIX}{secrets.token_hex(8)}{KV_SUFFIX}"


def is_hidden_or_in_progress(name: str) -> bool:
    """Files a watcher or a listing can ignore: saves in progress, the lock, temporary files."""
    return name.startswith((INCOMING_PREFIX, "."))
