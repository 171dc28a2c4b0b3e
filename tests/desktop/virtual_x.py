"""A virtual X display for desktop tests and measurements: Xvfb, optionally a window manager
and a system-tray host (trayer). One place for what tests/desktop, tests/packaging and
packaging/measure_startup.py all need."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager


def start_x(tray: bool = False, wm: bool = False, scale: int = 1) -> tuple[str, list[subprocess.Popen]]:
    """Xvfb on a display number it picks itself (-displayfd); returns (":N", processes)."""
    r, w = os.pipe()
    width, height = 1280 * scale, 800 * scale
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", f"{width}x{height}x24",
                             "-nolisten", "tcp"],
                            pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        number = f.readline().strip()
    if not number:
        xvfb.kill()
        raise RuntimeError("Xvfb did not start")
    display = f":{number}"
    procs = [xvfb]
    env = {**os.environ, "DISPLAY": display}
    if wm:
        procs.append(subprocess.Popen(["openbox"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    if tray:
        procs.append(subprocess.Popen(
            ["trayer", "--edge", "bottom", "--align", "right", "--widthtype", "request",
             "--height", str(32 * scale), "--SetDockType", "true", "--transparent", "false", "--tint",
             "0x303030"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if tray or wm:
        time.sleep(1.0)  # let the tray host claim the _NET_SYSTEM_TRAY selection
    return display, procs


def stop_x(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()


@contextmanager
def virtual_x(tray: bool = False, wm: bool = False, scale: int = 1):
    display, procs = start_x(tray, wm, scale)
    try:
        yield display
    finally:
        stop_x(procs)
