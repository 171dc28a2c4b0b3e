"""Size and start-up times of the built bundle (Linux), for the release notes.

    .venv/bin/python packaging/measure_startup.py [dist/slotkeeper] [--runs 5]

Measures, from launching the process:
  - `slotkeeper --version` until it exits;
  - `slotkeeper serve --demo` until it prints `ready http://...` (first launch on an empty data
    folder, which writes the demo model, then relaunches on the same folder);
  - the desktop app (`slotkeeper --demo`), when Xvfb and xdotool are installed: until its tray
    icon is embedded in a system tray (trayer on Xvfb) and, without a tray, until its main
    window is mapped. Both are polled every 10 ms with `xdotool search --onlyvisible`.
Each figure is the median of --runs launches (the slowest is shown too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "desktop"))
from virtual_x import virtual_x  # noqa: E402


def user_env(display: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLOTKEEPER_", "PYTHON", "VIRTUAL_ENV", "QT_"))}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not Path(d, "llama-server").exists())
    env["LANG"] = "C.UTF-8"
    if display:
        env["DISPLAY"] = display
        env["QT_QPA_PLATFORM"] = "xcb"
    else:
        env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (max {max(values):.2f} s, n={len(values)})"


def time_version(exe: Path, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([str(exe), "--version"], env=user_env(), check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def time_ready(exe: Path, data: Path) -> float:
    port = free_port()
    argv = [str(exe), "serve", "--demo", "--port", str(port), "--data-dir", str(data)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("ready "):
                return time.perf_counter() - t0
        raise RuntimeError(f"serve exited ({proc.wait()}) without printing ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def visible(display: str, query: tuple[str, ...], fits) -> bool:
    """Is a window matching the xdotool query, with a size that fits(w, h), mapped?"""
    env = {**os.environ, "DISPLAY": display}
    r = subprocess.run(["xdotool", "search", "--onlyvisible", *query], capture_output=True, text=True,
                       env=env)
    for wid in r.stdout.split():
        g = subprocess.run(["xdotool", "getwindowgeometry", "--shell", wid], capture_output=True, text=True,
                           env=env).stdout
        size = dict(line.split("=", 1) for line in g.split() if "=" in line)
        if "WIDTH" in size and fits(int(size["WIDTH"]), int(size["HEIGHT"])):
            return True
    return False


def is_tray_icon(w: int, h: int) -> bool:
    return w <= 64 and h <= 64  # a notification balloon has the same name and class


def is_main_window(w: int, h: int) -> bool:
    return w >= 400 and h >= 300


def time_gui(exe: Path, display: str, data: Path, query: tuple[str, ...], fits, timeout: float = 30) -> float:
    argv = [str(exe), "--demo", "--port", str(free_port()), "--data-dir", str(data)]
    data.mkdir(parents=True, exist_ok=True)
    log = data / "app.log"
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=user_env(display), stdout=err, stderr=err, stdin=subprocess.DEVNULL)
        try:
            while time.perf_counter() - t0 < timeout:
                if visible(display, query, fits):
                    return time.perf_counter() - t0
                if proc.poll() is not None:
                    raise RuntimeError(f"the app exited with {proc.returncode}:\n"
                                       f"{log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.01)
            raise RuntimeError(f"no visible window matching {query} after {timeout} s")
        finally:
            # Quit once llama-server is up: quitting while it is still being launched is
            # another matter (and used to leave it running).
            deadline = time.monotonic() + 30
            while (time.monotonic() < deadline and proc.poll() is None
                   and "server ready" not in log.read_text(errors="replace")):
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            kill_leftover_server(data)


def kill_leftover_server(data: Path) -> None:
    r = subprocess.run(["pgrep", "-f", f"slot-save-path {data / 'sessions'}"], capture_output=True, text=True)
    for pid in r.stdout.split():
        print(f"warning: llama-server {pid} outlived the app; killing it", file=sys.stderr)
        os.kill(int(pid), signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", nargs="?", default=str(ROOT / "dist" / "slotkeeper"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    bundle = Path(args.bundle)
    exe = bundle / "slotkeeper"
    if not exe.is_file():
        print(f"{exe} not found: run `make package` first", file=sys.stderr)
        return 2

    size = subprocess.run(["du", "-sh", str(bundle)], capture_output=True, text=True).stdout.split()[0]
    print(f"bundle size (du -sh {bundle}): {size}")
    print(f"--version: {summary(time_version(exe, args.runs))}")

    with tempfile.TemporaryDirectory() as tmp:
        firsts, agains = [], []
        for i in range(args.runs):
            data = Path(tmp, f"serve{i}")
            firsts.append(time_ready(exe, data))
            agains.append(time_ready(exe, data))
        print(f"serve --demo to `ready`, empty data folder: {summary(firsts)}")
        print(f"serve --demo to `ready`, relaunch:          {summary(agains)}")

        if not (shutil.which("Xvfb") and shutil.which("xdotool")):
            print("desktop app: skipped (needs Xvfb and xdotool)")
            return 0
        cases = [(True, ("--class", "slotkeeper"), is_tray_icon, "its tray icon (Xvfb + trayer)"),
                 (False, ("--name", "^Slotkeeper$"), is_main_window, "its main window (Xvfb, no tray)")]
        for tray, query, fits, what in cases:
            if tray and not shutil.which("trayer"):
                print("desktop app to its tray icon: skipped (needs trayer)")
                continue
            # --demo has a model, so with a tray the app starts in the tray (no window).
            with virtual_x(tray=tray) as display:
                runs = [time_gui(exe, display, Path(tmp, f"{'tray' if tray else 'window'}{i}"), query, fits)
                        for i in range(args.runs)]
            print(f"desktop app to {what}: {summary(runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
