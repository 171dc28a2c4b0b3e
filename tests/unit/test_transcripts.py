"""Transcripts: a request and its reply read as a conversation, in every shape the front door
passes (OpenAI chat, llama-server's /completion, Anthropic messages, Responses), streamed or not;
the file they are kept in; and what people get out of them (title, preview, Markdown, JSON)."""

from __future__ import annotations

import json

import pytest

from slotkeeper.core.sessions.transcripts import (
    MAX_REPLY_CHARS,
    ReplyCollector,
    Transcript,
    TranscriptError,
    conversation,
    from_request,
)

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_a_chat_with_tool_calls_reasoning_and_an_image_reads_as_a_conversation():
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                     {"type": "image_url", "image_url": {"url": IMAGE}}]},
        {"role": "assistant", "content": "", "reasoning_content": "Let me look.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a heron"},
        {"role": "nobody", "content": "dropped"},
    ], "tools": [{"type": "function", "function": {"name": "look"}}], "temperature": 0.7}
    t = from_request("/v1/chat/completions", "chat", body)
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool"]
    user = t.messages[1]
    assert (user.content == "What is in this picture?" and len(user.media) == 1
            and user.media[0].startswith("image:"))
    assert IMAGE not in json.dumps(t.to_json())  # a placeholder with its hash, never the image itself
    assert (t.messages[2].reasoning == "Let me look."
            and t.messages[2].tool_calls[0]["function"]["name"] == "look")
    assert t.messages[3].tool_call_id == "c1"
    assert t.options == {"tools": body["tools"]}  # what renders the prompt, not how it is sampled
    assert t.title() == "What is in this picture?"


def test_a_streamed_chat_reply_is_assembled_with_its_tool_calls():
    r = ReplyCollector()
    stream = sse({"choices": [{"delta": {"role": "assistant", "reasoning_content": "Think"}}]},
                 {"choices": [{"delta": {"reasoning_content": "ing."}}]},
                 {"choices": [{"delta": {"content": "The "}}]},
                 {"choices": [{"delta": {"content": "heron."}}]},
                 {"choices": [{"delta": {"tool_calls": [
                     {"index": 0, "id": "x", "function": {"name": "fly", "arguments": '{"a"'}}]}}]},
                 {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
                 {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": {"prompt_n": 3}})
    for cut in (7, 50, 333):  # whatever the chunks
        r = ReplyCollector()
        for i in range(0, len(stream), cut):
            r.feed_stream(stream[i:i + cut])
        m = r.message()
        assert (m.content, m.reasoning) == ("The heron.", "Thinking.")
        assert m.tool_calls == ({"id": "x", "type": "function",
                                 "function": {"name": "fly", "arguments": '{"a": 1}'}},)


def test_a_whole_chat_reply_and_the_conversation_after_it():
    t = from_request("/v1/chat/completions", "chat", {"messages": [{"role": "user", "content": "Hi"}]})
    r = ReplyCollector()
    r.feed_body(json.dumps({"choices": [{"message": {"role": "assistant", "content": "Hello!"}}],
                            "timings": {}}).encode())
    after = conversation(t, r)
    assert [(m.role, m.content) for m in after.messages] == [("user", "Hi"), ("assistant", "Hello!")]
    assert after.preview() == "Hello!" and after.turns == 1


def test_a_text_completion_keeps_its_prompt_and_what_followed():
    t = from_request("/completion", "text", {"prompt": "Once upon a time"}, "Once upon a time")
    r = ReplyCollector()
    r.feed_stream(sse({"content": ", a heron"}, {"content": " flew.", "stop": True}))
    after = conversation(t, r)
    assert (after.kind, after.prompt, after.completion) == ("text", "Once upon a time", ", a heron flew.")
    assert from_request("/completion", "text", {"prompt": [1, 2]}, None) is None  # tokens: no words to keep
    oai = ReplyCollector()
    oai.feed_body(json.dumps({"choices": [{"text": " and more"}]}).encode())
    assert oai.text() == " and more"


# Claude Code's way: the system prompt in blocks, the first its billing stamp; tools; a tool call and
# its result given before the user's next words in one message.
CLAUDE_CODE_BODY = {
    "model": "m", "max_tokens": 8, "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;"},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "read", "description": "Read a file",
               "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in"},
                                     {"type": "text", "text": "a.txt?"}]},
        {"role": "assistant",
         "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                     {"type": "text", "text": "Let me look."},
                     {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.txt", "n": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "herons"}]},
                                     {"type": "text", "text": "Thanks"}]}]}
RESPONSES_BODY = {
    "instructions": "Short.", "max_output_tokens": 8,
    "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
              {"type": "web_search"}],
    "input": [{"role": "user", "content": "Weather in Paris?"},
              {"type": "function_call", "call_id": "c1", "name": "weather",
               "arguments": "{\"city\":\"Paris\"}"},
              {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
              {"role": "assistant", "type": "message",
               "content": [{"type": "output_text", "text": "Sunny."}]},
              {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c2",
               "output": [{"type": "input_text", "text": "rain"}, {"type": "input_text", "text": "later"}]},
              {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]}]}


def _as_rendered(m: dict) -> dict:
    """A chat message as llama-server hands it to a template that takes text: its text parts
    joined by new lines, the fields it has."""
    content = m.get("content")
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content if p.get("type") == "text")
    out = {"role": m["role"], "content": content or ""}
    out.update((k, m[k]) for k in ("reasoning_content", "tool_calls", "tool_call_id", "name") if m.get(k))
    return out


@pytest.mark.parametrize("source, body", [("/v1/messages", CLAUDE_CODE_BODY),
                                          ("/v1/responses", RESPONSES_BODY)])
def test_an_agent_request_reads_as_the_chat_llama_server_converts_it_to(source, body):
    """The transcript of a Messages or Responses request holds the messages and options of the chat
    llama-server converts it to, message for message: what the template rendered."""
    from slotkeeper.core.chat.conversions import messages_to_chat, responses_to_chat

    chat = (messages_to_chat if source == "/v1/messages" else responses_to_chat)(body)
    t = from_request(source, "chat", chat)
    assert t.source == source
    assert t.to_openai() == {"messages": [_as_rendered(m) for m in chat["messages"]],
                             **{k: chat[k] for k in ("tools", "tool_choice") if k in chat}}
    assert "tools" in t.options


def test_a_claude_code_request_reads_as_llama_server_reads_it():
    from slotkeeper.core.chat.conversions import messages_to_chat

    t = from_request("/v1/messages", "chat", messages_to_chat(CLAUDE_CODE_BODY))
    assert [(m.role, m.content) for m in t.messages] == [
        # the blocks run together, the changing stamp blanked
        ("system", "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude Code."),
        ("user", "What is in\na.txt?"), ("assistant", "Let me look."),
        ("user", "Thanks"), ("tool", "herons")]  # the user's words before the tool's result
    assert t.messages[2].reasoning == "hm"
    assert t.messages[2].tool_calls[0]["function"]["arguments"] == '{"path":"a.txt","n":1}'  # dump()'s way
    assert t.options["tools"][0]["function"]["name"] == "read"  # the chat's tools, which the template renders
    r = ReplyCollector()
    r.feed_stream(sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "You are "}},
                      {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "welcome."}}))
    assert conversation(t, r).messages[-1].content == "You are welcome."


def test_a_responses_request_keeps_its_tool_calls_and_their_outputs():
    from slotkeeper.core.chat.conversions import responses_to_chat

    t = from_request("/v1/responses", "chat", responses_to_chat(RESPONSES_BODY))
    assert [(m.role, m.content) for m in t.messages] == [
        ("system", "Short."), ("user", "Weather in Paris?"), ("assistant", ""), ("tool", "sunny"),
        ("assistant", "Sunny."), ("tool", "rain\nlater"), ("user", "And tomorrow?")]
    # the second call joins the reply before it, as llama-server merges them
    assert [[c["id"] for c in m.tool_calls] for m in t.messages if m.role == "assistant"] == [["c1"], ["c2"]]
    assert [m.tool_call_id for m in t.messages if m.role == "tool"] == ["c1", "c2"]
    assert from_request("/infill", None, {"input_prefix": "def f("}) is None
    # an agent body is read only as its chat: never a second way
    assert from_request("/v1/responses", None, RESPONSES_BODY) is None


def test_a_reply_is_bounded():
    r = ReplyCollector()
    r.feed_stream(sse(*({"content": "x" * 100_000} for _ in range(50))))
    assert len(r.text()) == MAX_REPLY_CHARS


def test_the_file_round_trips_and_refuses_what_is_not_a_transcript():
    t = conversation(from_request("/v1/chat/completions", "chat", {
        "messages": [{"role": "user", "content": "Snow on the ridge?"}], "chat_template_kwargs": {"x": 1}}),
        _reply("Some, yes."))
    assert Transcript.from_bytes(t.to_bytes()) == t
    for raw, why in [(b"[]", "object"), (b'{"kind": "chat", "messages": []}', "version"),
                     (b'{"version": 99, "kind": "chat", "messages": []}', "newer"),
                     (b'{"version": 1, "kind": "poem"}', "unknown"), (b"\xff", "not valid"),
                     (b'{"version": 1, "kind": "chat", "messages": [{"content": "x"}]}', "role")]:
        with pytest.raises(TranscriptError, match=why):
            Transcript.from_bytes(raw)


def test_markdown_and_openai_json_for_export():
    t = conversation(from_request("/v1/chat/completions", "chat", {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Code?"}]}),
        _reply("```python\nprint(1)\n```"))
    md = t.to_markdown()
    assert md.startswith("# Code?") and "## User" in md and "```python\nprint(1)\n```" in md
    assert t.to_openai() == {"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Code?"},
                                          {"role": "assistant", "content": "```python\nprint(1)\n```"}]}
    assert t.search_text() == "Be brief.\nCode?\n```python\nprint(1)\n```"


def _reply(text: str) -> ReplyCollector:
    r = ReplyCollector()
    r.feed_body(json.dumps({"choices": [{"message": {"content": text}}]}).encode())
    return r


def test_agent_apis_answers_give_the_requests_figures_from_their_usage():
    import json as _json

    from slotkeeper.core.sessions.transcripts import ReplyCollector

    def sse(*events):
        return b"".join(b"event: x\ndata: " + _json.dumps(e).encode() + b"\n\n" for e in events)

    r = ReplyCollector()  # Anthropic, whole: input_tokens are the ones not cached
    r.feed_body(_json.dumps({"type": "message", "content": [{"type": "text", "text": "Hi"}],
                             "usage": {"cache_read_input_tokens": 30, "input_tokens": 5,
                                       "output_tokens": 2}}).encode())
    assert r.timings == {"cache_n": 30, "prompt_n": 5, "predicted_n": 2} and r.content == ["Hi"]
    r = ReplyCollector()  # Anthropic, streamed
    start = {"usage": {"cache_read_input_tokens": 30, "input_tokens": 5, "output_tokens": 0}}
    r.feed_stream(sse({"type": "message_start", "message": start},
                      {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}},
                      {"type": "message_delta", "usage": {"output_tokens": 3}}))
    assert r.timings == {"cache_n": 30, "prompt_n": 5, "predicted_n": 3} and r.content == ["Hi"]
    r = ReplyCollector()  # Responses, whole: input_tokens include the cached ones
    r.feed_body(_json.dumps({"object": "response", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "Hey"}]}],
        "usage": {"input_tokens": 35, "output_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 30}}}).encode())
    assert r.timings == {"cache_n": 30, "prompt_n": 5, "predicted_n": 2} and r.content == ["Hey"]
    r = ReplyCollector()  # Responses, streamed
    r.feed_stream(sse({"type": "response.output_text.delta", "delta": "Hey"},
                      {"type": "response.completed", "response": {"usage": {
                          "input_tokens": 35, "output_tokens": 4,
                          "input_tokens_details": {"cached_tokens": 30}}}}))
    assert r.timings == {"cache_n": 30, "prompt_n": 5, "predicted_n": 4} and r.content == ["Hey"]


ODD_VALUES = [5, None, ["a", 1], {"text": "a"}, 1.5, True, [[[[[[[[{"deep": [1]}]]]]]]]]]


@pytest.mark.parametrize("odd", ODD_VALUES, ids=repr)
def test_the_builder_never_raises_on_bodies_llama_server_accepts(odd):
    """Non-string texts, inputs, results and fields wherever a client can put them: a transcript
    (or None) comes out, and it can be written to its file."""
    from slotkeeper.core.sessions.transcripts import from_request

    bodies = [
        ("/v1/messages", None, {"system": [{"type": "text", "text": odd}, odd], "messages": [
            {"role": "user", "content": [{"type": "text", "text": odd}, {"type": "image", "source": odd},
                                         odd]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": odd},
                                              {"type": "tool_use", "id": odd, "name": odd, "input": odd}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": odd, "content": odd},
                                         {"type": "tool_result",
                                          "content": [odd, {"type": "text", "text": odd}]}]},
            {"role": odd, "content": odd}], "tools": odd}),
        ("/v1/responses", None, {"instructions": odd, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": odd}], "name": odd},
            {"role": odd, "content": "x"}, odd,
            {"role": "assistant", "content": odd,
             "tool_calls": [odd, {"function": odd}, {"function": {"name": odd, "arguments": odd}}],
             "reasoning_content": odd}]}),
        ("/v1/chat/completions", "chat", {"messages": [{"role": odd, "content": odd}, odd,
                                                       {"role": "user", "content": [odd, {"type": odd}]}],
                                          "tools": odd, "chat_template_kwargs": odd}),
    ]
    for source, kind, body in bodies:
        if kind is None:  # an agent API's body is read as the chat llama-server converts it to
            from slotkeeper.core.chat.conversions import NotConvertible, messages_to_chat, responses_to_chat

            try:
                body = (messages_to_chat if source == "/v1/messages" else responses_to_chat)(body)
            except NotConvertible:
                continue  # llama-server refuses it: it has no conversation
            kind = "chat"
        t = from_request(source, kind, body)
        assert t is not None
        assert Transcript.from_bytes(t.to_bytes()) == Transcript.from_bytes(t.to_bytes())
        t.to_markdown()
        t.search_text()
