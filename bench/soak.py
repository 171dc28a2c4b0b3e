"""A soak of the front door: chat, Messages and Responses clients with malformed bodies, clients that
leave, llama-server killed, and quits while restore points are being made, for a bounded time.

    .venv/bin/python bench/soak.py [--minutes 10] [--clients 3] [--model hybrid|gemma3|PATH] [--work DIR]

`slotkeeper serve` (two slots, `--idle-save 0.5`; the generated hybrid by default, whose
conversations get restore points) is driven by CLIENTS threads, each keeping a few conversations
going through one of the three APIs (streamed or not), and now and then sending a body a client
must not crash the service with (bad JSON, a lone surrogate, 200,000 levels of nesting to the token
counters, a Messages system text that is a number, a number past a double), or leaving (a stream
closed after its first event, a non-streamed request given up after 0.2 s). Meanwhile llama-server
is killed now and then (the supervisor restarts it), and serve is quit (SIGTERM) right as a
conversation goes idle (its save done, its restore points being made), then started again.

Checked all along: every well-formed request made while serve is up is answered (200; a request
that meets llama-server's restart may get 503 with Retry-After and is asked again); every malformed
one gets a 4xx, never a 5xx; every quit ends by itself with status 0 in bounded time, and after each
relaunch every saved session verifies. At the end each slot answers a request (none is left leased),
and after one more relaunch the latest chat conversations answered since llama-server was last
killed continue from disk (their next request reads at least half its prompt from the cache).
Prints the figures. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from benchlib import child_pids, free_port, generated_model, pypi_gemma3_270m, text, work_folder

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))


class Serve:
    """`slotkeeper serve` in its own process, its log in a file; ``url`` while it is up."""

    def __init__(self, model: Path, home: Path, extra: list[str]) -> None:
        self.model, self.home, self.extra = model, home, extra
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.port = free_port()
        self.up = threading.Event()
        self.log = home.parent / "serve.log"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(APP)}
        log = self.log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slotkeeper", "--data-dir", str(self.home), "serve",
             "--model", str(self.model), "--port", str(self.port), "--ctx", "8192", "--parallel", "2",
             "--idle-save", "0.5", *self.extra],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.url = line.split(" ", 1)[1].strip()
                self.up.set()
                return
        raise RuntimeError(f"serve did not start (see {self.log})")

    def quit(self) -> tuple[float, int]:
        """SIGTERM, then the seconds it took to end by itself and its status."""
        assert self.proc is not None
        self.up.clear()
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = -9
        return time.monotonic() - t0, code

    def llama_server(self) -> int | None:
        if self.proc is None:
            return None
        kids = child_pids(self.proc.pid)
        return kids[0] if kids else None


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.problems: list[str] = []

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def problem(self, what: str) -> None:
        with self.lock:
            self.problems.append(what)
            if len(self.problems) <= 30:
                print(f"  PROBLEM: {what}", flush=True)


def _chat_body(history: list[dict], stream: bool) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": history, "max_tokens": 16, "temperature": 0, "stream": stream}


def _messages_body(history: list[dict], stream: bool) -> tuple[str, dict]:
    return "/v1/messages", {"model": "m", "system": "You are terse.", "max_tokens": 16, "temperature": 0,
                            "messages": history[1:], "stream": stream}


def _responses_body(history: list[dict], stream: bool) -> tuple[str, dict]:
    items = [{"role": "user", "content": m["content"]} if m["role"] == "user" else
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": m["content"]}]}
             for m in history[1:]]
    return "/v1/responses", {"model": "m", "instructions": "You are terse.", "input": items,
                             "max_output_tokens": 16, "temperature": 0, "stream": stream}


def _answer_text(path: str, body: bytes, stream: bool) -> str:
    if stream:
        out = []
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                try:
                    d = json.loads(line[6:])
                except ValueError:
                    continue
                for c in d.get("choices", []) or []:
                    out.append((c.get("delta") or {}).get("content") or "")
                if d.get("type") == "content_block_delta":
                    out.append((d.get("delta") or {}).get("text") or "")
                if d.get("type") == "response.output_text.delta":
                    out.append(d.get("delta") or "")
        return "".join(out) or "ok"
    d = json.loads(body)
    if path == "/v1/chat/completions":
        return d["choices"][0]["message"]["content"] or "ok"
    if path == "/v1/messages":
        return "".join(b.get("text", "") for b in d["content"] if b.get("type") == "text") or "ok"
    return "".join(c.get("text", "") for o in d.get("output", []) for c in o.get("content", []) or []) or "ok"


MALFORMED = [  # (what, path, body): each answered as llama-server answers it, never with a 5xx
    ("JSON cut short", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}'),
    ("a lone surrogate", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}'),
    ("a system text that is a number (llama-server answers it)", "/v1/messages",
     json.dumps({"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": 5}],
                 "messages": [{"role": "user", "content": "hi"}]}).encode()),
    ("200,000 levels of nesting", "/v1/messages/count_tokens",
     b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": '
     + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    ("100,000 levels of nesting", "/v1/responses/input_tokens", b'{"model": "m", "input": "hi", "metadata": '
     + b"{\"a\":" * 100_000 + b"1" + b"}" * 100_000 + b"}"),
    ("a number past a double", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}'),
]


Kept = dict[str, tuple[float, str, list[dict]]]  # conversation -> (answered at, its API, its history)


def client(serve: Serve, tally: Tally, stop: threading.Event, seed: int, kept: Kept) -> None:
    rng = random.Random(seed)
    kinds = [_chat_body, _messages_body, _responses_body]
    conversations: list[list[dict]] = []
    while not stop.is_set():
        if not serve.up.wait(1.0):
            continue
        url = serve.url
        roll = rng.random()
        try:
            if roll < 0.12:
                what, path, raw = rng.choice(MALFORMED)
                r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"},
                               timeout=120)
                tally.add(f"odd body, {what}: {r.status_code}")
                if r.status_code >= 500 and r.status_code != 503:
                    tally.problem(f"{path} malformed body answered {r.status_code}: {r.text[:200]}")
                continue
            if not conversations or rng.random() < 0.15:
                conversations.append([{"role": "system", "content": "You are terse."}])
            history = rng.choice(conversations)
            if len(history) > 12:  # six turns: well within a small model's context
                history = [{"role": "system", "content": "You are terse."}]
                conversations.append(history)
            history.append({"role": "user", "content": text(rng.randrange(10_000), rng.randrange(8, 60))})
            make = rng.choice(kinds)
            stream = rng.random() < 0.5
            path, body = make(history, stream)
            if roll < 0.20:  # a client that leaves
                tally.add("left")
                try:
                    if stream:
                        with httpx.stream("POST", url + path, json=body, timeout=120) as r:
                            for _ in r.iter_raw():
                                break
                    else:
                        httpx.post(url + path, json=body, timeout=0.2)
                except httpx.HTTPError:
                    pass
                history.pop()
                continue
            for _attempt in range(20):
                try:
                    r = httpx.post(url + path, json=body, timeout=300)
                except httpx.HTTPError:
                    if not serve.up.is_set():  # quit meanwhile: asked again once it is back
                        serve.up.wait(120)
                        url = serve.url
                        continue
                    raise
                if r.status_code == 503:
                    tally.add("503, asked again")
                    time.sleep(float(r.headers.get("retry-after", "1")))
                    url = serve.url
                    continue
                break
            if r.status_code != 200:
                tally.problem(f"{path} answered {r.status_code}: {r.text[:300]}")
                history.pop()
                continue
            tally.add(f"{path} {'stream' if stream else 'json'} 200")
            history.append({"role": "assistant", "content": _answer_text(path, r.content, stream)})
            with tally.lock:
                kept[f"{seed}-{conversations.index(history)}"] = (time.monotonic(), path, list(history))
        except httpx.HTTPError as exc:
            if serve.up.is_set():
                tally.problem(f"a request failed while serve was up: {exc!r}")


def check_resumed(serve: Serve, kept: Kept, since: float, tally: Tally) -> tuple[int, int]:
    """After a relaunch, the chat conversations answered since the last kill of llama-server (a kill
    loses what was not saved yet, as it would anywhere) continue from disk: their next request reads
    at least half its prompt from the cache. Returns (resumed, checked)."""
    chats = sorted((at, history) for at, path, history in kept.values()
                   if at > since and path == "/v1/chat/completions" and len(history) >= 5)
    resumed = 0
    for _at, history in chats[-8:]:
        body = {"messages": [*history, {"role": "user", "content": "and then?"}], "max_tokens": 2,
                "temperature": 0}
        r = httpx.post(serve.url + "/v1/chat/completions", json=body, timeout=300)
        t = r.json().get("timings", {}) if r.status_code == 200 else {}
        cached, read = int(t.get("cache_n", 0)), int(t.get("prompt_n", 0))
        if cached >= (cached + read) / 2:
            resumed += 1
        else:
            tally.problem(f"a conversation of {len(history)} messages came back with {cached} tokens cached "
                          f"and {read} read again ({r.status_code})")
    return resumed, len(chats[-8:])


def check_sessions(home: Path, tally: Tally) -> int:
    from slotkeeper.core.sessions.store import SessionStore

    store = SessionStore(home / "sessions")
    n = 0
    for entry in store.sessions():
        n += 1
        if entry.status != "ok" or store.verify(entry.id).status != "ok":
            tally.problem(f"session {entry.id} does not verify: {entry.problems}")
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--model", default="hybrid")
    ap.add_argument("--models", default=str(Path.home() / ".cache" / "slotkeeper-bench"))
    ap.add_argument("--work")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        extra: list[str] = []
        if args.model == "hybrid":
            model = generated_model(work, "qwen35")
        elif args.model == "gemma3":
            model, extra = pypi_gemma3_270m(Path(args.models)), ["--swa-full"]
        else:
            model = Path(args.model)
        home = work / "home"
        serve = Serve(model, home, extra)
        serve.start()
        tally = Tally()
        stop = threading.Event()
        kept: Kept = {}
        last_kill = 0.0
        threads = [threading.Thread(target=client, args=(serve, tally, stop, i, kept), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        end = time.monotonic() + args.minutes * 60
        quits: list[tuple[float, int]] = []
        kills = 0
        next_kill = time.monotonic() + 70
        next_quit = time.monotonic() + 150
        print(f"soak: {model.name}, {args.clients} clients, {args.minutes:g} minutes", flush=True)
        while time.monotonic() < end:
            time.sleep(0.2)
            now = time.monotonic()
            if now > next_kill:
                pid = serve.llama_server()
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                    last_kill = time.monotonic()
                    print(f"  killed llama-server (pid {pid})", flush=True)
                next_kill = now + 90
            if now > next_quit:
                # Right as a conversation goes idle: its save is written and its points are being made.
                size = serve.log.stat().st_size
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with serve.log.open() as f:
                        f.seek(size)
                        if "saved slot" in f.read():
                            break
                    time.sleep(0.02)
                took, code = serve.quit()
                quits.append((took, code))
                print(f"  quit: ended by itself in {took:.1f} s, status {code}", flush=True)
                if code != 0:
                    tally.problem(f"a quit ended with status {code}")
                n = check_sessions(home, tally)
                print(f"  {n} saved sessions, all verified", flush=True)
                serve.start()
                next_quit = time.monotonic() + 150
        stop.set()
        for t in threads:
            t.join(330)
        leased = 0
        for slot in range(2):  # every slot answers: none is left leased
            try:
                r = httpx.post(serve.url + "/v1/chat/completions", timeout=120,
                               json={"messages": [{"role": "user", "content": f"last check {slot}"}],
                                     "max_tokens": 2, "id_slot": slot})
                if r.status_code != 200:
                    leased += 1
            except httpx.HTTPError:
                leased += 1
        took, code = serve.quit()
        quits.append((took, code))
        n = check_sessions(home, tally)
        serve.start()  # a last relaunch: the conversations answered since the last kill continue from disk
        resumed, checked = check_resumed(serve, kept, last_kill, tally)
        serve.quit()
        print("\nfigures:")
        for key, count in sorted(tally.counts.items()):
            print(f"  {key}: {count}")
        print(f"  llama-server killed {kills} times; quits {len(quits)}, each ended by itself in "
              f"{max(t for t, _ in quits):.1f} s at most, status {sorted({c for _, c in quits})}")
        verdict = f"{len(tally.problems)} problems (above)" if tally.problems else "all verified, none"
        print(f"  after the last relaunch, {resumed} of the {checked} latest chat conversations continued "
              "from disk (half their prompt or more cached)")
        print(f"  slots that did not answer at the end: {leased}; saved sessions at the end: {n}; {verdict}")
        return 1 if tally.problems or leased else 0


if __name__ == "__main__":
    raise SystemExit(main())
