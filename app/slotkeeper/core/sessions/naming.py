"""File names in the sessions folder: what is ours, what is a save in progress, what is a session id.

A session id is a name, never a path: every public entry point of the store checks it with
``validate_session_id`` (1-64 of ``[A-Za-z0-9_-]``, the sidecar schema's id pattern), so
``../config/settings``, ``/abs/path`` or ``./ID`` never reach the file system.

- ``<id>.json``            a sidecar (written last, atomically)
- ``<id>.<gen>.kvm``       a state's manifest (``pieces``): the header and token list llama-server
                           wrote, then the runs of cells it is made of; ``gen`` changes on every
                           save, so a new version never overwrites the old one before its sidecar
                           exists. ``<id>.<gen>.kv``: a state as llama-server wrote it, whole (the
                           layout before pieces; carried over once, ``migration``)
- ``pieces/<ab>/<hash>.kvp`` the pieces states are made of, each named by the hash of its bytes
- ``<id>.<gen>.chat``      the transcript of that version (``transcripts``), written before the
                           sidecar in the same save; the KV file's ``gen`` names it
- ``incoming-<rand>.kvm``  a manifest being written (llama-server writes its own files in the
                           staging folder, ``staging``)
- ``.lock``, ``.*.tmp``    the folder lock and atomic writes' temporary files (hidden)
"""

from __future__ import annotations

import re
import secrets

SIDECAR_SUFFIX = ".json"
KV_SUFFIX = ".kv"  # a state as llama-server writes it
MANIFEST_SUFFIX = ".kvm"  # a state kept as pieces
PIECES_DIR = "pieces"
INCOMING_PREFIX = "incoming-"
LOCK_NAME = ".lock"  # hidden: never listed as an unmanaged file


def is_scratch(name: str) -> bool:
    """Hidden files (the lock, temp files of atomic writes) and llama-server's files being
    written: never listed, never part of what a listing shows."""
    return name.startswith(".") or name.startswith(INCOMING_PREFIX)


SESSION_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
# The start of an id names a session (on the command line) from this many characters, as git
# takes commits; a shorter one only as a whole id.
MIN_ID_PREFIX = 4
SESSION_ID_RE = re.compile(SESSION_ID_PATTERN)
# \Z, not $: "$" also matches before a trailing newline, and a file name may end with one.
OWN_KV_RE = re.compile(r"^([0-9a-f]{12})\.([0-9a-f]{8})\.kvm?\Z")
OWN_TRANSCRIPT_RE = re.compile(r"^([0-9a-f]{12})\.([0-9a-f]{8})\.chat\Z")
TRANSCRIPT_SUFFIX = ".chat"
SIDECAR_NAME_RE = re.compile(rf"^({SESSION_ID_PATTERN})\.json\Z")


class InvalidSessionId(ValueError):
    """Something given as a session id that is not one (a path, an empty string ...)."""

    def __init__(self, value: object) -> None:
        super().__init__(f"{value!r} is not a session id (1-64 letters, digits, '-' or '_')")
        self.value = value


def validate_session_id(value: object) -> str:
    """``value`` if it is a session id; raises InvalidSessionId otherwise (never a path)."""
    if not isinstance(value, str) or not SESSION_ID_RE.fullmatch(value):
        raise InvalidSessionId(value)
    return value


def sidecar_name(session_id: str) -> str:
    return f"{validate_session_id(session_id)}{SIDECAR_SUFFIX}"


def new_kv_name(session_id: str) -> str:
    """A fresh ``<id>.<gen>.kvm`` name: every save of a session gets a new one."""
    return f"{session_id}.{secrets.token_hex(4)}{MANIFEST_SUFFIX}"


def transcript_name(kv_file: str) -> str | None:
    """The transcript file of the version whose KV file is ``kv_file`` (None: not one of ours)."""
    if not OWN_KV_RE.match(kv_file):
        return None
    return kv_file.rsplit(".", 1)[0] + TRANSCRIPT_SUFFIX


def new_incoming_name(suffix: str = KV_SUFFIX) -> str:
    """A save in progress: llama-server's file (``.kv``, in the staging folder) or a manifest
    being written (``.kvm``, in the sessions folder)."""
    return f"{INCOMING_PREFIX}{secrets.token_hex(8)}{suffix}"


def is_hidden_or_in_progress(name: str) -> bool:
    """Files a watcher or a listing can ignore: saves in progress, the lock, temporary files."""
    return name.startswith((INCOMING_PREFIX, "."))


def owns_kv_file(session_id: str, kv_file: str) -> bool:
    """A session's KV file is named after it (``<id>.<gen>.kv``); one saved under another id is not its."""
    return kv_file.startswith(f"{session_id}.")
