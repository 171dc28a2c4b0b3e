"""Restore vs cold prefill, measured side by side in one run on the ~200 MB bench model.

    .venv/bin/python bench/bench_restore.py [--tokens 4000] [--rounds 3]

For each round: a cold server prefills a long conversation (no cache), Slotkeeper saves it and
stops; a fresh server is launched, Slotkeeper restores the session, and the same prompt + a short
new message is sent. Prints both wall times, the ratio, and cache_n of the restored request.
Only loopback is used. Timings are noisy on shared machines: compare the ratio, not seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.model.modelgen import write_model  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402


def tokenize(url: str, text: str) -> list[int]:
    r = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": False}, timeout=60)
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def request(url: str, prompt: list[int]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 1, "cache_prompt": True},
                   timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["timings"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000, help="approximate conversation length")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", help="GGUF to use (default: the generated ~200 MB bench model)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotkeeper-bench-"))
    os.environ["SLOTKEEPER_HOME"] = str(work / "home")
    model = Path(args.model) if args.model else write_model(work / "bench.gguf", "bench")
    ctx = max(8192, args.tokens * 2)
    words = "the walkers went up the hill and came down again before the rain "
    cold, restored, cache_ns = [], [], []
    for rnd in range(args.rounds):
        settings = Settings(profile=ServerProfile(model_path=str(model), port=free_port(), ctx=ctx),
                            idle_save_seconds=3600, restore_on_start=1)
        engine = Engine(app_paths(), settings)
        engine.start()
        assert engine.wait_ready(300) is ServerState.READY, engine.supervisor.message
        url = engine.base_url
        # A cold start: empty the slot the launch restored the previous round into. The slot-file
        # actions are closed at the front door, so this goes to llama-server's private address.
        private, key = engine._upstream()
        httpx.post(f"{private}/slots/0", params={"action": "erase"},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60).raise_for_status()
        # Token ids, so the conversation is exactly --tokens long; each round differs.
        prompt = tokenize(url, f"round {rnd} " + words * (args.tokens // 4))[: args.tokens]
        more = tokenize(url, " and one more thing")
        t_cold, timings = request(engine.base_url, prompt)
        engine.stop()  # saves the slot, then stops the server
        engine = Engine(app_paths(), settings)
        t0 = time.perf_counter()
        engine.start()
        assert engine.wait_ready(300) is ServerState.READY
        t_launch = time.perf_counter() - t0
        t_next, timings2 = request(engine.base_url, prompt + more)
        engine.stop(save=False)
        for entry in engine.sessions.listing().sessions:
            engine.sessions.delete(entry.id)
        cold.append(t_cold)
        restored.append(t_launch + t_next)
        cache_ns.append(timings2["cache_n"])
        print(f"round {rnd}: cold prefill {t_cold:.2f} s ({timings['prompt_n']} tokens) | "
              f"relaunch+restore {t_launch:.2f} s + next request {t_next:.2f} s (cache_n "
              f"{timings2['cache_n']})")
    c, r = statistics.median(cold), statistics.median(restored)
    print(f"median cold prefill {c:.2f} s, median relaunch+restore+request {r:.2f} s: "
          f"{c / r:.1f}x faster with Slotkeeper (cache_n {min(cache_ns)}..{max(cache_ns)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
