"""The desktop app at rest: CPU and memory while nothing happens, measured with psutil.

    .venv/bin/python bench/bench_idle.py [--seconds 60] [--app dist/slotkeeper/slotkeeper]

Two apps run side by side under one virtual X display with a tray host (the window hidden in
the tray, as a user leaves it), each with the demo model (written beforehand, as the first run
leaves it): one as it comes, one with llama-server at `-lv 4`, whose log says
`update_slots: all slots are idle` twice a second. After they settle, each app process's CPU
time (its threads: engine loop, /slots poller, log tailer, Qt) and RSS are sampled over the same
window; llama-server's own CPU is shown apart. Prints % of one core and MB, and the -lv 4 app
against the plain one. --app measures a packaged app instead of the source tree. Needs Xvfb and
trayer (tests/system-deps.sh). Only loopback is used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from benchlib import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "desktop"))

from virtual_x import start_x, stop_x  # noqa: E402

sys.path.insert(0, str(ROOT / "app"))
from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.model.demo_model import ensure_demo_model  # noqa: E402


def launch(display: str, data: Path, port: int, extra: list[str], app: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "PYTHONPATH": str(ROOT / "app")}
    env.pop("SLOTKEEPER_HOME", None)
    log = open(data.parent / f"{data.name}.stderr", "wb")  # noqa: SIM115 - closed with the process
    program = [app] if app else [sys.executable, "-m", "slotkeeper"]
    return subprocess.Popen([*program, "--data-dir", str(data), "--demo",
                             "--port", str(port), *(["--", *extra] if extra else [])],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the app's server did not become ready")


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait after the server is ready")
    ap.add_argument("--app",
                    help="the packaged app to measure (e.g. dist/slotkeeper/slotkeeper; default: from "
                         "source)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotkeeper-bench-idle-"))
    display, xprocs = start_x(tray=True)
    apps: dict[str, subprocess.Popen] = {}
    try:
        for name, extra in (("plain", []), ("lv4", ["-lv", "4"])):
            port = free_port()
            ensure_demo_model(app_paths(work / name).models_dir)  # as after the first run (which writes it)
            apps[name] = launch(display, work / name, port, extra, args.app)
            wait_healthy(port, apps[name])
        time.sleep(args.settle)
        procs = {name: psutil.Process(p.pid) for name, p in apps.items()}
        servers = {name: [c for c in p.children(recursive=True) if "llama" in c.name()]
                   for name, p in procs.items()}
        start = {name: cpu_seconds(p) for name, p in procs.items()}
        sstart = {name: sum(cpu_seconds(c) for c in cs) for name, cs in servers.items()}
        rss: dict[str, list[float]] = {name: [] for name in procs}
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            for name, p in procs.items():
                rss[name].append(p.memory_info().rss / 1e6)
            time.sleep(1.0)
        took = time.monotonic() - t0
        cpu = {name: 100 * (cpu_seconds(p) - start[name]) / took for name, p in procs.items()}
        scpu = {name: 100 * (sum(cpu_seconds(c) for c in servers[name]) - sstart[name]) / took
                for name in procs}
        for name in procs:
            print(f"{name:>5}: app {cpu[name]:.2f}% of a core, RSS {statistics.median(rss[name]):.0f} MB "
                  f"(max {max(rss[name]):.0f}); llama-server {scpu[name]:.2f}% of a core  [{took:.0f} s "
                  "idle]")
        print(f"app CPU with -lv 4 vs plain: {cpu['lv4'] / max(cpu['plain'], 1e-6):.2f}x "
              f"(goal: each < 1% of a core, RSS < 120 MB)")
        log = work / "lv4" / "logs" / "llama-server.log"
        if log.exists():
            beats = sum(1 for line in log.read_text(errors="replace").splitlines()
                        if "all slots are idle" in line)
            print(f"the -lv 4 server log holds {beats} idle heartbeat lines (kept in the file, hidden in the "
                  "view)")
        return 0
    finally:
        for p in apps.values():
            p.terminate()
        for p in apps.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_x(xprocs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
