"""Transcripts: the conversation a saved session holds, as people and chat clients see it.

The front door records each request as it passes (``from_request``: the request's messages with
their roles, text, tool calls and results, reasoning; images and audio as a placeholder with their
SHA-256; for a text completion, the prompt), with the reply assembled from the response or its
stream (``ReplyCollector``). An agent API's request (Anthropic Messages, OpenAI Responses) is
given as the chat completion llama-server converts it to (``core.chat.conversions``), so its
transcript holds the messages llama-server's template rendered. A slot keeps the transcript of
what it holds; a save writes it beside the session's sidecar (``<id>.<gen>.chat.json``, 0600, in
the same crash-safe commit as the KV file), so a continued or edited conversation carries its
whole transcript on.

Titles, previews and the search text come from transcripts; detokenizing the KV file stays only as
the fallback for sessions saved without one. A transcript never changes what is sent to
llama-server, and is built after the reply has gone out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import NotARegularFile, UnsafeFile, open_regular

from .titles import PREVIEW_CHARS, TITLE_CHARS, clip

__all__ = ["Message", "ReplyCollector", "Transcript", "TranscriptError", "from_request"]

TRANSCRIPT_VERSION = 1
CHAT, TEXT = "chat", "text"
MAX_REPLY_CHARS = 4_000_000  # a reply longer than this is kept cut (a context holds far less)
MAX_FILE_BYTES = 64 * 1024 * 1024
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Request fields that shape how a chat is rendered (kept so the conversation can be continued and
# checked against the saved tokens with the same template options).
RENDER_FIELDS = ("tools", "tool_choice", "chat_template_kwargs", "reasoning_format", "parallel_tool_calls",
                 "response_format", "json_schema", "enable_thinking", "add_generation_prompt")


class TranscriptError(ValueError):
    """A transcript file that cannot be read as one."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    tool_call_id: str = ""
    name: str = ""
    media: tuple[str, ...] = ()  # "image:<sha256>" / "audio:<sha256>": what the message carried, by its hash

    def to_markdown(self) -> str:
        """Its text as Markdown: the content, tool calls as JSON code, media by name (the chat
        window's copy of a message, and each message of an export)."""
        parts = [self.content] if self.content else []
        for call in self.tool_calls:
            fn = call.get("function") or {}
            parts.append(f"Tool call `{fn.get('name', '?')}`:\n\n```json\n{fn.get('arguments', '')}\n```")
        parts += [f"*({media_label(item)})*" for item in self.media]
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("reasoning", "tool_call_id", "name"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.media:
            out["media"] = list(self.media)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Message:
        role = d.get("role")
        if not isinstance(role, str):
            raise TranscriptError("a message without a role")
        calls = d.get("tool_calls") or []
        media = d.get("media") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise TranscriptError("tool_calls must be a list of objects")
        if not isinstance(media, list) or not all(isinstance(m, str) for m in media):
            raise TranscriptError("media must be a list of names")
        return cls(role, _str(d, "content"), _str(d, "reasoning"), tuple(calls), _str(d, "tool_call_id"),
                   _str(d, "name"), tuple(media))

    def to_openai(self) -> dict[str, Any]:
        """As an OpenAI-style chat message (what continuing the conversation sends)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Transcript:
    kind: str  # "chat" (messages) or "text" (a completion's prompt and what followed it)
    messages: tuple[Message, ...] = ()
    prompt: str = ""  # kind "text"
    completion: str = ""  # kind "text"
    options: Mapping[str, Any] = field(default_factory=dict)  # RENDER_FIELDS as the request gave them
    source: str = ""  # the endpoint it came through (/v1/chat/completions, /completion, /v1/messages...)

    # -- reading ------------------------------------------------------------------------------
    @property
    def turns(self) -> int:
        """User messages (or 1 for a text completion)."""
        return sum(1 for m in self.messages if m.role == "user") if self.kind == CHAT else 1

    def title(self, width: int = TITLE_CHARS) -> str:
        """The first thing the user said, on one line."""
        text = next((m.content for m in self.messages if m.role == "user" and m.content.strip()), "")
        if self.kind == TEXT:
            text = self.prompt
        return _one_line(text, width)

    def preview(self, width: int = PREVIEW_CHARS) -> str:
        """The last answer, on one line."""
        if self.kind == TEXT:
            return _one_line(self.completion or self.prompt[-width:], width)
        text = next((m.content for m in reversed(self.messages) if m.role == "assistant"
                     and m.content.strip()),
                    "")
        return _one_line(text, width)

    def search_text(self) -> str:
        """Everything said (the reasoning too), a line per message: what the search index holds."""
        if self.kind == TEXT:
            return f"{self.prompt}\n{self.completion}"
        return "\n".join(part for m in self.messages for part in (m.reasoning, m.content) if part)

    def to_openai(self) -> dict[str, Any]:
        """OpenAI-style JSON: a chat's ``messages`` (with the options it was rendered with), or a
        text completion's ``prompt`` and ``completion``."""
        if self.kind == TEXT:
            return {"prompt": self.prompt, "completion": self.completion}
        return {"messages": [m.to_openai() for m in self.messages], **dict(self.options)}

    def to_markdown(self, title: str = "") -> str:
        """The conversation for people: a heading per message, its text as Markdown."""
        out = [f"# {title or self.title() or 'Conversation'}", ""]
        if self.kind == TEXT:
            out += ["## Prompt", "", self.prompt, "", "## Completion", "", self.completion, ""]
            return "\n".join(out)
        for m in self.messages:
            out += [f"## {m.role.capitalize()}" + (f" ({m.name})" if m.name else ""), ""]
            if m.reasoning:
                out += ["> " + line for line in m.reasoning.splitlines()] + [""]
            body = m.to_markdown()
            if body:
                out += [body, ""]
        return "\n".join(out)

    def with_reply(self, reply: Message) -> Transcript:
        return replace(self, messages=(*self.messages, reply))

    # -- the file ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": TRANSCRIPT_VERSION, "kind": self.kind, "source": self.source}
        if self.kind == TEXT:
            out.update(prompt=self.prompt, completion=self.completion)
        else:
            out["messages"] = [m.to_json() for m in self.messages]
        if self.options:
            out["options"] = dict(self.options)
        return out

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, d: Any) -> Transcript:
        if not isinstance(d, dict):
            raise TranscriptError("a transcript is a JSON object")
        version = d.get("version")
        if not isinstance(version, int) or version < 1:
            raise TranscriptError("a transcript without a version")
        if version > TRANSCRIPT_VERSION:
            raise TranscriptError(f"a transcript of a newer Slotkeeper (version {version})")
        kind = d.get("kind")
        options = d.get("options") or {}
        if not isinstance(options, dict):
            raise TranscriptError("options must be an object")
        if kind == TEXT:
            return cls(TEXT, prompt=_str(d, "prompt"), completion=_str(d, "completion"), options=options,
                       source=_str(d, "source"))
        if kind != CHAT:
            raise TranscriptError(f"unknown transcript kind {kind!r}")
        messages = d.get("messages")
        if not isinstance(messages, list):
            raise TranscriptError("a chat transcript without messages")
        return cls(CHAT, tuple(Message.from_json(m) for m in messages if isinstance(m, dict)),
                   options=options, source=_str(d, "source"))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Transcript:
        if len(raw) > MAX_FILE_BYTES:
            raise TranscriptError("the transcript file is too large")
        try:
            return cls.from_json(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, TranscriptError):
                raise
            raise TranscriptError(f"the transcript is not valid JSON: {exc}") from exc

    @classmethod
    def read_file(cls, path: Path) -> Transcript | None:
        """The transcript in ``path`` (None: there is none), read as every file of the sessions folder
        is: never followed, never waited on, bounded. TranscriptError for a file that cannot be read or
        is not a transcript."""
        try:
            with open_regular(path, MAX_FILE_BYTES) as fh:
                raw = fh.read()
        except FileNotFoundError:
            return None
        except (NotARegularFile, UnsafeFile, OSError) as exc:
            raise TranscriptError(f"the transcript {path.name} cannot be read: {exc}") from exc
        return cls.from_bytes(raw)


def media_label(item: str) -> str:
    """An image or audio part as words: its kind and the start of its hash ("image 3f2a…")."""
    parts = item.split(":", 1)
    return f"{parts[0]} {parts[-1][:12]}"


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    return v if isinstance(v, str) else ""


def _one_line(text: str, width: int) -> str:
    return clip(" ".join(text.split()), width)


# -- from a request ------------------------------------------------------------------------------
def from_request(source: str, prompt_kind: str | None, body: Mapping[str, Any],
                 prompt: str | None = None) -> Transcript | None:
    """The conversation a request carries (its reply comes later: ``with_reply``), or None when
    its shape is not one a person reads as a conversation. ``prompt``: a text completion's prompt
    as one string (the front door's reading of it). A Messages or Responses request (``source``
    says which) is given as the chat completion llama-server converts it to
    (``core.chat.conversions``, kind "chat"), the very messages its template rendered: it is never
    read here a second way."""
    if prompt_kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        out = [m for m in (_openai_message(x) for x in messages) if m is not None]
        return Transcript(CHAT, tuple(out), options=_options(body), source=source)
    if prompt_kind == TEXT:
        return Transcript(TEXT, prompt=prompt, source=source) if isinstance(prompt, str) else None
    return None


def _options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that shape the rendering, those that can be written down (not nested past what
    JSON is written to)."""
    return {k: body[k] for k in RENDER_FIELDS if k in body and _dumped(body[k], "") != ""}


def _text(value: Any) -> str:
    """A text field as llama-server reads it (``json_value(j, key, std::string())``): the value
    when it is a string, else nothing (a number, null, a list or an object is no text)."""
    return value if isinstance(value, str) else ""


def _dumped(value: Any, default: str = "") -> str:
    """``value`` as compact JSON, or ``default`` when it cannot be written (nested too deeply)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return default


def _media_name(kind: str, value: Any) -> str:
    raw = value if isinstance(value, str) else _dumped(value, repr(type(value)))
    return f"{kind}:{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()}"


def _tool_call(call: Any) -> dict[str, Any] | None:
    """An OpenAI tool call in the one shape a transcript keeps (name and arguments as strings)."""
    if not isinstance(call, dict):
        return None
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else {}
    arguments = fn.get("arguments")
    return {"id": _text(call.get("id")), "type": "function",
            "function": {"name": _text(fn.get("name")),
                         "arguments": arguments if isinstance(arguments, str) else _dumped(arguments)}}


def _parts(content: Any) -> tuple[str, tuple[str, ...]]:
    """An OpenAI message's content as text, and the media it carried (by hash)."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        return "", ()
    texts: list[str] = []
    media: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            media.append(_media_name("image", url.get("url") if isinstance(url, dict) else url))
        elif kind in ("input_audio", "audio"):
            media.append(_media_name("audio", part.get("input_audio") or part.get("audio")))
    return "\n".join(texts), tuple(media)


def _openai_message(x: Any) -> Message | None:
    if not isinstance(x, dict) or not isinstance(x.get("role"), str) or x["role"] not in ROLES:
        return None
    text, media = _parts(x.get("content"))
    given = x.get("tool_calls")
    calls = tuple(c for c in map(_tool_call, given) if c is not None) if isinstance(given, list) else ()
    reasoning = x.get("reasoning_content") or x.get("reasoning") or ""
    return Message(x["role"], text, reasoning if isinstance(reasoning, str) else "", calls,
                   _str(x, "tool_call_id"), _str(x, "name"), media)


# -- the reply ------------------------------------------------------------------------------------
class SseReader:
    """The JSON objects of a server-sent event stream, as its bytes come: each ``data:`` line's
    object (``[DONE]`` and anything that is not a JSON object left out)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        out = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                d = json.loads(payload)
            except ValueError:
                continue
            if isinstance(d, dict):
                out.append(d)
        return out


class ReplyCollector:
    """Assembles a reply from llama-server's answer: a whole JSON body or the events of a stream
    (OpenAI chat and completions, llama-server's own /completion, Anthropic messages, Responses),
    and keeps the ``timings`` it carries (the last event's, in a stream). Bounded: past
    ``MAX_REPLY_CHARS`` the text is cut."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.timings: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._size = 0
        self._events = SseReader()

    def feed_body(self, data: bytes) -> None:
        try:
            d = json.loads(data)
        except ValueError:
            return
        if isinstance(d, list):  # several prompts ran one after the other: the slot holds the last
            d = d[-1] if d else {}
        if isinstance(d, dict):
            self._take(d, stream=False)

    def feed_stream(self, chunk: bytes) -> None:
        for d in self._events.feed(chunk):
            self.take_event(d)

    def take_event(self, d: dict[str, Any]) -> None:
        """One event of a stream, decoded already (by a reader that looks at each event itself)."""
        self._take(d, stream=True)

    def _add(self, into: list[str], text: Any) -> None:
        if isinstance(text, str) and text and self._size < MAX_REPLY_CHARS:
            text = text[: MAX_REPLY_CHARS - self._size]
            self._size += len(text)
            into.append(text)

    def _take(self, d: dict[str, Any], stream: bool) -> None:
        t = d.get("timings")
        if isinstance(t, dict) and "prompt_n" in t:
            self.timings = t
        choices = d.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            c = choices[0]
            part = c.get("delta") if stream else c.get("message")
            if isinstance(part, dict):
                self._add(self.content, part.get("content"))
                self._add(self.reasoning, part.get("reasoning_content"))
                self._tool_calls(part.get("tool_calls"))
            self._add(self.content, c.get("text"))  # OpenAI completions
            return
        kind = d.get("type")
        if kind is None and d.get("object") == "response":  # a whole Responses answer names itself so
            kind = "response"
        if isinstance(kind, str):  # Anthropic messages, OpenAI Responses
            self._usage(kind, d)
            if kind == "message" and isinstance(d.get("content"), list):
                for block in d["content"]:
                    if isinstance(block, dict):
                        self._add(self.content, block.get("text"))
                        self._add(self.reasoning, block.get("thinking"))
            elif kind == "content_block_delta" and isinstance(d.get("delta"), dict):
                self._add(self.content, d["delta"].get("text"))
                self._add(self.reasoning, d["delta"].get("thinking"))
            elif kind == "response.output_text.delta":
                self._add(self.content, d.get("delta"))
            elif kind == "response" or kind == "response.completed":
                response = d.get("response", d)
                for item in response.get("output", []) if isinstance(response, dict) else []:
                    for block in item.get("content", []) if isinstance(item, dict) else []:
                        if isinstance(block, dict) and not stream:
                            self._add(self.content, block.get("text"))
            return
        self._add(self.content, d.get("content"))  # llama-server's own /completion

    def _usage(self, kind: str, d: dict[str, Any]) -> None:
        """The agent APIs carry no ``timings``; their usage says the same of the prompt: tokens read
        from the cache, tokens evaluated, tokens generated (no times: ``prompt_ms`` is left out)."""
        if kind in ("message", "message_start"):  # Anthropic: input_tokens are the ones not cached
            message = d.get("message", d)
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
                cached = usage.get("cache_read_input_tokens") or 0
                self.timings = {"cache_n": cached, "prompt_n": usage["input_tokens"],
                                "predicted_n": usage.get("output_tokens") or 0}
        elif kind == "message_delta" and self.timings is not None:
            usage = d.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.timings = {**self.timings, "predicted_n": usage["output_tokens"]}
        elif kind in ("response", "response.completed"):  # Responses: input_tokens include the cached
            response = d.get("response", d)
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
                details = usage.get("input_tokens_details")
                cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
                self.timings = {"cache_n": cached, "prompt_n": usage["input_tokens"] - cached,
                                "predicted_n": usage.get("output_tokens") or 0}

    def _tool_calls(self, calls: Any) -> None:
        if not isinstance(calls, list):
            return
        for i, call in enumerate(calls):
            if not isinstance(call, dict):
                continue
            index = call.get("index", i)
            into = self._calls.setdefault(index if isinstance(index, int) else i,
                                          {"id": "", "type": "function",
                                           "function": {"name": "", "arguments": ""}})
            if isinstance(call.get("id"), str):
                into["id"] = call["id"]
            fn = call.get("function")
            if isinstance(fn, dict):
                if isinstance(fn.get("name"), str):
                    into["function"]["name"] += fn["name"]
                if isinstance(fn.get("arguments"), str):
                    into["function"]["arguments"] += fn["arguments"]

    def message(self) -> Message:
        """The reply as the assistant's message."""
        calls = tuple(self._calls[i] for i in sorted(self._calls))
        return Message("assistant", "".join(self.content), "".join(self.reasoning), calls)

    def text(self) -> str:
        return "".join(self.content)


def conversation(transcript: Transcript | None, reply: ReplyCollector | None) -> Transcript | None:
    """The whole conversation after a request: its transcript with the reply added."""
    if transcript is None or reply is None:
        return None
    if transcript.kind == TEXT:
        return replace(transcript, completion=reply.text())
    return transcript.with_reply(reply.message())
