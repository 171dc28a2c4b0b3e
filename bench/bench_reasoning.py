"""Rollbacks into a conversation after a relaunch, and after others pushed it out of its slot:
Slotkeeper with restore points, Slotkeeper without them (as before them), and llama-server that
never stopped, side by side in one run.

    .venv/bin/python bench/bench_reasoning.py [--kind qwen35 --kind gemma3 --kind llama]
        [--starter PATH] [--turns 3] [--first-words 700] [--rounds 3] [--work DIR]

Models: the generated hybrid (qwen35: gated delta net + attention), sliding-window (gemma3, run
with --swa-full) and full-attention control (llama), and with --starter the starter model
(SmolLM2, full attention). Per model, a conversation of --turns turns (the first --first-words
words long) is had through Slotkeeper (`Engine`, in process) and saved when it goes idle, with and
without restore points (the `restore_points` setting); its folder is kept as it is then.

Then, per case and situation, each side starts from that state and gets one request:
- cases: "reasoning" (the client resends the last reply other than it was generated, as clients
  of reasoning models do, and a new turn), "regenerate" (the last prompt again), "edit" (the last
  user message changed);
- situations: "relaunch" (Slotkeeper started again: its launch restores the conversation) and
  "pushed out" (one slot: another conversation came first and took it);
- sides: "points" (Slotkeeper now), "no points" (Slotkeeper with restore_points off: what it did
  before them), "never stopped" (llama-server alone with Slotkeeper's arguments, the conversation
  replayed, then the request; the target).
Prints the prompt tokens each side evaluated and its first-token time (median of --rounds), and per
model the bytes the conversation takes on disk with its restore points, against its state as
llama-server saves it. Loopback only; times
are noisy on a shared machine, tokens are not.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
from benchlib import first_token, generated_model, text, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from e2e_helpers import bare_llama_server, free_port, resolve_auto_as_slotkeeper, wait_until  # noqa: E402

from slotkeeper.core.basics.paths import app_paths  # noqa: E402
from slotkeeper.core.engine import Engine  # noqa: E402
from slotkeeper.core.server.command import build_argv  # noqa: E402
from slotkeeper.core.server.locate import locate_server, probe_flags  # noqa: E402
from slotkeeper.core.server.state import ServerState  # noqa: E402
from slotkeeper.core.sessions.store import SessionStore  # noqa: E402
from slotkeeper.core.settings import ServerProfile, Settings  # noqa: E402

CASES = ("reasoning", "regenerate", "edit")
SITUATIONS = ("relaunch", "pushed out")
CTX = 2048  # the generated models' trained context
SWA_FULL = {"gemma3": True, "gpt-oss": True}


def ask(base: str, messages: list[dict], max_tokens: int = 12) -> dict:
    r = httpx.post(f"{base}/v1/chat/completions", timeout=600, json={
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1})
    r.raise_for_status()
    return r.json()


def converse(base: str, turns: int, first_words: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": text(turn, first_words if turn == 0 else 25)})
        reply = ask(base, messages)["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    return messages


def case_request(history: list[dict], case: str) -> list[dict]:
    if case == "reasoning":
        last = history[-1]["content"]
        return history[:-1] + [{"role": "assistant", "content": last[len(last) // 2:] or "Well."},
                                {"role": "user", "content": text(99, 25)}]
    if case == "regenerate":
        return history[:-1]
    return history[:-2] + [{"role": "user", "content": "Something else entirely, please."}]


OTHER = [{"role": "system", "content": "You answer questions about trains."},
         {"role": "user", "content": text(7, 100)}]


def settings(model: Path, server_bin: str, points: bool, swa_full: bool) -> Settings:
    profile = ServerProfile(model_path=str(model), server_bin=server_bin, port=free_port(), ctx=CTX,
                            swa_full=swa_full)
    return Settings(profile=profile, idle_save_seconds=0.2, restore_points=points)


@contextmanager
def engine(home: Path, s: Settings) -> Iterator[Engine]:
    e = Engine(app_paths(home), s)
    e.start()
    try:
        if e.wait_ready(120) is not ServerState.READY:
            raise RuntimeError("Slotkeeper's server did not get ready")
        yield e
    finally:
        e.stop(save=False)


def prepare(work: Path, model: Path, server_bin: str, points: bool, swa_full: bool,
            turns: int, first_words: int) -> tuple[Path, list[dict]]:
    """A data folder holding the conversation as Slotkeeper saved it when it went idle."""
    home = work / f"{model.stem}-{'points' if points else 'nopoints'}"
    shutil.rmtree(home, ignore_errors=True)
    with engine(home, settings(model, server_bin, points, swa_full)) as e:
        history = converse(e.base_url, turns, first_words)

        def settled():
            sessions = SessionStore(app_paths(home).sessions_dir).sessions()
            s = e.board[0]
            done = sessions and not s.busy and not s.watch.changed and (
                sessions[0].sidecar.points or not points or e.link.facts.restore_mode == "works")
            return sessions if done else None

        wait_until(settled, timeout=300, what="the idle save")
        wait_until(lambda: not e.board[0].busy, timeout=300, what="the restore points")
    return home, history


def slotkeeper_side(home: Path, s: Settings, history: list[dict], case: str, situation: str,
                    scratch: Path) -> tuple[int, float]:
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(home, run)
    s = replace(s, profile=replace(s.profile, port=free_port()), idle_save_seconds=3600)
    with engine(run, s) as e:
        if situation == "pushed out":
            ask(e.base_url, OTHER)
        ttft, timings = first_token(e.base_url, case_request(history, case))
    return int(timings["prompt_n"]), ttft


@contextmanager
def never_stopped(model: Path, server_bin: str, swa_full: bool, folder: Path, home: Path) -> Iterator[str]:
    binary = locate_server(server_bin)
    prof = ServerProfile(model_path=str(model), server_bin=server_bin, port=1, ctx=CTX, swa_full=swa_full)
    flags = probe_flags(binary)
    argv = build_argv(binary.argv_prefix, prof, model, folder, flags)
    resolve_auto_as_slotkeeper(binary.path, argv, model, prof, flags, home)  # flash attention as Slotkeeper's
    for flag in ("--host", "--port"):
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    with bare_llama_server(argv, folder / "never-stopped.log") as base:
        yield base


def never_stopped_side(base: str, history: list[dict], case: str) -> tuple[int, float]:
    httpx.post(f"{base}/slots/0", params={"action": "erase"}, timeout=60).raise_for_status()
    replay = [history[0]]
    for i in range(1, len(history), 2):
        replay.append(history[i])
        ask(base, replay)
        replay.append(history[i + 1])
    ttft, timings = first_token(base, case_request(history, case))
    return int(timings["prompt_n"]), ttft


def disk(home: Path) -> tuple[int, int, int]:
    """The conversation's tokens, the bytes of its state as llama-server saves it, and the bytes the
    sessions folder takes for it with its restore points (their shared pieces counted once)."""
    folder = app_paths(home).sessions_dir
    [entry] = [e for e in SessionStore(folder).sessions()]
    sc = entry.sidecar
    on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    return sc.n_tokens, sc.state_bytes, on_disk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", action="append", help="generated model kinds (default qwen35, gemma3, llama)")
    ap.add_argument("--starter", help="the starter model's GGUF (full attention), as a real model")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--first-words", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work")
    args = ap.parse_args()
    server_bin = str(locate_server().path)
    with work_folder(args.work) as work:
        kinds = args.kind or ["qwen35", "gemma3", "llama"]
        models = [(kind, generated_model(work, kind)) for kind in kinds]
        if args.starter:
            models.append(("starter", Path(args.starter)))
        for kind, model in models:
            swa_full = SWA_FULL.get(kind, False)
            print(f"\n== {kind} ({model.name}{', --swa-full' if swa_full else ''})", flush=True)
            homes, histories = {}, {}
            for points in (True, False):
                homes[points], histories[points] = prepare(work, model, server_bin, points, swa_full,
                                                           args.turns, args.first_words)
            history = histories[True]
            if histories[False] != history:
                raise SystemExit("the two sides' conversations differ (the model is not deterministic here)")
            n_tokens, state, on_disk = disk(homes[True])
            print(f"conversation: {n_tokens} tokens; its state {state / 1e6:.2f} MB as llama-server saves "
                  f"it; on disk with its restore points {on_disk / 1e6:.2f} MB ({on_disk / state:.2f}x)")
            with never_stopped(model, server_bin, swa_full, work, homes[True]) as raw:
                target = {case: [never_stopped_side(raw, history, case) for _ in range(args.rounds)]
                          for case in CASES}
            print(f"{'case':<11} {'situation':<11} | {'points':>16} | {'no points':>16} | "
                  f"{'never stopped':>16}   (prompt tokens evaluated, first-token ms)")
            for case in CASES:
                ns_tokens = target[case][0][0]
                ns_ms = statistics.median(t for _, t in target[case]) * 1000
                for situation in SITUATIONS:
                    cells = []
                    for points in (True, False):
                        runs = [slotkeeper_side(homes[points], settings(model, server_bin, points, swa_full),
                                                history, case, situation, work) for _ in range(args.rounds)]
                        cells.append((runs[0][0], statistics.median(t for _, t in runs) * 1000))
                    print(f"{case:<11} {situation:<11} | {cells[0][0]:>6} {cells[0][1]:>7.1f} ms | "
                          f"{cells[1][0]:>6} {cells[1][1]:>7.1f} ms | {ns_tokens:>6} {ns_ms:>7.1f} ms",
                          flush=True)


if __name__ == "__main__":
    main()
