"""Non-streamed generations asked of llama-server as streams: a client that leaves stops its
generation at once (llama-server alone runs a non-streamed request on while anything else keeps
it busy), and the answer a client gets is, byte for byte, the one llama-server alone writes for
the same request (only the fields that differ between any two runs of it set aside: ids, times)."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

import httpx
import pytest
from e2e_helpers import assert_it_answers, llama_server_as_slotkeeper_runs_it, make_engine

from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/completion", {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}),
    ("/completions", {"prompt": ["Once upon a time, in a land"], "n_predict": 8, "temperature": 0,
                      "stop": [" the"]}),
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hello to Anna."}],
                              "max_tokens": 12, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                              "tools": TOOLS, "tool_choice": "required", "max_tokens": 40, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count: one, two, three"}],
                              "stop": ["four"], "max_tokens": 16, "temperature": 0}),
    ("/v1/messages", {"model": "local", "max_tokens": 12, "temperature": 0,
                      "system": "You are brief.", "messages": [{"role": "user", "content": "Hello there"}]}),
    ("/v1/messages", {"model": "local", "max_tokens": 40, "temperature": 0, "tool_choice": {"type": "any"},
                      "tools": [{"name": "get_weather", "description": "The weather in a city",
                                 "input_schema": TOOLS[0]["function"]["parameters"]}],
                      "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}),
]
VARYING = [(re.compile(rb'"(id|created)":("[^"]*"|\d+)'), rb'"\1":_'),
           (re.compile(rb'"timings":\{[^{}]*\}'), rb'"timings":_')]


def answers(base: str) -> list[tuple[int, str, bytes]]:
    """Each request's status, content type and body with the fields that vary between runs set aside."""
    out = []
    for path, body in REQUESTS:
        r = httpx.post(f"{base}{path}", json=body, timeout=120)
        data = r.content
        for pattern, replacement in VARYING:
            data = pattern.sub(replacement, data)
        out.append((r.status_code, r.headers["content-type"], data))
    return out


def test_non_streamed_answers_are_llama_servers_own_byte_for_byte(starter_model, server_bin, port, tmp_path):
    with llama_server_as_slotkeeper_runs_it(server_bin, starter_model, tmp_path, parallel=1) as raw:
        want = answers(raw)
    assert all(status == 200 for status, _t, _b in want), want
    engine = make_engine(starter_model, server_bin, port, parallel=1, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = answers(engine.base_url)
    finally:
        engine.stop(save=False)
    for (path, body), g, w in zip(REQUESTS, got, want):
        assert g == w, (path, body, g, w)


# A Messages request goes the chat's way (as its chat completion); its conversion drops ignore_eos,
# so the tiny model's answer to it would end as soon as it chanced on an end of generation.
LONG_ANSWERS = {
    "/completion": {"prompt": "Once upon a time", "n_predict": 20000, "ignore_eos": True},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": 20000,
                             "ignore_eos": True},
}


@pytest.mark.parametrize("path", list(LONG_ANSWERS))
def test_a_client_that_leaves_a_non_streamed_request_stops_it_at_once(path, llama_model, server_bin, port):
    """One slot; the client leaves a long non-streamed generation after a second. The generation
    stops at once (llama-server alone, asked something every now and then, as Slotkeeper asks
    /slots, would run all 20,000 tokens for nobody) and the next request is served."""
    engine = make_engine(llama_model, server_bin, port, parallel=1, idle_save=3600, ctx=32768)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url, key = engine.link.upstream()
        private = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        body = json.dumps(LONG_ANSWERS[path]).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % path.encode()
                      + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            deadline = time.monotonic() + 30
            while not private.get("/slots").json()[0]["is_processing"]:
                assert time.monotonic() < deadline, "the generation never started"
                time.sleep(0.05)
            time.sleep(1.0)
        left = time.monotonic()
        while private.get("/slots").json()[0]["is_processing"]:  # asked often, as other traffic would
            assert time.monotonic() - left < 30, "still generating for a client that left"
            time.sleep(0.05)
        stopped = time.monotonic() - left
        [decoded] = [float(line.split()[-1]) for line in private.get("/metrics").text.splitlines()
                     if line.startswith("llamacpp:tokens_predicted_total")]
        assert 0 < decoded < 20000 and stopped < 2.0, (decoded, stopped)
        start = time.monotonic()
        assert_it_answers(engine.base_url)
        assert time.monotonic() - start < 10
        private.close()
    finally:
        engine.stop(save=False)
