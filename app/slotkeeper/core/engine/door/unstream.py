"""A non-streamed generation asked of llama-server as a stream, and its answer written back as
llama-server writes the non-streamed one.

llama-server stops a streamed task as soon as its client's connection closes, but notices that a
non-streamed request's client left only after a second in which no task has a result (which
Slotkeeper's polls of /slots never leave it): a client that gives up on a non-streamed answer would
keep its slot busy to the end. So the front door asks for the stream and gathers its events into
the answer llama-server's non-streamed handler writes (``server_task_result_cmpl_final``'s
``to_json_non_oaicompat``, ``to_json_oaicompat`` and ``to_json_oaicompat_chat`` in
tools/server/server-task.cpp, b11434): the same keys in the same order, written as its ``dump()``
writes them. A client that leaves closes the stream, and llama-server stops at the next token.

Only requests whose answer the stream carries whole are asked so (``streamable``): not those asking
for token probabilities, token ids, the debugging fields (``verbose``), picked response fields or
several completions, nor Responses, whose non-streamed answer is written from state the stream does
not carry. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.prompts import single_prompt

__all__ = ["NONE", "OAI_CHAT", "OAI_CMPL", "Unstreamed", "answer_kind", "streamed_request"]

NONE, OAI_CMPL, OAI_CHAT = "none", "oai_cmpl", "oai_chat"  # llama-server's task_response_type
# Fields whose non-streamed answer holds what the stream does not carry whole (or in another shape).
NOT_STREAMABLE = frozenset({"n_probs", "logprobs", "top_logprobs", "post_sampling_probs", "response_fields",
                            "return_tokens", "verbose", "n", "n_cmpl", "stream_options",
                            "return_progress"})
_KINDS = {"/completion": NONE, "/completions": NONE, "/infill": NONE, "/v1/completions": OAI_CMPL,
          "/chat/completions": OAI_CHAT, "/v1/chat/completions": OAI_CHAT}


def answer_kind(path: str, prompt: str | None, body: dict[str, Any]) -> str | None:
    """How llama-server writes the answer to a non-streamed ``body`` sent to ``path`` when it can be
    asked as a stream and written back exactly (None: sent as it is)."""
    if body.get("stream") is True or NOT_STREAMABLE & body.keys():
        return None
    kind = _KINDS.get(path)
    if kind is None or (prompt == endpoints.PROMPT_TEXT and single_prompt(body.get("prompt")) is None):
        return None  # several prompts (an array of answers) or one with media: sent as it is
    return kind


def streamed_request(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """The request asked as a stream (a chat's with its usage, which its non-streamed answer holds)."""
    asked = {**body, "stream": True}
    if kind == OAI_CHAT:
        asked["stream_options"] = {"include_usage": True}
    return asked


def dump(value: Any) -> bytes:
    """As llama-server's ``json::dump()`` writes it: compact, UTF-8 as it is, keys in their order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Unstreamed:
    """The events of one streamed answer (decoded, in order), gathered into the non-streamed one."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None  # the final result's event (its last, for a chat)
        self.first_final: dict[str, Any] | None = None  # a chat's: the one with finish_reason
        self.verbose: Any = None
        self.error: dict[str, Any] | None = None

    def feed(self, event: dict[str, Any]) -> None:
        if "error" in event and "choices" not in event:
            error = event["error"]
            self.error = error if isinstance(error, dict) else {"message": str(error)}
            return
        if self.kind == NONE:
            if event.get("stop") is True:
                self.final = event
            elif isinstance(event.get("content"), str):
                self.text.append(event["content"])
            return
        if "__verbose" in event and self.verbose is None:
            self.verbose = event["__verbose"]
        choices = event.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            else None
        if self.kind == OAI_CMPL:
            if choice is not None and choice.get("finish_reason") is not None:
                self.final = event
            elif choice is not None and isinstance(choice.get("text"), str):
                self.text.append(choice["text"])
            return
        if choice is None:  # a chat's usage, after the choice that finished it
            self.final = event
            return
        given = choice.get("delta")
        delta: dict[str, Any] = given if isinstance(given, dict) else {}
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            self.reasoning.append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or []:
            self._tool_call(call)
        if choice.get("finish_reason") is not None:
            self.first_final = event
            self.final = self.final or event

    def _tool_call(self, call: Any) -> None:
        if not isinstance(call, dict) or not isinstance(call.get("index"), int):
            return
        into = self.calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
        if isinstance(call.get("id"), str):
            into["id"] = call["id"]
        fn = call.get("function")
        if isinstance(fn, dict):
            for key in ("name", "arguments"):
                if isinstance(fn.get(key), str):
                    into[key] += fn[key]

    def answer(self) -> tuple[int, bytes] | None:
        """(status, body) as llama-server answers the non-streamed request; None when the stream
        ended without its final result (llama-server went away)."""
        if self.error is not None:
            code = self.error.get("code")
            return (code if isinstance(code, int) and 400 <= code < 600 else 500), dump({"error": self.error})
        if self.final is None:
            return None
        if self.kind == NONE:
            out = dict(self.final)
            out["content"] = "".join(self.text)
            settings = out.get("generation_settings")
            if isinstance(settings, dict) and "stream" in settings:
                out["generation_settings"] = {**settings, "stream": False}
            return 200, dump(out)
        if self.kind == OAI_CMPL:
            out = dict(self.final)
            out["choices"] = [{**self.final["choices"][0], "text": "".join(self.text)}]
            return 200, dump(out)
        return 200, dump(self._chat())

    def _chat(self) -> dict[str, Any]:
        """``to_json_oaicompat_chat``: the message as ``common_chat_msg::to_json_oaicompat`` writes it."""
        finishing = self.first_final or {}
        choice = (finishing.get("choices") or [{}])[0]
        final = self.final or {}
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = []
            for i in sorted(self.calls):
                c = self.calls[i]
                tc: dict[str, Any] = {"type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}}
                if c["id"]:
                    tc["id"] = c["id"]
                message["tool_calls"].append(tc)
        out: dict[str, Any] = {
            "choices": [{"finish_reason": choice.get("finish_reason"), "index": choice.get("index", 0),
                         "message": message}],
            "created": finishing.get("created", final.get("created")),
            "model": finishing.get("model", final.get("model")),
            "system_fingerprint": finishing.get("system_fingerprint", final.get("system_fingerprint")),
            "object": "chat.completion",
        }
        if "usage" in final:
            out["usage"] = final["usage"]
        out["id"] = finishing.get("id", final.get("id"))
        if self.verbose is not None:
            out["__verbose"] = self.verbose
        if "timings" in final:
            out["timings"] = final["timings"]
        return out
