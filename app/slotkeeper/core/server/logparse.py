"""Per-slot, per-request figures from llama-server's own log lines.

/slots shows n_prompt_tokens_cache only while a request runs and /metrics is global, so with
several slots busy the server log is the one source that names the slot for each request.
A request on slot S goes through these lines (task T):

    slot launch_slot_: id  S | task T | processing task
    slot update_slots: id  S | task T | new prompt, n_ctx_slot = 2048, n_keep = 0, task.n_tokens = 1041
    slot update_slots: id  S | task T | n_tokens = 1001, memory_seq_rm [1001, end)
    slot update_slots: id  S | task T | prompt processing progress, n_tokens = 1041, batch.n_tokens = 40, progress = 1.0
    slot print_timing: id  S | task T |
    prompt eval time =      27.36 ms /    40 tokens (...)
    slot      release: id  S | task T | stop processing: n_tokens = 1049, truncated = 0

cache_n is the n_tokens kept before processing (the memory_seq_rm line), prompt_n the tokens
processed; their sum is the prompt. The parser is a small state machine per slot.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

_SLOT = re.compile(r"slot\s+(\S+?):\s+id\s+(\d+)\s+\|\s+task\s+(-?\d+)\s+\|\s*(.*)$")
_NEW_PROMPT = re.compile(r"new prompt.*task\.n_tokens\s*=\s*(\d+)")
_KEPT = re.compile(r"n_tokens\s*=\s*(\d+), memory_seq_rm \[(\d+), end\)")
_EVAL = re.compile(r"^\s*eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*tokens")
_PROGRESS = re.compile(r"prompt processing progress, n_tokens\s*=\s*(\d+).*?progress\s*=\s*([\d.]+)")
_PROMPT_EVAL = re.compile(r"prompt eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*tokens")
_RELEASE = re.compile(r"stop processing: n_tokens\s*=\s*(\d+)")


@dataclass
class RequestFigures:
    slot: int
    task: int
    n_prompt: int = 0  # the whole prompt
    cache_n: int = 0  # served from the slot's cache
    prompt_n: int = 0  # processed now
    prompt_ms: float = 0.0
    n_generated: int = 0
    n_tokens_after: int = 0  # tokens the slot holds once released
    done: bool = False
    seen_prompt_line: bool = False

    @property
    def cache_share(self) -> float:
        return self.cache_n / self.n_prompt if self.n_prompt else 0.0


@dataclass
class _Pending:
    fig: RequestFigures
    kept_seen: bool = False


@dataclass
class SlotLogParser:
    """Feed it log lines; it calls ``on_progress`` during prefill and ``on_done`` per request."""

    on_done: Callable[[RequestFigures], None]
    on_progress: Callable[[RequestFigures], None] | None = None
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _timing_slot: int | None = None

    def feed(self, line: str) -> None:
        m = _SLOT.search(line)
        if m is None:
            if self._timing_slot is not None:
                t = _PROMPT_EVAL.search(line)
                if t:
                    p = self._pending.get(self._timing_slot)
                    if p:
                        p.fig.prompt_ms = float(t.group(1))
                        p.fig.prompt_n = int(t.group(2))
                    self._timing_slot = None
            return
        func, slot, task, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        p = self._pending.get(slot)
        if p is None or p.fig.task != task:
            if task < 0:
                return
            p = self._pending[slot] = _Pending(RequestFigures(slot, task))
        fig = p.fig
        if (n := _NEW_PROMPT.search(rest)) is not None:
            fig.n_prompt = int(n.group(1))
            fig.seen_prompt_line = True
        elif (k := _KEPT.search(rest)) is not None:
            # Long prompts (and context checkpoints) log one such line per chunk; only the
            # first says what the cache held when the request arrived.
            if not p.kept_seen:
                fig.cache_n = int(k.group(2))
                p.kept_seen = True
        elif (g := _PROGRESS.search(rest)) is not None:
            fig.prompt_n = max(0, int(g.group(1)) - fig.cache_n)
            if self.on_progress:
                self.on_progress(fig)
        elif func == "print_timing":
            self._timing_slot = slot
            t = _PROMPT_EVAL.search(rest)
            if t:
                fig.prompt_ms, fig.prompt_n = float(t.group(1)), int(t.group(2))
                self._timing_slot = None
            elif (e := _EVAL.search(rest)) is not None:
                fig.n_generated = int(e.group(2))
        elif (r := _RELEASE.search(rest)) is not None:
            fig.n_tokens_after = int(r.group(1))
            fig.done = True
            del self._pending[slot]
            if not fig.seen_prompt_line:
                # Info-level logs only: the slot ends with prompt + generated - 1 tokens
                # (the last sampled token is never evaluated).
                fig.n_prompt = max(fig.prompt_n, fig.n_tokens_after - max(fig.n_generated - 1, 0))
                fig.cache_n = fig.n_prompt - fig.prompt_n
            self.on_done(fig)
