"""The soak test's moving parts: `slotkeeper serve` as a child process, chat clients that each keep
one slot busy, the chaos schedule, and the rule for which conversation states must be on disk.

Timeline (wall clock, so the figures line up with serve's log):

- ``busy``: every request any client had in flight, as (start, end). A cancelled stream counts
  until a second after it was closed (llama-server stops generating when it notices).
- ``down``: from each kill until Slotkeeper says ``ready`` again (after a llama-server crash:
  restarted and slots restored; after Slotkeeper's own death: the new `serve` adopted the server).
  Killing llama-server also wipes what its slots held and Slotkeeper had not saved yet.

A conversation state "had an idle pause" when all of these hold:

1. the last request before the pause succeeded (a complete reply, not a cancelled stream, not a
   request that failed in an outage): clients pause only then;
2. the pause lies inside one up period: no outage from its start until a second after its end;
   and llama-server was not killed between that request and the pause (a client may pause twice
   in a row: a crash between the two pauses took the state with it, unless it was saved before);
3. the autosave policy had to save it within the pause. A slot is saved once it has been idle
   ``--idle-save`` seconds, but while another slot generates the save waits (``autosave.py``:
   a save stalls llama-server's task loop), up to a minute. So the pause must contain a stretch
   of at least ``QUIET_NEEDED`` seconds with no request in flight on any slot, starting
   ``--idle-save`` + ``POLL_SLACK`` seconds after the reply ended (the poller notices the end of a
   turn up to one poll late) and ending ``END_SLACK`` seconds before the client spoke again.
   ``QUIET_NEEDED`` is two poll periods (0.5 s each): the engine sees every slot idle at least once.
   A pause longer than the longest wait (``MAX_DEFER_SECONDS``) qualifies whatever the others did.

A pause that misses one of these is counted but not required on disk; the figures say how many.
The state each client leaves its slot in when the load stops (last request complete, llama-server
not killed since) must be on disk too: SIGTERM saves every changed slot.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from slotkeeper.core.engine.slots.autosave import MAX_DEFER_SECONDS

IDLE_SAVE = 1.0  # --idle-save
POLL_SLACK = 0.75  # the poller sees a turn end at most one poll (0.5 s) late, plus its own latency
QUIET_NEEDED = 1.0  # a poll (every 0.5 s, plus its latency) with every slot idle
END_SLACK = 0.5  # the save is asked for before the client speaks again
AFTER_PAUSE_UP = 1.0  # the server stays up this long after the pause (the save completes)
CANCEL_TAIL = 1.0  # a closed stream may keep its slot busy until llama-server notices
OUTAGE_RETRY_SECONDS = 0.5
OUTAGE_STATUSES = frozenset({502, 503})
TOKEN_CAP = 1100  # per conversation; each slot holds 2048 and a cancelled stream asks for 600 more

SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly and stay on the topic of the question."
# Replies are plain lowercase words: what is generated, what is re-rendered into the next prompt
# and what the saved tokens detokenize to are then the same text.
WORDS_GRAMMAR = 'root ::= [a-z]+ (" " [a-z]+)*'
WORDS = """
river mountain bread oven train station harbour lake sail wind rain map compass boots tent
stove kettle garden apple pear orchard winter summer autumn spring morning evening bridge
tower castle village market cheese honey candle lantern forest valley meadow cloud storm
thunder island ferry bicycle engine library letter stamp clock hammer ladder window chimney
""".split()


def now() -> float:
    return time.time()


def norm(text: str) -> str:
    """Whitespace-insensitive text (detokenized special tokens come with spaces around them)."""
    return re.sub(r"\s+", " ", text).strip()


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """A conversation state the client left alone: ``kind`` is "pause" (an idle pause) or
    "shutdown" (the state each slot held when serve was told to stop)."""

    kind: str
    client: int
    conv: str
    messages: tuple[dict, ...]
    finish: str  # finish_reason of the last reply
    last_piece: str  # the last reply's last token, as text
    n_tokens: int  # prompt + reply tokens of the last request
    created: float  # when the request that led to this state was sent
    start: float
    end: float

    def needles(self) -> list[str]:
        """Every message of the state, in order, as it must appear in the saved conversation. A reply
        cut by max_tokens ends with a token that was sampled but never decoded into the KV cache, so
        the last reply is checked without it (the next request re-renders it in full)."""
        out = [norm(m["content"]) for m in self.messages]
        last = self.messages[-1]["content"]
        if self.finish == "length" and self.last_piece and last.endswith(self.last_piece):
            last = last[: -len(self.last_piece)]
        out[-1] = norm(last)
        return [n for n in out if n]

    def describe(self, t0: float) -> str:
        users = [m["content"][: m["content"].index("]") + 1] for m in self.messages if m["role"] == "user"]
        return (f"{self.kind} of {self.conv} (slot {self.client}) at "
                f"+{self.start - t0:.1f}..+{self.end - t0:.1f} s, {len(self.messages)} messages, "
                f"{self.n_tokens} tokens, users {' '.join(users)}")


def find_in_order(text: str, needles: list[str]) -> int:
    """How many of ``needles`` appear in ``text`` one after another (all of them: ``len(needles)``)."""
    pos = 0
    for i, needle in enumerate(needles):
        at = text.find(needle, pos)
        if at < 0:
            return i
        pos = at + len(needle)
    return len(needles)


class Timeline:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: list[tuple[float, float]] = []
        self.down: list[list] = []  # [start, end or None while down, llama-server's slots wiped]
        self.events: list[tuple[float, str]] = []

    def add_busy(self, start: float, end: float) -> None:
        with self.lock:
            self.busy.append((start, end))

    def outage_begins(self, what: str, wipes_slots: bool) -> float:
        t = now()
        with self.lock:
            self.down.append([t, None, wipes_slots])
            self.events.append((t, what))
        return t

    def outage_ends(self, what: str) -> float:
        t = now()
        with self.lock:
            self.down[-1][1] = t
            self.events.append((t, what))
        return t

    def up_throughout(self, start: float, end: float) -> bool:
        with self.lock:
            return not any(a <= end and (b is None or b >= start) for a, b, _ in self.down)

    def slots_kept(self, start: float, end: float) -> bool:
        """llama-server was not killed between ``start`` and ``end``."""
        with self.lock:
            return not any(wiped and start <= a <= end for a, _, wiped in self.down)

    def quiet_gap(self, start: float, end: float) -> float:
        """The longest stretch of [start, end] with no request in flight on any slot."""
        if end <= start:
            return 0.0
        with self.lock:
            spans = sorted((max(a, start), min(b, end)) for a, b in self.busy if b > start and a < end)
        best, cur = 0.0, start
        for a, b in spans:
            best = max(best, a - cur)
            cur = max(cur, b)
        return max(best, end - cur)

    def busy_share(self, start: float, end: float) -> float:
        """The share of [start, end] with at least one request in flight."""
        return 1.0 - self._idle_time(start, end) / (end - start) if end > start else 0.0

    def _idle_time(self, start: float, end: float) -> float:
        with self.lock:
            spans = sorted((max(a, start), min(b, end)) for a, b in self.busy if b > start and a < end)
        idle, cur = 0.0, start
        for a, b in spans:
            idle += max(0.0, a - cur)
            cur = max(cur, b)
        return idle + max(0.0, end - cur)

    def must_be_saved(self, s: State) -> str | None:
        """None when the state had an idle pause the engine had to save; otherwise why not."""
        if not self.up_throughout(s.start, s.end + (AFTER_PAUSE_UP if s.kind == "pause" else 0.0)):
            return "outage"
        if not self.slots_kept(s.created, s.end):
            return "llama-server killed since the last request"
        if s.kind == "shutdown":
            return None
        if s.end - s.start >= IDLE_SAVE + MAX_DEFER_SECONDS + POLL_SLACK + END_SLACK:
            return None  # saved even if the other slots never rested
        if self.quiet_gap(s.start + IDLE_SAVE + POLL_SLACK, s.end - END_SLACK) < QUIET_NEEDED:
            return "other slots busy"
        return None


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0  # answered requests (turns and forks), cancelled streams apart
    attempts: int = 0
    turns: int = 0
    forks: int = 0
    cancels: int = 0
    cancels_completed: int = 0  # streams that ended before the client closed them
    conversations: int = 0
    outage_errors: int = 0
    outage_kinds: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # anything but an outage
    states: list[State] = field(default_factory=list)

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def outage(self, kind: str) -> None:
        with self.lock:
            self.outage_errors += 1
            self.outage_kinds[kind] = self.outage_kinds.get(kind, 0) + 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def record(self, state: State) -> None:
        with self.lock:
            self.states.append(state)


# ---------------------------------------------------------------------------------------------
# `slotkeeper serve`
# ---------------------------------------------------------------------------------------------


class Serve:
    """One `slotkeeper serve` process: stdout read by a thread (``ready URL`` lines, timed), stderr
    to a file."""

    def __init__(self, argv: list[str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self._err = open(stderr_path, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err, text=True)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"serve-{self.proc.pid}-stdout")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((now(), line.strip()))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_ready(self, after: float, timeout: float) -> tuple[float, str]:
        """The first ``ready URL`` line printed after ``after``: (time, url)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    if t >= after and line.startswith("ready "):
                        return t, line.split()[1]
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"serve exited with {self.proc.returncode} before it was ready; "
                                         f"see {self.stderr_path}:\n{tail(self.stderr_path)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"serve printed no ready line within {timeout:.0f} s; "
                                         f"see {self.stderr_path}:\n{tail(self.stderr_path)}")
                self._cond.wait(min(left, 0.5))

    def kill(self) -> None:
        self.proc.kill()
        self.wait(30)

    def terminate(self, timeout: float) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)
            self._err.close()


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as exc:
        return f"({exc})"


def llama_server_pid(data_dir: Path) -> int:
    return int(json.loads((data_dir / "state" / "server.json").read_text())["pid"])


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Cluster:
    """The serve process of the moment (a SIGKILL replaces it) and the chaos that befalls it."""

    def __init__(self, argv: list[str], data_dir: Path, logs_dir: Path, timeline: Timeline) -> None:
        self.argv = argv
        self.data_dir = data_dir
        self.logs_dir = logs_dir
        self.timeline = timeline
        self.serves: list[Serve] = []
        self.kills: dict[str, int] = {"llama-server": 0, "slotkeeper": 0}
        self.notes: list[str] = []
        self.url = ""

    @property
    def serve(self) -> Serve:
        return self.serves[-1]

    def start(self, timeout: float = 180.0) -> float:
        t = now()
        self.serves.append(Serve(self.argv, self.logs_dir / f"serve-{len(self.serves) + 1}.err"))
        ready_at, self.url = self.serve.wait_ready(t, timeout)
        return ready_at

    def kill_llama_server(self) -> None:
        pid = llama_server_pid(self.data_dir)
        t = self.timeline.outage_begins(f"SIGKILL llama-server pid {pid}", wipes_slots=True)
        os.kill(pid, signal.SIGKILL)
        self.kills["llama-server"] += 1
        self.serve.wait_ready(t, 180)  # the supervisor restarted it and restored the slots
        self.timeline.outage_ends("Slotkeeper ready again (llama-server restarted)")
        new_pid = llama_server_pid(self.data_dir)
        self.notes.append(f"llama-server {pid} killed, restarted as {new_pid}")
        assert new_pid != pid and process_alive(new_pid), (pid, new_pid)

    def kill_slotkeeper(self) -> None:
        pid = llama_server_pid(self.data_dir)
        self.timeline.outage_begins(f"SIGKILL slotkeeper serve pid {self.serve.proc.pid}", wipes_slots=False)
        self.serve.kill()
        self.kills["slotkeeper"] += 1
        assert process_alive(pid), "llama-server died with Slotkeeper"
        self.start()
        self.timeline.outage_ends("Slotkeeper ready again (a new serve adopted llama-server)")
        adopted = llama_server_pid(self.data_dir)
        self.notes.append(f"slotkeeper serve killed; the new one runs llama-server {adopted} (was {pid})")
        assert adopted == pid, f"the new serve did not adopt llama-server {pid} (now {adopted})"


class Chaos(threading.Thread):
    """Kills at planned offsets from the start: [(seconds, "llama-server" | "slotkeeper")]."""

    def __init__(self, cluster: Cluster, plan: list[tuple[float, str]], t0: float, stop: threading.Event,
                 stats: Stats) -> None:
        super().__init__(name="chaos", daemon=True)
        self.cluster, self.plan, self.t0, self.stop, self.stats = cluster, plan, t0, stop, stats

    def run(self) -> None:
        try:
            for at, what in self.plan:
                if self.stop.wait(max(0.0, self.t0 + at - now())):
                    return
                if what == "llama-server":
                    self.cluster.kill_llama_server()
                else:
                    self.cluster.kill_slotkeeper()
        except BaseException:
            self.stats.error("chaos: " + traceback.format_exc())


# ---------------------------------------------------------------------------------------------
# Chat clients
# ---------------------------------------------------------------------------------------------


class GaveUp(Exception):
    pass


class ChatClient(threading.Thread):
    """One chat user on slot ``n``: conversations of varying length with turns, cancelled streams,
    edits that fork, and idle pauses. Survives outages by retrying the same request."""

    def __init__(self, n: int, cluster: Cluster, timeline: Timeline, stats: Stats, stop: threading.Event,
                 seed: int, give_up_after: float) -> None:
        super().__init__(name=f"client-{n}", daemon=True)
        self.n, self.cluster, self.timeline, self.stats, self.stop = n, cluster, timeline, stats, stop
        self.rng = random.Random(seed)
        self.give_up_after = give_up_after
        self.http = httpx.Client(timeout=httpx.Timeout(120.0, connect=5.0))
        self.msg_no = 0
        self.messages: list[dict] = []
        self.conv = ""
        self.last_ok = False  # the last request gave a complete reply
        self.last_meta = ("", "", 0)  # finish_reason, last token text, tokens in the slot
        self.last_sent = 0.0  # when the last request that succeeded was sent
        self.final: State | None = None

    # -- the user ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            k = 0
            while not self.stop.is_set():
                k += 1
                self.conversation(f"c{self.n}.{k}")
            if self.last_ok and len(self.messages) > 1:
                t = now()
                self.final = self.state("shutdown", t, t)
        except GaveUp as exc:
            self.stats.error(f"client {self.n}: {exc}")
        except BaseException:
            self.stats.error(f"client {self.n}: " + traceback.format_exc())
        finally:
            self.http.close()

    def conversation(self, conv: str) -> None:
        rng = self.rng
        self.conv, self.messages, self.last_ok = conv, [{"role": "system", "content": SYSTEM_PROMPT}], False
        self.last_meta = ("", "", 0)
        self.stats.add(conversations=1)
        target = rng.choice([rng.randint(1, 3), rng.randint(3, 8), rng.randint(8, 16)])
        turns = 0
        while not self.stop.is_set() and turns < target and self.last_meta[2] < TOKEN_CAP:
            n_turns = (len(self.messages) - 1) // 2
            roll = rng.random()
            if n_turns == 0 or roll < 0.5:
                turns += self.turn("t")
            elif roll < 0.6:
                self.cancel()
            elif roll < 0.75 and n_turns >= 2:
                self.fork(rng.randint(1, min(2, n_turns - 1)))
                turns += 1
            elif self.last_ok:
                self.pause()
            if not self.stop.is_set():
                self.stop.wait(rng.uniform(0.3, 1.5))  # the user reads and types
        if self.last_ok and not self.stop.is_set() and rng.random() < 0.6:
            self.pause()  # the user leaves the conversation for a while

    def user_text(self, label: str) -> str:
        self.msg_no += 1
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(10, 40)))
        return f"[{self.conv} {label}{self.msg_no}] {words}"

    def turn(self, label: str) -> int:
        self.messages.append({"role": "user", "content": self.user_text(label)})
        # Short replies too: a continuation that re-tokenizes the last reply differently from what
        # was generated (random weights do that) then leaves the saved tokens within the lineage's
        # tail slack and updates the session in place; longer ones fork it.
        short = self.rng.random() < 0.4
        body = {"messages": self.messages,
                "max_tokens": self.rng.randint(4, 8) if short else self.rng.randint(9, 48)}
        reply = self.post(body)
        if reply is None:
            self.messages.pop()
            return 0
        choice = reply["choices"][0]
        pieces = [p["token"] for p in (choice.get("logprobs") or {}).get("content") or []]
        usage = reply.get("usage") or {}
        self.messages.append({"role": "assistant", "content": choice["message"]["content"]})
        self.last_meta = (choice.get("finish_reason") or "", pieces[-1] if pieces else "",
                          int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)))
        self.last_ok = True
        self.stats.add(requests=1, turns=1)
        return 1

    def fork(self, drop: int) -> None:
        """An edit: the last ``drop`` turns are dropped and something else is asked instead."""
        del self.messages[len(self.messages) - 2 * drop:]
        if self.turn("f"):
            self.stats.add(forks=1)

    def cancel(self) -> None:
        """A streamed reply the user stops after a few chunks (the question is not kept)."""
        self.last_ok = False
        body = {"messages": [*self.messages, {"role": "user", "content": self.user_text("x")}],
                "max_tokens": 600, "stream": True}
        self.post(body, cancel_after=self.rng.randint(2, 5))

    def pause(self) -> None:
        start = now()
        roll = self.rng.random()
        if roll < 0.8:
            length = self.rng.uniform(4.0, 8.0)
        elif roll < 0.95:
            length = self.rng.uniform(8.0, 15.0)
        else:  # past the longest an idle save waits for the other slots (autosave.MAX_DEFER_SECONDS)
            length = self.rng.uniform(IDLE_SAVE + MAX_DEFER_SECONDS + 2, IDLE_SAVE + MAX_DEFER_SECONDS + 6)
        self.stop.wait(length)
        self.stats.record(self.state("pause", start, now()))

    def state(self, kind: str, start: float, end: float) -> State:
        finish, piece, n_tokens = self.last_meta
        return State(kind, self.n, self.conv, tuple(copy.deepcopy(self.messages)), finish, piece, n_tokens,
                     self.last_sent, start, end)

    # -- the wire ---------------------------------------------------------------------------
    def post(self, body: dict, cancel_after: int | None = None) -> dict | None:
        body = {**body, "id_slot": self.n, "temperature": 1.0, "seed": self.rng.randint(1, 2**31 - 1),
                "grammar": WORDS_GRAMMAR, "logprobs": True}
        deadline = None
        while True:
            start = now()
            self.stats.add(attempts=1)
            try:
                if cancel_after is None:
                    r = self.http.post(f"{self.cluster.url}/v1/chat/completions", json=body)
                    status, out = r.status_code, (r.json() if r.status_code == 200 else r.text)
                    end = now()
                else:
                    status, out = self._stream(body, cancel_after)
                    end = now() + CANCEL_TAIL
            except httpx.TransportError as exc:
                status, out, end = None, type(exc).__name__, now()
            self.timeline.add_busy(start, end)
            if status == 200:
                self.last_sent = start
                return out
            if status is None or status in OUTAGE_STATUSES:  # the server is restarting: wait and retry
                self.last_ok = False
                self.stats.outage(out if status is None else f"HTTP {status}")
                deadline = deadline or time.monotonic() + self.give_up_after
                if time.monotonic() > deadline:
                    raise GaveUp(f"the server did not come back within {self.give_up_after:.0f} s")
                time.sleep(OUTAGE_RETRY_SECONDS)
                continue
            self.last_ok = False
            self.stats.error(f"client {self.n} {self.conv}: HTTP {status}: {str(out)[:300]}")
            return None

    def _stream(self, body: dict, cancel_after: int) -> tuple[int, dict | str]:
        with self.http.stream("POST", f"{self.cluster.url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, r.read().decode(errors="replace")
            chunks = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks += 1
                    if chunks >= cancel_after:
                        break  # leaving the block closes the connection mid-reply
            else:
                self.stats.add(cancels_completed=1)
        self.stats.add(cancels=1)
        return 200, {}


def slotkeeper_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "slotkeeper", *args]
