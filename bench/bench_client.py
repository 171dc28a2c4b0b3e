"""LlamaClient's cost: importing it (time, RSS), and 200 GET /slots against a real llama-server.

    .venv/bin/python bench/bench_client.py [--calls 200] [--baseline-app OTHER_CHECKOUT/app] [--url URL]

Each measurement runs in a fresh interpreter per app folder: this checkout's app/ and, with
--baseline-app, another checkout's (an older client to compare with). The import figures are
the wall time and the RSS growth of importing the client, the engine and the GUI (median of
--imports runs);
the latency figures are per call of LlamaClient.slots() on one client, after 10 warm-up calls.
For reference the same calls are also made with a bare httpx.Client. Without --url a
llama-server is started on the tiny generated test model (loopback only); --local uses a
keep-alive http.server in this process instead. Timings are noisy on shared machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchlib import free_port

ROOT = Path(__file__).resolve().parents[1]
# The client alone, the engine that imports it, and the GUI (what the desktop app loads at start-up).
IMPORTED = ("slotkeeper.core.server.client", "slotkeeper.core.engine.engine", "slotkeeper.gui.application")

IMPORT_PROBE = """
import sys, time, psutil
proc = psutil.Process()
rss0, t0 = proc.memory_info().rss, time.perf_counter()
try:
    import {module}
except ModuleNotFoundError as e:  # a checkout from before the client moved under core/server/
    if e.name != "slotkeeper.core.server.client":
        raise
    import slotkeeper.core.client
t1 = time.perf_counter()
print(t1 - t0, proc.memory_info().rss - rss0)
"""

LATENCY_PROBE = """
import json, sys, time
url, calls = sys.argv[1], int(sys.argv[2])
if sys.argv[3] == "httpx":
    import httpx
    http = httpx.Client(base_url=url, timeout=10)
    call = lambda: http.get("/slots").json()
else:
    try:
        from slotkeeper.core.server.client import LlamaClient
    except ModuleNotFoundError:  # a checkout from before the client moved under core/server/
        from slotkeeper.core.client import LlamaClient
    http = LlamaClient(url)
    call = http.slots
for _ in range(10):
    call()
times = []
for _ in range(calls):
    t0 = time.perf_counter()
    call()
    times.append(time.perf_counter() - t0)
http.close()
print(json.dumps(times))
"""


def run_probe(app: Path | None, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(app) if app else ""}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    return out.stdout


def import_cost(app: Path | None, module: str, runs: int) -> tuple[float, float]:
    samples = [run_probe(app, IMPORT_PROBE.format(module=module)).split() for _ in range(runs)]
    return (statistics.median(float(t) for t, _ in samples),
            statistics.median(int(rss) for _, rss in samples) / 2**20)


def latency(app: Path | None, url: str, calls: int, kind: str) -> str:
    times = sorted(json.loads(run_probe(app, LATENCY_PROBE, url, str(calls), kind)))
    ms = [t * 1000 for t in times]
    return (f"median {statistics.median(ms):.3f} ms, p90 {ms[int(len(ms) * 0.9)]:.3f} ms, "
            f"total {sum(ms):.1f} ms")


class SlotsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    body = json.dumps([{"id": i, "n_ctx": 4096, "is_processing": False, "id_task": None}
                       for i in range(4)]).encode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def start_llama_server(work: Path) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(ROOT / "app"))
    from slotkeeper.core.model.modelgen import write_model
    from slotkeeper.core.server.client import LlamaClient, ServerUnavailable
    from slotkeeper.core.server.locate import locate_server

    model = write_model(work / "tiny.gguf", "llama")
    port = free_port()
    argv = [*locate_server().argv_prefix, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", "4"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    with LlamaClient(url, timeout=2) as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if client.health().ok:
                    return proc, url
            except ServerUnavailable:
                pass
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama-server did not become ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--imports", type=int, default=7, help="fresh interpreters per import figure")
    ap.add_argument("--baseline-app", type=Path, help="another checkout's app/ folder to compare with")
    ap.add_argument("--url", help="a running llama-server to call (default: start one)")
    ap.add_argument("--local", action="store_true", help="call a local http.server, not llama-server")
    args = ap.parse_args()
    apps = {"this": ROOT / "app"}
    if args.baseline_app:
        apps["baseline"] = args.baseline_app.resolve()

    print(f"import time and RSS growth (median of {args.imports} fresh interpreters):")
    probes = [("httpx", None, "(no app)")]
    probes += [(module, app, name) for module in IMPORTED for name, app in apps.items()]
    for module, app, name in probes:
        seconds, mib = import_cost(app, module, args.imports)
        print(f"  {name + ': import ' + module:50} {seconds * 1000:7.1f} ms {mib:7.1f} MiB")

    server, proc = None, None
    if args.url:
        url = args.url
    elif args.local:
        server = ThreadingHTTPServer(("127.0.0.1", 0), SlotsHandler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
    else:
        proc, url = start_llama_server(Path(tempfile.mkdtemp(prefix="slotkeeper-bench-")))
    try:
        print(f"{args.calls} x GET /slots on {'a local http.server' if args.local else 'llama-server'}:")
        print(f"  {'bare httpx.Client':30} {latency(None, url, args.calls, 'httpx')}")
        for name, app in apps.items():
            print(f"  {name + ': LlamaClient.slots()':30} {latency(app, url, args.calls, 'client')}")
    finally:
        if server is not None:
            server.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
