"""Agent clients as their users run them: the official ``anthropic`` and ``openai`` Python SDKs,
side by side against llama-server alone (started with Slotkeeper's own arguments) and through the
front door, with one slot and with two. At temperature 0 the answers are the same; with two slots
nothing is refused (a Messages request goes on as the chat completion llama-server converts it to,
on the slot the door chose, and its answer comes back as llama-server's Messages handler writes it,
whole or as events). Ids are random on both sides and are left out of the comparison; the prompt's
figures are compared as their sum (which part came from the cache depends on each side's slots)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import openai
import pytest
from e2e_helpers import LONG_FIRST_TURN, USER_TURNS, llama_server_as_slotkeeper_runs_it, make_engine

from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0}  # the SDK has no temperature of its own here
# A new connection for every call, on both sides: llama-server may close a kept-alive connection
# just as the client reuses it ("Server disconnected without sending a response"), which the
# SDKs would retry; retries are off so that a connection the door loses is never hidden.
ONE_SHOT = httpx2.Limits(max_keepalive_connections=0)
TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


def same(answer: Any) -> Any:
    """What must be equal on both sides: ids out, a prompt's figures as their sum."""
    if isinstance(answer, dict):
        out = {k: same(v) for k, v in answer.items() if k != "id"}
        usage = out.get("usage")
        if isinstance(usage, dict) and "cache_read_input_tokens" in usage:
            usage = dict(usage)
            cached = usage.pop("cache_read_input_tokens") or 0
            usage["input_tokens"] = (usage.get("input_tokens") or 0) + cached
            usage.pop("cache_creation_input_tokens", None)
            out["usage"] = usage
        return out
    if isinstance(answer, list):
        return [same(v) for v in answer]
    return answer


def messages_session(base: str) -> list[Any]:
    """Everything a user of the anthropic SDK does, recorded as what came back."""
    client = anthropic.Anthropic(base_url=base, api_key="local", max_retries=0,
                                 http_client=anthropic.DefaultHttpxClient(limits=ONE_SHOT))
    got: list[Any] = []
    system = LONG_FIRST_TURN
    history = [{"role": "user", "content": USER_TURNS[0]}]
    first = client.messages.create(model="local", max_tokens=12, extra_body=GREEDY, system=system,
                                   messages=history)
    got.append(same(first.model_dump()))
    history += [{"role": "assistant", "content": first.content[0].text if first.content else "."},
                {"role": "user", "content": USER_TURNS[1]}]
    with client.messages.stream(model="local", max_tokens=12, extra_body=GREEDY, system=system,
                                messages=history) as stream:
        events = [same(e.model_dump()) for e in stream]
        final = stream.get_final_message()
    got += [events, same(final.model_dump())]
    # Tools: offered (the answer may call one or not), then a call and its result in the history.
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.messages.create(model="local", max_tokens=40, extra_body=GREEDY, tools=TOOLS,
                                  tool_choice={"type": "any"}, messages=ask)
    got.append(same(call.model_dump()))
    follow = ask + [{"role": "assistant", "content": [
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                         "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                  "content": "sunny, 21 degrees"}]}]
    with client.messages.stream(model="local", max_tokens=12, extra_body=GREEDY, tools=TOOLS,
                                messages=follow) as stream:
        got.append([same(e.model_dump()) for e in stream])
    stopped = client.messages.create(model="local", max_tokens=30, extra_body=GREEDY, stop_sequences=[" "],
                                     messages=[{"role": "user", "content": "Say hello to the walkers."}])
    got.append(same(stopped.model_dump()))
    got.append(client.messages.count_tokens(model="local", system=system, messages=history).input_tokens)
    return got


def responses_session(base: str) -> list[Any]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="local", max_retries=0,
                           http_client=openai.DefaultHttpxClient(limits=ONE_SHOT))
    got: list[Any] = []
    items: list[dict] = []
    for text in USER_TURNS[:3]:
        items.append({"role": "user", "content": text})
        r = client.responses.create(model="local", instructions=LONG_FIRST_TURN, input=items,
                                    max_output_tokens=12, temperature=0)
        got.append(r.output_text)
        items.append({"role": "assistant", "type": "message", "content": r.output_text or "."})
    chat = client.chat.completions.create(model="local", max_tokens=12, temperature=0, messages=[
        {"role": "user", "content": USER_TURNS[0]}])
    got.append(chat.choices[0].message.content)
    return got


# With two slots each side puts a conversation where its own rule says, so a request meets another
# cache state on each side. With flash attention on, llama-server's answer to one request moves
# with its cache state (log-probs ~1e-3 apart: a near tie may turn), so the two-slot comparison,
# token for token, runs with it off on both sides; one slot runs the default (auto: on here).
@pytest.mark.parametrize("slots, flash_attn", [(1, None), (2, False)], ids=["1", "2"])
def test_the_sdks_get_the_same_answers_through_the_door_as_from_llama_server(slots, flash_attn, starter_model,
                                                                               server_bin, port, tmp_path):
    with llama_server_as_slotkeeper_runs_it(server_bin, starter_model, tmp_path, parallel=slots,
                                            flash_attn=flash_attn) as raw:
        want_messages = messages_session(raw)
        want_responses = responses_session(raw)
    engine = make_engine(starter_model, server_bin, port, parallel=slots, flash_attn=flash_attn)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        got_messages = messages_session(engine.base_url)
        got_responses = responses_session(engine.base_url)
    finally:
        engine.stop(save=False)
    for i, (got, want) in enumerate(zip(got_messages, want_messages)):
        assert got == want, (i, got, want)
    assert got_responses == want_responses
