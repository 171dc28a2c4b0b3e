"""The user's API key, as the front door checks it: llama-server's rules, failing closed.

Where the keys come from (llama.cpp common/arg.cpp, b11434): ``--api-key K1,K2`` is a
comma-separated list; ``--api-key-file F`` adds every line of F that is not empty and does not
start with ``#`` (a line is taken as it is); ``$LLAMA_API_KEY`` and ``$LLAMA_ARG_API_KEY_FILE``
stand in for the flags when a flag is not given. Several sources add up.

A key file is read again whenever it changes (its stat), so a rotated key takes effect at once.
When a key was asked for but none can be had (the file is missing, unreadable or holds no key, a
flag has no value) the door does not fall open: every request but the public ones is answered
503 with the reason (``KeyUnavailable``) until a key can be read again. Keys are compared in
constant time, and never written anywhere.
"""

from __future__ import annotations

import csv
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.fsutil import stat_stamp
from slotkeeper.core.server.command import api_key_args, is_loopback


class KeyUnavailable(Exception):
    """A key was asked for but none can be read: the door stays shut, saying why."""


def split_keys(value: str) -> list[str]:
    """``--api-key``'s value as llama-server reads it: a CSV row, empty items skipped."""
    try:
        row = next(csv.reader([value], skipinitialspace=False), [])
    except csv.Error:
        row = value.split(",")
    return [k for k in row if k]


def file_keys(text: str) -> list[str]:
    """A key file as llama-server reads it: one key per line, ``#`` lines are comments."""
    return [line for line in text.split("\n") if line and not line.startswith("#")]


@dataclass(frozen=True)
class _FileState:
    stamp: dict[str, int] | None
    keys: tuple[str, ...]
    problem: str | None


class DoorKeys:
    """The keys a client may send to the front door (None of them: the door is open)."""

    def __init__(self, extra_args: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        args = api_key_args(tuple(extra_args))
        self._fixed: list[str] = []
        self._files: list[Path] = []
        self._problems: list[str] = []
        given_key = [v for f, v in args if f == "--api-key"]
        given_file = [v for f, v in args if f == "--api-key-file"]
        if not given_key and env.get("LLAMA_API_KEY"):
            given_key = [env["LLAMA_API_KEY"]]
        if not given_file and env.get("LLAMA_ARG_API_KEY_FILE"):
            given_file = [env["LLAMA_ARG_API_KEY_FILE"]]
        for value in given_key:
            keys = split_keys(value or "")
            if not keys:
                self._problems.append("--api-key was given without a key")
            self._fixed.extend(keys)
        for value in given_file:
            if not value:
                self._problems.append("--api-key-file was given without a file")
            else:
                self._files.append(Path(value).expanduser())
        self.required = bool(given_key or given_file)
        self._states: dict[Path, _FileState] = {}

    def keys(self) -> tuple[str, ...]:
        """Every key that opens the door now; KeyUnavailable when a key was asked for and a
        source of it cannot be read (the door shuts rather than opening with fewer keys)."""
        if self._problems:
            raise KeyUnavailable(self._problems[0])
        keys = list(self._fixed)
        for path in self._files:
            state = self._read(path)
            if state.problem:
                raise KeyUnavailable(state.problem)
            keys.extend(state.keys)
        return tuple(keys)

    def first(self) -> str | None:
        """A key Slotkeeper's own calls to the front door can send (None: no key, or none now)."""
        try:
            keys = self.keys()
        except KeyUnavailable:
            return None
        return keys[0] if keys else None

    def check(self, given: str) -> bool:
        """``given`` is one of the keys (constant time in the key's value; KeyUnavailable)."""
        ok = False
        raw = given.encode("utf-8", "surrogateescape")
        for key in self.keys():
            ok |= hmac.compare_digest(raw, key.encode("utf-8", "surrogateescape"))
        return ok

    def _read(self, path: Path) -> _FileState:
        try:
            st = os.stat(path)
            stamp = stat_stamp(st)
        except OSError as exc:
            return _FileState(None, (), f"the API key file {path} cannot be read ({exc.strerror or exc})")
        known = self._states.get(path)
        if known is not None and known.stamp == stamp:
            return known
        try:
            text = path.read_bytes().decode("utf-8", "surrogateescape")
        except OSError as exc:
            state = _FileState(None, (), f"the API key file {path} cannot be read ({exc.strerror or exc})")
        else:
            keys = tuple(file_keys(text))
            state = _FileState(stamp, keys, None if keys else f"the API key file {path} holds no key")
        self._states[path] = state
        return state


def exposure_refusal(host: str, port: int, extra_args: Sequence[str],
                     environ: Mapping[str, str] | None = None) -> str | None:
    """Why Slotkeeper will not listen on ``host``: beyond this machine with no usable key (None: it may)."""
    if is_loopback(host):
        return None
    keys = DoorKeys(extra_args, environ)
    try:
        usable = bool(keys.keys())
    except KeyUnavailable as exc:
        return (f"Slotkeeper does not listen on {host}, beyond this machine, while {exc}: anyone who can "
                f"reach port {port} could use it and read its conversations. Fix the key, or listen on "
                "127.0.0.1.")
    if usable:
        return None
    return (f"Slotkeeper does not listen on {host}, beyond this machine, without an API key: anyone who can "
            f"reach port {port} could use it and read its conversations. Add --api-key-file FILE to "
            "llama-server's arguments (or set LLAMA_API_KEY), or listen on 127.0.0.1.")
