"""Agent APIs as llama-server reads them: a body of OpenAI's Responses API (``/v1/responses``) turned
into the chat completion llama-server converts it to, so the front door knows its prompt tokens
(the chat's template, then ``/tokenize``) exactly as llama-server computes them.

A port of ``server_chat_convert_responses_to_chatcmpl`` (tools/server/server-chat.cpp, llama.cpp
b11434), step for step and key for key: llama-server's JSON keeps the order keys are inserted in
(``ordered_json``), and a template that renders tool definitions or calls with ``tojson`` shows it.
Where llama-server would refuse a body (``std::invalid_argument``), ``NotConvertible`` is raised:
the door then routes the request as one whose tokens are not known (the safe way), and llama-server
gives the client its own error.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["NotConvertible", "responses_to_chat"]


class NotConvertible(ValueError):
    """llama-server would refuse this body (its message), or the port does not know it."""


def _is_array(j: Any, key: str) -> bool:
    return isinstance(j, dict) and isinstance(j.get(key), list)


def _is_string(j: Any, key: str) -> bool:
    return isinstance(j, dict) and isinstance(j.get(key), str)


def _json_str(j: dict[str, Any], key: str) -> str:
    """``json_value(j, key, std::string())``: the value when it is a string, else empty."""
    value = j.get(key)
    return value if isinstance(value, str) else ""


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body llama-server makes of a Responses API body. Raises NotConvertible."""
    if "input" not in body:
        raise NotConvertible("'input' is required")
    if _json_str(body, "previous_response_id"):
        raise NotConvertible("llama.cpp does not support 'previous_response_id'.")
    input_value = body["input"]
    chat = copy.deepcopy(body)
    del chat["input"]
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": _json_str(body, "instructions")})
        chat.pop("instructions", None)

    if isinstance(input_value, str):
        messages.append({"role": "user", "content": input_value})
    elif isinstance(input_value, list):
        for raw in input_value:
            item = copy.deepcopy(raw)
            if not isinstance(item, dict):
                raise NotConvertible("Cannot determine type of 'item'")
            merge_prev = bool(messages) and messages[-1].get("role", "") == "assistant"
            if _is_string(item, "content"):
                item["content"] = [{"text": item["content"], "type": "input_text"}]
            role = item.get("role")
            if _is_array(item, "content") and role in ("user", "system", "developer"):
                content = []
                for part in item["content"]:
                    kind = _json_str(part, "type") if isinstance(part, dict) else ""
                    if kind == "input_text":
                        if "text" not in part:
                            raise NotConvertible("'Input text' requires 'text'")
                        content.append({"text": part["text"], "type": "text"})
                    elif kind == "input_image":
                        if "image_url" not in part:
                            raise NotConvertible("'image_url' is required")
                        content.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
                    elif kind == "input_file":
                        raise NotConvertible(
                            "'input_file' is not supported by llamacpp at this moment")
                    else:
                        raise NotConvertible(
                            "'type' must be one of 'input_text', 'input_image', or 'input_file'")
                item.pop("type", None)
                item.pop("status", None)
                item["content"] = content
                messages.append(item)
            elif isinstance(role, str) and role == "assistant" and _json_str(item, "type") == "message":
                content = []
                if isinstance(item.get("content"), str):
                    content.append({"text": item["content"], "type": "text"})
                elif _is_array(item, "content"):
                    for part in item["content"]:
                        kind = _json_str(part, "type") if isinstance(part, dict) else ""
                        if kind in ("output_text", "input_text"):
                            if not _is_string(part, "text"):
                                raise NotConvertible("'Output text' requires 'text'")
                            content.append({"text": part["text"], "type": "text"})
                        elif kind == "refusal":
                            if not _is_string(part, "refusal"):
                                raise NotConvertible("'Refusal' requires 'refusal'")
                            content.append({"refusal": part["refusal"], "type": "refusal"})
                        else:
                            raise NotConvertible("'type' must be one of 'output_text' or 'refusal'")
                if merge_prev:
                    prev = messages[-1]
                    if not _is_array(prev, "content"):
                        prev["content"] = []
                    prev["content"].extend(content)
                else:
                    item.pop("status", None)
                    item.pop("type", None)
                    item["content"] = content
                    messages.append(item)
            elif (_is_string(item, "arguments") and _is_string(item, "call_id") and _is_string(item, "name")
                  and _json_str(item, "type") == "function_call"):
                tool_call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                             "id": item["call_id"], "type": "function"}
                if merge_prev:
                    prev = messages[-1]
                    if not _is_array(prev, "tool_calls"):
                        prev["tool_calls"] = []
                    prev["tool_calls"].append(tool_call)
                else:
                    messages.append({"role": "assistant", "tool_calls": [tool_call]})
            elif (_is_string(item, "call_id") and (_is_string(item, "output") or _is_array(item, "output"))
                  and _json_str(item, "type") == "function_call_output"):
                if isinstance(item["output"], str):
                    messages.append({"content": item["output"], "role": "tool",
                                     "tool_call_id": item["call_id"]})
                else:
                    outputs = item["output"]
                    for out in outputs:
                        if not isinstance(out, dict) or "type" not in out:
                            raise NotConvertible("Output of tool call missing 'type' field")
                        if out["type"] not in ("input_text", "input_image"):
                            raise NotConvertible(
                                "Output of tool call should be 'Input text' or 'Input image'")
                        if out["type"] == "input_text":
                            out["type"] = "text"
                        else:
                            if "image_url" not in out:
                                raise NotConvertible("'image_url' is required")
                            out["type"] = "image_url"
                            out["image_url"] = {"url": out["image_url"]}
                    messages.append({"content": outputs, "role": "tool", "tool_call_id": item["call_id"]})
            elif _is_array(item, "summary") and _json_str(item, "type") == "reasoning":
                if not _is_array(item, "content"):
                    raise NotConvertible("item['content'] is not an array")
                if not item["content"]:
                    raise NotConvertible("item['content'] is empty")
                if not _is_string(item["content"][0], "text"):
                    raise NotConvertible("item['content']['text'] is not a string")
                if merge_prev:
                    messages[-1]["reasoning_content"] = item["content"][0]["text"]
                else:
                    messages.append({"role": "assistant", "content": [],
                                     "reasoning_content": item["content"][0]["text"]})
            else:
                raise NotConvertible("Cannot determine type of 'item'")
    else:
        raise NotConvertible("'input' must be a string or array of objects")

    chat["messages"] = messages

    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise NotConvertible("'tools' must be an array of objects")
        tools = []
        for raw in body["tools"]:
            tool = copy.deepcopy(raw)
            if not isinstance(tool, dict) or _json_str(tool, "type") != "function":
                continue  # no chat-completions equivalent: llama-server skips it too
            del tool["type"]
            if "strict" not in tool:
                tool["strict"] = True
            tools.append({"type": "function", "function": tool})
        chat.pop("tools", None)
        if tools:
            chat["tools"] = tools

    if "max_output_tokens" in body:
        chat.pop("max_output_tokens", None)
        chat["max_tokens"] = body["max_output_tokens"]

    if "reasoning" in body:
        reasoning = body["reasoning"]
        if isinstance(reasoning, dict) and "effort" in reasoning:
            chat["reasoning_effort"] = reasoning["effort"]
        chat.pop("reasoning", None)
    return chat
