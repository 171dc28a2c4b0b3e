"""Flash attention measured on this machine, for this model, on the work Slotkeeper serves.

Which is faster depends on the machine and the model: on one 2-core CPU flash attention made a
long chat's follow-ups 6-10x slower and its replies 3-4x slower, on another it read the small
model's first prompt 1.4x faster and the generated bench model's 1.2x slower. No rule per backend
holds on a CPU, so Slotkeeper measures once per model and machine (``measure``): two servers of the
launch's own command line, flash attention on in one and off in the other, each given a warm
conversation in small (a ~2,000-token chat, then follow-ups with replies at that context), in turn
(on, off, then off, on, so the machine's drift falls on both alike); each side's best session
counts. Only llama-server's own timings are added up (prefill and generation, no HTTP).

The servers run at a lower CPU priority and with nothing on disk; ``Calibration.cancel`` stops
them at once (a request came): the engine runs this only while nothing else does.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import psutil

from slotkeeper.core.server.client import LlamaClient, ServerError, ServerUnavailable
from slotkeeper.core.server.private import free_port
from slotkeeper.core.server.spawn import kill_now, launch_environment, start

log = logging.getLogger(__name__)

VERSION = 1  # what a kept verdict was measured by: a change of the workload measures again
PROMPT_TOKENS = 2048  # the chat before the follow-ups (less when the slot's context is smaller)
FOLLOW_UPS = 2
FOLLOW_UP_TOKENS = 16
REPLY_TOKENS = 32  # generated after the first message and after each follow-up
ROUNDS = 2  # sessions per side
TIE = 0.03  # a side must be this much faster to be chosen; within it, llama-server's own choice
START_TIMEOUT_SECONDS = 300.0
REQUEST_TIMEOUT_SECONDS = 1800.0
NICE = 10  # POSIX niceness of the measuring servers
PROSE = ("the keeper of the lighthouse wrote each evening of the boats that passed the harbour, "
         "of the weather over the hills, of letters that came late and of the lamps along the quay; ")


class Cancelled(Exception):
    """The measurement was stopped before it ended."""


@dataclass(frozen=True)
class Session:
    """One side's best session, in milliseconds of llama-server's own work."""

    cold_ms: float  # the first message's prefill
    follow_ms: float  # the follow-ups' prefills, added up
    reply_ms: float  # every reply's generation, added up
    prompt_tokens: int
    reply_tokens: int

    @property
    def total_ms(self) -> float:
        return self.cold_ms + self.follow_ms + self.reply_ms


@dataclass(frozen=True)
class Verdict:
    """What was measured and what it says: ``value`` is flash attention on (True) or off."""

    value: bool
    on: Session
    off: Session
    seconds: float  # how long the measuring took

    @property
    def speedup(self) -> float:
        """How many times faster the chosen side's session was than the other's."""
        fast, slow = (self.on, self.off) if self.value else (self.off, self.on)
        return slow.total_ms / max(fast.total_ms, 1e-9)

    def to_json(self) -> dict:
        return {"version": VERSION, "value": self.value, "on": asdict(self.on), "off": asdict(self.off),
                "seconds": round(self.seconds, 1)}

    @classmethod
    def from_json(cls, raw: object) -> Verdict | None:
        """A kept verdict, or None when it is not one this version measured."""
        try:
            assert isinstance(raw, dict) and raw.get("version") == VERSION
            return cls(bool(raw["value"]), Session(**raw["on"]), Session(**raw["off"]), float(raw["seconds"]))
        except (AssertionError, KeyError, TypeError, ValueError):
            return None


def decide(on: Session, off: Session, auto: bool) -> bool:
    """The faster side for the session; within ``TIE`` of each other, ``auto`` (llama-server's own
    choice) stays."""
    if off.total_ms < on.total_ms * (1 - TIE):
        return False
    if on.total_ms < off.total_ms * (1 - TIE):
        return True
    return auto


def calibration_argv(argv: Sequence[str], flash_attn: bool, port: int, n_ctx: int) -> list[str]:
    """The launch's command line for one measuring server: one slot of ``n_ctx`` tokens on ``port``,
    flash attention as asked, no slot files, no metrics."""
    out = list(argv)
    out[out.index("--flash-attn") + 1] = "on" if flash_attn else "off"
    out[out.index("--port") + 1] = str(port)
    for flag, value in (("--ctx-size", str(n_ctx)), ("--parallel", "1")):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    if "--slot-save-path" in out:
        i = out.index("--slot-save-path")
        del out[i:i + 2]
    return out


class Calibration:
    """One measurement, run by ``run`` on a thread of its own; ``cancel`` from any other."""

    def __init__(self, argv: Sequence[str], n_ctx_slot: int, auto: bool,
                 starter: Callable[..., subprocess.Popen] = start) -> None:
        self.prompt_tokens = max(256, min(PROMPT_TOKENS, n_ctx_slot - 2 * (FOLLOW_UPS + 1) * 64))
        self.n_ctx = self.prompt_tokens + (FOLLOW_UPS + 1) * (FOLLOW_UP_TOKENS + REPLY_TOKENS) + 256
        self.argv = list(argv)
        self.auto = auto
        self._starter = starter
        self._procs: list[subprocess.Popen] = []
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            kill_now(proc)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def run(self) -> Verdict:
        """Measure both sides (Cancelled when stopped; OSError, ServerError or ServerUnavailable
        when a server would not run or answer)."""
        began = time.monotonic()
        try:
            sides = {value: self._start(value) for value in (True, False)}
            prompt = self._prompt(sides[True])
            best: dict[bool, Session] = {}
            for rnd in range(ROUNDS):
                for value in ((True, False) if rnd % 2 == 0 else (False, True)):
                    self._check()
                    got = _session(sides[value], prompt[rnd % 2:] + prompt[:rnd % 2], self._check)
                    if value not in best or got.total_ms < best[value].total_ms:
                        best[value] = got
            verdict = Verdict(decide(best[True], best[False], self.auto), best[True], best[False],
                              time.monotonic() - began)
        except (ServerError, ServerUnavailable, OSError):
            if self.cancelled:
                raise Cancelled() from None
            raise
        finally:
            with self._lock:
                procs, self._procs = self._procs, []
            for proc in procs:
                kill_now(proc)
        log.info("flash attention measured in %.0f s: on %.0f ms, off %.0f ms for the session; %s",
                 verdict.seconds, verdict.on.total_ms, verdict.off.total_ms, "on" if verdict.value else "off")
        return verdict

    def _check(self) -> None:
        if self.cancelled:
            raise Cancelled()

    def _start(self, flash_attn: bool) -> LlamaClient:
        self._check()
        key = secrets.token_hex(16)
        port = free_port()
        proc = self._starter(calibration_argv(self.argv, flash_attn, port, self.n_ctx),
                             launch_environment(key), True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self._lock:
            self._procs.append(proc)
        if self.cancelled:
            kill_now(proc)
            raise Cancelled()
        _lower_priority(proc.pid)
        client = LlamaClient(f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_SECONDS, api_key=key)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            self._check()
            if proc.poll() is not None:
                raise OSError(f"llama-server ended with {proc.returncode} before it was ready")
            try:
                if client.health().ok:
                    return client
            except ServerUnavailable:
                pass
            if time.monotonic() > deadline:
                raise ServerUnavailable("llama-server did not become ready")
            time.sleep(0.05)

    def _prompt(self, client: LlamaClient) -> list[int]:
        words = PROSE * (self.prompt_tokens // 20 + 8)
        tokens = client.tokenize(words)
        while len(tokens) < self.prompt_tokens + FOLLOW_UPS * FOLLOW_UP_TOKENS:
            tokens = tokens + tokens
        return tokens[: self.prompt_tokens + FOLLOW_UPS * FOLLOW_UP_TOKENS]


def _session(client: LlamaClient, tokens: list[int], check: Callable[[], None]) -> Session:
    """The first message, then the follow-ups, each answered; llama-server's own timings."""
    n_first = len(tokens) - FOLLOW_UPS * FOLLOW_UP_TOKENS
    prompt = tokens[:n_first]
    cold = follow = reply = 0.0
    replied = 0
    for k in range(FOLLOW_UPS + 1):
        check()
        if k:
            start_at = n_first + (k - 1) * FOLLOW_UP_TOKENS
            prompt = prompt + tokens[start_at:start_at + FOLLOW_UP_TOKENS]
        timings, generated = client.complete(prompt, REPLY_TOKENS)
        if k == 0:
            cold = float(timings.get("prompt_ms", 0.0))
        else:
            follow += float(timings.get("prompt_ms", 0.0))
        reply += float(timings.get("predicted_ms", 0.0))
        replied += int(timings.get("predicted_n", 0))
        prompt = prompt + generated
    return Session(round(cold, 3), round(follow, 3), round(reply, 3), n_first, replied)


def _lower_priority(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        if sys.platform == "win32":
            proc.nice(psutil.BELOW_NORMAL_PRIORITY_CLASS)  # type: ignore[attr-defined,unused-ignore]
        else:
            proc.nice(NICE)
    except (psutil.Error, OSError):
        pass


