"""The desktop app as a person uses it: Xvfb, a real tray host (trayer), the real llama-server.

Launch -> the tray icon appears -> the server becomes ready -> a chat moves the gauge -> a right
click opens the tray menu -> Quit saves the session -> a relaunch restores it -> the next
request's gauge shows the cache hit. Screenshots land in the test's tmp dir; with
SLOTKEEPER_SCREENSHOTS=DIR they are also copied there (docs/screenshots for the README).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from virtual_x import virtual_x

pytestmark = pytest.mark.e2e
SCENARIO = Path(__file__).with_name("desktop_scenario.py")
TOOLS = ("Xvfb", "trayer", "openbox", "xdotool", "import")


@pytest.fixture
def desktop(tmp_path):
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        if os.environ.get("SLOTKEEPER_REQUIRE_SERVER") == "1":
            pytest.fail(f"missing {missing}: tests/system-deps.sh installs them")
        pytest.skip(f"missing {missing}")
    scale = int(os.environ.get("SLOTKEEPER_DESKTOP_SCALE", "1"))  # 2 = a HiDPI screen
    with virtual_x(tray=True, wm=True, scale=scale) as display:
        yield {**os.environ, "DISPLAY": display, "QT_SCALE_FACTOR": str(scale), "SCREEN_HEIGHT": str(800 * scale)}


def run_phase(phase, env, home, shots, model, server_bin, port):
    result = shots.parent / f"{phase}.json"
    # The Model menu lists what discovery finds: a llama.cpp cache with one other model, and no
    # Hugging Face cache of the machine's user.
    cache = shots.parent / "llama-cache"
    if not cache.exists():
        from slotkeeper.core.modelgen import write_model

        write_model(cache / "tiny-llama-alt.gguf", "llama-alt")
    env = {**env, "LLAMA_CACHE": str(cache), "HF_HUB_CACHE": str(shots.parent / "hf-hub")}
    cmd = [sys.executable, str(SCENARIO), phase, str(result), str(shots), "--",
           "--model", str(model), "--server-bin", server_bin, "--port", str(port),
           "--ctx", "2048", "--data-dir", str(home), "--idle-save", "0.3"]
    env = {**env, "QT_QPA_PLATFORM": "xcb", "LANG": "C.UTF-8", "QT_SCALE_FACTOR": env.get("QT_SCALE_FACTOR", "1")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    data = json.loads(result.read_text()) if result.exists() else {}
    assert proc.returncode == 0 and "error" not in data, (
        f"{phase} failed ({proc.returncode}): {data.get('error')}\n{proc.stderr[-3000:]}")
    return data


# `make stress-desktop` runs the whole scenario (two launches and quits) this many times in a row:
# the app must exit cleanly (code 0, no abort at exit) every time.
ROUNDS = int(os.environ.get("SLOTKEEPER_DESKTOP_ROUNDS", "1"))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_tray_gauge_quit_saves_relaunch_restores(desktop, tmp_path, llama_model, server_bin, port, round_):
    home = tmp_path / "home"
    shots = tmp_path / "shots"
    shots.mkdir()
    first = run_phase("first", desktop, home, shots, llama_model, server_bin, port)
    assert first["tray_available"] and first["has_tray"]
    x, y, w, h = first["tray_geometry"]
    logical_height = int(desktop["SCREEN_HEIGHT"]) / int(desktop["QT_SCALE_FACTOR"])
    assert w > 0 and h > 0 and y > 0.85 * logical_height  # in the tray at the bottom of the screen
    assert "127.0.0.1" in first["tooltip"]
    assert first["first_gauge"]["n_prompt"] > 0
    assert "Quit Slotkeeper" in first["menu_items"] and any("Resume" in t for t in first["menu_items"])
    assert first["done"] is True  # Quit saved and stopped everything

    from slotkeeper.core.sessions.store import SessionStore

    [saved] = SessionStore(home / "sessions").sessions()
    assert saved.status == "ok" and saved.sidecar.n_tokens > 50

    second = run_phase("second", desktop, home, shots, llama_model, server_bin, port)
    assert second["restored"] == 1
    t = second["timings"]
    assert t["cache_n"] >= 0.9 * saved.sidecar.n_tokens - 20
    assert second["second_gauge"]["cache_n"] == t["cache_n"]
    [after] = SessionStore(home / "sessions").sessions()
    assert after.sidecar.last_restore.effective is True

    assert "tiny-llama-alt" in " ".join(first["model_menu_items"])
    assert first["model_menu_checked"] == [llama_model.name]
    for name in ("main-window-slots.png", "main-window-sessions.png", "settings.png", "tray-menu.png",
                 "tray-model-menu.png", "main-window-cache-hit.png", "main-window-history.png"):
        assert (shots / name).stat().st_size > 10_000, name
    keep = os.environ.get("SLOTKEEPER_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        suffix = "" if desktop["QT_SCALE_FACTOR"] == "1" else f"@{desktop['QT_SCALE_FACTOR']}x"
        if os.environ.get("SLOTKEEPER_COLOR_SCHEME", "").lower() == "dark":  # the app follows it (gui.theme)
            suffix = f"-dark{suffix}"
        for png in shots.glob("*.png"):
            shutil.copy(png, Path(keep) / f"{png.stem}{suffix}.png")
