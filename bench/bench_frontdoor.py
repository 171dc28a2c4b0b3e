"""The front door, measured side by side with raw llama-server in one run (the ~200 MB bench model).

    .venv/bin/python bench/bench_frontdoor.py [--conversations 8] [--turns 4] [--restart-after 2]
                                              [--first-tokens 800] [--seed 7] [--overhead-requests 200]

1. A trace: N conversations x T turns in a seeded random order, one slot, replayed against
   Slotkeeper's front door and against raw llama-server with its default flags (so with its own
   RAM prompt cache), both restarted when the first conversation reaches turn R. Each turn goes
   to every system in turn (the first one changing every turn), so the machine's noise falls on
   all of them alike. Each turn sends
   the whole conversation and measures the time to the first streamed token. Prints total
   prefilled tokens and total time to first token for both, the ratio, the same for the turns
   after the restart, and the least any cache could prefill (every conversation's first turn is
   new to any server, and so is each turn's new text): what is above it was re-read.
2. Interleaved with them, Slotkeeper with its llama-server left to its own RAM cache too
   (--cache-ram on, the choice Slotkeeper did not make), for the record.
3. Overhead, with `slotkeeper serve` in its own process as a user runs it: a request whose
   prefix is already in the slot (a chat turn, a text prompt, a token prompt), sent in turn
   straight to llama-server, through the front door and through a bare aiohttp relay that does
   nothing else (the floor for any proxy in Python on this machine): the median added latency.
   And a stream's tokens per second straight and through the front door.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import LlamaServer, first_token, free_port, serve, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.model.modelgen import write_model  # noqa: E402
from slotkeeper.core.server.locate import locate_server  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402


def trace(conversations: int, turns: int, seed: int) -> list[tuple[int, int]]:
    """(conversation, turn) in a random order that keeps each conversation's turns in order."""
    rng = random.Random(seed)
    left = {c: 0 for c in range(conversations)}
    order = []
    while any(t < turns for t in left.values()):
        c = rng.choice([c for c, t in left.items() if t < turns])
        order.append((c, left[c]))
        left[c] += 1
    return order


def replay(order, systems: dict, restart_after: int, first_tokens: int, seed: int) -> dict:
    """Send the trace to every system, turn by turn (``systems``: name -> (send(messages) ->
    (ttft, timings), restart())), so the machine's noise falls on all of them alike: each turn
    goes to each system in turn, the first one changing every turn. All are restarted when the
    first conversation reaches turn R. The replies are scripted, so every system sees the same
    conversations. Totals per system."""
    history: dict[int, list[dict]] = {}
    totals = {name: {"ttft": 0.0, "prefilled": 0, "cached": 0, "ttft_after": 0.0, "prefilled_after": 0,
                     "least": 0} for name in systems}
    last_prompt: dict[tuple[str, int], int] = {}
    names = list(systems)
    restarted = False
    for step, (c, t) in enumerate(order):
        if t == restart_after and not restarted:
            for _send, restart in systems.values():
                restart()
            restarted = True
        msgs = history.setdefault(c, [{"role": "system", "content": f"You are assistant number {c}."}])
        msgs.append({"role": "user",
                     "content": text(seed * 100 + c * 10 + t, first_tokens if t == 0 else 30)})
        k = step % len(names)
        for name in names[k:] + names[:k]:
            ttft, timings = systems[name][0](msgs)
            tot = totals[name]
            tot["ttft"] += ttft
            tot["prefilled"] += timings.get("prompt_n", 0)
            tot["cached"] += timings.get("cache_n", 0)
            n_prompt = timings.get("prompt_n", 0) + timings.get("cache_n", 0)
            tot["least"] += max(n_prompt - last_prompt.get((name, c), 0), 0)
            last_prompt[(name, c)] = n_prompt
            if restarted:
                tot["ttft_after"] += ttft
                tot["prefilled_after"] += timings.get("prompt_n", 0)
        msgs.append({"role": "assistant", "content": text(seed * 1000 + c * 10 + t, 12)})  # a scripted reply
    return totals


class RawServer(LlamaServer):
    """llama-server with its default flags, started and restarted by hand."""

    def __init__(self, binary: list[str], model: Path, ctx: int, extra: list[str]) -> None:
        super().__init__([*binary, "-m", str(model), "-c", str(ctx), "-np", "1", *extra])


def slotkeeper(model: Path, ctx: int, home: Path, extra: tuple[str, ...] = ()) -> Engine:
    os.environ["SLOTKEEPER_HOME"] = str(home)
    settings = Settings(profile=ServerProfile(model_path=str(model), port=free_port(), ctx=ctx,
                                              extra_args=extra),
                        idle_save_seconds=10.0)
    engine = Engine(app_paths(), settings)
    engine.start()
    assert engine.wait_ready(300) is ServerState.READY, engine.supervisor.message
    return engine


def restart(engine: Engine) -> None:
    engine.restart()
    assert engine.wait_ready(300) is ServerState.READY


RELAY = """
import asyncio, sys
import aiohttp
from aiohttp import web

async def main(port, upstream, key):
    session = aiohttp.ClientSession(auto_decompress=False)
    async def relay(request):
        body = await request.read()
        async with session.post(upstream + request.path_qs, data=body, headers={
                "Authorization": "Bearer " + key, "Content-Type": "application/json"}) as up:
            return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
"""


def overhead(model: Path, ctx: int, home: Path, n: int) -> dict:
    """Requests whose prefix is already in the slot, sent in turn straight to llama-server,
    through the front door (``slotkeeper serve`` in its own process) and through a bare aiohttp
    relay that does nothing else (the floor any proxy in Python pays here): median ms of each,
    per kind of request. And a stream's tokens per second straight and through the front door,
    as the client sees them and as llama-server reports them."""
    proc, front, private, key = serve(model, ctx, home)
    relay_port = free_port()
    relay = subprocess.Popen([sys.executable, "-c", RELAY, str(relay_port), private, key],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None and relay.stdout.readline().startswith("ready")
        direct_h = {"Authorization": f"Bearer {key}"}
        targets = (("direct", private, direct_h), ("front door", front, {}),
                   ("bare relay", f"http://127.0.0.1:{relay_port}", {}))
        kinds = {
            "chat turn": ("/v1/chat/completions", {"messages": [{"role": "user", "content": text(5, 300)}],
                                                    "max_tokens": 1, "temperature": 0}),
            "text prompt": ("/completion", {"prompt": text(6, 300), "n_predict": 1, "temperature": 0}),
            "token prompt": ("/completion",
                             {"prompt": list(range(100, 700)), "n_predict": 1, "temperature": 0}),
        }
        out: dict = {}
        with httpx.Client(timeout=60) as c:
            for kind, (path, body) in kinds.items():
                c.post(f"{front}{path}", json=body).raise_for_status()  # into the slot
                times: dict[str, list[float]] = {name: [] for name, _u, _h in targets}
                for i in range(n):
                    for name, url, h in targets[i % 3:] + targets[:i % 3]:  # each goes first in turn
                        t0 = time.perf_counter()
                        c.post(f"{url}{path}", json=body, headers=h).raise_for_status()
                        times[name].append((time.perf_counter() - t0) * 1000)
                out[kind] = {name: statistics.median(v) for name, v in times.items()}

        def stream(url: str, h: dict) -> tuple[float, float]:
            stamps, server = [], 0.0
            with httpx.stream("POST", f"{url}/completion", headers=h, timeout=120, json={
                    "prompt": text(6, 50), "n_predict": 200, "stream": True, "temperature": 0,
                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        stamps.append(time.perf_counter())
                        if '"timings"' in line:
                            server = json.loads(line[6:])["timings"]["predicted_per_second"]
            return (len(stamps) - 1) / (stamps[-1] - stamps[0]), server

        rates: dict[str, list[tuple[float, float]]] = {"direct": [], "front door": []}
        for i in range(10):
            for name, url, h in targets[:2][:: 1 if i % 2 else -1]:
                rates[name].append(stream(url, h))
        for name, v in rates.items():
            out[f"stream {name}"] = (statistics.median(c for c, _s in v), statistics.median(s for _c, s in v))
        return out
    finally:
        relay.kill()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def replay_trace(args, model: Path, server_bin, ctx: int, work: Path) -> None:
    """The trace: each turn to raw llama-server and both Slotkeepers in turn; prints the totals."""
    order = trace(args.conversations, args.turns, args.seed)
    print(f"trace: {args.conversations} conversations x {args.turns} turns, one slot, restart after turn "
          f"{args.restart_after}, seed {args.seed}")

    # The RAM-cache variant is the choice Slotkeeper did not make, allowed here only for the
    # measurement: its extra "--cache-ram 8192" comes after the "--cache-ram 0" Slotkeeper passes,
    # and llama-server takes the last one.
    import slotkeeper.core.server.command as command

    command.OWNED_FLAGS = command.OWNED_FLAGS - {"--cache-ram"}
    raw = RawServer(list(server_bin.argv_prefix), model, ctx, [])
    engines: dict[str, Engine] = {}
    try:
        raw.start()
        for name, extra in (("slotkeeper", ()),
                            ("slotkeeper + llama-server RAM cache", ("--cache-ram", "8192"))):
            engines[name] = slotkeeper(model, ctx, work / name.replace(" ", "-"), extra)

        def raw_restart() -> None:
            raw.stop()
            raw.start()

        systems = {"raw": (lambda m: first_token(raw.url, m), raw_restart)}
        for name, engine in engines.items():
            systems[name] = (lambda m, e=engine: first_token(e.base_url, m), lambda e=engine: restart(e))
        totals = replay(order, systems, args.restart_after, args.first_tokens, args.seed)
    finally:
        raw.stop()
        for engine in engines.values():
            engine.close(save=False)
    r = totals.pop("raw")
    results = totals

    def row(name: str, t: dict) -> None:
        print(f"{name:<38} prefilled {t['prefilled']:>7,} tokens  time to first token {t['ttft']:7.2f} s   "
              f"after the restart: {t['prefilled_after']:>7,} tokens {t['ttft_after']:7.2f} s")

    row("raw llama-server (default flags)", r)
    for name, t in results.items():
        row(name, t)
    s = results["slotkeeper"]
    print(f"Slotkeeper vs raw llama-server: {r['ttft'] / s['ttft']:.1f}x less total time to first token "
          f"({r['prefilled'] / max(1, s['prefilled']):.1f}x fewer tokens prefilled); after the restart "
          f"{r['ttft_after'] / s['ttft_after']:.1f}x")
    least = r["least"]
    print(f"least any cache could prefill (each conversation's first turn, then each turn's new text): "
          f"{least:,} tokens; re-read on top of it: raw {r['prefilled'] - least:,}, "
          f"Slotkeeper {s['prefilled'] - least:,}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--restart-after", type=int, default=2)
    ap.add_argument("--first-tokens", type=int, default=800,
                    help="words in each conversation's first message")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--overhead-requests", type=int, default=200)
    ap.add_argument("--overhead-only", action="store_true",
                    help="only the front door's cost on requests whose prefix is in the slot (minutes)")
    ap.add_argument("--model", help="GGUF to use (default: the generated ~200 MB bench model)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotkeeper-bench-"))
    model = Path(args.model) if args.model else write_model(work / "bench.gguf", "bench")
    server_bin = locate_server(None)
    ctx = 16384
    if not args.overhead_only:
        replay_trace(args, model, server_bin, ctx, work)
    over = overhead(model, ctx, work / "overhead", args.overhead_requests)
    print(f"front door overhead, prefix already in the slot (median of {args.overhead_requests}; "
          "slotkeeper serve in its own process):")
    for kind in ("chat turn", "text prompt", "token prompt"):
        o = over[kind]
        print(f"  {kind:<13} direct {o['direct']:6.2f} ms   front door +{o['front door'] - o['direct']:.2f} "
              f"ms   (a bare aiohttp relay: +{o['bare relay'] - o['direct']:.2f} ms)")
    (dc, ds), (fc, fs) = over["stream direct"], over["stream front door"]
    print(f"streaming: {dc:.1f} tokens/s direct, {fc:.1f} through the front door "
          f"({100 * (fc / dc - 1):+.1f}%); llama-server's own figure {ds:.1f} vs {fs:.1f} "
          f"({100 * (fs / ds - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
