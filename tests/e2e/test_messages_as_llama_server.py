"""The Messages path (and Responses' slot) answered as llama-server answers, side by side with
llama-server alone on two slots: a lone surrogate and a number past a double are 400 on both sides;
``n``/``n_cmpl`` and ``id_slot``, which llama-server's Messages conversion drops, are ignored; a
Responses request's ``id_slot`` beyond the slots is wrapped around as llama-server wraps it; a tool
call's input that is not an object and a billing stamp with characters of several bytes are read
as llama-server reads them (the door's token count is llama-server's own)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from e2e_helpers import llama_server_as_slotkeeper_runs_it, make_engine

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

USER = {"role": "user", "content": "Hello there"}
BASE = {"model": "local", "max_tokens": 2, "temperature": 0, "messages": [USER]}
RAW_BODIES: list[tuple[str, str, bytes]] = [  # (what, path, body as sent)
    ("a lone surrogate", "/v1/messages",
     b'{"model": "local", "max_tokens": 2, "messages": [{"role": "user", "content": "hi \\ud800"}]}'),
    ("a lone surrogate in a key", "/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "\\udc00": 1}'),
    ("temperature past a double", "/v1/messages",
     b'{"model": "local", "max_tokens": 2, "temperature": 1e400, '
     b'"messages": [{"role": "user", "content": "hi"}]}'),
    ("top_p past a double", "/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "top_p": -1e999}'),
]
BODIES: list[tuple[str, str, dict[str, Any]]] = [
    ("n", "/v1/messages", {**BASE, "n": 2}),
    ("n_cmpl", "/v1/messages", {**BASE, "n_cmpl": 2}),
    ("id_slot past the slots", "/v1/messages", {**BASE, "id_slot": 9}),
    ("id_slot", "/v1/messages", {**BASE, "id_slot": 1}),
    ("id_slot past the slots", "/v1/responses", {"input": "hi", "max_output_tokens": 2, "id_slot": 9}),
]
STAMP = "x-anthropic-billing-header: cc_version=2.1; cch=éé1;You are a helpful assistant."
TOKEN_BODIES: list[dict[str, Any]] = [
    *({**BASE, "messages": [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": given}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}
      for given in ("Paris", 5, ["Paris", "Lyon"], None)),
    {**BASE, "system": STAMP},
    {**BASE, "system": [{"type": "text", "text": STAMP}]},
]


def side(base: str) -> tuple[list[tuple[int, str]], list[tuple[int, Any]]]:
    """Each body's status (and error type, or the kind of answer) through ``base``."""
    raw = []
    for _what, path, body in RAW_BODIES:
        r = httpx.post(f"{base}{path}", content=body, headers={"Content-Type": "application/json"},
                       timeout=60)
        raw.append((r.status_code, r.json()["error"]["type"] if r.status_code >= 400 else ""))
    answered = []
    for _what, path, body in BODIES:
        r = httpx.post(f"{base}{path}", json=body, timeout=60)
        d = r.json()
        answered.append((r.status_code, d.get("type") or d.get("object")))
    return raw, answered


def test_the_messages_path_answers_as_llama_server_does(llama_model, server_bin, port, tmp_path):
    with llama_server_as_slotkeeper_runs_it(server_bin, llama_model, tmp_path, parallel=2) as raw:
        want_raw, want = side(raw)
        want_tokens = [httpx.post(f"{raw}/v1/messages/count_tokens", json=body,
                                  timeout=60).json()["input_tokens"] for body in TOKEN_BODIES]
    assert [status for status, _t in want_raw] == [400] * len(RAW_BODIES)
    assert [status for status, _t in want] == [200] * len(BODIES)
    engine = make_engine(llama_model, server_bin, port, parallel=2, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got_raw, got = side(engine.base_url)
        assert got_raw == want_raw, [(w[0], g, x) for w, g, x in zip(RAW_BODIES, got_raw, want_raw) if g != x]
        assert got == want, [(w[:2], g, x) for w, g, x in zip(BODIES, got, want) if g != x]
        ours = [engine.loop.call(engine.prompts.tokens(endpoints.PROMPT_MESSAGES, body), 60)
                for body in TOKEN_BODIES]
        assert [None if t is None else len(t) for t in ours] == want_tokens
        for body in TOKEN_BODIES:  # and each is answered through the door, on the slot it chose
            assert httpx.post(f"{engine.base_url}/v1/messages", json=body, timeout=60).status_code == 200
    finally:
        engine.stop(save=False)
