"""`slotkeeper serve`'s prelaunch: llama-server is started before the engine is imported, and the
engine takes that launch over (its events, its restores) as if it had made it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from e2e_helpers import USER_TURNS, converse

pytestmark = pytest.mark.e2e

# The engine's heavy parts: none of them may be needed to start llama-server.
HEAVY = ("aiohttp", "numpy", "gguf", "httpx", "sqlite3", "slotkeeper.core.engine.engine",
         "slotkeeper.core.engine.door.frontdoor", "slotkeeper.core.sessions.search")

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.settings import ServerProfile, Settings
    from slotkeeper.core.engine.lifecycle.launching import prelaunch

    model, server_bin, port, heavy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
    wait = sys.argv[5] == "wait"  # else the engine is built at once, as `serve` does
    settings = Settings(profile=ServerProfile(model_path=model, server_bin=server_bin, port=port, ctx=2048),
                        idle_save_seconds=3600)
    paths = app_paths()
    pre = prelaunch(paths, settings)
    assert pre is not None
    # The server loads (and may even be ready) while the engine is imported and built.
    deadline = time.monotonic() + 120
    while wait and pre.supervisor.state.value != "ready" and time.monotonic() < deadline:
        time.sleep(0.02)
    while pre.supervisor.pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = pre.supervisor.pid
    loaded_before = sorted(m for m in heavy if m in sys.modules)
    from slotkeeper.core import events as ev
    from slotkeeper.core.engine import Engine
    engine = Engine(paths, settings, prelaunched=pre)
    seen, restored = [], []
    engine.events.subscribe(lambda e: seen.append(e.state.value), ev.ServerStateChanged)
    engine.events.subscribe(lambda e: restored.extend(r.id for r in e.restored), ev.EngineReady)
    engine.start()
    ok = engine.wait_ready(120)
    print(json.dumps({"pid": pid, "server_pid": engine.supervisor.pid, "loaded_before": loaded_before,
                      "ready": ok.value, "states": seen, "restored": restored, "url": engine.base_url}),
          flush=True)
    sys.stdin.readline()  # the test talks to it, then lets it go
    engine.close(save=True)
    engine.dispose()
""")


def run_prelaunched(llama_model, server_bin, port, env, wait=True):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(llama_model), server_bin, str(port),
                             ",".join(HEAVY), "wait" if wait else "now"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(line)


def test_serve_starts_llama_server_before_the_engine_and_the_engine_takes_it_over(
        llama_model, server_bin, port, isolated_home):
    env = {**os.environ, "SLOTKEEPER_HOME": str(isolated_home)}
    proc, out = run_prelaunched(llama_model, server_bin, port, env)
    try:
        assert out["loaded_before"] == []  # llama-server ran before any of them was imported
        # the engine took that very process over
        assert out["server_pid"] == out["pid"] and out["ready"] == "ready"
        # The engine heard the launch from its start (held events), and reached ready once.
        assert out["states"][:1] == ["starting"] and out["states"].count("ready") == 1, out["states"]
        converse(out["url"], USER_TURNS[:2])  # the front door serves on the claimed address
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0, proc.stderr

    # Next launch, the engine built at once (the launch may not have begun): the conversation saved
    # at shutdown is restored into the prelaunched server, and the next turn hits that cache.
    saved = [p.stem for p in (isolated_home / "sessions").glob("*.json")]
    proc, out = run_prelaunched(llama_model, server_bin, port, env, wait=False)
    try:
        assert out["restored"] == saved and len(saved) == 1, out
        assert out["server_pid"] == out["pid"] and out["states"].count("ready") == 1, out
        _, resp = converse(out["url"], USER_TURNS[:3])
        assert resp["timings"]["cache_n"] > 0.8 * (resp["timings"]["cache_n"] + resp["timings"]["prompt_n"])
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_busy_port_leaves_the_launch_to_the_engine_which_says_so(llama_model, server_bin, isolated_home):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "slotkeeper", "serve", "--model", str(llama_model),
                            "--server-bin", server_bin, "--port", str(taken), "--data-dir",
                            str(isolated_home)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "already in use" in r.stderr and "Traceback" not in r.stderr
    assert not (isolated_home / "logs" / "llama-server.log").exists()  # no llama-server was started
