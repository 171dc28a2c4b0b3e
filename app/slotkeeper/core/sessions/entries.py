"""What a listing of the sessions folder returns: sessions with their problems, and other files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotkeeper.core.sessions.sidecar import SIDECAR_KEYS, Sidecar

# `sessions list --json` shows every sidecar key but these internals.
LIST_KEYS: tuple[str, ...] = tuple(k for k in SIDECAR_KEYS if k not in ("schema_version", "tokens_digest", "corrupt"))


@dataclass
class SessionEntry:
    """A sidecar as listed: with the problems a cheap look (or a verify) found."""

    id: str
    sidecar: Sidecar | None  # None when the sidecar itself cannot be read
    kv_path: Path | None
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "corrupt" if self.problems else "ok"

    @property
    def size_bytes(self) -> int:
        if self.sidecar is not None:
            return self.sidecar.size_bytes
        try:
            return self.kv_path.stat().st_size if self.kv_path else 0
        except OSError:
            return 0

    def to_json(self) -> dict[str, Any]:
        """The stable shape of `sessions list --json` (users' scripts rely on these names)."""
        data = self.sidecar.to_json() if self.sidecar is not None else {}
        base: dict[str, Any] = {k: data.get(k) for k in LIST_KEYS}
        if self.sidecar is None:
            base.update(id=self.id, size_bytes=self.size_bytes, pinned=False)
        base["status"] = self.status
        base["problems"] = list(self.problems)
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
        return sum(e.size_bytes for e in self.sessions) + self.unmanaged_bytes

    @property
    def unmanaged_bytes(self) -> int:
        return sum(u.size_bytes for u in self.unmanaged)
