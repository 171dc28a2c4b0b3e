"""The chat window as a person sees it: Xvfb with a window manager, the real llama-server, and the
starter model (SmolLM2-135M-Instruct) answering in English. The scenario (chat_scenario.py) types
two questions and photographs the window; with SLOTKEEPER_SCREENSHOTS=DIR the picture is kept there
(docs/screenshots: chat-window.png, chat-window-dark.png with SLOTKEEPER_COLOR_SCHEME=dark)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from virtual_x import virtual_x

pytestmark = pytest.mark.e2e
SCENARIO = Path(__file__).with_name("chat_scenario.py")
TOOLS = ("Xvfb", "openbox", "import")


@pytest.mark.timeout(1800)  # a 135M model on a busy two-core machine answers slowly
def test_the_chat_window_with_the_starter_model_answering(tmp_path, starter_model, server_bin, port):
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        if os.environ.get("SLOTKEEPER_REQUIRE_SERVER") == "1":
            pytest.fail(f"missing {missing}: tests/system-deps.sh installs them")
        pytest.skip(f"missing {missing}")
    shots = tmp_path / "shots"
    shots.mkdir()
    result = tmp_path / "chat.json"
    with virtual_x(wm=True) as display:
        env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "LANG": "C.UTF-8"}
        cmd = [sys.executable, str(SCENARIO), str(result), str(shots), "--",
               "--model", str(starter_model), "--server-bin", server_bin, "--port", str(port),
               "--ctx", "4096", "--data-dir", str(tmp_path / "home")]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    data = json.loads(result.read_text()) if result.exists() else {}
    assert proc.returncode == 0 and "error" not in data, (
        f"failed ({proc.returncode}): {data.get('error')}\n{proc.stderr[-3000:]}")
    assert data["roles"] == ["system", "user", "assistant", "user", "assistant"]
    for reply in data["replies"]:
        assert len(re.findall(r"[A-Za-z]{3,}", reply["text"])) >= 5, reply["text"]  # words, in English
    assert re.match(r"[\d,]+ of [\d,]+ tokens from cache · first token \d+\.\d\d s", data["footer"])
    assert (shots / "chat-window.png").stat().st_size > 20_000
    keep = os.environ.get("SLOTKEEPER_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        dark = os.environ.get("SLOTKEEPER_COLOR_SCHEME", "").lower() == "dark"
        shutil.copy(shots / "chat-window.png",
                    Path(keep) / ("chat-window-dark.png" if dark else "chat-window.png"))
