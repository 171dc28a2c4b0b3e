"""A conversation switch on one slot: Slotkeeper's front door vs raw llama-server by hand.

    .venv/bin/python bench/bench_switch.py [--tokens 4000] [--rounds 8] [--work DIR]

Setup (not timed): the ~200 MB bench model; two conversations A and B of --tokens tokens each,
prefilled on both sides: `slotkeeper serve` with one slot (A's request, then B's: A is saved as it
leaves the slot), and raw llama-server with the same arguments (A prefilled and saved to a.kv,
then B prefilled).

Each round switches to the other conversation and asks its next turn (one more sentence, one
token), Slotkeeper and raw in alternating order:
- Slotkeeper: the request through the front door, which saves the conversation in the slot and
  restores the other one;
- raw: `POST /slots/0?action=save` of the conversation in the slot, `POST /slots/0?action=restore`
  of the other, then the same request: the least a switch costs with llama-server's own tools.
The clock runs from the first call to the reply; each round is followed by a pause of 1.5 s (on
both sides), so that what Slotkeeper finishes after a reply (the commit of the save) does not fall
on the other side's round. Prints the median of each, the ratio, and cache_n
of every reply. Loopback only; compare the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx
from bench_relaunch import WORDS, both_sides, complete
from benchlib import alternate, generated_model, report, work_folder

OTHER = "a sailor crossed the bay in a small boat while the wind was rising "
# after every round, on both sides: what finishes after a reply does not fall on the next
SETTLE_SECONDS = 1.5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000, help="length of each conversation in tokens")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--work",
                    help="folder for the model, the data and the logs (default: a new temporary one)")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        return measure(args, work)


def measure(args: argparse.Namespace, work: Path) -> int:
    serve, raw, _ = both_sides(work, generated_model(work, "bench"), args.tokens)
    with httpx.Client() as http:
        serve.start()
        raw.start(http)
        try:
            def tokenize(text: str) -> list[int]:
                r = http.post(f"{serve.url}/tokenize", json={"content": text, "add_special": False},
                              timeout=60)
                r.raise_for_status()
                return [int(t) for t in r.json()["tokens"]]

            convs = {"a": tokenize(WORDS * (args.tokens // 10))[: args.tokens],
                     "b": tokenize(OTHER * (args.tokens // 10))[: args.tokens]}
            mores = [tokenize(f" and then number {i} came along") for i in range(2 * args.rounds + 2)]
            print(f"setup: prefilling two conversations of {args.tokens} tokens on both sides (not timed) "
                  "...",
                  flush=True)
            for name in ("a", "b"):
                complete(http, serve.url, convs[name])  # B takes the slot: A is saved
                complete(http, raw.url, convs[name])
                if name == "a":
                    raw.save(http, "a.kv")
            state = {"sk": "b", "raw": "b"}  # what each slot holds
            prompts = {side: dict(convs) for side in state}  # each conversation's last prompt, per side
            turns = {side: 0 for side in state}

            def next_turn(side: str) -> tuple[str, list[int]]:
                target = "a" if state[side] == "b" else "b"
                prompts[side][target] = prompts[side][target] + mores[turns[side]]
                turns[side] += 1
                return target, prompts[side][target]

            def slotkeeper_round() -> tuple[float, str]:
                target, prompt = next_turn("sk")
                t0 = time.perf_counter()
                timings = complete(http, serve.url, prompt)
                took = time.perf_counter() - t0
                state["sk"] = target
                time.sleep(SETTLE_SECONDS)  # the save committing after the switch: not on the raw round
                return took, f"cache_n {timings['cache_n']}, prompt_n {timings['prompt_n']}"

            def raw_round() -> tuple[float, str]:
                target, prompt = next_turn("raw")
                t0 = time.perf_counter()
                raw.save(http, f"{state['raw']}.kv")
                raw.restore(http, f"{target}.kv")
                timings = complete(http, raw.url, prompt)
                took = time.perf_counter() - t0
                state["raw"] = target
                time.sleep(SETTLE_SECONDS)
                return took, f"cache_n {timings['cache_n']}, prompt_n {timings['prompt_n']}"

            sk_times, raw_times = alternate(args.rounds, slotkeeper_round, raw_round)
        finally:
            raw.stop()
            serve.stop()
    report(f"switch between two {args.tokens}-token conversations on one slot", sk_times, raw_times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
