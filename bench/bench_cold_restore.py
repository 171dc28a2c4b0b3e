"""Restore of a >= 1 GiB session from a cold page cache, Slotkeeper vs raw llama-server, in one run.

    .venv/bin/python bench/bench_cold_restore.py [--tokens 8200] [--rounds 5] [--work DIR]

With --work, the saved sessions stay there and a later run with the same folder reuses them
(the prefill takes minutes).

Setup (not timed): the generated "bench-kv" model (an 8B model's 128 KiB of KV per token, with
little compute), one slot; a --tokens conversation is prefilled and saved by Slotkeeper (8,200
tokens: a 1.0 GiB file), and a one-token conversation is saved too.

Each round, in alternating order, with the session file dropped from the page cache first
(posix_fadvise(DONTNEED) after fsync; needs a disk-backed folder, not tmpfs):
- Slotkeeper: `Engine.restore(session, 0)`, the restore a launch (`--resume`) and the front
  door's restore on demand run (the window and the tray reach it through them): compatibility and
  integrity checks, then llama-server's restore, then the token list read and the sidecar updated;
- raw: `POST /slots/0?action=restore` straight to the same llama-server with the same file.
Between rounds the small session is restored through the engine so the slot changes hands.
Prints both medians and the ratio. Timings are noisy on shared machines: compare the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx
from benchlib import alternate, free_port, generated_model, report, work_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402

WORDS = "the walkers went up the hill and came down again before the rain "




def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def save_conversation(engine: Engine, http: httpx.Client, prompt: list[int]) -> str:
    r = http.post(f"{engine.base_url}/completion",
                  json={"prompt": prompt, "n_predict": 1, "cache_prompt": True}, timeout=3600)
    r.raise_for_status()
    summary = engine.save_slot(0)
    assert summary is not None, "the save failed"
    assert summary.id is not None
    return summary.id


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", help="folder for the model and the data (default: a new temporary one)")
    args = ap.parse_args()
    with work_folder(args.work, parent=os.getcwd()) as work:
        return measure(args, work)


def measure(args: argparse.Namespace, work: Path) -> int:
    os.environ["SLOTKEEPER_HOME"] = str(work / "home")
    model = generated_model(work, "bench-kv")
    settings = Settings(profile=ServerProfile(model_path=str(model), port=free_port(),
                                              ctx=max(16384, args.tokens + 512), parallel=1),
                        idle_save_seconds=3600, restore_on_start=0)
    engine = Engine(app_paths(), settings)
    engine.start()
    try:
        assert engine.wait_ready(600) is ServerState.READY, engine.supervisor.message
        private_url, key = engine._upstream()  # llama-server's own address: the raw side
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}) as http:
            r = http.post(f"{private_url}/tokenize", json={"content": WORDS * (args.tokens // 10 + 10),
                                                           "add_special": False}, timeout=60)
            prompt = [int(t) for t in r.json()["tokens"]][: args.tokens]
            kept = {e.sidecar.n_tokens: e.id for e in engine.library.store.listing().sessions
                    if e.sidecar is not None and not e.problems}
            if len(prompt) in kept and 1 in kept:  # a --work folder of an earlier run: its saves serve again
                big, small = kept[len(prompt)], kept[1]
                print(f"setup: the {len(prompt)}-token and one-token sessions saved by an earlier run",
                      flush=True)
            else:
                print(f"setup: prefilling {len(prompt)} tokens (once, not timed) ...", flush=True)
                t0 = time.perf_counter()
                big = save_conversation(engine, http, prompt)
                print(f"setup: prefill and save {time.perf_counter() - t0:.1f} s", flush=True)
                small = save_conversation(engine, http, prompt[:1])
            entry = engine.library.store.get(big)
            kv = entry.kv_path
            print(f"session file {kv.stat().st_size / 2**30:.2f} GiB ({entry.sidecar.n_tokens} tokens)",
                  flush=True)

            def slotkeeper_round() -> float:
                engine.restore(small, 0)
                drop_from_page_cache(kv)
                t0 = time.perf_counter()
                summary = engine.restore(big, 0)
                took = time.perf_counter() - t0
                assert summary is not None and summary.n_restored == entry.sidecar.n_tokens, summary
                return took

            def raw_round() -> float:
                engine.restore(small, 0)
                drop_from_page_cache(kv)
                t0 = time.perf_counter()
                r = http.post(f"{private_url}/slots/0", params={"action": "restore"},
                              json={"filename": kv.name}, timeout=600)
                took = time.perf_counter() - t0
                r.raise_for_status()
                assert r.json()["n_restored"] == entry.sidecar.n_tokens
                return took

            sk, raw = alternate(args.rounds, lambda: (slotkeeper_round(), ""), lambda: (raw_round(), ""))
    finally:
        engine.close(save=False)
    report(f"cold restore of {kv.stat().st_size / 2**30:.2f} GiB", sk, raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
