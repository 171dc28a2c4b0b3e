"""Bodies llama-server accepts but no client should send: texts that are numbers, null, lists or
objects, a tool call's input that is not an object, tool results of odd shapes, Responses items with
odd fields. Each goes to llama-server alone and through the front door: the door answers as
llama-server does, and its slot is free again afterwards (the next request is served), with one
slot and with two."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from e2e_helpers import llama_server_as_slotkeeper_runs_it, make_engine

from slotkeeper.core.engine.door import frontdoor
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

ODD = [5, None, ["a", 1], {"text": "a"}, 1.5, True]
USER = {"role": "user", "content": "Hello there"}


def messages(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": "local", "max_tokens": 2, "temperature": 0, "messages": [USER], **fields}


def tool_turn(input_value: Any, result: Any) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                      "input": input_value}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}]


def responses(input_value: Any, **fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"input": input_value, "max_output_tokens": 2, "temperature": 0, **fields}


def chat(msgs: list[Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0}


BODIES: list[tuple[str, dict[str, Any]]] = [
    *(messages(system=[{"type": "text", "text": v}]) for v in ODD),
    messages(system=[{"type": "text", "text": "a"}, 5, None, {"type": "text"}, {"type": 5, "text": "b"}]),
    *(messages(messages=[{"role": "user", "content": [{"type": "text", "text": v}]}]) for v in ODD[:4]),
    messages(messages=[USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": 5},
                                                                {"type": "text", "text": "ok"}]}, USER]),
    *(messages(messages=tool_turn(v, "ok")) for v in ("abc", 5, [1, 2], None, True)),
    *(messages(messages=tool_turn({"city": "Paris"}, v)) for v in ODD),
    messages(messages=tool_turn({}, [5, None, "x", {"type": "text", "text": 5},
                                     {"type": "image", "source": 5},
                                     {"type": "text", "text": ["a"]}])),
    messages(messages=[USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": 5, "name": ["f"], "input": {"a": [[[[[[1]]]]]]}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": None, "content": "ok"}]}]),
    messages(messages=[{"role": ["user"], "content": "hi"}, USER]),
    messages(messages=[USER, {"role": "user", "content": [{"type": "image", "source": 5}, "text"]}]),
    *(responses([{"role": "user", "content": [{"type": "input_text", "text": v}]}]) for v in ODD[:4]),
    responses([{"role": "user", "content": "hi", "name": 5, "tool_calls": "junk", "reasoning_content": 5}]),
    responses([{"role": "user", "content": "hi",
                "tool_calls": [5, {"function": "f"}, {"function": {"name": 5, "arguments": [1]}}]}]),
    responses([USER, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1",
                "output": [{"type": "input_text", "text": 5}]},
               {"role": "assistant", "type": "message", "content": [{"type": "output_text", "text": "a"}],
                "status": 5}]),
    responses([{"role": ["user"], "content": "hi"}]),
    responses("hi", instructions=5),
    responses("hi", instructions=["a"], tools=5),
    chat([{"role": "user", "content": [{"type": "text", "text": 5}]}]),
    chat([USER, {"role": "assistant", "content": "x", "tool_calls": [{"function": "junk"}, 5]}, USER]),
    chat([{"role": {"a": 1}, "content": "hi"}, USER]),
    chat([USER, {"role": "assistant", "content": None, "reasoning_content": 5}, USER]),
]
NORMAL = messages()


def post(base: str, path: str, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=timeout)


def answers(base: str) -> list[int]:
    return [post(base, path, body).status_code for path, body in BODIES]


def served(base: str) -> None:
    """A normal request is answered in time: no slot was left leased by what came before."""
    path, body = NORMAL
    r = post(base, path, body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("slots", [1, 2])
def test_odd_bodies_are_answered_as_llama_server_answers_and_free_their_slot(slots, llama_model, server_bin,
                                                                           port, tmp_path):
    with llama_server_as_slotkeeper_runs_it(server_bin, llama_model, tmp_path, parallel=slots) as raw:
        want = answers(raw)
    assert 200 in want  # llama-server takes most of them: each would lease a slot at the door
    engine = make_engine(llama_model, server_bin, port, parallel=slots, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got = []
        for path, body in BODIES:
            got.append(post(engine.base_url, path, body).status_code)
            served(engine.base_url)
        assert got == want, [(b, g, w) for b, g, w in zip(BODIES, got, want) if g != w]
        # Two such requests on the slots at once, then a normal one.
        odd = [b for b, status in zip(BODIES, want) if status == 200][:2]
        for path, body in odd:
            assert post(engine.base_url, path, body).status_code == 200
        served(engine.base_url)
        assert engine.snapshot.ready
    finally:
        engine.stop(save=False)


def test_a_request_whose_conversation_cannot_be_written_down_frees_its_slot(llama_model, server_bin, port,
                                                                              monkeypatch, caplog):
    """Whatever building the transcript raises, the request's answer goes out, its slot is released
    and the door serves on (the failure is logged)."""
    def broken(*_args: Any) -> None:
        raise RuntimeError("no transcript today")

    monkeypatch.setattr(frontdoor, "conversation", broken)
    engine = make_engine(llama_model, server_bin, port, parallel=1, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        with caplog.at_level(logging.ERROR, logger=frontdoor.__name__):
            for _ in range(3):
                served(engine.base_url)
        assert any("could not be written down" in r.getMessage() for r in caplog.records)
    finally:
        engine.stop(save=False)
