"""llama-server's start-up alone and beside one busy process, side by side in one run.

    .venv/bin/python bench/bench_load_contention.py [--rounds 6] [--busy 1.0] [--kind bench] [--work DIR]

A relaunch of Slotkeeper runs Python's start-up on the same cores as llama-server's model load.
This shows what any such neighbour costs llama-server: each round starts llama-server as
bench_relaunch's raw side does (Slotkeeper's arguments, `/health` polled every 10 ms), once alone
and once while a separate process spins for --busy seconds of CPU (the order flips every other
round). Prints
the median time to ready of each, their ratio, and the CPU llama-server used (Linux's /proc):
when it grows with the same work, its threads spent it waiting. Loopback only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import httpx
from bench_relaunch import Raw
from benchlib import alternate, generated_model, report, work_folder

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}:\n    pass\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--busy", type=float, default=1.0, help="CPU seconds the busy neighbour spins for")
    ap.add_argument("--kind", choices=("bench", "bench-kv"), default="bench")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--work", help="folder for the model and the log (default: a new temporary one)")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        folder = work / "contention-slots"
        folder.mkdir(mode=0o700, exist_ok=True)
        server = Raw(generated_model(work, args.kind), args.ctx, folder, work / "contention.log")
        cpu: dict[bool, list[float]] = {False: [], True: []}

        def start(busy: bool) -> tuple[float, str]:
            neighbours: list[subprocess.Popen] = []

            def spawn_neighbour() -> None:
                neighbours.append(subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=args.busy)]))

            with httpx.Client() as http:
                t0 = time.perf_counter()
                try:
                    server.start(http, spawn_neighbour if busy else None)
                    took = time.perf_counter() - t0
                finally:
                    server.stop()
                    for p in neighbours:
                        p.kill()
                        p.wait()
            used = server.cpu_at_ready[-1] if server.cpu_at_ready else None
            server.cpu_at_ready.clear()
            if used is not None:
                cpu[busy].append(used)
            return took, "" if used is None else f"CPU {used:.2f} s"

        start(False)  # warm-up: the model in the page cache
        beside, alone = alternate(args.rounds, lambda: start(True), lambda: start(False), ("beside", "alone"))
    report("llama-server start to ready", beside, alone, ("beside a busy process", "alone"))
    if cpu[True] and cpu[False]:
        print(f"llama-server's CPU until ready (median): {statistics.median(cpu[True]):.2f} s beside it, "
              f"{statistics.median(cpu[False]):.2f} s alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
