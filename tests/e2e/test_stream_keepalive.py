"""Streams kept alive through a long prefill, side by side with llama-server alone: llama-server
sends an SSE comment (``:``) in a stream that stays silent for its ``--sse-ping-interval``; through
the door its own pings never come (Slotkeeper's polls of /slots keep llama-server from seeing a
quiet second), so the door sends them, between events, at the same interval. The events
themselves are unchanged."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from e2e_helpers import llama_server_as_slotkeeper_runs_it, make_engine

from slotkeeper.core.engine.door.frontdoor import PING
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

PING_ARGS = ("--sse-ping-interval", "1")
LONG = "The trail winds up past the lake and the old stone hut, then down to the river. " * 100


def requests() -> dict[str, tuple[str, dict[str, Any]]]:
    return {"messages": ("/v1/messages", {"model": "local", "max_tokens": 2, "stream": True,
                                           "temperature": 0,
                                           "messages": [{"role": "user", "content": "Messages. " + LONG}]}),
            "responses": ("/v1/responses", {"input": "Responses. " + LONG, "max_output_tokens": 2,
                                            "stream": True, "temperature": 0}),
            "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Chat. " + LONG}],
                                              "max_tokens": 2, "stream": True, "temperature": 0})}


def streamed(base: str) -> dict[str, tuple[list[tuple[float, bytes]], bytes]]:
    """Each API's stream: (when each chunk came, after the headers; all of its bytes)."""
    out = {}
    for name, (path, body) in requests().items():
        with httpx.stream("POST", f"{base}{path}", json=body, timeout=300) as r:
            assert r.status_code == 200
            start = time.monotonic()
            chunks = [(time.monotonic() - start, chunk) for chunk in r.iter_raw()]
        out[name] = (chunks, b"".join(c for _t, c in chunks))
    return out


def pings_before_the_first_event(chunks: list[tuple[float, bytes]]) -> int:
    data = b"".join(c for _t, c in chunks)
    first = min(i for i in (data.find(b"data:"), data.find(b"event:")) if i >= 0)
    return data[:first].count(PING)


def test_a_long_prefill_keeps_the_stream_alive_as_llama_server_does(starter_model, server_bin, port,
                                                                    tmp_path):
    with llama_server_as_slotkeeper_runs_it(server_bin, starter_model, tmp_path, parallel=2, ctx=8192,
                                            extra_args=PING_ARGS) as raw:
        want = streamed(raw)
    for name, (chunks, _data) in want.items():
        assert pings_before_the_first_event(chunks) >= 1, (name, "llama-server alone pings while it prefills")
    engine = make_engine(starter_model, server_bin, port, parallel=2, ctx=8192, idle_save=3600,
                         extra_args=PING_ARGS)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = streamed(engine.base_url)
    finally:
        engine.stop(save=False)
    for name, (chunks, data) in got.items():
        assert pings_before_the_first_event(chunks) >= 1, (name, [(round(t, 2), c[:20])
                                                                   for t, c in chunks[:5]])
        # No second of the prefill went without a byte (as llama-server's pings come, at its interval).
        times = [0.0, *(t for t, _c in chunks)]
        assert max(b - a for a, b in zip(times, times[1:])) < 1.9, (name, times[:10])
        # Pings only between events: with them taken out, every piece is a whole event.
        pieces = [p for p in data.split(b"\n\n") if p]
        assert all(p == b":" or p.startswith((b"data: ", b"event: ")) for p in pieces), (name, pieces[:5])
        # The same events as llama-server's, in the same order (their names; chat's are unnamed).
        assert kinds(data) == kinds(want[name][1]), name


def kinds(data: bytes) -> list[bytes]:
    return [p.split(b"\n")[0] if p.startswith(b"event:") else b"data" for p in data.split(b"\n\n")
            if p and p != b":"]
