"""What a listing of the sessions folder returns: sessions with their problems, and other files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotkeeper.core.sessions.sidecar import SIDECAR_KEYS, Sidecar

# `sessions list --json` shows every sidecar key but these internals.
LIST_KEYS: tuple[str, ...] = tuple(k for k in SIDECAR_KEYS if k not in ("schema_version", "tokens_digest", "corrupt",
                                                                        "continues"))


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
    data = sidecar_json or {}
    base: dict[str, Any] = {k: data.get(k) for k in LIST_KEYS}
    if sidecar_json is None:
        base.update(id=session_id, pinned=False)
    base["size_bytes"] = size_bytes  # on disk, as budgets count it
    base["status"] = "corrupt" if problems else "ok"
    base["problems"] = list(problems)
    return base


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

    @property
    def disk_bytes(self) -> int:
        """Everything in the folder: sessions and other files."""
        return self.total_bytes + self.unmanaged_bytes
