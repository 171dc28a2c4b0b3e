"""The head start (core/server/headstart.py), with the real llama-server: the second launch of
`slotkeeper serve` (or of the desktop app) with the same command line starts llama-server from the
first launch's note, the planned launch takes that process over, and the saved conversation is
restored into it; an early server that is not exactly the planned one never runs on; a busy
folder gets no early server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import psutil
import pytest
from e2e_helpers import USER_TURNS, converse, wait_until

pytestmark = pytest.mark.e2e

TAKEN_OVER = "llama-server has had a head start of"


class Serve:
    """`python -m slotkeeper serve` as a user runs it, with the debug log kept."""

    def __init__(self, home, model, server_bin, port) -> None:
        self.argv = [sys.executable, "-m", "slotkeeper", "-v", "--data-dir", str(home), "serve", "--model",
                     str(model), "--server-bin", server_bin, "--port", str(port), "--ctx", "2048",
                     "--idle-save", "3600"]
        self.home = home
        self.url = f"http://127.0.0.1:{port}"
        self.err = home.parent / "serve-stderr.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Serve:
        self.err.write_text("")
        with self.err.open("a") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in self.proc.stdout:
            if line.startswith("ready "):
                return self
        self.proc.wait(30)
        raise AssertionError(f"serve did not start:\n{self.log()}")

    def log(self) -> str:
        return self.err.read_text()

    def stop(self, sig: int = signal.SIGINT) -> str:
        assert self.proc is not None
        self.proc.send_signal(sig)
        assert self.proc.wait(120) == 0, self.log()
        return self.log()


class DesktopApp(Serve):
    """The desktop app (`python -m slotkeeper` without a command) on Qt's offscreen platform."""

    def __init__(self, home, model, server_bin, port) -> None:
        super().__init__(home, model, server_bin, port)
        self.argv.remove("serve")

    def start(self) -> DesktopApp:
        self.err.write_text("")
        with self.err.open("a") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err,
                                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        # Requests wait at the front door until the launch restores are done.
        wait_until(lambda: "server ready" in self.log() or self.proc.poll() is not None, 120,
                   what="the app's llama-server ready")
        assert self.proc.poll() is None, self.log()
        return self

    def stop(self, sig: int = signal.SIGTERM) -> str:  # as a desktop session ending: it saves first
        return super().stop(sig)


def assert_next_turn_restored(url: str) -> None:
    """The third turn of the conversation saved after two reuses what was restored."""
    _, resp = converse(url, USER_TURNS[:3])
    t = resp["timings"]
    assert t["cache_n"] > 0.8 * (t["cache_n"] + t["prompt_n"]), t


def staging_of(home) -> set[str]:
    """Where the llama-servers of ``home``'s data folder write their slot files (their
    --slot-save-path): its staging folder in memory, or in the data folder."""
    from slotkeeper.core.sessions.staging import staging_folder

    return {str(staging_folder(home, 0)), str(home / "staging")}


def servers_of(home) -> list[psutil.Process]:
    """The llama-servers running for ``home``'s data folder."""
    found = []
    folders = staging_of(home)
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if folders & set(cmd):
            found.append(p)
    return found


def test_the_next_serve_starts_llama_server_from_the_note_and_restores_into_it(
        llama_model, server_bin, port, isolated_home):
    serve = Serve(isolated_home, llama_model, server_bin, port)
    serve.start()
    converse(serve.url, USER_TURNS[:2])
    first_log = serve.stop()
    assert TAKEN_OVER not in first_log  # nothing noted yet: the plain launch
    note = json.loads((isolated_home / "cache" / "last-launch.json").read_text())
    assert note["command_line"] == serve.argv[3:]

    serve.start()
    try:
        assert TAKEN_OVER in serve.log(), serve.log()
        pid = json.loads((isolated_home / "state" / "server.json").read_text())["pid"]
        # one llama-server: the early one, supervised
        assert [p.pid for p in servers_of(isolated_home)] == [pid]

        # The same command line while it runs: the folder is in use, no second llama-server starts.
        busy = subprocess.run(serve.argv, capture_output=True, text=True, timeout=120)
        assert busy.returncode != 0 and "already running" in busy.stderr and "Traceback" not in busy.stderr
        assert [p.pid for p in servers_of(isolated_home)] == [pid]

        assert_next_turn_restored(serve.url)  # the conversation saved at shutdown
    finally:
        serve.stop()
    assert servers_of(isolated_home) == []


def test_an_early_server_that_is_not_the_planned_one_is_stopped_and_the_plan_launched(
        llama_model, server_bin, port, isolated_home):
    serve = Serve(isolated_home, llama_model, server_bin, port)
    serve.start()
    serve.stop()
    # A note whose inputs all still hold but whose llama-server command line is not what the plan
    # makes (as if something the note cannot see had changed): the early server is the wrong one.
    path = isolated_home / "cache" / "last-launch.json"
    note = json.loads(path.read_text())
    argv = note["server_argv"]
    argv[argv.index("--ctx-size") + 1] = "4096"
    path.write_text(json.dumps(note))

    serve.start()
    try:
        assert TAKEN_OVER not in serve.log()
        running = servers_of(isolated_home)
        assert len(running) == 1 and "4096" not in running[0].cmdline(), [p.cmdline() for p in running]
        props = httpx.get(f"{serve.url}/props", timeout=30).json()
        assert props["default_generation_settings"]["n_ctx"] == 2048  # the planned launch
        converse(serve.url, USER_TURNS[:1])
    finally:
        serve.stop()
    # The plan's command line is noted again, and the next launch gets its head start.
    assert json.loads(path.read_text())["server_argv"][argv.index("--ctx-size") + 1] == "2048"
    serve.start()
    try:
        assert TAKEN_OVER in serve.log()
    finally:
        serve.stop()


BEGIN = textwrap.dedent("""
    import json, sys, time
    from slotkeeper.core.server import headstart, spawn
    heavy = None
    real_spawn = spawn.spawn_server
    def spawn_server(*args, **kwargs):  # what is imported by the time llama-server starts
        global heavy
        heavy = [m for m in sys.argv[1].split(",") if m in sys.modules]
        return real_spawn(*args, **kwargs)
    spawn.spawn_server = spawn_server
    headstart.begin(sys.argv[2:])
    early = headstart.early()
    print(json.dumps({"pid": early.popen.pid if early else None, "heavy": heavy}), flush=True)
    time.sleep(120)
""")

# What the head start must not wait for: the command line, the settings, the engine, psutil ...
# (psutil comes right after the spawn, to record the server)
HEAVY = ("argparse", "slotkeeper.cli", "slotkeeper.core.settings", "slotkeeper.core.engine", "psutil",
         "asyncio", "aiohttp", "http.client", "slotkeeper.core.server.supervisor",
         "slotkeeper.core.model.gguf_header")


def test_the_head_start_imports_nothing_heavy_and_a_stop_before_the_take_over_stops_its_server(
        llama_model, server_bin, port, isolated_home):
    serve = Serve(isolated_home, llama_model, server_bin, port)
    serve.start()
    serve.stop()
    proc = subprocess.Popen([sys.executable, "-c", BEGIN, ",".join(HEAVY), *serve.argv[3:]],
                            stdout=subprocess.PIPE, text=True)
    try:
        out = json.loads(proc.stdout.readline())
        assert out["pid"] is not None and out["heavy"] == []
        early = psutil.Process(out["pid"])
        assert staging_of(isolated_home) & set(early.cmdline())
        proc.send_signal(signal.SIGTERM)  # e.g. a logout while the app starts
        proc.wait(30)
        wait_until(lambda: not early.is_running() or early.status() == psutil.STATUS_ZOMBIE, 30,
                   what="the early llama-server stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert servers_of(isolated_home) == []
    # And the next launch still starts (its lock was the dead process's).
    serve.start()
    time.sleep(0.1)
    assert len(servers_of(isolated_home)) == 1
    serve.stop()


KILLED_BEFORE_THE_TAKE_OVER = textwrap.dedent("""
    import json, os, signal, sys
    from slotkeeper.core.server import headstart
    headstart.begin(sys.argv[1:])
    early = headstart.early()
    print(json.dumps({"pid": early.popen.pid if early else None}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a crash or a `kill -9` before the take-over
""")


def test_a_kill_before_the_take_over_leaves_a_record_and_the_next_serve_stops_that_server(
        llama_model, server_bin, port, isolated_home):
    serve = Serve(isolated_home, llama_model, server_bin, port)
    serve.start()
    converse(serve.url, USER_TURNS[:2])
    serve.stop()
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_THE_TAKE_OVER, *serve.argv[3:]],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    pid = json.loads(proc.stdout)["pid"]
    state = json.loads((isolated_home / "state" / "server.json").read_text())
    assert state["pid"] == pid and state["early"] is True
    assert [p.pid for p in servers_of(isolated_home)] == [pid]  # left running, and recorded

    serve.start()
    try:
        log = serve.log()
        assert f"stopping llama-server pid {pid} left by an earlier session (started early" in log, log
        assert "saving the conversations of a server left" not in log and "could not save" not in log
        assert pid not in [p.pid for p in servers_of(isolated_home)] and len(servers_of(isolated_home)) == 1
        assert "early" not in json.loads((isolated_home / "state" / "server.json").read_text())
        assert_next_turn_restored(serve.url)  # a launch of its own restored the saved conversation
    finally:
        serve.stop()
    assert servers_of(isolated_home) == []


def test_without_a_note_or_with_another_command_line_there_is_no_head_start(
        llama_model, server_bin, port, isolated_home):
    serve = Serve(isolated_home, llama_model, server_bin, port)
    serve.start()
    serve.stop()
    serve.argv[serve.argv.index("--idle-save") + 1] = "3000"  # another command line: its own note
    serve.start()
    try:
        assert TAKEN_OVER not in serve.log()
    finally:
        serve.stop()
    os.remove(isolated_home / "cache" / "last-launch.json")
    serve.start()
    try:
        assert TAKEN_OVER not in serve.log()
        assert len(servers_of(isolated_home)) == 1
    finally:
        serve.stop()


def test_the_desktop_app_gets_the_head_start_too(llama_model, server_bin, port, isolated_home):
    app = DesktopApp(isolated_home, llama_model, server_bin, port)
    app.start()
    converse(app.url, USER_TURNS[:2])
    assert TAKEN_OVER not in app.stop()
    note = json.loads((isolated_home / "cache" / "last-launch.json").read_text())
    assert note["command_line"] == app.argv[3:]

    app.start()
    try:
        assert TAKEN_OVER in app.log(), app.log()
        assert len(servers_of(isolated_home)) == 1
        assert_next_turn_restored(app.url)  # restored at launch into the early server
    finally:
        app.stop()
    assert servers_of(isolated_home) == []


def test_a_desktop_app_that_cannot_start_leaves_no_llama_server(llama_model, server_bin, port, isolated_home):
    """Qt's libraries missing: the app's launch began before the GUI was imported, and is stopped.
    The import fails only once llama-server runs (its state file written), so the launch being
    stopped is a running server's, however slow the machine."""
    script = f"""
import sys, time
from pathlib import Path
state = Path({str(isolated_home / "state" / "server.json")!r})

class NoQt:
    def find_spec(self, name, path=None, target=None):
        if name != "slotkeeper.gui.application":
            return None
        deadline = time.monotonic() + 120
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ImportError("no Qt here" + (" (llama-server was running)" if state.exists() else ""))

sys.meta_path.insert(0, NoQt())
from slotkeeper.cli.commands import main
raise SystemExit(main(sys.argv[1:]))
"""
    app = DesktopApp(isolated_home, llama_model, server_bin, port)
    r = subprocess.run([sys.executable, "-c", script, *app.argv[3:]], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 1 and "the desktop app cannot start" in r.stderr and "Traceback" not in r.stderr
    assert "(llama-server was running)" in r.stderr, r.stderr
    assert servers_of(isolated_home) == [] and not (isolated_home / "state" / "server.json").exists()
