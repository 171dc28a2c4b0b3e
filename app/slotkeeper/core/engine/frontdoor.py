"""The front door: the address clients use. Every llama-server endpoint passes through it.

llama-server listens on a private port of 127.0.0.1 and demands a random key only Slotkeeper
knows; clients talk to the front door (the host and port in the settings), which:

- checks the user's own API key (when one is set) the way llama-server would, with the same
  public endpoints (``/health``, the web UI's files);
- refuses what would go behind Slotkeeper's back: the slot-file actions (``POST /slots/N``),
  run-time LoRA changes (they change what a saved KV cache means) and model loading;
- routes every generation request (chat, completion, infill, responses, messages) to a slot
  through the engine's front desk, which saves, restores or erases that slot first when needed,
  and tells it what the response's ``timings`` say afterwards;
- passes everything else through as it is. Streams are forwarded chunk by chunk as they come;
  a client that goes away cancels the request upstream (its connection is closed).

It runs on the engine loop (aiohttp's server and client), so routing reads the engine's state
directly. No HTTP is parsed by hand.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from slotkeeper.core.engine.frontdesk import FrontDeskError, Outcome, Ticket, request_shape
from slotkeeper.core.engine.httpstack import aiohttp, web
from slotkeeper.core.tokens import TokenArray, tokens_from_json

if TYPE_CHECKING:
    from slotkeeper.core.engine.frontdesk import FrontDesk

log = logging.getLogger(__name__)

# Requests routed to a slot, and how their prompt is known.
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
COMPLETION_PATHS = frozenset({"/completion", "/completions", "/v1/completions"})
OTHER_GENERATION_PATHS = frozenset({"/infill", "/v1/responses", "/responses", "/v1/messages"})
# Not through the front door: Slotkeeper owns the slot files and what the KV cache means.
BLOCKED = {
    "/lora-adapters": "LoRA adapters are set at launch (extra arguments); changing them at run time would "
                      "change what the saved conversations mean",
    "/models/load": "Slotkeeper runs one model", "/models/unload": "Slotkeeper runs one model",
}
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# API paths answered with JSON: everything else a browser GETs is the web UI (public, as upstream).
API_PREFIXES = ("/v1/", "/props", "/slots", "/metrics", "/models", "/lora-adapters", "/tokenize", "/detokenize",
                "/apply-template", "/completion", "/chat/", "/infill", "/embedding", "/rerank", "/responses",
                "/api/", "/tools", "/cors-proxy")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key"})


def error_response(status: int, message: str, error_type: str = "invalid_request_error") -> web.Response:
    """An error in llama-server's own shape, so clients show it as they show the server's."""
    return web.json_response({"error": {"code": status, "message": message, "type": error_type}}, status=status)


class FrontDoor:
    def __init__(self, desk: FrontDesk, upstream: Callable[[], tuple[str, str]],
                 user_key: Callable[[], str | None]) -> None:
        """``upstream()`` gives llama-server's private base URL and key now; ``user_key()`` the
        key clients must send (None: no key)."""
        self.desk = desk
        self._upstream = upstream
        self._user_key = user_key
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.host = ""
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        """Listen on ``host`` ``port``, or on ``sock``: that address, already claimed."""
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        try:
            if sock is not None:
                await web.SockSite(runner, sock).start()
            else:
                await web.TCPSite(runner, host, port, reuse_address=True).start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(exc.errno, f"cannot listen on {host} port {port}: {exc.strerror or exc}") from exc
        self._runner = runner
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, force_close=False))
        self.host, self.port = host, port
        log.info("front door listening on %s port %s", host, port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def running(self) -> bool:
        return self._runner is not None

    # -- requests -------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if not self._authorised(request):
            return error_response(401, "Invalid API Key", "authentication_error")
        if request.method == "POST" and (path.startswith("/slots/") or path == "/slots"):
            return error_response(403, "slot files are managed by Slotkeeper: its sessions save and restore "
                                       "every conversation (see `slotkeeper sessions`)", "permission_error")
        if request.method == "POST" and path in BLOCKED:
            return error_response(403, BLOCKED[path], "permission_error")
        if request.method == "POST" and (path in CHAT_PATHS or path in COMPLETION_PATHS
                                         or path in OTHER_GENERATION_PATHS):
            return await self._generate(request)
        return await self._pass(request, await request.read())

    def _authorised(self, request: web.Request) -> bool:
        key = self._user_key()
        if not key:
            return True
        path = request.path
        if path in PUBLIC_PATHS or (request.method in ("GET", "HEAD") and not path.startswith(API_PREFIXES)):
            return True  # health checks and the web UI's files, as llama-server itself allows
        given = request.headers.get("Authorization") or request.headers.get("X-Api-Key") or ""
        if given.startswith("Bearer "):
            given = given[len("Bearer "):]
        return given == key

    def _headers(self, request: web.Request) -> dict[str, str]:
        _url, key = self._upstream()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Authorization"] = f"Bearer {key}"
        return headers

    async def _pass(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Anything else, as it is (the upstream answer streamed back)."""
        url, _key = self._upstream()
        assert self._session is not None
        try:
            async with self._session.request(request.method, url + request.path_qs, data=body or None,
                                             headers=self._headers(request)) as up:
                return await self._relay(request, up, None)
        except aiohttp.ClientConnectionError:
            return error_response(503, "llama-server is not answering (it may be starting or restarting)",
                                  "unavailable_error")

    async def _relay(self, request: web.Request, up: aiohttp.ClientResponse,
                     on_chunk: Callable[[bytes], None] | None) -> web.StreamResponse:
        headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
        if up.content_type != "text/event-stream" and on_chunk is None:
            body = await up.read()
            return web.Response(body=body, status=up.status, headers=headers)
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            if on_chunk is not None:
                on_chunk(chunk)
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = parse_object(raw)
        if body is None:
            return await self._pass(request, raw)  # llama-server says what is wrong with it
        path = request.path
        pinned = body.get("id_slot")
        pinned = pinned if isinstance(pinned, int) and not isinstance(pinned, bool) and pinned >= 0 else None
        kind = "chat" if path in CHAT_PATHS else "text" if path in COMPLETION_PATHS else None
        shape = request_shape(kind, body) if kind else None
        ticket = self.desk.admit_continuation(shape, pinned)  # the next turn of what a slot holds
        fast = ticket is not None
        if ticket is None:
            tokens = await self._prompt_tokens(path, body)
            try:
                ticket = await self.desk.admit(tokens, pinned)
            except FrontDeskError as exc:
                return error_response(exc.status, exc.message, "unavailable_error" if exc.status == 503 else
                                      "invalid_request_error")
            ticket.shape = shape
        outcome = Outcome(status=0, processed=False)
        try:
            return await self._forward(request, with_slot(raw, body, ticket.slot), ticket, outcome)
        finally:
            if not fast:
                self.desk.finish(ticket, outcome)
            elif outcome.timings is not None or not outcome.processed:
                self.desk.finish(ticket, outcome, learn=lambda: self._prompt_tokens(path, body))
            else:  # cut short: what the slot holds is known only from the tokens
                asyncio.ensure_future(self._prompt_tokens(path, body)).add_done_callback(
                    lambda f: self._finish_tokenized(ticket, outcome, f))

    def _finish_tokenized(self, ticket: Ticket, outcome: Outcome, f: asyncio.Future[TokenArray | None]) -> None:
        ticket.tokens = None if f.cancelled() or f.exception() is not None else f.result()
        self.desk.finish(ticket, outcome)

    async def _forward(self, request: web.Request, data: bytes, ticket: Ticket,
                       outcome: Outcome) -> web.StreamResponse:
        """Send the request on and the answer back; the client has all of it before ``finish``."""
        url, _key = self._upstream()
        assert self._session is not None
        headers = self._headers(request)
        headers["Content-Type"] = "application/json"
        sse = SseTimings()
        try:
            async with self._session.post(url + request.path_qs, data=data, headers=headers) as up:
                outcome.status = up.status
                if up.content_type == "text/event-stream":
                    outcome.processed = up.status == 200
                    try:
                        return await self._relay(request, up, sse.feed)
                    finally:
                        outcome.timings = sse.timings
                body = await up.read()
                outcome.processed = up.status == 200
                if outcome.processed:
                    outcome.timings = timings_of(body)
                resp = web.Response(body=body, status=up.status,
                                    headers={k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP})
                await resp.prepare(request)
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectionError:
            outcome.processed = ticket.slot is not None  # the server may have worked on it before it went
            return error_response(503, "llama-server went away during the request (it is being restarted)",
                                  "unavailable_error")

    async def _prompt_tokens(self, path: str, body: dict[str, Any]) -> TokenArray | None:
        """The request's prompt as llama-server will tokenize it (None when it cannot be known)."""
        url, key = self._upstream()
        assert self._session is not None
        headers = {"Authorization": f"Bearer {key}"}
        try:
            if path in CHAT_PATHS:
                async with self._session.post(url + "/apply-template", json=body, headers=headers) as r:
                    if r.status != 200:
                        return None
                    prompt: Any = orjson.loads(await r.read()).get("prompt")
            elif path in COMPLETION_PATHS:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and prompt:
                    return token_list(prompt)
            else:
                return None
            if not isinstance(prompt, str):
                return None
            async with self._session.post(url + "/tokenize", headers=headers,
                                          json={"content": prompt, "add_special": True, "parse_special": True}) as r:
                if r.status != 200:
                    return None
                return tokens_from_json(orjson.loads(await r.read()).get("tokens", []))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError) as exc:
            log.debug("could not tokenize the request: %s", exc)
            return None


def parse_object(raw: bytes) -> dict[str, Any] | None:
    """A request body that is a JSON object, or None (then llama-server answers it as it would)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # orjson refuses what JSON allows but it does not (integers past 64 bits)
            body = json.loads(raw)
        except ValueError:
            return None
    return body if isinstance(body, dict) else None


def with_slot(raw: bytes, body: dict[str, Any], slot: int | None) -> bytes:
    """The request body to send on, with ``id_slot`` set to the slot the front desk chose.

    The client's bytes are kept as they are and the field is put in front, unless the client
    named a slot itself (then the body is written anew, so the key appears once)."""
    if slot is None:
        return raw
    if "id_slot" not in body:
        start = raw.find(b"{")
        return b'{"id_slot":%d,' % slot + raw[start + 1:] if body else b'{"id_slot":%d}' % slot
    return orjson.dumps({**body, "id_slot": slot})


def token_list(prompt: list[Any]) -> TokenArray | None:
    """A prompt given as token ids, or None when it is anything else (text pieces, mixed, empty)."""
    return tokens_from_json(prompt) if prompt else None


def timings_of(data: bytes) -> dict[str, Any] | None:
    """The ``timings`` object of a response (it comes last: only that part is read)."""
    at = data.rfind(b'"timings"')
    if at < 0:
        return None
    start = data.find(b"{", at)
    if start < 0:
        return None
    try:
        t, _end = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return t if isinstance(t, dict) and "prompt_n" in t else None


_DECODER = json.JSONDecoder()


class SseTimings:
    """Finds the ``timings`` a stream carries (in its last events) without holding the stream up."""

    def __init__(self) -> None:
        self._buffer = b""
        self.timings: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:") or b"timings" not in line:
                continue
            t = timings_of(line[5:].strip())
            if t is not None:
                self.timings = t
