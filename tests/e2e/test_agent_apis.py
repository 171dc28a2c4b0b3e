"""Agent clients' APIs through the front door against the real llama-server: the door knows a
Responses API request's prompt tokens exactly as llama-server computes them (it converts the body
to the chat completion llama-server makes of it, then the chat's template), so such conversations
are routed, saved, evicted and restored like chat ones."""

from __future__ import annotations

import httpx
import pytest
from e2e_helpers import LONG_FIRST_TURN, USER_TURNS, make_engine, wait_until

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

BODIES = [
    {"input": "Hello there, how are you?", "max_output_tokens": 8, "temperature": 0},
    {"instructions": "Be brief.", "input": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "type": "message", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer in one word."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"}]}],
     "max_output_tokens": 8},
    {"input": [{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather",
                "arguments": "{\"city\":\"Paris\"}"},
               {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 degrees"},
               {"role": "assistant", "type": "message", "content": "It is sunny."},
               {"role": "user", "content": "And tomorrow?"}],
     "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}},
               {"type": "web_search"}],
     "reasoning": {"effort": "low"}, "max_output_tokens": 8},
]


def test_the_doors_tokens_of_a_responses_request_are_llama_servers(starter_model, server_bin, port):
    """Text, messages with a developer message and an earlier reply, tool calls and their results,
    tools (one without a chat equivalent, which llama-server skips): the door's token count equals
    llama-server's own for the same body (/v1/responses/input_tokens), and a body llama-server
    refuses is not guessed at (unknown tokens: the safe way)."""
    engine = make_engine(starter_model, server_bin, port)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for body in BODIES:
            ours = engine.loop.call(engine.prompts.tokens(endpoints.PROMPT_RESPONSES, body), 60)
            theirs = httpx.post(f"{engine.base_url}/v1/responses/input_tokens", json=body, timeout=60).json()
            assert ours is not None and len(ours) == theirs["input_tokens"], body
        refused = {"input": "hi", "previous_response_id": "resp_1"}
        assert engine.loop.call(engine.prompts.tokens(endpoints.PROMPT_RESPONSES, refused), 60) is None
        assert httpx.post(f"{engine.base_url}/v1/responses", json=refused, timeout=60).status_code >= 400
    finally:
        engine.stop(save=False)


def respond(base: str, instructions: str, items: list[dict]) -> tuple[str, int, int]:
    """A Responses API turn: (the reply, prompt tokens, of which cached)."""
    r = httpx.post(f"{base}/v1/responses", timeout=120, json={
        "instructions": instructions, "input": items, "max_output_tokens": 8, "temperature": 0})
    r.raise_for_status()
    d = r.json()
    text = "".join(c.get("text", "") for o in d["output"] if o.get("type") == "message" for c in o["content"])
    usage = d["usage"]
    return text, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


def message(base: str, system: str, messages: list[dict]) -> tuple[str, int, int]:
    """A Messages API turn: (the reply, prompt tokens, of which cached)."""
    r = httpx.post(f"{base}/v1/messages", timeout=120, json={
        "model": "local", "system": system, "messages": messages, "max_tokens": 8, "temperature": 0})
    r.raise_for_status()
    d = r.json()
    text = "".join(b.get("text", "") for b in d["content"] if b.get("type") == "text")
    usage = d["usage"]
    cached = usage.get("cache_read_input_tokens", 0)
    return text, usage["input_tokens"] + cached, cached


APIS = {"responses": (respond, lambda text: {"role": "assistant", "type": "message", "content": text}),
        "messages": (message, lambda text: {"role": "assistant", "content": text})}


@pytest.mark.parametrize("api", list(APIS))
def test_two_agent_conversations_taking_turns_on_one_slot_are_restored_not_reread(
        api, starter_model, server_bin, port):
    """A and B take turns on one slot, then Slotkeeper is quit and started again: each next turn
    finds its conversation in the cache (saved as the other took the slot, restored for it), as a
    chat client's would, instead of being re-read."""
    ask, reply_item = APIS[api]
    systems = {"A": LONG_FIRST_TURN, "B": " ".join(USER_TURNS * 8)}
    history: dict[str, list[dict]] = {"A": [], "B": []}
    cached: list[tuple[str, int, int]] = []

    def turn(base: str, who: str, text: str) -> None:
        history[who].append({"role": "user", "content": text})
        reply, n_input, n_cached = ask(base, systems[who], history[who])
        history[who].append(reply_item(reply or "..."))
        cached.append((who, n_input, n_cached))

    engine = make_engine(starter_model, server_bin, port, parallel=1)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for text in USER_TURNS[:2]:
            for who in ("A", "B"):
                turn(engine.base_url, who, text)
        wait_until(lambda: len(engine.library.store.sessions()) == 2, what="both saved")
    finally:
        engine.stop()
    engine = make_engine(starter_model, server_bin, port, parallel=1)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for who in ("A", "B"):
            turn(engine.base_url, who, USER_TURNS[2])
        # The history records each request's figures, from the API's own usage.
        wait_until(lambda: [r.cache_n for r in engine.history.recent(2)] == [c[2] for c in cached[-2:]],
                   what="the history of the last two turns")
        # Recorded like chat: each conversation's transcript is kept with its save, in words.
        engine.save_slot(0)
        transcripts = [engine.library.store.transcript(e) for e in engine.library.store.sessions()]
        said = [" ".join(m.content for m in t.messages) for t in transcripts if t is not None]
        assert any(USER_TURNS[2] in text and "mountain" in text.lower() for text in said), said
        hits = engine.sessions.search("trail winds").hits
        assert hits, "the conversation's text is searchable"
    finally:
        engine.stop(save=False)
    # Every turn after a conversation's first finds all but its newest message in the cache.
    print(f"{api}: (conversation, prompt tokens, of which cached) per turn: {cached}")
    later = [c for i, c in enumerate(cached) if i >= 2]
    for who, n_input, n_cached in later:
        assert n_cached >= n_input - 40, (who, n_input, n_cached, cached)


MESSAGES_BODIES = [
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello there"}]},
    {"model": "m", "max_tokens": 8, "temperature": 0, "stop_sequences": ["\n\n"],
     "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You help."},
                {"type": "text", "text": " Be brief."}],
     "messages": [
         {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
         {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "I should call the tool.", "signature": "s"},
             {"type": "text", "text": "Let me check."},
             {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
              "input": {"city": "Paris", "units": "°C", "days": [1, 2], "exact": 1.5}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1",
              "content": [{"type": "text", "text": "sunny"}]},
             {"type": "text", "text": "Thanks!"}]}],
     "tools": [{"name": "get_weather", "description": "The weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}],
     "tool_choice": {"type": "auto"}},
]


def test_the_doors_tokens_of_a_messages_request_are_llama_servers(starter_model, server_bin, port):
    """Anthropic's Messages API: a system prompt in blocks with Claude Code's billing header, a
    reply with thinking, text and a tool call (its input with non-ASCII text and a float), a tool
    result: the door's token count equals llama-server's own (/v1/messages/count_tokens)."""
    engine = make_engine(starter_model, server_bin, port, parallel=1)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        for body in MESSAGES_BODIES:
            ours = engine.loop.call(engine.prompts.tokens(endpoints.PROMPT_MESSAGES, body), 60)
            theirs = httpx.post(f"{engine.base_url}/v1/messages/count_tokens", json=body, timeout=60).json()
            assert ours is not None and len(ours) == theirs["input_tokens"], body
    finally:
        engine.stop(save=False)


@pytest.mark.parametrize("stream", [False, True])
def test_llama_server_lost_during_a_messages_request_is_a_clear_error_and_the_door_goes_on(
        stream, llama_model, server_bin, port):
    """Two slots: a Messages request runs as its chat completion when llama-server dies. The client
    gets llama-server's kind of answer for it (a 503 with the reason, or an error event ending the
    stream), and once llama-server is back the door serves Messages again."""
    import os
    import signal
    import threading

    engine = make_engine(llama_model, server_bin, port, parallel=2)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        body = {"model": "m", "max_tokens": 1500, "temperature": 0, "stream": stream,
                "messages": [{"role": "user", "content": " ".join(USER_TURNS)}]}
        got: dict = {}

        def ask() -> None:
            with httpx.stream("POST", f"{engine.base_url}/v1/messages", json=body, timeout=120) as r:
                got["status"] = r.status_code
                got["text"] = r.read().decode()

        t = threading.Thread(target=ask)
        t.start()
        wait_until(lambda: any(s.busy for s in engine.board), what="the request running")
        os.kill(engine.supervisor.pid, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        if stream:
            assert got["status"] == 200 and "event: error" in got["text"] and "went away" in got["text"]
        else:
            assert got["status"] == 503 and "went away" in got["text"], got
        short = {**body, "stream": False, "max_tokens": 4}

        def served() -> bool:  # 503 with Retry-After while llama-server restarts, then served
            r = httpx.post(f"{engine.base_url}/v1/messages", timeout=60, json=short)
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200 and r.json()["type"] == "message"

        wait_until(served, timeout=90, interval=0.5, what="Messages served again after the restart")
    finally:
        engine.stop(save=False)
