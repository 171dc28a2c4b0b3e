"""A request's prompt tokens, as llama-server will tokenize them: a chat rendered by its template
(``/apply-template``), then ``/tokenize``; token ids as they are. Asked of llama-server itself on
its private address, over a kept-alive connection of its own (on the engine loop).

The front door asks for a request's tokens before routing it; the front desk asks later for the
requests that came in the fast way (``PromptSource``: what the slot record keeps to ask with), when a
full route needs them. None when they cannot be known: the request is then routed as one whose
tokens are not known."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

import orjson

from slotkeeper.core.basics.tokens import TokenArray, tokens_from_json
from slotkeeper.core.chat.conversions import NotConvertible, messages_to_chat, responses_to_chat
from slotkeeper.core.engine.door import endpoints
from slotkeeper.core.engine.door.httpstack import aiohttp
from slotkeeper.core.engine.door.shapes import PromptSource
from slotkeeper.core.engine.lifecycle.server_link import ServerLink
from slotkeeper.core.server.client import (
    DETOKENIZE_PATH,
    TEMPLATE_PATH,
    TOKENIZE_PATH,
    rendered_prompt,
    tokenize_body,
)

log = logging.getLogger(__name__)

# A prompt this many characters per token of a slot's context cannot fit it whatever the
# tokenizer: llama-server refuses it, and the front door does not tokenize it first.
MAX_CHARS_PER_TOKEN = 64
TOKENIZE_ATTEMPTS = 3
# Agent APIs' bodies, as the chat completions llama-server converts them to.
CONVERSIONS = {endpoints.PROMPT_RESPONSES: responses_to_chat, endpoints.PROMPT_MESSAGES: messages_to_chat}


def single_prompt(prompt: Any) -> str | list[Any] | None:
    """The one prompt a completion runs, as llama-server reads ``prompt`` (tools/server
    ``tokenize_input_prompts``): a string, token ids, or a mixed list of both; ``[x]`` and
    ``{"prompt_string": x}`` are ``x``. None when it runs several prompts or one with media."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        if "multimodal_data" in prompt or "prompt_string" not in prompt:
            return None
        inner = prompt["prompt_string"]
        return inner if isinstance(inner, str) or _mixed(inner) else None
    if not isinstance(prompt, list) or not prompt:
        return None
    if any(_is_number(p) for p in prompt):  # one prompt: token ids, or token ids and text
        return prompt if _mixed(prompt) else None
    if len(prompt) == 1:
        return single_prompt(prompt[0])
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mixed(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(p, str) or type(p) is int for p in v)


def resetting_socket(addr_info: Any) -> socket.socket:
    """Upstream sockets close with a reset, not a FIN: a client that goes away cancels its request,
    which closes its upstream connection, and llama-server (b11434) notices a reset at once but goes
    on generating a non-streamed reply to the end after a plain close (measured: 6,000 tokens
    after the client left)."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


class _NotTokenized(Exception):
    """llama-server answered, but not with tokens (it refused the request)."""


class PromptTokens:
    def __init__(self, link: ServerLink) -> None:
        self.link = link
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """On the loop, before the first request (the front door opens it as it starts listening)."""
        if self._session is None:
            # Kept alive: small questions, retried when a kept connection turns out closed.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=0, force_close=False, socket_factory=resetting_socket))

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def learn(self, what: PromptSource) -> TokenArray | None:
        return await self.tokens(what.prompt_kind, what.body)

    # -- a transcript read as the door reads requests (``transcript_check.PromptReader``) ----------
    async def chat_tokens(self, body: dict[str, Any]) -> TokenArray | None:
        return await self.tokens(endpoints.PROMPT_CHAT, body)

    async def text_tokens(self, text: str) -> TokenArray | None:
        return await self.tokens(endpoints.PROMPT_TEXT, {"prompt": text})

    async def detokenize(self, tokens: list[int]) -> str | None:
        try:
            answer = await self._upstream_json(DETOKENIZE_PATH, {"tokens": tokens})
        except (_NotTokenized, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.debug("could not detokenize: %s", exc)
            return None
        content = answer.get("content") if isinstance(answer, dict) else None
        return content if isinstance(content, str) else None

    async def tokens(self, prompt_kind: str | None, body: dict[str, Any]) -> TokenArray | None:
        """The request's prompt as llama-server will tokenize it (None when it cannot be known)."""
        prompt: str | list[Any] | None = None
        convert = CONVERSIONS.get(prompt_kind or "")
        if convert is not None:
            try:
                body, prompt_kind = convert(body), endpoints.PROMPT_CHAT
            except NotConvertible:
                return None  # llama-server refuses it, or the port does not know it: the safe way
        if prompt_kind == endpoints.PROMPT_TEXT:
            prompt = single_prompt(body.get("prompt"))
            if prompt is None:
                return None
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return tokens_from_json(prompt)  # token ids, checked by the front door's rules
        elif prompt_kind != endpoints.PROMPT_CHAT:
            return None
        for attempt in range(TOKENIZE_ATTEMPTS):
            try:
                if prompt_kind == endpoints.PROMPT_CHAT:
                    prompt = rendered_prompt(await self._upstream_json(TEMPLATE_PATH, body))
                    if prompt is None:
                        return None
                if prompt is None or self._too_long(prompt):
                    return None  # llama-server refuses it; it is not worth tokenizing first
                answer = await self._upstream_json(TOKENIZE_PATH, tokenize_body(prompt))
                return tokens_from_json(answer.get("tokens") if isinstance(answer, dict) else None)
            except _NotTokenized:
                return None  # llama-server refused it (a template that cannot be applied, say)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError) as exc:
                log.debug("could not tokenize the request (attempt %d): %s", attempt + 1, exc)
                if attempt + 1 < TOKENIZE_ATTEMPTS:
                    await self.link.wait_serving()
        return None

    async def _upstream_json(self, path: str, payload: dict[str, Any]) -> Any:
        url, key = self.link.upstream()
        self.open()
        assert self._session is not None
        async with self._session.post(url + path, data=orjson.dumps(payload),
                                      headers={"Authorization": f"Bearer {key}",
                                               "Content-Type": "application/json"}) as r:
            data = await r.read()
            if r.status != 200:
                raise _NotTokenized(r.status)
            return orjson.loads(data)

    def _too_long(self, prompt: Any) -> bool:
        n_ctx = self.link.slot_context()
        if not n_ctx:
            return False
        chars = len(prompt) if isinstance(prompt, str) else sum(len(p) for p in prompt if isinstance(p, str))
        return chars > n_ctx * MAX_CHARS_PER_TOKEN
