"""A streamed answer's events gathered into the answer llama-server writes unstreamed (the e2e
test compares the bytes with llama-server's own; here the rare shapes: errors, tool calls, a
stream cut short, what is never asked as a stream)."""

from __future__ import annotations

import json

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.unstream import (
    NONE,
    OAI_CHAT,
    OAI_CMPL,
    Unstreamed,
    answer_kind,
    streamed_request,
)


def chunk(delta=None, finish=None, **extra):
    choices = [] if delta is None and finish is None else [
        {"finish_reason": finish, "index": 0, "delta": delta or {}}]
    return {"choices": choices, "created": 1, "id": "c", "model": "m", "system_fingerprint": "b",
            "object": "chat.completion.chunk", **extra}


def test_a_chats_tool_calls_and_reasoning_are_written_as_llama_server_writes_the_message():
    u = Unstreamed(OAI_CHAT)
    for event in [chunk({"role": "assistant", "content": None}), chunk({"reasoning_content": "hm"}),
                  chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": "{\"ci"}}]}),
                  chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ty\":\"Paris\"}"}}]}),
                  chunk({}, "tool_calls", __verbose={"stopping_word": ""}),
                  chunk(usage={"completion_tokens": 3}, timings={"predicted_n": 3})]:
        u.feed(event)
    status, body = u.answer()
    assert status == 200
    assert list(json.loads(body)) == ["choices", "created", "model", "system_fingerprint", "object", "usage",
                                      "id", "__verbose", "timings"]
    assert json.loads(body)["choices"] == [{"finish_reason": "tool_calls", "index": 0, "message": {
        "role": "assistant", "content": "", "reasoning_content": "hm",
        "tool_calls": [{"type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                        "id": "call_1"}]}}]


def test_an_error_in_the_stream_is_the_unstreamed_error_and_a_cut_stream_is_none():
    u = Unstreamed(NONE)
    u.feed({"index": 0, "content": "a", "stop": False})
    u.feed({"error": {"code": 400, "message": "context exceeded", "type": "exceed_context_size_error"}})
    assert u.answer() == (400, b'{"error":{"code":400,"message":"context exceeded",'
                               b'"type":"exceed_context_size_error"}}')
    cut = Unstreamed(OAI_CMPL)
    cut.feed({"choices": [{"text": "a", "index": 0, "logprobs": None, "finish_reason": None}]})
    assert cut.answer() is None


def test_what_is_asked_as_a_stream():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert answer_kind("/v1/chat/completions", endpoints.PROMPT_CHAT, chat) == OAI_CHAT
    assert streamed_request(chat, OAI_CHAT) == {**chat, "stream": True,
                                                "stream_options": {"include_usage": True}}
    assert answer_kind("/completion", endpoints.PROMPT_TEXT, {"prompt": "x"}) == NONE
    assert answer_kind("/v1/completions", endpoints.PROMPT_TEXT, {"prompt": [[1, 2]]}) == OAI_CMPL
    for path, prompt, body in [("/v1/chat/completions", endpoints.PROMPT_CHAT, {**chat, "stream": True}),
                               ("/v1/chat/completions", endpoints.PROMPT_CHAT, {**chat, "logprobs": True}),
                               ("/completion", endpoints.PROMPT_TEXT, {"prompt": "x", "n_probs": 2}),
                               ("/completion", endpoints.PROMPT_TEXT, {"prompt": ["a", "b"]}),
                               ("/completion", endpoints.PROMPT_TEXT, {"prompt": "x", "verbose": True}),
                               ("/v1/responses", endpoints.PROMPT_RESPONSES, {"input": "x"}),
                               ("/v1/messages", endpoints.PROMPT_MESSAGES, chat)]:
        assert answer_kind(path, prompt, body) is None, body
