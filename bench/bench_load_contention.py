"""llama-server's start-up alone and beside one busy process, side by side in one run.

    .venv/bin/python bench/bench_load_contention.py [--rounds 6] [--busy 1.0] [--kind bench] [--work DIR]

A relaunch of Slotkeeper runs Python's start-up on the same cores as llama-server's model load.
This shows what any such neighbour costs llama-server: each round starts llama-server (with the
arguments Slotkeeper gives it) and polls `/health` every 5 ms, once alone and once while a
separate process spins for --busy seconds of CPU (the order flips every other round). Prints
the median time to ready of each, their ratio, and the CPU llama-server used (Linux's /proc):
when it grows with the same work, its threads spent it waiting. Loopback only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from benchlib import alternate, cpu_seconds, free_port, generated_model, report, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from slotkeeper.core.server.command import build_argv  # noqa: E402
from slotkeeper.core.server.locate import locate_server, probe_flags  # noqa: E402
from slotkeeper.core.settings import ServerProfile  # noqa: E402

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
        model = generated_model(work, args.kind)
        binary = locate_server()
        port = free_port()
        folder = work / "contention-slots"
        folder.mkdir(mode=0o700, exist_ok=True)
        profile = ServerProfile(model_path=str(model), host="127.0.0.1", port=port, ctx=args.ctx, parallel=1)
        argv = build_argv(binary.argv_prefix, profile, model, folder, supported_flags=probe_flags(binary))
        cpu: dict[bool, list[float]] = {False: [], True: []}

        def start(busy: bool) -> tuple[float, str]:
            with httpx.Client() as http, (work / "contention.log").open("a") as log:
                t0 = time.perf_counter()
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                neighbour = (subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=args.busy)])
                             if busy else None)
                try:
                    while True:
                        try:
                            if http.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        if proc.poll() is not None:
                            raise RuntimeError(f"llama-server stopped; see {work / 'contention.log'}")
                        time.sleep(0.005)
                    took = time.perf_counter() - t0
                    used = cpu_seconds(proc.pid)
                finally:
                    proc.terminate()
                    proc.wait(60)
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
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
