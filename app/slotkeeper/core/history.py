"""Per-request history (how much of each prompt came from the cache), kept across restarts.

Stored as JSON Lines, one request per line, so recording a request is one small append
rather than a rewrite. A launch of the server is a line too (``LaunchRecord``: when it was ready
and which slots it restored), so the History tab marks launches of earlier runs after a relaunch;
a version that does not know launch lines skips them as it skips any line it cannot read. The file is
compacted (rewritten atomically with the newest ``max_records``) once it holds twice that many lines, which
keeps appends cheap and the file bounded. A damaged line (a crash mid-append, a disk filling up) costs that
one record, never the whole history.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from slotkeeper.core.basics.fsutil import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, atomic_write_text

__all__ = ["HISTORY_VERSION", "LaunchRecord", "RequestHistory", "RequestRecord"]

HISTORY_VERSION = 1


@dataclass(frozen=True)
class RequestRecord:
    """One completed request, as llama-server reported its prompt processing.

    at: unix time the request finished.
    n_prompt: tokens in the prompt.
    cache_n: prompt tokens taken from the KV cache (llama-server's timings.cache_n).
    prompt_n: prompt tokens evaluated anew (timings.prompt_n).
    prompt_ms: time spent evaluating them (timings.prompt_ms).
    """

    at: float
    slot: int
    n_prompt: int
    cache_n: int
    prompt_n: int
    prompt_ms: float
    # Where the cache came from: "slot" (it was there), "restored" (from disk for this request),
    # "ram" (llama-server's own prompt cache), "recomputed" (erased to stay correct), "none";
    # "" for records written before Slotkeeper served the requests itself.
    source: str = ""
    saved_ms: float = 0.0  # prefill time the cached tokens saved, at the measured prefill rate

    @property
    def cache_share(self) -> float:
        """Fraction of the prompt served from the cache, 0.0-1.0 (0.0 for an empty prompt)."""
        total = self.n_prompt or (self.cache_n + self.prompt_n)
        if total <= 0:
            return 0.0
        return min(1.0, max(0.0, self.cache_n / total))

    def to_json(self) -> dict[str, Any]:
        return {"v": HISTORY_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> RequestRecord:
        """Parse one line's object; ValueError when it is not a record this version knows."""
        if not isinstance(data, dict) or data.get("v") != HISTORY_VERSION:
            raise ValueError("not a version-1 history record")
        return cls(
            at=_number(data, "at"),
            slot=_int(data, "slot"),
            n_prompt=_int(data, "n_prompt"),
            cache_n=_int(data, "cache_n"),
            prompt_n=_int(data, "prompt_n"),
            prompt_ms=_number(data, "prompt_ms"),
            source=str(data.get("source", "")),
            saved_ms=_number(data, "saved_ms") if "saved_ms" in data else 0.0,
        )


@dataclass(frozen=True)
class LaunchRecord:
    """The server was launched and ready at ``at`` (unix time), with saved conversations restored
    into ``restored_slots`` at launch: the first request of such a slot is served by that restore."""

    at: float
    restored_slots: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"v": HISTORY_VERSION, "launch": self.at, "restored_slots": list(self.restored_slots)}

    @classmethod
    def from_json(cls, data: Any) -> LaunchRecord:
        """ValueError when it is not a launch line this version knows."""
        if not isinstance(data, dict) or data.get("v") != HISTORY_VERSION or "launch" not in data:
            raise ValueError("not a version-1 launch record")
        slots = data.get("restored_slots", [])
        if (not isinstance(slots, list)
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in slots)):
            raise ValueError(f"bad restored_slots: {slots!r}")
        return cls(at=_number(data, "launch"), restored_slots=tuple(slots))


def _number(data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    # bool is an int subclass; a true/false here means the line is not ours.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"bad {key}: {value!r}")
    return float(value)


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"bad {key}: {value!r}")
    return value


def _encode(record: RequestRecord | LaunchRecord) -> str:
    return json.dumps(record.to_json(), separators=(",", ":")) + "\n"


def _separator(fh: BinaryIO) -> str:
    """A newline when the file ends mid-line (a crash during an append), else nothing.

    Without it the next record would be glued to the damaged tail and lost with it.
    """
    end = fh.seek(0, os.SEEK_END)
    if end == 0:
        return ""
    fh.seek(end - 1)
    return "" if fh.read(1) == b"\n" else "\n"


def _decode(line: str) -> RequestRecord | None:
    try:
        return RequestRecord.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError):
        return None


def _decode_launch(line: str) -> LaunchRecord | None:
    if '"launch"' not in line:  # most lines are requests: no JSON parse for them
        return None
    try:
        return LaunchRecord.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError):
        return None


class RequestHistory:
    """The history file; one instance per file, shared by every thread that records."""

    def __init__(self, path: Path, max_records: int = 5000) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}")
        self.path = Path(path)
        self.max_records = max_records
        self._lock = threading.Lock()
        self._line_count: int | None = None  # counted lazily, on the first append

    def append(self, record: RequestRecord | LaunchRecord) -> None:
        """Record one request (or a launch); compacts the file when it has grown past 2x max_records."""
        line = _encode(record)
        with self._lock:
            if self._line_count is None:
                self._line_count = self._count_lines()
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                         PRIVATE_FILE_MODE)
            if sys.platform != "win32" and os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, PRIVATE_FILE_MODE)  # a file an older version made 0644
            with os.fdopen(fd, "ab+") as fh:
                fh.write((_separator(fh) + line).encode("utf-8"))
            self._line_count += 1
            if self._line_count > 2 * self.max_records:
                self._compact()

    def load(self) -> list[RequestRecord]:
        """The newest ``max_records`` readable records, oldest first.

        Malformed lines are skipped and a missing or unreadable file reads as empty: a damaged
        history must never stop the app. Lines beyond ``max_records`` that compaction has not
        yet dropped are left out, so the answer does not depend on when it last ran.
        """
        with self._lock:
            return list(self._read(self.max_records))

    def launches(self) -> list[LaunchRecord]:
        """The launches recorded since the oldest request kept, oldest first (the launch before
        that request included: it marks where that request's run began)."""
        with self._lock:
            records, launches = self._read_all(self.max_records)
        oldest = records[0].at if records else float("-inf")
        before = [launch for launch in launches if launch.at <= oldest]
        return before[-1:] + [launch for launch in launches if launch.at > oldest]

    def recent(self, n: int) -> list[RequestRecord]:
        """The newest ``n`` records (at most ``max_records``), oldest first."""
        if n <= 0:
            return []
        with self._lock:
            return list(self._read(min(n, self.max_records)))

    # -- internals (called with the lock held) -------------------------------------------

    def _read(self, keep: int) -> deque[RequestRecord]:
        return self._read_all(keep)[0]

    def _read_all(self, keep: int) -> tuple[deque[RequestRecord], list[LaunchRecord]]:
        newest: deque[RequestRecord] = deque(maxlen=keep)
        launches: list[LaunchRecord] = []
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    record = _decode(line)
                    if record is not None:
                        newest.append(record)
                        continue
                    launch = _decode_launch(line)
                    if launch is not None:
                        launches.append(launch)
        except OSError:
            pass  # no history yet, or unreadable: the plot simply starts empty
        return newest, launches

    def _count_lines(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0

    def _compact(self) -> None:
        records, launches = self._read_all(self.max_records)
        oldest = records[0].at if records else float("-inf")
        kept = [launch for launch in launches if launch.at <= oldest][-1:] + [
            launch for launch in launches if launch.at > oldest]
        lines: list[RequestRecord | LaunchRecord] = sorted([*records, *kept], key=lambda r: r.at)
        atomic_write_text(self.path, "".join(_encode(r) for r in lines))  # 0600
        self._line_count = len(lines)
