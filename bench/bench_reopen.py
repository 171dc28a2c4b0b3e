"""Reopen a saved conversation and continue it: what the chat window does, measured side by side in
one run on the starter model (SmolLM2-135M-Instruct Q4_1).

    .venv/bin/python bench/bench_reopen.py [--tokens 7500] [--rounds 3]

A conversation of about ``--tokens`` tokens is saved and then pushed out of every slot (another
conversation takes the slot). Its next message is then sent, streamed, and the time to the first
token measured, three ways in turn each round:

- Slotkeeper: the next message through the front door, exactly as the chat window sends it (the
  whole conversation plus the new message): the door finds the saved conversation, restores it
  into the slot and answers;
- raw by hand: llama-server with --slot-save-path, the same conversation saved to a file by hand
  (`POST /slots/0?action=save`), another conversation in the slot, then `action=restore` and the
  same request (the time includes the restore call);
- cold: raw llama-server reading the whole conversation from token one.

Prints the medians and the ratios: the goal is Slotkeeper <= 1.2x raw by hand and >= 50x faster
than cold.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import LlamaServer, first_token, free_port, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.model.starter_model import ensure_starter_model  # noqa: E402
from slotkeeper.core.server.locate import locate_server  # noqa: E402

CTX = 8192


def conversation(url: str, tokens: int, seed: int) -> list[dict]:
    """Chat messages of about ``tokens`` tokens (counted with the server's own template)."""
    messages = [{"role": "system", "content": "You are a patient assistant who keeps notes."}]
    while True:
        messages.append({"role": "user", "content": text(seed + len(messages), 300)})
        prompt = httpx.post(f"{url}/apply-template", json={"messages": messages}, timeout=60).json()["prompt"]
        n = len(httpx.post(f"{url}/tokenize", json={"content": prompt}, timeout=60).json()["tokens"])
        if n >= tokens:
            return messages
        messages.append({"role": "assistant", "content": text(seed * 7 + len(messages), 60)})


class Raw(LlamaServer):
    def __init__(self, binary: list[str], model: Path, save_dir: Path) -> None:
        super().__init__([*binary, "-m", str(model), "-c", str(CTX), "-np", "1", "--slot-save-path",
                          str(save_dir), "--cache-ram", "0"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=7500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reopen-") as tmp:
        work = Path(tmp)
        model = ensure_starter_model(work / "models")
        binary = list(locate_server(None).argv_prefix)
        raw = Raw(binary, model, work / "raw-saves")
        (work / "raw-saves").mkdir()
        raw.start()
        home = work / "home"
        port = free_port()
        door = subprocess.Popen([sys.executable, "-m", "slotkeeper", "serve", "--data-dir", str(home),
                                 "--model", str(model), "--port", str(port), "--ctx", str(CTX), "--idle-save",
                                 "3600"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        door_url = door.stdout.readline().split()[1] if door.stdout else ""
        results: dict[str, list[float]] = {"slotkeeper": [], "raw by hand": [], "cold": []}
        cached: dict[str, list[int]] = {"slotkeeper": [], "raw by hand": []}
        try:
            for r in range(args.rounds):
                messages = conversation(raw.url, args.tokens, args.seed + 100 * r)
                other = [{"role": "user", "content": text(args.seed + 999 + r, 200)}]
                nxt = [*messages, {"role": "assistant", "content": text(r, 40)},
                       {"role": "user", "content": "And what should I note down next?"}]
                # Both hold the conversation once (a cold prefill each, not measured), then lose the slot.
                first_token(door_url, messages)
                first_token(raw.url, messages)
                httpx.post(f"{raw.url}/slots/0", params={"action": "save"}, json={"filename": f"conv{r}.bin"},
                           timeout=600).raise_for_status()
                # the door saves the conversation before the other takes the slot
                first_token(door_url, other)
                first_token(raw.url, other)
                order = ["slotkeeper", "raw by hand", "cold"]
                order = order[r % 3:] + order[:r % 3]
                for name in order:
                    if name == "slotkeeper":
                        ttft, t = first_token(door_url, nxt)
                        cached["slotkeeper"].append(t.get("cache_n", 0))
                    elif name == "raw by hand":
                        t0 = time.perf_counter()
                        httpx.post(f"{raw.url}/slots/0", params={"action": "restore"},
                                   json={"filename": f"conv{r}.bin"}, timeout=600).raise_for_status()
                        restore = time.perf_counter() - t0
                        ttft, t = first_token(raw.url, nxt)
                        ttft += restore
                        cached["raw by hand"].append(t.get("cache_n", 0))
                        first_token(raw.url, other)  # the slot goes back to the other conversation
                    else:
                        httpx.post(f"{raw.url}/slots/0", params={"action": "erase"},
                                   timeout=60).raise_for_status()
                        ttft, t = first_token(raw.url, nxt)
                        first_token(raw.url, other)
                    results[name].append(ttft)
                first_token(door_url, other)  # ready for the next round: the other conversation in the slot
        finally:
            raw.stop()
            door.send_signal(signal.SIGTERM)
            door.wait(120)
        med = {k: statistics.median(v) for k, v in results.items()}
        print(f"\nreopen a saved ~{args.tokens:,}-token conversation and continue it, {args.rounds} "
              "round(s), time to first token (median):")
        for name, value in med.items():
            extra = f"  (cached {statistics.median(cached[name]):,.0f} tokens)" if name in cached else ""
            print(f"  {name:12} {value:7.3f} s{extra}")
        print(f"  Slotkeeper / raw by hand: {med['slotkeeper'] / med['raw by hand']:.2f}x (goal <= 1.2x)")
        print(f"  cold / Slotkeeper:        {med['cold'] / med['slotkeeper']:.0f}x faster (goal >= 50x)")


if __name__ == "__main__":
    main()
