"""Agent APIs as llama-server reads them: a body of OpenAI's Responses API (``/v1/responses``) or of
Anthropic's Messages API (``/v1/messages``) turned into the chat completion llama-server converts it
to, so the front door knows its prompt tokens (the chat's template, then ``/tokenize``) exactly as
llama-server computes them, and a saved conversation's transcript holds the very messages the
template rendered (the front door gives ``transcripts.from_request`` this chat, never the body).

Ports of ``server_chat_convert_responses_to_chatcmpl`` and ``server_chat_convert_anthropic_to_oai``
(tools/server/server-chat.cpp, llama.cpp b11434), step for step and key for key: llama-server's JSON
keeps the order keys are inserted in (``ordered_json``), and a template that renders tool definitions
or calls with ``tojson`` shows it; a tool call's input is written as its ``dump()`` writes it.
Where llama-server would refuse a body (``std::invalid_argument``), ``NotConvertible`` is raised:
the door then routes the request as one whose tokens are not known (the safe way), and llama-server
gives the client its own error.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["MESSAGES_AS_CHAT_PATH", "MessagesStream", "NotConvertible", "chat_to_message_answer",
           "message_answer_bytes", "messages_as_chat", "messages_to_chat", "responses_to_chat", "sse_event",
           "without_extras"]


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


# -- Anthropic's Messages API -------------------------------------------------------------------
BILLING_HEADER = "x-anthropic-billing-header:"
CCH_LENGTH = 5


def _normalize_billing_header(text: str) -> str:
    """llama-server blanks the changing ``cch=`` stamp of Claude Code's billing header (it would stop
    prefix caching at the first line): ``normalize_anthropic_billing_header``, which counts and
    replaces bytes of UTF-8, not characters (whole characters all the same: the five bytes lie
    between "cch=" and a ";")."""
    if not text.startswith(BILLING_HEADER):
        return text
    raw = text.encode("utf-8")
    at = raw.find(b"cch=", len(BILLING_HEADER))
    if at < 0:
        return text
    start = at + 4
    if start + CCH_LENGTH < len(raw) and raw[start + CCH_LENGTH] == ord(";"):
        return (raw[:start] + b"f" * CCH_LENGTH + raw[start + CCH_LENGTH:]).decode("utf-8")
    return text


def _value(j: Any, key: str, default: Any) -> Any:
    """``json_value(j, key, default)``: the value when it has the default's type, else the default."""
    if not isinstance(j, dict) or key not in j or j[key] is None:
        return default
    value = j[key]
    if isinstance(default, str):
        return value if isinstance(value, str) else default
    if isinstance(default, dict):
        return value if isinstance(value, dict) else default
    if isinstance(default, bool):
        return value if isinstance(value, bool) else default
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else default
    return value


def _dump(value: Any) -> str:
    """``json::dump()``: compact, UTF-8 as it is, keys in their order."""
    import json

    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NotConvertible(f"a tool's input cannot be written as llama-server writes it: {exc}") from None


def _image(source: dict[str, Any]) -> dict[str, Any] | None:
    kind = _value(source, "type", "")
    if kind == "base64":
        url = f"data:{_value(source, 'media_type', 'image/jpeg')};base64,{_value(source, 'data', '')}"
    elif kind == "url":
        url = _value(source, "url", "")
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body llama-server makes of an Anthropic Messages API body
    (``server_chat_convert_anthropic_to_oai``). Raises NotConvertible."""
    messages: list[Any] = []
    system = body.get("system")
    if system is not None:
        text = ""
        if isinstance(system, str):
            text = _normalize_billing_header(system)
        elif isinstance(system, list):
            for block in system:
                if _value(block, "type", "") == "text":
                    text += _normalize_billing_header(_value(block, "text", ""))
        messages.append({"role": "system", "content": text})
    if "messages" not in body:
        raise NotConvertible("'messages' is required")
    if isinstance(body["messages"], list):
        for msg in body["messages"]:
            role = _value(msg, "role", "")
            if not isinstance(msg, dict) or "content" not in msg:
                if role != "assistant":
                    messages.append(copy.deepcopy(msg))
                continue
            content = msg["content"]
            if not isinstance(content, list):
                messages.append(copy.deepcopy(msg))
                continue
            tool_calls: list[dict[str, Any]] = []
            converted: list[Any] = []
            tool_results: list[dict[str, Any]] = []
            reasoning = ""
            has_tool_calls = False
            for block in content:
                kind = _value(block, "type", "")
                if kind == "text":
                    converted.append(copy.deepcopy(block))
                elif kind == "thinking":
                    reasoning += _value(block, "thinking", "")
                elif kind == "image":
                    image = _image(_value(block, "source", {}))
                    if image is not None:
                        converted.append(image)
                elif kind == "tool_use":  # json_value<json>: as given (an object when absent or null)
                    given = block.get("input")
                    tool_calls.append({"id": _value(block, "id", ""), "type": "function",
                                       "function": {"name": _value(block, "name", ""),
                                                    "arguments": _dump({} if given is None else given)}})
                    has_tool_calls = True
                elif kind == "tool_result":
                    tool_use_id = _value(block, "tool_use_id", "")
                    result = block.get("content")
                    if isinstance(result, str):
                        tool_results.append({"role": "tool", "tool_call_id": tool_use_id, "content": result})
                    elif isinstance(result, list):
                        text, parts, has_images = "", [], False
                        for c in result:
                            c_type = _value(c, "type", "")
                            if c_type == "text":
                                piece = _value(c, "text", "")
                                text += piece
                                parts.append({"type": "text", "text": piece})
                            elif c_type == "image":
                                has_images = True
                                image = _image(_value(c, "source", {}))
                                if image is not None:
                                    parts.append(image)
                        tool_results.append({"role": "tool", "tool_call_id": tool_use_id,
                                             "content": parts if has_images else text})
                    else:
                        tool_results.append({"role": "tool", "tool_call_id": tool_use_id, "content": ""})
            if converted or has_tool_calls or reasoning:
                new_msg: dict[str, Any] = {"role": role}
                if converted:
                    new_msg["content"] = converted
                else:
                    new_msg["content"] = ""
                if tool_calls:
                    new_msg["tool_calls"] = tool_calls
                if reasoning:
                    new_msg["reasoning_content"] = reasoning
                messages.append(new_msg)
            messages.extend(tool_results)
    chat: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if "tools" in body and isinstance(tools, list):
        chat["tools"] = [{"type": "function", "function": {
            "name": _value(tool, "name", ""), "description": _value(tool, "description", ""),
            "parameters": (copy.deepcopy(tool["input_schema"])
                           if isinstance(tool, dict) and "input_schema" in tool else {})}} for tool in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = _value(choice, "type", "")
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            chat["tool_choice"] = "required"
    if "stop_sequences" in body:
        chat["stop"] = copy.deepcopy(body["stop_sequences"])
    chat["max_tokens"] = copy.deepcopy(body["max_tokens"]) if "max_tokens" in body else 4096
    for key in ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs"):
        if key in body:
            chat[key] = copy.deepcopy(body[key])
    if "thinking" in body:
        thinking = _value(body, "thinking", {})
        if _value(thinking, "type", "") == "enabled":
            chat["thinking_budget_tokens"] = _value(thinking, "budget_tokens", 10000)
    if "metadata" in body:
        user_id = _value(_value(body, "metadata", {}), "user_id", "")
        if user_id:
            chat["__metadata_user_id"] = user_id
    return chat


# -- answering a Messages request the door sent as a chat completion ------------------------------
# With more than one slot the door sends a Messages request as the chat completion above (with the
# slot it chose: llama-server's own Messages handler drops ``id_slot``) and writes the answer as
# llama-server's Messages handler writes it (``to_json_anthropic``, ``to_json_anthropic_stream`` and
# the partial results' events in tools/server/server-task.cpp, ``format_anthropic_sse``).
CHAT_EXTRAS = {"verbose": True}  # the answer then says which stop sequence ended it (``__verbose``)
STREAM_EXTRAS = {"timings_per_token": True}  # the prompt's figures reach the stream's first events
MESSAGES_AS_CHAT_PATH = "/v1/chat/completions"


def messages_as_chat(body: dict[str, Any]) -> dict[str, Any] | None:
    """A Messages request as the chat completion llama-server converts it to, with what lets its
    answer be written back as llama-server writes a Messages answer; None when llama-server would
    refuse the body (it is sent on as it is, and refused there)."""
    try:
        chat = messages_to_chat(body)
    except NotConvertible:
        return None
    chat.update(CHAT_EXTRAS)
    if chat.get("stream") is True:
        chat.update(STREAM_EXTRAS)
    return chat


def without_extras(chat: dict[str, Any]) -> dict[str, Any]:
    """A Messages request's chat completion without what the door adds to write its answer back."""
    return {k: v for k, v in chat.items() if k not in CHAT_EXTRAS and k not in STREAM_EXTRAS}


def message_answer_bytes(answer: bytes) -> bytes:
    """A whole chat completion answer's bytes, as llama-server writes the Messages answer (what is
    not a chat completion, an error say, goes back as it is)."""
    import json

    try:
        written = chat_to_message_answer(json.loads(answer))
    except (ValueError, TypeError, AttributeError, IndexError):
        return answer
    return json.dumps(written, ensure_ascii=False, separators=(",", ":")).encode()


def _stop_reason(finish_reason: Any, has_tool_calls: bool) -> str:
    """llama-server's: "max_tokens" unless an end of generation or a stop word ended it."""
    if finish_reason in ("stop", "tool_calls"):
        return "tool_use" if has_tool_calls else "end_turn"
    return "max_tokens"


def _stop_sequence(answer: dict[str, Any]) -> str | None:
    verbose = answer.get("__verbose")
    word = verbose.get("stopping_word") if isinstance(verbose, dict) else None
    return word if isinstance(word, str) and word else None


def _tool_input(arguments: Any) -> Any:
    import json

    try:
        value = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        value = None
    return value if value is not None else {}


def chat_to_message_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion answer written as llama-server writes a Messages answer."""
    choice = (answer.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    calls = msg.get("tool_calls") or []
    blocks: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        blocks.append({"type": "text", "text": msg["content"]})
    for call in calls:
        fn = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
                       "input": _tool_input(fn.get("arguments"))})
    t = answer.get("timings") or {}
    cached = int(t.get("cache_n") or 0)
    usage = answer.get("usage") or {}
    return {"id": answer.get("id", ""), "type": "message", "role": "assistant", "content": blocks,
            "model": answer.get("model", ""),
            "stop_reason": _stop_reason(choice.get("finish_reason"), bool(calls)),
            "stop_sequence": _stop_sequence(answer),
            "usage": {"cache_read_input_tokens": cached, "input_tokens": int(t.get("prompt_n") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or t.get("predicted_n") or 0)}}


def sse_event(event: str, data: dict[str, Any]) -> bytes:
    """``format_anthropic_sse`` of one event: its name, then its data as compact JSON."""
    import json

    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode()


class MessagesStream:
    """A streamed chat completion's chunks (decoded) turned into the events of llama-server's
    streamed Messages answer. ``feed`` each chunk; it returns the bytes to send on."""

    def __init__(self) -> None:
        self.started = False
        self.thinking_started = False
        self.text_started = False
        self.has_reasoning = False
        self.n_tool_calls = 0
        self.done = False
        self.stopping_word: str | None = None  # the final result's first chunk says it (``__verbose``)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if "error" in chunk and "choices" not in chunk:
            return sse_event("error", chunk["error"])  # as llama-server ends a Messages stream that fails
        out: list[bytes] = []
        if "__verbose" in chunk:
            self.stopping_word = _stop_sequence(chunk)
        choice = (chunk.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        finish = choice.get("finish_reason")
        t = chunk.get("timings")
        if not self.started and isinstance(t, dict):
            self.started = True
            out.append(sse_event("message_start", {"type": "message_start", "message": {
                "id": chunk.get("id", ""), "type": "message", "role": "assistant", "content": [],
                "model": chunk.get("model", ""), "stop_reason": None, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": int(t.get("cache_n") or 0),
                          "input_tokens": int(t.get("prompt_n") or 0), "output_tokens": 0}}}))
        reasoning, content = delta.get("reasoning_content"), delta.get("content")
        if isinstance(reasoning, str) and reasoning:
            self.has_reasoning = True
            if not self.thinking_started:
                self.thinking_started = True
                out.append(sse_event("content_block_start", {
                    "type": "content_block_start", "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""}}))
            out.append(sse_event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "thinking_delta", "thinking": reasoning}}))
        if isinstance(content, str) and content:
            index = 1 if self.has_reasoning else 0
            if not self.text_started:
                self.text_started = True
                out.append(sse_event("content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}))
            out.append(sse_event("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": content}}))
        for call in delta.get("tool_calls") or []:
            i = int(call.get("index", 0))
            index = (1 if self.has_reasoning else 0) + (1 if self.text_started else 0) + i
            fn = call.get("function") or {}
            if fn.get("name"):
                self.n_tool_calls = max(self.n_tool_calls, i + 1)
                out.append(sse_event("content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": call.get("id", ""), "name": fn["name"]}}))
            if fn.get("arguments"):
                out.append(sse_event("content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}}))
        if finish is not None and not self.done:
            self.done = True
            out.append(self._close(chunk, finish))
        return b"".join(out)

    def _close(self, chunk: dict[str, Any], finish: Any) -> bytes:
        out: list[bytes] = []
        text_index = 1 if self.has_reasoning else 0
        if self.has_reasoning:
            out.append(sse_event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "signature_delta", "signature": ""}}))
            out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        if self.text_started:
            out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": text_index}))
        for i in range(self.n_tool_calls):
            index = (1 if self.has_reasoning else 0) + (1 if self.text_started else 0) + i
            out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        t = chunk.get("timings") or {}
        usage = chunk.get("usage") or {}
        out.append(sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(finish, self.n_tool_calls > 0),
                      "stop_sequence": self.stopping_word},
            "usage": {"output_tokens": int(usage.get("completion_tokens") or t.get("predicted_n") or 0)}}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)
