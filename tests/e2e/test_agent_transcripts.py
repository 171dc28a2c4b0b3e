"""An agent conversation's transcript against the real llama-server: a Claude-Code-like Messages
request (the system prompt in blocks with the billing stamp, tools, a tool call and its result)
and a Responses request with function calls and their outputs, sent through the front door and
saved. The transcript holds the chat llama-server rendered, so rendered again with the model's
template it is exactly the tokens the door routed by and the saved conversation begins with, and
`sessions verify`'s check says it matches."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from e2e_helpers import make_engine, transcript_check, wait_until

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

CLAUDE_CODE = {
    "model": "claude", "max_tokens": 6, "temperature": 0,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=9f3a1;"},
               {"type": "text", "text": "You are Claude Code, a helper for walkers.",
                "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": " Keep answers short."}],
    "tools": [{"name": "read_map", "description": "Read a map of an area",
               "input_schema": {"type": "object", "properties": {"area": {"type": "string"}},
                                "required": ["area"]}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Which path goes over the ridge?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me read the map."},
            {"type": "tool_use", "id": "toolu_01", "name": "read_map",
             "input": {"area": "the ridge", "scale": 25000}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01",
             "content": [{"type": "text", "text": "The north path climbs past the hut."}]},
            {"type": "text", "text": "Thanks, and is it steep?"}]}],
}
RESPONSES = {
    "instructions": "You help walkers.", "max_output_tokens": 6, "temperature": 0,
    "tools": [{"type": "function", "name": "weather", "description": "The weather in a place",
               "parameters": {"type": "object", "properties": {"place": {"type": "string"}}}}],
    "input": [
        {"role": "user", "content": "Is it dry on the ridge today?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": "{\"place\":\"ridge\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "dry, light wind"},
        {"role": "assistant", "type": "message",
         "content": [{"type": "output_text", "text": "It is dry with a light wind."}]},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": "{\"place\":\"hut\"}"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "rain after four"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And at the hut?"}]}],
}
CASES = [  # (what, path, the door's kind of prompt, body)
    ("messages as a chat completion", "/v1/messages", endpoints.PROMPT_MESSAGES, CLAUDE_CODE),
    ("messages streamed by llama-server's own handler", "/v1/messages", endpoints.PROMPT_MESSAGES,
     {**CLAUDE_CODE, "stream": True}),
    ("responses", "/v1/responses", endpoints.PROMPT_RESPONSES, RESPONSES),
]


def send(url: str, path: str, body: dict[str, Any]) -> None:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as r:
        r.read()
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("what, path, prompt_kind, body", CASES, ids=[c[0] for c in CASES])
def test_an_agent_conversations_transcript_renders_to_the_tokens_the_door_routed_by(
        what, path, prompt_kind, body, llama_model, server_bin, port):
    from slotkeeper.core.services.transcript_check import OK

    engine = make_engine(llama_model, server_bin, port, parallel=1, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        send(engine.base_url, path, body)
        wait_until(lambda: engine.board[0].content.transcript is not None, what="the slot's transcript")
        saved = engine.save_slot(0)
        entry = engine.library.store.get(saved.id)
        transcript = engine.library.store.transcript(entry)
        assert transcript is not None and transcript.source == path
        routed = list(engine.loop.call(engine.prompts.tokens(prompt_kind, body), 60))
        assert list(engine.library.store.tokens(entry))[:len(routed)] == routed  # what the slot ran on
        # The transcript's request, rendered by the model's template: the very tokens routed by.
        asked = [m.to_openai() for m in transcript.messages[:-1]]
        rendered = engine.loop.call(engine.prompts.chat_tokens(
            {"messages": asked, **transcript.options, "add_generation_prompt": True}), 60)
        assert list(rendered) == routed, what
        check = transcript_check(engine.base_url, saved.id)  # what `sessions verify` says
        assert check is not None and check.verdict == OK, check
    finally:
        engine.stop(save=False)
