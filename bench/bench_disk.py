"""A reasoning client's conversation on disk, turn by turn: Slotkeeper as it is against the layout
before (each state kept whole), side by side in one run.

    .venv/bin/python bench/bench_disk.py [--model gemma3|hybrid|starter|PATH ...] [--turns 8]
                                         [--reply 200] [--relaunches 5] [--before REV] [--work DIR]

Each side is `slotkeeper serve` in its own process (`--idle-save 1`, `--swa-full` for Gemma 3): a
chat of TURNS turns whose client, as one of a reasoning model does, resends each reply without its
first half (its "reasoning"), so each next prompt leaves the saved reply before its end. After each
turn the side is left idle until its saves and restore points are done (the sessions folder quiet
for 3 s), and printed per turn: the sessions (rows the list would show before conversations were
grouped), the bytes on disk in the sessions folder, the bytes this turn wrote to the disk (the
kernel's write_bytes of serve and of its llama-server: what reached the storage layer), and the
newest state's size, and for the last turn what it wrote against 3x the KV of the tokens it added
plus 1 MB (the goal). After the last turn each side is relaunched RELAUNCHES times, alternating
with the other, each time from a copy of the data folder its last turn left, and the median time
from the request to the first token of the next turn is printed (the conversation restored at
launch; goal: within 10% of the layout before), and of the turn after it once another conversation
has pushed it out of the only slot (restored on demand; the same goal); with --after-reboot the
in-memory cache of whole states is emptied before each relaunch, so restores assemble from pieces
as after a restart of the machine. Then, on Slotkeeper as it
is, from the same copy, a Regenerate (the last reply sampled again) and an edit of the last user
message: what each adds to the folder against the KV of its new tokens plus 1 MB (the goal).
Then llama-server's own slot save of the final conversation (saved by hand from a raw server that
replays it) gives the reference size: the goal is at most 1.3x it on disk, restore points included.

The side before runs the Slotkeeper of git revision REV (default: the last one before pieces),
unpacked into --work. Models: gemma3 (Gemma 3 270M from PyPI packages, --models), hybrid (the
generated qwen35), starter (SmolLM2-135M), or a GGUF path. Linux (per-process I/O counters),
loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
from benchlib import child_pids, free_port, generated_model, pypi_gemma3_270m, text, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

BEFORE = "10252fd"  # the last revision that kept every state whole


def io_written(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def folder_stamp(folder: Path) -> tuple:
    out = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


class Side:
    def __init__(self, name: str, app: Path, home: Path, model: Path, swa_full: bool, ctx: int) -> None:
        self.name, self.app, self.home, self.model = name, app, home, model
        self.argv_extra = ["--swa-full"] if swa_full else []
        self.ctx = ctx
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.written = 0  # by processes that ended

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(self.app)}
        log = (self.home.parent / f"{self.home.name}.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slotkeeper", "--data-dir", str(self.home), "serve",
             "--model", str(self.model), "--port", str(port), "--ctx", str(self.ctx), "--parallel", "1",
             "--idle-save", "1", *self.argv_extra],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                return
        raise RuntimeError(f"{self.name}: serve did not start (see {log.name})")

    def io(self) -> int:
        if self.proc is None:
            return self.written
        pids = [self.proc.pid, *child_pids(self.proc.pid)]
        return self.written + sum(io_written(p) for p in pids)

    def stop(self) -> None:
        """Quit (saving on the way out); what it wrote is read once it has exited and before it is
        reaped: a process's count includes the children it reaped (llama-server)."""
        if self.proc is not None:
            pid = self.proc.pid
            self.proc.send_signal(signal.SIGINT)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            self.written += io_written(pid)
            self.proc.wait(600)
            self.proc = None

    def settle(self, quiet: float = 3.0, timeout: float = 900.0) -> None:
        """Until the sessions folder has not changed for ``quiet`` seconds."""
        folder = self.home / "sessions"
        last, since = None, time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = folder_stamp(folder)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.25)

    def sessions(self) -> list[dict]:
        out = []
        for path in (self.home / "sessions").glob("*.json"):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        return out


def chat(url: str, messages: list[dict], reply: int, temperature: float = 0.0,
         seed: int = 1) -> tuple[str, dict, float]:
    """A streamed answer: its text, llama-server's timings and the seconds to the first token."""
    body = {"messages": messages, "max_tokens": reply, "temperature": temperature, "seed": seed,
            "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    first = None
    parts: list[str] = []
    timings: dict = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            for c in d.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    parts.append(piece)
                    if first is None:
                        first = time.perf_counter() - t0
            timings = d.get("timings", timings)
    return "".join(parts), timings, first if first is not None else time.perf_counter() - t0


def run_side(side: Side, turns: int, reply: int) -> tuple[list[dict], list[dict]]:
    """The reasoning conversation on ``side``: its history and each turn's figures."""
    history = [{"role": "system", "content": "You are a careful assistant. Think before you answer."}]
    rows = []
    side.start()
    try:
        for k in range(turns):
            history.append({"role": "user", "content": f"Turn {k + 1}: " + text(k, 40)})
            before_io = side.io()
            answer, timings, _ttft = chat(side.url, history, reply)
            # The client resends the reply without its first half (its reasoning).
            history.append({"role": "assistant", "content": answer[len(answer) // 2:] or answer})
            side.settle()
            sessions = side.sessions()
            newest = max(sessions, key=lambda s: s.get("last_used_at", ""), default={})
            rows.append({"turn": k + 1, "sessions": len(sessions),
                         "disk": folder_bytes(side.home / "sessions"), "written": side.io() - before_io,
                         "state": newest.get("state_bytes") or newest.get("size_bytes", 0),
                         "prompt_n": timings.get("prompt_n")})
    finally:
        side.stop()
    return history, rows


def relaunch_first_token(side: Side, history: list[dict], reply: int) -> tuple[float, float]:
    """The first token of the conversation's next request after a relaunch (restored at the launch),
    then of the request after that once another conversation has pushed it out of the only slot
    (restored on demand)."""
    side.written = 0
    side.start()
    try:
        nxt = history + [{"role": "user", "content": "And one more question, please: " + text(99, 20)}]
        answer, timings, ttft = chat(side.url, nxt, 8)
        chat(side.url, [{"role": "user", "content": "Something else entirely: " + text(55, 60)}], 8)
        side.settle()
        again = nxt + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": "And after that? " + text(98, 12)}]
        _answer, t2, on_demand = chat(side.url, again, 8)
        print(f"  {side.name}: relaunch's first token {ttft * 1000:.0f} ms "
              f"(prompt_n {timings.get('prompt_n')}, cache_n {timings.get('cache_n')}); restored on demand "
              f"{on_demand * 1000:.0f} ms (prompt_n {t2.get('prompt_n')}, cache_n {t2.get('cache_n')})",
              flush=True)
        return ttft, on_demand
    finally:
        side.stop()


def relaunch_rounds(runs: list[tuple[Side, list[dict]]], rounds: int, reply: int,
                    work: Path, after_reboot: bool = False) -> dict[str, tuple[float, float]]:
    """The median first-token times after a relaunch and after a restore on demand of each side,
    over ``rounds`` rounds in alternating order, each side started every time from the data folder
    its last turn left (a copy), so that every relaunch restores the same conversation."""
    import shutil

    snapshots = {}
    for side, _history in runs:
        snap = work / f"{side.home.name}-snapshot"
        shutil.rmtree(snap, ignore_errors=True)
        shutil.copytree(side.home, snap, symlinks=True)
        snapshots[side.name] = snap
    times: dict[str, list[tuple[float, float]]] = {side.name: [] for side, _h in runs}
    for r in range(rounds):
        for side, history in (runs if r % 2 == 0 else list(reversed(runs))):
            shutil.rmtree(side.home)
            shutil.copytree(snapshots[side.name], side.home, symlinks=True)
            if after_reboot:  # what a restart of the machine empties: /dev/shm
                for cached in Path("/dev/shm").glob(f"slotkeeper-{os.getuid()}/*/state-*"):
                    cached.unlink(missing_ok=True)
            times[side.name].append(relaunch_first_token(side, history, reply))
    return {name: (statistics.median(a for a, _ in t), statistics.median(b for _, b in t))
            for name, t in times.items()}


def branches(side: Side, history: list[dict], reply: int, work: Path) -> list[tuple[str, int, int, int]]:
    """A Regenerate (the last reply again, sampled) and an edit (the last user message changed),
    each on the data folder the last turn left: (what, new tokens, bytes the folder grew by, bytes
    written)."""
    snap = work / f"{side.home.name}-snapshot"
    shutil.rmtree(side.home)
    shutil.copytree(snap, side.home, symlinks=True)
    side.written = 0
    out = []
    side.start()
    try:
        side.settle()
        edited = {"role": "user", "content": "The last turn, put another way: " + text(77, 30)}
        asks = [("regenerate", history[:-1], 0.9), ("edit", history[:-2] + [edited], 0.0)]
        for what, messages, temperature in asks:
            disk, written = folder_bytes(side.home / "sessions"), side.io()
            _answer, timings, _ttft = chat(side.url, messages, reply, temperature=temperature, seed=7)
            side.settle()
            out.append((what, (timings.get("prompt_n") or 0) + reply,
                        folder_bytes(side.home / "sessions") - disk, side.io() - written))
    finally:
        side.stop()
    return out


def kv_bytes_per_token(state: Path) -> int:
    """What one more token adds to a state: its K and V in every layer of every cache."""
    from slotkeeper.core.sessions.statefile import read_layout

    total = 0
    for cache in read_layout(state).caches:
        for stream in cache.streams[:1]:
            total += sum(r.row_bytes for r in stream.k) + sum(r.row_bytes * (r.n_embd or 1) for r in stream.v)
    return total


def llama_servers_own_save(model: Path, history: list[dict], swa_full: bool, ctx: int,
                           work: Path) -> tuple[int, int]:
    """The size of llama-server's own slot save of the final conversation (replayed on a raw
    server), and the KV bytes a token adds to it."""
    from benchlib import LlamaServer

    from slotkeeper.core.server.locate import locate_server

    folder = work / "raw-save"
    folder.mkdir(exist_ok=True)
    argv = [locate_server().path, "-m", str(model), "-c", str(ctx), "-np", "1", "--flash-attn", "off",
            "--slot-save-path", str(folder), *(["--swa-full"] if swa_full else [])]
    server = LlamaServer(argv)
    server.start()
    try:
        body = {"messages": history, "max_tokens": 1, "temperature": 0}
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=1800).raise_for_status()
        httpx.post(f"{server.url}/slots/0", params={"action": "save"}, json={"filename": "final.kv"},
                   timeout=600).raise_for_status()
        return (folder / "final.kv").stat().st_size, kv_bytes_per_token(folder / "final.kv")
    finally:
        server.stop()


def unpack_before(rev: str, work: Path) -> Path:
    target = work / f"before-{rev}"
    if not (target / "app").exists():
        target.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parents[1]
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "app"], check=True,
                                 capture_output=True).stdout
        tar = target / "app.tar"
        tar.write_bytes(archive)
        with tarfile.open(tar) as t:
            t.extractall(target, filter="data")
    return target / "app"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="gemma3, hybrid, starter or a GGUF path")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--reply", type=int, default=200, help="tokens generated per turn")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--relaunches", type=int, default=5, help="relaunches of each side, alternating")
    ap.add_argument("--before", default=BEFORE, help="the git revision of the layout before")
    ap.add_argument("--after-reboot", action="store_true",
                    help="empty the in-memory cache of whole states before every relaunch, as a reboot does")
    ap.add_argument("--models", default=str(Path.home() / ".cache" / "slotkeeper-bench"))
    ap.add_argument("--work", help="folder for data, logs and the side before (default: a new temporary one)")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        before_app = unpack_before(args.before, work)
        for which in args.model or ["gemma3", "hybrid", "starter"]:
            reply = args.reply
            if which == "gemma3":
                model, swa_full = pypi_gemma3_270m(Path(args.models)), True
            elif which == "hybrid":
                # its context is 2,048 tokens: the turns' replies are shorter
                model, swa_full = generated_model(work, "qwen35"), False
                reply = min(args.reply, 50)
            elif which == "starter":
                from slotkeeper.core.model.starter_model import ensure_starter_model

                model, swa_full = Path(ensure_starter_model(work / "models")), False
            else:
                model, swa_full = Path(which), False
            print(f"\n{model.name}{' --swa-full' if swa_full else ''}, {args.turns} turns of {reply} "
                  f"tokens, the client dropping each reply's first half:", flush=True)
            results = {}
            runs = []
            for name, app in (("now", APP), ("before", before_app)):
                home = work / f"{model.stem}-{name}"
                shutil.rmtree(home, ignore_errors=True)
                side = Side(name, app, home, model, swa_full, args.ctx)
                history, rows = run_side(side, args.turns, reply)
                runs.append((side, history))
                results[name] = (history, rows)
            ttfts = relaunch_rounds(runs, args.relaunches, reply, work, args.after_reboot)
            reference, per_token = llama_servers_own_save(model, results["now"][0], swa_full, args.ctx, work)
            print(f"  {'turn':>4} | {'sessions':>8} {'on disk':>10} {'written':>10} {'newest':>9} | "
                  f"{'sessions':>8} {'on disk':>10} {'written':>10} {'newest':>9}   (now | before; MB)")
            for now, before in zip(results["now"][1], results["before"][1]):
                cells = []
                for r in (now, before):
                    cells.append(f"{r['sessions']:>8} {r['disk'] / 1e6:>10.1f} {r['written'] / 1e6:>10.1f} "
                                 f"{r['state'] / 1e6:>9.1f}")
                print(f"  {now['turn']:>4} | " + " | ".join(cells))
            final_now, final_before = results["now"][1][-1], results["before"][1][-1]
            print(f"  llama-server's own save of the final conversation: {reference / 1e6:.1f} MB; "
                  f"on disk now "
                  f"{final_now['disk'] / reference:.2f}x it (goal: at most 1.3x), before "
                  f"{final_before['disk'] / reference:.2f}x")
            new_tokens = (final_now["prompt_n"] or 0) + reply
            allowed = 3 * new_tokens * per_token + 1_000_000
            written = final_now["written"]
            print(f"  turn {final_now['turn']} wrote {written / 1e6:.1f} MB for {new_tokens} new tokens "
                  f"({new_tokens * per_token / 1e6:.1f} MB of KV, {per_token} bytes a token); goal: at most "
                  f"3x that plus 1 MB, {allowed / 1e6:.1f} MB ({written / allowed:.2f} of it)")
            for what, new_tokens, grew, wrote in branches(runs[0][0], results["now"][0], reply, work):
                goal = new_tokens * per_token + 1_000_000
                article = "an" if what[0] in "aeiou" else "a"
                print(f"  now, {article} {what}: {new_tokens} new tokens; the folder grew "
                      f"{grew / 1e6:.1f} MB, {wrote / 1e6:.1f} MB written (goal: grows at most their KV "
                      f"plus 1 MB, {goal / 1e6:.1f} MB; {grew / goal:.2f} of it)")
            (a, a2), (b, b2) = ttfts["now"], ttfts["before"]
            print(f"  relaunch's first token (median of {args.relaunches}, alternating): now {a * 1000:.0f} "
                  f"ms, before {b * 1000:.0f} ms ({a / b:.2f}x; goal: within 10%)", flush=True)
            print(f"  a restore on demand's first token (the same rounds): now {a2 * 1000:.0f} ms, before "
                  f"{b2 * 1000:.0f} ms ({a2 / b2:.2f}x; goal: within 10%)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
