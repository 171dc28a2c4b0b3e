"""What the benchmarks here share: a free loopback port (benchmarks never leave 127.0.0.1), the
work folder and its generated model, and rounds that alternate Slotkeeper and raw llama-server."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux's /proc; None elsewhere or once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux's /proc; empty elsewhere)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def work_folder(given: str | None, parent: str | None = None) -> Iterator[Path]:
    """The benchmark's folder: --work's (created if missing, and kept: a later run reuses what it
    holds), or a new temporary one under ``parent``, removed after a run that ends well (a failed
    run keeps its logs to look at)."""
    work = Path(given) if given else Path(tempfile.mkdtemp(prefix="slotkeeper-bench-", dir=parent))
    work.mkdir(parents=True, exist_ok=True)
    yield work
    if not given:
        shutil.rmtree(work, ignore_errors=True)


def generated_model(work: Path, kind: str) -> Path:
    """The generated model of ``kind`` in ``work``, written once (a --work folder keeps it)."""
    model = work / f"{kind}.gguf"
    if not model.exists():
        from slotkeeper.core.modelgen import write_model

        write_model(model, kind)
    return model


def alternate(rounds: int, slotkeeper: Callable[[], tuple[float, str]],
              raw: Callable[[], tuple[float, str]],
              names: tuple[str, str] = ("slotkeeper", "raw")) -> tuple[list[float], list[float]]:
    """``rounds`` rounds of Slotkeeper against raw llama-server (or the two sides ``names`` says),
    the order flipped every other round so the machine's drift falls on both alike; each side
    returns (seconds, a note for the line). Prints a line per round; returns the seconds of each side."""
    times: tuple[list[float], list[float]] = ([], [])
    for rnd in range(rounds):
        order = [(0, slotkeeper), (1, raw)]
        if rnd % 2:
            order.reverse()
        line = []
        for side, fn in order:
            took, note = fn()
            times[side].append(took)
            line.append(f"{names[side]} {took:.3f} s{f' ({note})' if note else ''}")
        print(f"round {rnd}: " + " | ".join(line), flush=True)
    return times


def report(what: str, slotkeeper: list[float], raw: list[float],
           names: tuple[str, str] = ("Slotkeeper", "raw llama-server")) -> None:
    """The medians of ``alternate``'s rounds, and their ratio."""
    s, r = statistics.median(slotkeeper), statistics.median(raw)
    print(f"{what}, median of {len(slotkeeper)}: {names[0]} {s:.3f} s, {names[1]} {r:.3f} s: {s / r:.2f}x")
