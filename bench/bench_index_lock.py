"""How long writing the sessions index out holds the lock every routed request takes.

    .venv/bin/python bench/bench_index_lock.py [--sessions 10000] [--rounds 5]

Builds a sessions index in memory as a running engine holds it (a sidecar record and a token
part for each of N sessions, conversations of 1,000 to 5,000 tokens), then calls ``to_bytes``
(what the engine's ``save_index`` writes to disk) ``--rounds`` times, twice over:

- cold: right after the records were made, nothing of them encoded yet (after many saves);
- warm: every record's JSON already encoded once (the steady state).

Each time it prints how long ``to_bytes`` took in all and the longest time it held the index's
lock in one go, and, with a thread routing prompts meanwhile (``longest_prefix``, as the front
door does for every request), the longest a routing call took while ``to_bytes`` ran. No disk,
no server. Timings are noisy on shared machines: compare the lock's hold with the whole call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.sessions.index import BLOCK, SessionsIndex, SidecarRecord  # noqa: E402
from slotkeeper.core.sessions.index_file import index_bytes
from slotkeeper.core.sessions.sidecar import Sidecar  # noqa: E402

SIDECAR = Path(__file__).resolve().parents[1] / "tests" / "data" / "sidecar_v2.json"


class TimedLock:
    """An RLock that remembers the longest time it was held in one go (outermost hold)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self.longest = 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            if self._depth == 1:
                self._since = time.perf_counter()
        return got

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.longest = max(self.longest, time.perf_counter() - self._since)
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def build(n: int) -> tuple[SessionsIndex, str]:
    base = Sidecar.from_json(json.loads(SIDECAR.read_text()))
    index = SessionsIndex(Path("/nonexistent/sessions"))
    index.lock = TimedLock()  # type: ignore[assignment]
    now = time.time_ns() - 60 * 10**9
    for i in range(n):
        sid = f"{i:012x}"
        kv = f"{sid}.00000000.kv"
        n_tokens = 1000 + (i * 7919) % 4000
        sc = replace(base, id=sid, kv_file=kv, title=f"{base.title} #{i}", n_tokens=n_tokens)
        stamp = (0o100600, 1000 + i, now + i, 10_000 + i, now + i)
        index.set_record(sid, SidecarRecord.read(stamp, sc))
        tokens = range(i * 10_000, i * 10_000 + n_tokens)
        index.add_tokens(sid, base.model_sha256, kv, sc.size_bytes, now + i, tokens)
    return index, base.model_sha256


def measure(index: SessionsIndex, sha: str, n: int) -> tuple[float, float, float]:
    """(to_bytes seconds, longest lock hold, longest routing call meanwhile)."""
    lock: TimedLock = index.lock  # type: ignore[assignment]
    stop = threading.Event()
    worst = [0.0]
    prompt = list(range(5 * 10_000, 5 * 10_000 + 20 * BLOCK))

    def route() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            index.longest_prefix(prompt, sha)
            worst[0] = max(worst[0], time.perf_counter() - t)
            time.sleep(0.0005)

    router = threading.Thread(target=route, daemon=True)
    router.start()
    time.sleep(0.05)
    worst[0] = 0.0
    lock.longest = 0.0
    t0 = time.perf_counter()
    data = index_bytes(index)
    took = time.perf_counter() - t0
    held = lock.longest
    stop.set()
    router.join()
    assert data.count(b"\n") == n + 1
    return took, held, worst[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for state in ("cold", "warm"):
        rows = []
        for _ in range(args.rounds):
            index, sha = build(args.sessions)
            if state == "warm":
                index_bytes(index)
            rows.append(measure(index, sha, args.sessions))
        took, held, routed = (statistics.median(r[k] for r in rows) * 1000 for k in range(3))
        print(f"{state}: to_bytes of {args.sessions:,} sessions {took:.1f} ms; the lock held at most "
              f"{held:.1f} ms in one go; a routing call meanwhile took at most {routed:.1f} ms "
              f"(medians of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
