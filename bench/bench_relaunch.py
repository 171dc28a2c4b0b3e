"""Relaunch to first reply, Slotkeeper vs raw llama-server, side by side in one run.

    .venv/bin/python bench/bench_relaunch.py [--tokens 8000] [--rounds 6] [--kind bench|bench-kv] [--desktop
    [--tray]]
                                             [--model PATH] [--work DIR]

Setup (not timed): the ~200 MB bench model; `slotkeeper serve` prefills a --tokens conversation
and saves it at shutdown; a copy of that save file goes to raw llama-server's own folder.

Each round, in alternating order:
- Slotkeeper: `slotkeeper serve` started in its own process, as a user starts it (Python start-up
  included); it restores the conversation at launch and prints `ready URL`; then the conversation
  plus one new sentence is sent through its front door (`/completion`, one token).
- raw: llama-server started by hand with the very same arguments, `/health` polled every 10 ms,
  `POST /slots/0?action=restore`, then the same request.
The clock runs from the process start to the reply. Both stop afterwards (Slotkeeper with SIGINT:
its shutdown save, untimed, finds the conversation unchanged after the first round). Prints the
median of each, the ratio, and cache_n of every reply (the restore was used); with `serve` on
Linux, also the CPU each side has used by the time it is ready (Slotkeeper's Python and its
llama-server, raw llama-server alone), which bounds Slotkeeper's side from below. Loopback only.
Timings are noisy on shared machines: compare the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from benchlib import alternate, child_pids, cpu_seconds, free_port, generated_model, report, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from slotkeeper.core.server.command import build_argv  # noqa: E402
from slotkeeper.core.server.locate import locate_server, probe_flags  # noqa: E402
from slotkeeper.core.settings import ServerProfile  # noqa: E402

WORDS = "the walkers went up the hill and came down again before the rain "
RAW_POLL_SECONDS = 0.01




def complete(http: httpx.Client, url: str, prompt: list[int]) -> dict:
    r = http.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 1, "cache_prompt": True,
                                             "temperature": 0}, timeout=600)
    r.raise_for_status()
    return r.json()["timings"]


def serve_environment(work: Path) -> dict[str, str]:
    """Slotkeeper's code first on the path, with compiled bytecode kept (under ``work``) as an
    installed or frozen app has it, even where PYTHONDONTWRITEBYTECODE is set."""
    env = {**os.environ, "PYTHONPATH": str(APP), "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


class Serve:
    """`slotkeeper serve` in its own process."""

    def __init__(self, home: Path, model: Path, ctx: int, log: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "slotkeeper", "--data-dir", str(home), "serve", "--model",
                     str(model), "--port", str(self.port), "--ctx", str(ctx), "--parallel", "1",
                     "--idle-save", "3600"]
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.cpu_at_ready: list[tuple[float, float]] = []  # (Slotkeeper's Python, its llama-server) per start

    def start(self) -> None:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                         start_new_session=True,
                                         env=serve_environment(self.log.parent))
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready "):
                own, server = cpu_seconds(self.proc.pid), [cpu_seconds(c) for c in child_pids(self.proc.pid)]
                if own is not None and len(server) == 1 and server[0] is not None:
                    self.cpu_at_ready.append((own, server[0]))
                return
        raise RuntimeError(f"slotkeeper serve did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # saves what changed, stops llama-server
            if self.proc.wait(300) != 0:
                raise RuntimeError(f"slotkeeper serve exited with {self.proc.returncode}; see {self.log}")
            self.proc = None


class Desktop(Serve):
    """The desktop app in its own process, started with a model: it launches the server at once.
    On Qt's offscreen platform (no tray: the window is built at once), or on ``display`` (an X
    display with a tray host: the app lives in the tray and builds no window). A client cannot know
    when it is ready, so the request is sent at once and again every 10 ms while the connection is
    refused."""

    def __init__(self, home: Path, model: Path, ctx: int, log: Path, display: str | None = None) -> None:
        super().__init__(home, model, ctx, log)
        self.argv.remove("serve")
        self.qt = {"DISPLAY": display,
                   "QT_QPA_PLATFORM": "xcb"} if display else {"QT_QPA_PLATFORM": "offscreen"}

    def start(self) -> None:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True,
                                         env={**serve_environment(self.log.parent), **self.qt})

    def complete(self, http: httpx.Client, prompt: list[int]) -> dict:
        while True:
            try:
                return complete(http, self.url, prompt)
            except httpx.ConnectError:
                if self.proc is None or self.proc.poll() is not None:
                    raise RuntimeError(f"the desktop app stopped; see {self.log}") from None
                time.sleep(RAW_POLL_SECONDS)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)  # as the desktop session ending: saves, stops llama-server
            if self.proc.wait(300) != 0:
                raise RuntimeError(f"the desktop app exited with {self.proc.returncode}; see {self.log}")
            self.proc = None


class Raw:
    """llama-server with Slotkeeper's arguments, restarted and restored by hand."""

    def __init__(self, model: Path, ctx: int, folder: Path, log: Path) -> None:
        self.folder = folder
        binary = locate_server()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        profile = ServerProfile(model_path=str(model), host="127.0.0.1", port=self.port, ctx=ctx, parallel=1)
        self.argv = build_argv(binary.argv_prefix, profile, model, folder,
                               supported_flags=probe_flags(binary))
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.cpu_at_ready: list[float] = []

    def start(self, http: httpx.Client, after_spawn: Callable[[], None] | None = None) -> None:
        """Start llama-server and wait for /health; ``after_spawn`` runs right after the spawn."""
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        if after_spawn is not None:
            after_spawn()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if http.get(f"{self.url}/health", timeout=2).status_code == 200:
                    cpu = cpu_seconds(self.proc.pid)
                    if cpu is not None:
                        self.cpu_at_ready.append(cpu)
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(RAW_POLL_SECONDS)
        raise RuntimeError(f"llama-server did not start; see {self.log}")

    def save(self, http: httpx.Client, filename: str) -> dict:
        r = http.post(f"{self.url}/slots/0", params={"action": "save"}, json={"filename": filename},
                      timeout=600)
        r.raise_for_status()
        return r.json()

    def restore(self, http: httpx.Client, filename: str) -> dict:
        r = http.post(f"{self.url}/slots/0", params={"action": "restore"}, json={"filename": filename},
                      timeout=600)
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
            self.proc = None


def both_sides(work: Path, model: Path, tokens: int) -> tuple[Serve, Raw, int]:
    """`slotkeeper serve` on a new data folder (work/home) and raw llama-server on a new folder of
    its own (work/raw), with a context that holds ``tokens`` and more; and that context."""
    ctx = max(16384, tokens + 1024)
    home, raw_dir = work / "home", work / "raw"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir(mode=0o700)
    return Serve(home, model, ctx, work / "serve.log"), Raw(model, ctx, raw_dir, work / "raw.log"), ctx


def session_file(home: Path) -> Path:
    files = sorted((home / "sessions").glob("*.kv"))
    if len(files) != 1:
        raise RuntimeError(f"expected one saved session in {home}, found {len(files)}")
    return files[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8000, help="conversation length in tokens")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--model", help="GGUF to use (default: a generated model of --kind)")
    ap.add_argument("--kind", choices=("bench", "bench-kv"), default="bench",
                    help="the generated model: bench (~200 MB, loads in ~0.5 s) or bench-kv (an 8B model's "
                         "KV per token: 2 GiB of KV at 16K context, a load of seconds)")
    ap.add_argument("--desktop", action="store_true",
                    help="time the desktop app (started with the model, Qt offscreen) instead of `serve`")
    ap.add_argument("--tray", action="store_true",
                    help="with --desktop: on a virtual X display with a tray host (Xvfb and trayer), as the "
                         "app usually runs, instead of Qt offscreen")
    ap.add_argument("--work",
                    help="folder for the model, the data and the logs (default: a new temporary one)")
    args = ap.parse_args()
    if args.tray and not args.desktop:
        ap.error("--tray times the desktop app: add --desktop")
    with work_folder(args.work) as work:
        if not args.tray:
            return measure(args, work)
        sys.path.insert(0, str(APP.parent / "tests" / "desktop"))
        from virtual_x import virtual_x

        with virtual_x(tray=True) as display:
            return measure(args, work, display)


def measure(args: argparse.Namespace, work: Path, display: str | None = None) -> int:
    model = Path(args.model) if args.model else generated_model(work, args.kind)
    serve, raw, ctx = both_sides(work, model, args.tokens)
    home, raw_dir = serve.home, raw.folder
    desktop = Desktop(home, model, ctx, work / "desktop.log", display) if args.desktop else None

    with httpx.Client() as http:
        print(f"setup: prefilling {args.tokens} tokens (once, not timed) ...", flush=True)
        serve.start()
        r = http.post(f"{serve.url}/tokenize",
                      json={"content": WORDS * (args.tokens // 10), "add_special": False}, timeout=60)
        r.raise_for_status()
        prompt = [int(t) for t in r.json()["tokens"]][: args.tokens]
        r = http.post(f"{serve.url}/tokenize", json={"content": " and one more thing", "add_special": False},
                      timeout=60)
        more = [int(t) for t in r.json()["tokens"]]
        t0 = time.perf_counter()
        complete(http, serve.url, prompt)
        print(f"setup: cold prefill {time.perf_counter() - t0:.1f} s", flush=True)
        serve.stop()

        def slotkeeper_round() -> tuple[float, dict]:
            t0 = time.perf_counter()
            if desktop is not None:
                desktop.start()
                timings = desktop.complete(http, prompt + more)
                took = time.perf_counter() - t0
                desktop.stop()
                return took, timings
            serve.start()
            timings = complete(http, serve.url, prompt + more)
            took = time.perf_counter() - t0
            serve.stop()
            return took, timings

        def raw_round() -> tuple[float, dict]:
            t0 = time.perf_counter()
            raw.start(http)
            raw.restore(http, "conversation.kv")
            timings = complete(http, raw.url, prompt + more)
            took = time.perf_counter() - t0
            raw.stop()
            return took, timings

        slotkeeper_round()  # warm-up; afterwards the saved conversation is what every round restores
        kv = session_file(home)
        shutil.copyfile(kv, raw_dir / "conversation.kv")
        print(f"conversation: {len(prompt)} tokens, save file {kv.stat().st_size / 2**20:.0f} MiB",
              flush=True)
        raw_round()  # warm-up
        def noted(fn):
            took, timings = fn()
            return took, f"cache_n {timings['cache_n']}, prompt_n {timings['prompt_n']}"

        serve.cpu_at_ready.clear()
        raw.cpu_at_ready.clear()
        try:
            sk_times, raw_times = alternate(args.rounds, lambda: noted(slotkeeper_round),
                                            lambda: noted(raw_round))
        finally:
            raw.stop()
            if serve.proc is not None:
                serve.proc.kill()
    what = " (desktop app, in the tray)" if display else " (desktop app, no tray)" if desktop else ""
    report("relaunch -> first reply" + what, sk_times, raw_times)
    if serve.cpu_at_ready and raw.cpu_at_ready:
        cpu_breakdown(serve.cpu_at_ready, raw.cpu_at_ready)
    return 0


def cpu_breakdown(serve: list[tuple[float, float]], raw: list[float]) -> None:
    """Where the CPU goes before the first reply can be served: Slotkeeper's Python start-up
    shares the cores with the model load, which raw llama-server has to itself."""
    py = statistics.median(p for p, _ in serve)
    server = statistics.median(s for _, s in serve)
    alone = statistics.median(raw)
    cores = os.cpu_count() or 1
    print(f"CPU used until ready (median, /proc): Slotkeeper's Python {py:.2f} s + its llama-server "
          f"{server:.2f} s; raw llama-server {alone:.2f} s. On {cores} cores Slotkeeper's side needs at "
          f"least {(py + server) / cores:.2f} s of wall time for that CPU alone.")


if __name__ == "__main__":
    raise SystemExit(main())
