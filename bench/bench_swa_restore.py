"""How far an exact continuation after llama-server's save -> restart -> restore drifts from the
server that never stopped, for sliding-window models with --swa-full, against a full-attention
control, side by side in one run.

    .venv/bin/python bench/bench_swa_restore.py --model GEMMA3.gguf --control SMOLLM2.gguf
        [--tokens 300,1000,3000] [--reply 256] [--prompts 3] [--flash-attn] [--threads N] [--work DIR]
    .venv/bin/python bench/bench_swa_restore.py --kind gemma3 --kind gpt-oss --control-kind llama

Models: --model PATH (repeatable) for real GGUFs, --kind KIND (repeatable) for the generated
random-weight models of core/model/modelgen.py (their logits are flat: greedy tokens flip on the least
noise, so read their log-prob figures, not their divergence). --control PATH / --control-kind KIND is
a full-attention model, whose restore should be bit-exact. Every model runs with Slotkeeper's own
llama-server arguments (core/server/command.py: one slot, non-unified KV, no RAM cache, flash
attention off unless --flash-attn), plus --swa-full.

For each model, each conversation length N (--tokens) and each of --prompts different prompts
(English prose from the Python standard library's docstrings, a different stretch each):
- live: a llama-server prefills the N-token prompt (n_predict 0) and saves the slot; then, without
  a restart, the prompt + a fixed question is sent with greedy decoding (temperature 0, top_k 1,
  fixed seed) for --reply tokens, with n_probs 5: tokens and per-token log-probs;
- restored: a new llama-server restores that file and gets the very same request (cache_n shows
  the restore was used);
- cold: a new llama-server gets the same request with nothing restored (a full prefill: what
  Slotkeeper's "never" restore mode gives);
- with --noise-threads K, "tK": the same as cold on a server with K threads instead of the
  default: the drift a mere change of thread count brings, for scale.
Restored, cold and tK are each compared with live: the first position where the greedy tokens differ,
and, before it, the largest and mean difference of the chosen token's log-prob and the largest
difference over tokens in both top-5 lists. Per model and N: how many runs diverged within
--reply tokens, and the figures side by side. Loopback only. Run it with `nice -n 10` on a shared
machine: the figures do not depend on timing.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from benchlib import free_port, generated_model, work_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from slotkeeper.core.server.command import build_argv  # noqa: E402
from slotkeeper.core.server.locate import locate_server, probe_flags  # noqa: E402
from slotkeeper.core.settings import ServerProfile  # noqa: E402

QUESTION = "\n\nQuestion: What is the text above about? Explain it in detail, step by step.\nAnswer:"
SEED = 1234
# Standard-library modules whose docstrings are long English prose: the prompts' text.
DOC_MODULES = ("argparse", "asyncio", "collections", "concurrent.futures", "csv", "dataclasses", "decimal",
               "difflib", "email", "enum", "fractions", "functools", "heapq", "http.client", "inspect",
               "ipaddress", "itertools", "json", "logging", "pathlib", "pickle", "random", "re", "sched",
               "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap",
               "threading", "tkinter", "typing", "unittest", "urllib.parse", "uuid", "zipfile")


def prose() -> str:
    """Docstrings of the standard library (modules, classes, functions), a few MB of English."""
    import importlib

    parts: list[str] = []
    for name in DOC_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        members = (v for _, v in sorted(vars(mod).items()) if inspect.isclass(v) or inspect.isfunction(v))
        for obj in [mod, *members]:
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200 and doc not in parts:
                parts.append(doc)
    return "\n\n".join(parts)


def die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when this benchmark dies, even by SIGKILL, so no
    llama-server outlives a killed run."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """llama-server with Slotkeeper's arguments and --swa-full, on loopback."""

    def __init__(self, model: Path, ctx: int, folder: Path, log: Path, args: argparse.Namespace,
                 threads: int | None = None) -> None:
        binary = locate_server()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = tuple(args.server_arg)
        threads = threads or args.threads
        if threads:
            extra += ("--threads", str(threads), "--threads-batch", str(threads))
        profile = ServerProfile(model_path=str(model), host="127.0.0.1", port=self.port, ctx=ctx, parallel=1,
                                flash_attn=args.flash_attn, swa_full=True, extra_args=extra)
        self.argv = build_argv(binary.argv_prefix, profile, model, folder,
                               supported_flags=probe_flags(binary))
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                if self.proc.returncode == -signal.SIGILL:
                    raise RuntimeError("llama-server died of SIGILL (an instruction this CPU or VM does not "
                                       "run: AMX kernels of quantized weights on some VMs); try "
                                       f"--server-arg=--no-repack; see {self.log}")
                break
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"llama-server did not start; see {self.log}")

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
            self.proc = None

    def post(self, path: str, body: dict, **params: str) -> dict:
        r = httpx.post(f"{self.url}{path}", params=params, json=body, timeout=1800)
        r.raise_for_status()
        return r.json()

    def tokenize(self, text: str, special: bool) -> list[int]:
        return [int(t) for t in self.post("/tokenize", {"content": text, "add_special": special})["tokens"]]

    def reply(self, prompt: list[int], n: int) -> Reply:
        data = self.post("/completion",
                         {"prompt": prompt, "n_predict": n, "cache_prompt": True, "temperature": 0,
                          "top_k": 1, "seed": SEED, "n_probs": 5,
                          "ignore_eos": True})
        probs = data["completion_probabilities"]
        return Reply([p["id"] for p in probs], [p["logprob"] for p in probs],
                     [{t["id"]: t["logprob"] for t in p["top_logprobs"]} for p in probs],
                     data["timings"]["cache_n"])


@dataclass
class Reply:
    tokens: list[int]
    chosen: list[float]  # log-prob of the chosen token, per position
    top: list[dict[int, float]]  # top-5 log-probs, per position
    cache_n: int


@dataclass
class Diff:
    first: int | None  # first position where the tokens differ; None: equal throughout
    chosen_max: float
    chosen_mean: float
    top_max: float


def fig(x: float) -> str:
    """A difference: exactly 0 as such (bit-exact), a tiny one in scientific notation."""
    return "0" if x == 0 else f"{x:.4f}" if x >= 1e-3 else f"{x:.1e}"


def compare(ref: Reply, other: Reply) -> Diff:
    n = min(len(ref.tokens), len(other.tokens))
    first = next((i for i in range(n) if ref.tokens[i] != other.tokens[i]), None)
    upto = n if first is None else first + 1  # the divergent position itself still had the same context
    chosen = [abs(a - b) for a, b in zip(ref.chosen[:upto], other.chosen[:upto])]
    top = [abs(a[t] - b[t]) for a, b in zip(ref.top[:upto], other.top[:upto]) for t in a if t in b]
    return Diff(first, max(chosen, default=0.0), statistics.fmean(chosen) if chosen else 0.0,
                max(top, default=0.0))


def run_model(name: str, model: Path, args: argparse.Namespace, work: Path, text: str) -> list[tuple]:
    rows = []
    folder = work / "slots"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    ctx = max(args.tokens) + args.reply + 512

    def server(threads: int | None = None) -> Server:
        return Server(model, ctx, folder, work / f"{name.split()[0]}.log", args, threads)

    for n_tokens in args.tokens:
        diffs: dict[str, list[Diff]] = {"restored": [], "cold": [], f"t{args.noise_threads}": []}
        for k in range(args.prompts):
            with server() as live:
                start = len(text) * k // max(args.prompts, 1)
                words = (text[start:] + text)[: n_tokens * 8]
                prompt = live.tokenize(words, special=True)[:n_tokens]
                question = live.tokenize(QUESTION, special=False)
                live.post("/completion", {"prompt": prompt, "n_predict": 0, "cache_prompt": True})
                saved = live.post("/slots/0", {"filename": "s.kv"}, action="save")
                assert saved["n_saved"] == len(prompt), saved
                ref = live.reply(prompt + question, args.reply)
            with server() as restarted:
                restored = restarted.post("/slots/0", {"filename": "s.kv"}, action="restore")
                assert restored["n_restored"] == len(prompt), restored
                got = restarted.reply(prompt + question, args.reply)
            if got.cache_n < len(prompt):
                print(f"  !! {name} N={n_tokens} prompt {k}: the restore was not reused (cache_n "
                      f"{got.cache_n})")
            cold = None
            if not args.no_cold:
                with server() as fresh:
                    cold = fresh.reply(prompt + question, args.reply)
            noise = None
            if args.noise_threads:
                with server(args.noise_threads) as fresh:
                    noise = fresh.reply(prompt + question, args.reply)
            for arm, other in (("restored", got), ("cold", cold), (f"t{args.noise_threads}", noise)):
                if other is None:
                    continue
                d = compare(ref, other)
                diffs[arm].append(d)
                print(f"  {name} N={n_tokens} prompt {k} {arm:8s}: first divergence "
                      f"{'none' if d.first is None else d.first:>4} | chosen max {fig(d.chosen_max)} "
                      f"mean {fig(d.chosen_mean)} | top-5 max {fig(d.top_max)}" +
                      (f" | cache_n {other.cache_n}" if arm == "restored" else ""), flush=True)
        rows.append((name, n_tokens, diffs))
    return rows


def summary(rows: list[tuple], args: argparse.Namespace) -> None:
    print(f"\nsummary: greedy reply of {args.reply} tokens after an N-token prompt + a question; "
          f"each compared with the server that never stopped")
    head = f"{'model':<28} {'N':>5} | {'arm':<8} {'diverged':>8} {'first (median)':>14} " \
           f"{'chosen max':>10} {'chosen mean':>11} {'top-5 max':>9}"
    print(head)
    print("-" * len(head))
    for name, n_tokens, diffs in rows:
        for arm, ds in diffs.items():
            if not ds:
                continue
            firsts = [d.first for d in ds if d.first is not None]
            print(f"{name:<28} {n_tokens:>5} | {arm:<8} {len(firsts):>3} of {len(ds):<2} "
                  f"{(str(int(statistics.median(firsts))) if firsts else '-'):>14} "
                  f"{fig(max(d.chosen_max for d in ds)):>10} "
                  f"{fig(statistics.fmean(d.chosen_mean for d in ds)):>11} "
                  f"{fig(max(d.top_max for d in ds)):>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], help="a sliding-window GGUF (repeatable)")
    ap.add_argument("--kind", action="append", default=[],
                    help="a generated model kind: gemma3, gemma2, gpt-oss")
    ap.add_argument("--control", help="a full-attention GGUF: its restore should be bit-exact")
    ap.add_argument("--control-kind", help="a generated full-attention model kind as the control (llama)")
    ap.add_argument("--tokens", default="300,1000,3000", help="conversation lengths, comma-separated")
    ap.add_argument("--reply", type=int, default=256, help="greedy tokens generated per run")
    ap.add_argument("--prompts", type=int, default=3, help="different prompts per model and length")
    ap.add_argument("--flash-attn", action="store_true",
                    help="run llama-server with -fa on (Slotkeeper: off)")
    ap.add_argument("--threads", type=int, help="llama-server --threads and --threads-batch")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more llama-server argument for every arm (repeatable), e.g. "
                         "--server-arg=--no-repack")
    ap.add_argument("--noise-threads", type=int,
                    help="one more arm: a fresh server with this many threads, full prefill (the drift a "
                         "mere change of thread count brings, for scale)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-prefill arm")
    ap.add_argument("--work",
                    help="folder for generated models, save files and logs (default: a temporary one)")
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    if not (args.model or args.kind or args.control or args.control_kind):
        ap.error("name at least one model: --model, --kind, --control or --control-kind")
    with work_folder(args.work) as work:
        models = [(Path(m).stem, Path(m)) for m in args.model]
        models += [(f"{k} (random)", generated_model(work, k)) for k in args.kind]
        if args.control:
            models.append((f"{Path(args.control).stem} (control)", Path(args.control)))
        if args.control_kind:
            models.append((f"{args.control_kind} (random, control)",
                           generated_model(work, args.control_kind)))
        text = prose()
        rows = []
        for name, path in models:
            print(f"{name}: {path.name}, flash attention {'on' if args.flash_attn else 'off'}", flush=True)
            rows += run_model(name, path, args, work, text)
        summary(rows, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
