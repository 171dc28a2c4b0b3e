"""Cold prefill and decode: Slotkeeper's defaults against llama-server's own, side by side in one run.

    .venv/bin/python bench/bench_cold.py [--model starter|bench|PATH ...] [--rounds 6] [--words 900]
                                         [--decode 64] [--ctx 8192] [--pause S] [--busy N]
                                         [--flags | --write-beside MB]

For each model, `slotkeeper serve` with its defaults (in its own process, as a user runs it) and
raw llama-server with its defaults (the same model, context and one slot: `-c CTX -np 1`) run at
once, idle while the other works. Each round sends each side, in turn (the order flipped every
other round, so the machine's drift falls on both alike), a prompt it has never seen (new words,
so nothing is in any cache) and asks for DECODE tokens. Printed per model: the medians of
llama-server's own prompt and decode rates on each side (what the flags cost), of the time to the
whole answer seen by the client (what the user waits), and the ratios. A new conversation in the
only slot makes Slotkeeper save the one before (the save's commit, a hash and an fsync of its file,
runs beside the new prompt's prefill); --pause S waits S seconds before each request, so it is done.
--busy N: N processes spin on the CPU meanwhile, as on a machine doing other work.

--flags: raw llama-server with its defaults against raw llama-server with each flag Slotkeeper
passes (and the old `--flash-attn off`), one at a time, then all of them: cold prefill and decode
rates and the server's resident memory after the rounds. The table in docs/MEASUREMENTS.md.

--write-beside MB: two raw llama-servers with the same defaults; as each request to the second is
sent, another process writes MB megabytes to a file in --work's folder and fsyncs it (what a
save's commit does to the disk beside a new prefill, without Slotkeeper). What that writing alone
costs llama-server on this machine.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from benchlib import LlamaServer, generated_model, serve, text, work_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.server.locate import locate_server  # noqa: E402


def starter_model(work: Path) -> Path:
    """The installed starter model (fetched into ``work`` when this installation lacks it)."""
    from slotkeeper.core.model.starter_model import ensure_starter_model

    return Path(ensure_starter_model(work / "models"))


def ask(url: str, words: str, decode: int) -> tuple[float, dict]:
    """Seconds to the whole answer of a new conversation, and llama-server's timings."""
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": decode, "temperature": 0,
            "seed": 1, "ignore_eos": True}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["timings"]


def rounds(sides: dict[str, str], n: int, words: int, decode: int, seed: int,
           pause: float = 0.0,
           beside: dict[str, Callable[[], Any]] | None = None) -> dict[str, dict[str, list]]:
    """``n`` rounds over ``sides`` (name -> URL), each side a new prompt every round, the order
    turned every round, ``pause`` seconds before each request; ``beside[name]()`` is called as a
    request to that side is sent, and what it returns waited for (``.wait()``) after the answer."""
    got: dict[str, dict[str, list]] = {name: {"pp": [], "tg": [], "wall": [], "n": []} for name in sides}
    names = list(sides)
    for rnd in range(n):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        line = []
        for i, name in enumerate(order):
            time.sleep(pause)
            other = (beside or {}).get(name)
            running = other() if other else None
            wall, t = ask(sides[name], text(seed + 1000 * rnd + i * 7 + hash(name) % 997, words), decode)
            if running is not None:
                running.wait()
            g = got[name]
            g["pp"].append(t["prompt_per_second"])
            g["tg"].append(t["predicted_per_second"])
            g["wall"].append(wall)
            g["n"].append(t["prompt_n"])
            line.append(f"{name} {t['prompt_n']} tok {t['prompt_per_second']:.0f}/s pp "
                        f"{t['predicted_per_second']:.1f}/s tg {wall:.2f} s")
        print(f"  round {rnd}: " + " | ".join(line), flush=True)
    return got


def med(values: list[float]) -> float:
    return statistics.median(values)


def compare(model: Path, args, work: Path, server_bin) -> None:
    print(f"\n{model.name} ({model.stat().st_size / 1e6:.0f} MB), context {args.ctx}, one slot:")
    raw = LlamaServer(raw_argv(model, args, server_bin))
    raw.start()
    proc, url, _private, _key = serve(model, args.ctx, work / f"home-{model.stem}")
    try:
        got = rounds({"slotkeeper": url, "raw": raw.url}, args.rounds, args.words, args.decode,
                     args.seed, args.pause)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        raw.stop()
    s, r = got["slotkeeper"], got["raw"]
    print(f"  prompt tokens per round: {med(s['n']):.0f} / {med(r['n']):.0f}")
    for key, what, higher in (("pp", "cold prefill, tokens/s", True), ("tg", "decode, tokens/s", True),
                              ("wall", "whole answer, s", False)):
        a, b = med(s[key]), med(r[key])
        ratio = a / b if higher else b / a
        print(f"  {what:<24} Slotkeeper {a:9.2f}   raw llama-server {b:9.2f}   "
              f"Slotkeeper at {100 * ratio:.1f}% of raw")


# Each flag Slotkeeper passes (or used to), against llama-server's defaults.
FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--flash-attn on (auto's choice here)", ("--flash-attn", "on")),
    ("--flash-attn off (the old default)", ("--flash-attn", "off")),
    ("--cache-type-k/v f16", ("--cache-type-k", "f16", "--cache-type-v", "f16")),
    ("--metrics", ("--metrics",)),
    ("--slot-save-path", ("--slot-save-path", "SAVES")),
    ("--no-kv-unified", ("--no-kv-unified",)),
    ("--no-cache-idle-slots", ("--no-cache-idle-slots",)),
    ("--cache-ram 0", ("--cache-ram", "0")),
)


def raw_argv(model: Path, args, server_bin) -> list[str]:
    """Raw llama-server with its own defaults: the model, the context and one slot."""
    return [*server_bin.argv_prefix, "-m", str(model), "-c", str(args.ctx), "-np", "1"]


def raw_sides(argvs: dict[str, list[str]], args,
              beside: dict[str, Callable[[], Any]] | None = None) -> tuple[dict, dict[str, int]]:
    """Raw llama-servers (name -> argv) started side by side, ``rounds`` over them, then stopped:
    the rounds' figures and each server's resident memory after them."""
    servers = {name: LlamaServer(argv) for name, argv in argvs.items()}
    for server in servers.values():
        server.start()
    try:
        got = rounds({k: v.url for k, v in servers.items()}, args.rounds, args.words, args.decode, args.seed,
                     beside=beside)
        rss = {k: psutil.Process(v.proc.pid).memory_info().rss for k, v in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    return got, rss


def flag_sweep(model: Path, args, work: Path, server_bin) -> None:
    print(f"\nflags, {model.name}, context {args.ctx}, one slot: raw llama-server's defaults against each")
    base = raw_argv(model, args, server_bin)
    saves = work / "saves"
    saves.mkdir(exist_ok=True)
    every = tuple(a for _n, f in FLAGS[:1] + FLAGS[2:] for a in f)
    for name, flag in (*FLAGS, ("all Slotkeeper passes", every)):
        flag = tuple(str(saves) if a == "SAVES" else a for a in flag)
        got, rss = raw_sides({"default": base, "flag": [*base, *flag]}, args)
        d, f = got["default"], got["flag"]
        print(f"  {name:<40} prefill {100 * med(f['pp']) / med(d['pp']):6.1f}%   decode "
              f"{100 * med(f['tg']) / med(d['tg']):6.1f}%   memory {rss['flag'] / 1e6:7.0f} MB vs "
              f"{rss['default'] / 1e6:7.0f} MB   (of the default's)", flush=True)


WRITER = """
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
block = os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for _ in range(size):
    os.write(fd, block)
os.fsync(fd)
os.close(fd)
"""


def write_beside(model: Path, args, work: Path, server_bin) -> None:
    print(f"\n{model.name}: raw llama-server against raw llama-server with {args.write_beside} MB "
          "written and fsynced beside each request")
    base = raw_argv(model, args, server_bin)
    target = work / "written-beside.bin"

    def writer() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(args.write_beside)])

    try:
        got, _rss = raw_sides({"alone": base, "writing": base}, args, beside={"writing": writer})
    finally:
        target.unlink(missing_ok=True)
    a, w = got["alone"], got["writing"]
    print(f"  prefill with the writing {100 * med(w['pp']) / med(a['pp']):6.1f}% of alone   decode "
          f"{100 * med(w['tg']) / med(a['tg']):6.1f}%   "
          f"whole answer {100 * med(a['wall']) / med(w['wall']):6.1f}%", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append",
                    help="starter, bench or a GGUF path (default: starter and bench)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--words", type=int, default=900, help="words in each new prompt")
    ap.add_argument("--decode", type=int, default=64, help="tokens to generate each time")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--flags", action="store_true", help="the flag-by-flag table instead")
    ap.add_argument("--write-beside", type=int, default=0, metavar="MB",
                    help="raw against raw with MB megabytes written and fsynced beside each request instead")
    ap.add_argument("--work", help="folder to work in (kept; reuses the generated model)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds between requests (Slotkeeper's save of the conversation before is then "
                         "done before the next one starts)")
    ap.add_argument("--busy", type=int, default=0,
                    help="processes spinning on the CPU meanwhile (a machine doing other work)")
    args = ap.parse_args()
    server_bin = locate_server(None)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return run(args, server_bin)
    finally:
        for p in spinners:
            p.kill()


def run(args, server_bin) -> int:
    with work_folder(args.work) as work:
        for which in args.model or ["starter", "bench"]:
            model = (starter_model(work) if which == "starter" else generated_model(work, "bench")
                     if which == "bench" else Path(which))
            if args.flags:
                flag_sweep(model, args, work, server_bin)
            elif args.write_beside:
                write_beside(model, args, work, server_bin)
            else:
                compare(model, args, work, server_bin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
