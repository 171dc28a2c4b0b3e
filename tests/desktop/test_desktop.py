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
        yield {**os.environ, "DISPLAY": display, "QT_SCALE_FACTOR": str(scale),
               "SCREEN_HEIGHT": str(800 * scale)}


def run_phase(phase, env, home, shots, model, server_bin, port):
    result = shots.parent / f"{phase}.json"
    # The Model menu lists what discovery finds: a llama.cpp cache with one other model, and no
    # Hugging Face cache of the machine's user.
    cache = shots.parent / "llama-cache"
    if not cache.exists():
        from slotkeeper.core.model.modelgen import write_model

        write_model(cache / "tiny-llama-alt.gguf", "llama-alt")
    env = {**env, "LLAMA_CACHE": str(cache), "HF_HUB_CACHE": str(shots.parent / "hf-hub")}
    cmd = [sys.executable, str(SCENARIO), phase, str(result), str(shots), "--",
           "--model", str(model), "--server-bin", server_bin, "--port", str(port),
           "--ctx", "2048", "--data-dir", str(home), "--idle-save", "0.3"]
    env = {**env, "QT_QPA_PLATFORM": "xcb", "LANG": "C.UTF-8",
           "QT_SCALE_FACTOR": env.get("QT_SCALE_FACTOR", "1")}
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


def run_command_phase(phase, env, home, shots, port, cache):
    """A phase run as the `slotkeeper` command runs the app: no model on the command line (what the
    first run chose is what runs), a llama.cpp cache holding the model to find."""
    result = shots.parent / f"{phase}.json"
    cmd = [sys.executable, str(SCENARIO), phase, str(result), str(shots), "--",
           "--port", str(port), "--data-dir", str(home), "--idle-save", "0.3"]
    env = {**env, "LLAMA_CACHE": str(cache), "HF_HUB_CACHE": str(shots.parent / "hf-hub"),
           "QT_QPA_PLATFORM": "xcb", "LANG": "C.UTF-8"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    data = json.loads(result.read_text()) if result.exists() else {}
    assert proc.returncode == 0 and "error" not in data, (
        f"{phase} failed ({proc.returncode}): {data.get('error')}\n{proc.stderr[-3000:]}")
    return data, proc.stderr


def test_a_newcomers_first_day(desktop, tmp_path, llama_model, port):
    """A fresh data folder, the first run (choose a model), two conversations, Quit; the relaunch
    serves at once, Resume lists both, and the window and the tray agree on where each is; another
    program on the port is a failure in words and a red icon."""
    import socket

    home, shots, cache = tmp_path / "home", tmp_path / "shots", tmp_path / "llama-cache"
    shots.mkdir()
    cache.mkdir()
    shutil.copy(llama_model, cache / "tiny-llama.gguf")

    first, _ = run_command_phase("newcomer", desktop, home, shots, port, cache)
    assert first["first_run"]["title"] == "Welcome to Slotkeeper"
    assert first["chosen"] == str(cache / "tiny-llama.gguf")
    assert first["done"] is True
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.settings import load_settings

    saved = load_settings(app_paths(home).settings_file)
    assert saved.profile.model_path == str(cache / "tiny-llama.gguf")
    assert saved.start_server_on_launch, "once a model is chosen, a relaunch serves it"

    again, err = run_command_phase("newcomer-again", desktop, home, shots, port, cache)
    assert not again["first_run_shown"]
    assert again["health"] == 200, "serving without a click"
    assert not again["window_built"]
    assert f"ready: clients use http://127.0.0.1:{port}" in err
    ids = again["resume_ids"]
    assert len(ids) == 2 and all(ids), again["resume_items"]
    assert "(in slot 0)" in again["resume_items"][0]  # restored at launch into the one slot
    assert again["tray_where"] == again["table_where"], (again["tray_where"], again["table_where"])
    assert again["table_where"][again["a_id"]] == "0", "the conversation that went on is in slot 0"
    assert again["tray_age"] == again["table_age"]
    assert again["launches"] >= 2 and again["launch_markers"] == 2, "both launches are marked"
    assert "restored" in again["sources"]
    assert again["log_sideways"] == 0
    assert "&Help" in again["help_menu"] and again["tray_about"] == "About Slotkeeper…"
    for name, (width, needs) in again["search_widths"].items():
        assert width >= needs, (name, width, needs)

    with socket.socket() as other:  # another program takes the port
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        busy, err = run_command_phase("port-busy", desktop, home, shots, port, cache)
    assert busy["icon_state"] == "error"
    assert busy["state_label"] == "Failed"
    assert f"Port {port} on 127.0.0.1 is already in use" in busy["state_message"]
    assert busy["log_last"].startswith(f"——— llama-server failed: Port {port}"), \
        "the log says it, not an old run"
    assert "Traceback" not in err, err[-3000:]
    assert sum("already in use" in line for line in err.splitlines()) == 1, err[-3000:]
    keep = os.environ.get("SLOTKEEPER_SCREENSHOTS")
    if keep:
        suffix = "-dark" if os.environ.get("SLOTKEEPER_COLOR_SCHEME", "").lower() == "dark" else ""
        for name in ("tray-resume-menu.png", "main-window-port-in-use.png", "first-run.png"):
            shutil.copy(shots / name, Path(keep) / name.replace(".png", f"{suffix}.png"))
