"""What a listing of the sessions folder returns: sessions with their problems, and other files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from slotkeeper.core.sessions.sidecar import SIDECAR_KEYS, Sidecar

# `sessions list --json` shows every sidecar key but these internals.
LIST_KEYS: tuple[str,
                 ...] = tuple(k for k in SIDECAR_KEYS
                              if k not in ("schema_version", "tokens_digest", "corrupt",
                                           "continues"))


class SessionNotFound(KeyError):
    def __str__(self) -> str:
        return f"no saved session with id {self.args[0]!r}"


@dataclass
class SessionEntry:
    """A sidecar as listed: with the problems a cheap look (or a verify) found."""

    id: str
    sidecar: Sidecar | None  # None when the sidecar itself cannot be read
    kv_path: Path | None
    problems: list[str] = field(default_factory=list)
    # The KV file's size on disk (lstat; 0 when missing or not a regular file). Never the
    # sidecar's size_bytes: that is what was saved, checked against this, and a sidecar may lie.
    size_bytes: int = 0

    @property
    def status(self) -> str:
        return "corrupt" if self.problems else "ok"

    def to_json(self) -> dict[str, Any]:
        """The stable shape of `sessions list --json` (users' scripts rely on these names)."""
        return list_row(self.id, None if self.sidecar is None else self.sidecar.to_json(), self.size_bytes,
                        self.problems)


def list_row(session_id: str, sidecar_json: dict[str, Any] | None, size_bytes: int,
             problems: list[str]) -> dict[str, Any]:
    """One session in `sessions list --json`, from its sidecar's JSON (None: unreadable)."""
    base = row_base(sidecar_json or {})
    if sidecar_json is None:
        base.update(id=session_id, pinned=False)
    base.update(row_end(size_bytes, problems))
    return base


def row_base(sidecar_json: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's part of a list row (what the sessions index keeps ready as JSON)."""
    return {k: sidecar_json.get(k) for k in LIST_KEYS if k != "size_bytes"}


def row_end(size_bytes: int, problems: list[str]) -> dict[str, Any]:
    """What the folder adds to a list row: the KV file's size on disk (as budgets count it), and
    the problems a cheap look found."""
    return {"size_bytes": size_bytes, "status": "corrupt" if problems else "ok", "problems": list(problems)}


def finish_row(base_json: bytes, size_bytes: int, problems: list[str]) -> bytes:
    """``orjson.dumps(list_row(...))`` from ``orjson.dumps(row_base(sidecar))``, without decoding it."""
    return base_json[:-1] + b"," + orjson.dumps(row_end(size_bytes, problems))[1:]


@dataclass(frozen=True)
class UnmanagedFile:
    """A file in the sessions folder that Slotkeeper did not write (never followed if a link)."""

    name: str
    size_bytes: int  # regular files only; 0 for links, FIFOs, directories ...
    kind: str = "file"  # fsutil.file_kind: "file", "symbolic link", "directory", "FIFO" ...


@dataclass
class Listing:
    sessions: list[SessionEntry]
    unmanaged: list[UnmanagedFile]

    @property
    def total_bytes(self) -> int:
        """The saved sessions' KV files on disk: what counts towards the budget. Files that are
        not Slotkeeper's (``unmanaged``) are reported apart and never count."""
        return sum(e.size_bytes for e in self.sessions)

    @property
    def unmanaged_bytes(self) -> int:
        return sum(u.size_bytes for u in self.unmanaged)
