"""The Responses API body as llama-server converts it to a chat completion (server-chat.cpp, b11434),
key for key and in the order it inserts them (a template's ``tojson`` shows the order)."""

from __future__ import annotations

import pytest

from slotkeeper.core.chat.conversions import NotConvertible, messages_to_chat, responses_to_chat


def test_text_input_instructions_and_renamed_fields():
    chat = responses_to_chat({"model": "m", "instructions": "Be brief.", "input": "Hi",
                              "max_output_tokens": 5, "reasoning": {"effort": "low", "summary": "auto"},
                              "temperature": 0})
    assert list(chat) == ["model", "temperature", "messages", "max_tokens", "reasoning_effort"]
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat["max_tokens"] == 5 and chat["reasoning_effort"] == "low"


def test_items_become_messages_replies_and_tool_calls_merge_into_the_assistant_message():
    chat = responses_to_chat({"input": [
        {"role": "user", "content": "Weather?", "type": "message", "status": "completed"},
        {"role": "assistant", "type": "message", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "sun"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
    ]})
    user, assistant, tool, thinking = chat["messages"]
    assert user == {"role": "user", "content": [{"text": "Weather?", "type": "text"}]}
    assert list(assistant) == ["role", "content", "tool_calls"]
    assert assistant["content"] == [{"text": "Let me look.", "type": "text"}]
    assert assistant["tool_calls"] == [{"function": {"arguments": "{}", "name": "w"}, "id": "c1",
                                        "type": "function"}]
    assert list(tool) == ["content", "role", "tool_call_id"]
    assert tool["content"] == [{"type": "text", "text": "sun"}]
    assert thinking == {"role": "assistant", "content": [], "reasoning_content": "hmm"}


def test_tools_keep_their_keys_with_strict_added_and_others_skipped():
    chat = responses_to_chat({"input": "x", "tools": [
        {"type": "function", "name": "w", "parameters": {"type": "object"}}, {"type": "web_search"}]})
    assert chat["tools"] == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"},
                                                               "strict": True}}]
    assert "tools" not in responses_to_chat({"input": "x", "tools": [{"type": "web_search"}]})


@pytest.mark.parametrize("body", [{}, {"input": "x", "previous_response_id": "r"}, {"input": 3},
                                  {"input": [{"type": "mystery"}]},
                                  {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
                                  {"input": "x", "tools": {}}])
def test_what_llama_server_refuses_is_not_converted(body):
    with pytest.raises(NotConvertible):
        responses_to_chat(body)


def test_an_anthropic_body_becomes_llama_servers_chat_completion():
    from slotkeeper.core.chat.conversions import messages_to_chat

    chat = messages_to_chat({
        "model": "claude", "max_tokens": 20, "stream": True, "metadata": {"user_id": "u1"},
        "thinking": {"type": "enabled", "budget_tokens": 500},
        "system": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code.",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                              {"type": "tool_use", "id": "t1", "name": "f",
                                               "input": {"b": "é", "a": [1, 2.5]}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "o"}, {"type": "text", "text": "k"}]}]},
            {"role": "assistant"},
        ],
        "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    })
    assert list(chat) == ["messages", "tools", "tool_choice", "max_tokens", "stream",
                          "thinking_budget_tokens", "__metadata_user_id"]
    system, user, assistant, tool = chat["messages"]
    # the changing stamp of Claude Code's billing header is blanked, so prefixes stay cacheable
    assert system == {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1; cch=fffff;"
                                                   "You are Claude Code."}
    assert user == {"role": "user", "content": "Hi"}
    assert list(assistant) == ["role", "content", "tool_calls", "reasoning_content"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"b":"é","a":[1,2.5]}'
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": "ok"}  # text-only results collapse
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "description": "",
                                                               "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == "required" and chat["max_tokens"] == 20


def test_an_anthropic_body_without_messages_is_not_converted():
    from slotkeeper.core.chat.conversions import messages_to_chat

    with pytest.raises(NotConvertible):
        messages_to_chat({"model": "m", "max_tokens": 1})


def test_the_billing_stamp_is_counted_in_bytes_as_llama_server_counts_it():
    header = "x-anthropic-billing-header: cch="
    # five bytes before the ";", not five characters: blanked as llama-server blanks it
    assert messages_to_chat({"system": header + "éé1;rest", "messages": []})["messages"][0]["content"] == (
        header + "fffff;rest")
    # five characters but seven bytes: left alone, as by llama-server
    assert messages_to_chat({"system": header + "éé123;x", "messages": []})["messages"][0]["content"] == (
        header + "éé123;x")
    assert messages_to_chat({"system": header + "ab€;xx", "messages": []})["messages"][0]["content"] == (
        header + "fffff;xx")


@pytest.mark.parametrize("given, written", [("abc", '"abc"'), (5, "5"), ([1, {"a": "é"}], '[1,{"a":"é"}]'),
                                            (None, "{}"), (True, "true")])
def test_a_tool_uses_input_is_written_as_given_as_llama_server_writes_it(given, written):
    body = {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": given}]}]}
    [message] = messages_to_chat(body)["messages"]
    assert message["tool_calls"][0]["function"]["arguments"] == written
