"""The front door: the address clients use. llama-server's public endpoints pass through it.

llama-server listens on a private port of 127.0.0.1 and demands a random key only Slotkeeper
knows; clients talk to the front door (the host and port in the settings), which:

- makes every request target canonical and looks it up in one table of llama-server's endpoints
  (``endpoints``): what is not in it is never forwarded, and what is forwarded is exactly the
  canonical path that was judged;
- checks the user's own API key (``apikey.DoorKeys``: llama-server's rules; a key file that
  cannot be read shuts the door rather than opening it) except for the public endpoints;
- refuses what would go behind Slotkeeper's back: the slot-file actions (``POST /slots/N``),
  run-time LoRA changes (they change what a saved KV cache means), model loading, and requests
  that would run on a slot it cannot choose;
- routes every generation request (chat, completion, infill, responses, messages) to a slot
  through the engine's front desk, which saves, restores or erases that slot first when needed,
  and tells it what the response's ``timings`` say afterwards;
- passes everything else through as it is. Streams are forwarded chunk by chunk as they come;
  a client that goes away closes the request's upstream connection, which cancels a streamed
  request at once; a non-streamed generation is asked as a stream and answered as llama-server
  answers it unstreamed (``unstream``), so it stops too. Bodies are bounded as
  llama-server bounds them (100 MiB), read once, and the requests and bytes in flight are bounded
  too.

It runs on the engine loop (aiohttp's server and client), so routing reads the engine's state
directly. No HTTP is parsed by hand.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from yarl import URL

from slotkeeper.core.basics import ports
from slotkeeper.core.basics.tokens import TokenArray
from slotkeeper.core.chat.conversions import (
    MESSAGES_AS_CHAT_PATH,
    MessagesStream,
    message_answer_bytes,
    messages_as_chat,
    sse_event,
    without_extras,
)
from slotkeeper.core.engine.desk.frontdesk import FrontDeskError, Outcome, Ticket, request_shape
from slotkeeper.core.engine.door import endpoints, own
from slotkeeper.core.engine.door.endpoints import BadTarget, Endpoint, canonical_target
from slotkeeper.core.engine.door.httpstack import aiohttp, web
from slotkeeper.core.engine.door.prompts import CONVERSIONS, PromptTokens, resetting_socket, single_prompt
from slotkeeper.core.engine.door.shapes import SAMPLING_FIELDS, PromptSource
from slotkeeper.core.engine.door.unstream import Unstreamed, answer_kind, streamed_request
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.server.apikey import DoorKeys, KeyUnavailable, exposure_refusal
from slotkeeper.core.server.command import SSE_PING_DEFAULT, sse_ping_interval, user_wants
from slotkeeper.core.server.supervisor import port_user
from slotkeeper.core.services.running import clear_door, publish_door
from slotkeeper.core.sessions import transcripts
from slotkeeper.core.sessions.transcripts import ReplyCollector, SseReader, conversation

if TYPE_CHECKING:
    from pathlib import Path

    from slotkeeper.core.engine.desk.frontdesk import FrontDesk
    from slotkeeper.core.engine.lifecycle.loop import EngineLoop
    from slotkeeper.core.sessions.compat import ServerFacts
    from slotkeeper.core.settings import ServerProfile

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 100 * 1024 * 1024  # cpp-httplib's CPPHTTPLIB_PAYLOAD_MAX_LENGTH, as llama-server is built
MAX_IN_FLIGHT = 256  # requests the front door holds at once; beyond, 503 with Retry-After
MAX_BODY_BYTES_IN_FLIGHT = 512 * 1024 * 1024  # request bodies held at once
BUSY_RETRY_SECONDS = 1
SHUTDOWN_GRACE_SECONDS = 1.0
TOKEN_LIMIT = 2**31  # llama-server's token ids are 32-bit
MAX_DOUBLE = 1.7976931348623157e308  # a JSON number llama-server reads past this overflows
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length", "authorization",
                        "x-api-key"})


def error_response(status: int, message: str, error_type: str = "invalid_request_error",
                   retry_after: float | None = None) -> web.Response:
    """An error in llama-server's own shape, so clients show it as they show the server's."""
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return web.Response(body=orjson.dumps({"error": {"code": status, "message": message,
                                                     "type": error_type}}),
                        status=status, content_type="application/json", charset="utf-8", headers=headers)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 501: "not_supported_error",
               503: "unavailable_error"}


@dataclass(frozen=True)
class DoorPolicy:
    """What the user chose for the door: the keys, and which optional endpoints clients may use
    (llama-server's ``--no-slots`` and ``--metrics``: Slotkeeper itself always has both)."""

    keys: DoorKeys | None = None
    slots: bool = True
    metrics: bool = False
    n_slots: int = 0  # 0: not known yet
    sse_ping: int = SSE_PING_DEFAULT  # llama-server's --sse-ping-interval: seconds, <= 0 none


def door_policy(profile: ServerProfile, keys: DoorKeys, facts: ServerFacts | None) -> DoorPolicy:
    """What clients may reach through the door of a server run with ``profile``, and with which keys."""
    return DoorPolicy(keys, slots=user_wants(profile.extra_args, "slots"),
                      metrics=user_wants(profile.extra_args, "metrics"),
                      n_slots=facts.n_parallel if facts is not None else profile.parallel,
                      sse_ping=sse_ping_interval(profile.extra_args))


async def open_door(front: FrontDoor, profile: ServerProfile, loop: EngineLoop, record: Path,
                    sock: socket.socket | None = None) -> None:
    """``front`` listens on the user's address (``sock``: claimed already), which ``record`` keeps
    for Slotkeeper's command line (``services.running``); EngineError with a sentence for a person
    when it may not (exposed without a key) or cannot (the port is taken)."""
    refusal = exposure_refusal(profile.host, profile.port, profile.extra_args)
    if refusal:
        raise EngineError(refusal)
    try:
        await front.start(profile.host, profile.port, sock=sock)
    except OSError as exc:
        who = await loop.run_io(port_user, profile.host, profile.port)
        what = (f"Port {profile.port} on {profile.host} is already in use by {who}" if who
                else f"Cannot listen on {profile.host} port {profile.port}: {exc.strerror or exc}")
        raise EngineError(f"{what}. Choose another port in Settings (or --port); Slotkeeper does not "
                          "stop programs it did not start.") from exc
    loop.in_background(publish_door, record, profile.base_url, what="recording the front door's address")


async def close_door(front: FrontDoor, loop: EngineLoop, record: Path) -> None:
    await front.stop()
    loop.in_background(clear_door, record, what="removing the front door's record")


PING = b":\n\n"  # llama-server's SSE comment ping (a line a client's SSE parser skips)


class SseWriter:
    """Writes a stream's bytes to the client, and an SSE comment (``PING``) whenever ``interval``
    seconds pass without a write, between events only: so a client that times out a silent
    connection keeps it through a long prefill or any longer pause, as llama-server's own pings
    would keep it (Slotkeeper's polls of /slots keep those from coming: llama-server pings only
    after a quiet second). The events' bytes are never changed."""

    def __init__(self, resp: web.StreamResponse, interval: float) -> None:
        self.resp = resp
        self.interval = interval
        self.between = True  # what was written ends an event (or nothing was)
        self.last = asyncio.get_running_loop().time()

    async def write(self, data: bytes) -> None:
        if data:
            await self.resp.write(data)
            self.between = data.endswith(b"\n\n")
            self.last = asyncio.get_running_loop().time()

    async def pump(self, read: Callable[[], Awaitable[bytes]], out: Callable[[bytes], bytes]) -> None:
        """``read`` chunks until it gives b"", writing ``out(chunk)`` of each; pinging in silences."""
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[bytes] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(read())
                timeout = None if self.interval <= 0 else max(0.0, self.last + self.interval - loop.time())
                done, _ = await asyncio.wait({pending}, timeout=timeout)
                if not done:
                    if self.between:
                        await self.resp.write(PING)
                    self.last = loop.time()
                    continue
                chunk = pending.result()
                pending = None
                if not chunk:
                    return
                await self.write(out(chunk))
        finally:
            if pending is not None:
                pending.cancel()


class BadBody(ValueError):
    """A body the front door refuses to route (400 with the reason)."""


class FrontDoor:
    def __init__(self, desk: FrontDesk, prompts: PromptTokens, upstream: Callable[[], tuple[str, str]],
                 policy: DoorPolicy) -> None:
        """``prompts``: a request's tokens, asked of llama-server; ``upstream()`` gives llama-server's
        private base URL and key now; ``policy``: what clients may reach and with which keys (the
        engine replaces it when that changes)."""
        self.desk = desk
        self.prompts = prompts
        self._upstream = upstream
        self.policy = policy
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self.host = ""
        self.port = 0
        self._in_flight = 0
        self._bytes_in_flight = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        """Listen on ``host`` ``port``, or on ``sock``: that address, already claimed."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_response_prepare.append(_no_server_header)
        # A stop does not wait for requests in flight (llama-server stops at once too): they are cut
        # after a moment, and the conversations they ran on are saved as the server stops.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                               shutdown_timeout=SHUTDOWN_GRACE_SECONDS)
        await runner.setup()
        made: list[socket.socket] = []
        try:
            # Our own sockets, not TCPSite's: its reuse_address is SO_REUSEADDR, with which Windows binds
            # over a busy port (ports.listen_on has each platform's options and refusals).
            if sock is None:
                made = ports.listen_on(host, port)
            for each in made if sock is None else [sock]:
                await web.SockSite(runner, each).start()
        except OSError as exc:
            for each in made:  # the ones no site took yet (closing one twice does nothing)
                each.close()
            await runner.cleanup()
            raise OSError(exc.errno, f"cannot listen on {host} port {port}: {exc.strerror or exc}") from exc
        self._runner = runner
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        # Kept alive: requests passed through as they are (idempotent ones, retried when a kept
        # connection turns out closed); a new connection for each request on a slot (llama-server
        # closes one after every streamed answer, so a kept one could be dead when a request needs it).
        self.prompts.open()
        self._session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, force_close=False, socket_factory=resetting_socket))
        self._fresh = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, force_close=True, socket_factory=resetting_socket))
        self.host, self.port = host, port
        log.info("front door listening on %s port %s", host, port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        await self.prompts.close()
        self._session = self._fresh = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    # -- requests -------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self._in_flight >= MAX_IN_FLIGHT:
            return error_response(503,
                                  "Slotkeeper is holding as many requests as it takes; try again shortly",
                                  "unavailable_error", retry_after=BUSY_RETRY_SECONDS)
        self._in_flight += 1
        try:
            return await self._dispatch(request)
        except FrontDeskError as exc:
            return error_response(exc.status, exc.message, ERROR_TYPES.get(exc.status, "server_error"),
                                  retry_after=exc.retry_after)
        except BadBody as exc:
            return error_response(400, str(exc))
        except (asyncio.CancelledError, web.HTTPException):
            raise
        except aiohttp.ClientResponseError as exc:  # e.g. a 204 with a body, which HTTP does not allow
            log.warning("llama-server's answer to %s %s could not be read: %s", request.method,
                        request.rel_url, exc)
            return error_response(502, f"llama-server's answer could not be read: {exc.message}",
                                  "server_error")
        except Exception as exc:  # never a bare 500: the client sees what went wrong, the log the rest
            log.exception("the front door failed on %s %s", request.method, request.rel_url)
            return error_response(500, f"Slotkeeper could not handle this request: {exc}", "server_error")
        finally:
            self._in_flight -= 1

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            path, query = canonical_target(request.raw_path)
        except BadTarget as exc:
            return error_response(400, f"Bad request target: {exc}")
        if request.method == "OPTIONS":  # a browser's CORS preflight: llama-server answers it, without a key
            return await self._pass(request, path, query, b"")
        policy = self.policy
        ep = endpoints.endpoint(request.method, path)
        if ep is None or ep.kind != endpoints.PUBLIC:
            denied = self._denied(request, policy)
            if denied is not None:
                return denied
        if ep is None:
            return error_response(404, "File Not Found", "not_found_error")
        if ep.kind == endpoints.REFUSED:
            return error_response(ep.status, ep.reason, ERROR_TYPES.get(ep.status, "permission_error"))
        if ep.kind == endpoints.SLOTS and not policy.slots:
            return error_response(501, "This server does not support slots endpoint. Start it with `--slots`",
                                  "not_supported_error")
        if ep.kind == endpoints.METRICS and not policy.metrics:
            return error_response(501,
                                  "This server does not support metrics endpoint. Start it with `--metrics`",
                                  "not_supported_error")
        raw = await self._read_body(request)
        try:
            if ep.kind == endpoints.GENERATE:
                return await self._generate(request, path, query, ep, raw, policy)
            if ep.json_body:
                read_json(raw)  # BadBody: what llama-server's parser would refuse or not survive
            if ep.kind == endpoints.OWN:
                status, said = await own.transcript_check(self.desk.library, self.desk.link.facts,
                                                          self.prompts, raw)
                return web.json_response(said) if status == 200 else error_response(status, str(said))
            return await self._pass(request, path, query, raw)
        finally:
            self._bytes_in_flight -= len(raw)

    def _denied(self, request: web.Request, policy: DoorPolicy) -> web.Response | None:
        """None when the request may go on (no key set, or the right one), else the answer."""
        keys = policy.keys
        if keys is None or not keys.required:
            return None
        given = request.headers.get("Authorization") or request.headers.get("X-Api-Key") or ""
        if given.startswith("Bearer "):
            given = given[len("Bearer "):]
        try:
            if keys.check(given):
                return None
        except KeyUnavailable as exc:
            log.warning("refusing a request: %s", exc)
            return error_response(503, f"Slotkeeper cannot check API keys: {exc}", "unavailable_error",
                                  retry_after=BUSY_RETRY_SECONDS)
        return error_response(401, "Invalid API Key", "authentication_error")

    async def _read_body(self, request: web.Request) -> bytes:
        """The request body, read once; bounded per request (413) and in all (503)."""
        length = request.content_length or 0
        if length > MAX_BODY_BYTES:
            raise FrontDeskError(413, f"the request body is {length:,} bytes; llama-server takes at most "
                                      f"{MAX_BODY_BYTES:,}")
        if self._bytes_in_flight + length > MAX_BODY_BYTES_IN_FLIGHT:
            raise FrontDeskError(503,
                                 "Slotkeeper is holding as much request data as it takes; try again shortly",
                                 retry_after=BUSY_RETRY_SECONDS)
        self._bytes_in_flight += length
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise FrontDeskError(413,
                                 f"the request body is larger than llama-server takes ({MAX_BODY_BYTES:,} "
                                 "bytes)") from exc
        finally:
            self._bytes_in_flight -= length
        self._bytes_in_flight += len(raw)
        return raw

    def _url(self, path: str, query: str) -> URL:
        base, _key = self._upstream()  # encoded: sent exactly as judged, never normalised again
        return URL(f"{base}{path}?{query}" if query else f"{base}{path}", encoded=True)

    def _headers(self, request: web.Request) -> dict[str, str]:
        _url, key = self._upstream()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Authorization"] = f"Bearer {key}"
        return headers

    async def _pass(self, request: web.Request, path: str, query: str, body: bytes) -> web.StreamResponse:
        """A request that runs on no slot, as it is (the upstream answer streamed back)."""
        assert self._session is not None and self._fresh is not None
        # A question that changes nothing may go on a kept connection, and again if that one was closed.
        idempotent = request.method in ("GET", "HEAD", "OPTIONS")
        session = self._session if idempotent else self._fresh
        answered = False
        for attempt in range(2 if idempotent else 1):
            try:
                async with session.request(request.method, self._url(path, query), data=body or None,
                                           headers=self._headers(request)) as up:
                    answered = True
                    return await self._relay(request, up, None, self.policy.sse_ping)
            except aiohttp.ServerDisconnectedError:
                if attempt == 0 and idempotent and not answered:
                    continue  # a kept connection llama-server had closed: nothing was answered yet
            except aiohttp.ClientConnectionError:
                pass
            break
        return error_response(503, "llama-server is not answering (it may be starting or restarting)",
                              "unavailable_error", retry_after=BUSY_RETRY_SECONDS)

    async def _relay(self, request: web.Request, up: aiohttp.ClientResponse,
                     on_chunk: Callable[[bytes], None] | None, ping: float) -> web.StreamResponse:
        """llama-server's answer as it comes; a stream kept alive in silences (``SseWriter``)."""
        headers = answer_headers(up)
        if up.content_type != "text/event-stream" and on_chunk is None:
            body = await up.read()
            return web.Response(body=body, status=up.status, headers=headers)
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)

        def out(chunk: bytes) -> bytes:
            if on_chunk is not None:
                on_chunk(chunk)
            return chunk

        sse = up.content_type == "text/event-stream"
        await SseWriter(resp, ping if sse else 0).pump(up.content.readany, out)
        await resp.write_eof()
        return resp

    async def _relay_as_messages(self, request: web.Request, up: aiohttp.ClientResponse,
                                 reply: ReplyCollector, ping: float) -> web.StreamResponse:
        """A streamed chat completion, sent back as the events of llama-server's streamed Messages
        answer (an error event ends it if llama-server goes away meanwhile); kept alive in
        silences (``SseWriter``)."""
        resp = web.StreamResponse(status=up.status, headers=answer_headers(up))
        await resp.prepare(request)
        events, chunks = MessagesStream(), SseReader()

        def out(chunk: bytes) -> bytes:
            written = b"".join(events.feed(d) for d in chunks.feed(chunk))
            if written:
                reply.feed_stream(written)
            return written

        try:
            await SseWriter(resp, ping).pump(up.content.readany, out)
        except aiohttp.ClientError:
            await resp.write(sse_event("error", {"code": 503, "message": WENT_AWAY,
                                                 "type": "unavailable_error"}))
        await resp.write_eof()
        return resp

    async def _generate(self, request: web.Request, path: str, query: str, ep: Endpoint, raw: bytes,
                        policy: DoorPolicy) -> web.StreamResponse:
        body = parse_object(raw)  # BadBody: never forwarded unrouted
        pinned = _pinned(ep.prompt_kind, body, policy.n_slots)
        # (the Messages conversion drops n and n_cmpl)
        if policy.n_slots > 1 and ep.prompt_kind != endpoints.PROMPT_MESSAGES:
            many = _several_slots(path, body)
            if many:
                raise FrontDeskError(501, many)
        shape = request_shape(ep.prompt_kind, body) if ep.prompt_kind else None
        ticket = self.desk.admit_continuation(shape, pinned)  # the next turn of what a slot holds
        fast = ticket is not None
        if ticket is None:
            await self.desk.until_serving()  # a request that waits for a restart is tokenized after it
            place = self.desk.arrive()  # in line before tokenizing: first come, first served
            try:
                tokens = await self.prompts.tokens(ep.prompt_kind, body)
            except BaseException:
                self.desk.leave(place)
                raise
            ticket = await self.desk.admit(tokens, pinned, place)
            ticket.shape = shape
        outcome = Outcome(status=0, processed=False)
        reply = ReplyCollector()
        learn = PromptSource(ep.prompt_kind, prompt_fields(body))
        try:  # from here on the slot is leased: released below whatever happens
            target, sent, as_messages = path, body, False
            chat = None
            streamed = body.get("stream") is True
            if ep.prompt_kind == endpoints.PROMPT_MESSAGES and (policy.n_slots > 1 or not streamed):
                chat = messages_as_chat(body)  # with two slots; or to be asked as a stream (below)
            if chat is not None:  # llama-server's Messages handler would drop the slot chosen: sent as a chat
                target, sent, as_messages = MESSAGES_AS_CHAT_PATH, chat, True
            # A non-streamed answer is asked as a stream, which stops when its client leaves.
            kind = (answer_kind(target, endpoints.PROMPT_CHAT, without_extras(sent)) if as_messages
                    else answer_kind(target, ep.prompt_kind, sent))
            if kind is not None:
                sent = streamed_request(sent, kind)
            data = (with_slot(raw, body, ticket.slot) if sent is body
                    else with_slot(_dumps(sent), sent, ticket.slot))
            ping = _ping_interval(ep.prompt_kind, body, policy)
            return await self._forward(request, target, query, data, ticket, outcome, reply, ping,
                                       as_messages, kind)
        finally:
            if outcome.processed and outcome.timings is not None:
                as_chat = _as_chat(ep.prompt_kind, body)
                outcome.request = None if as_chat is None else PromptSource(endpoints.PROMPT_CHAT,
                                                                     prompt_fields(as_chat))
                outcome.transcript = _transcript(path, ep.prompt_kind, body, as_chat, reply)
            if not fast:
                self.desk.finish(ticket, outcome)
            elif outcome.timings is not None or not outcome.processed:
                self.desk.finish(ticket, outcome, learn=learn)
            else:  # cut short: what the slot holds is known only from the tokens
                asyncio.ensure_future(self.prompts.tokens(ep.prompt_kind, body)).add_done_callback(
                    lambda f: self._finish_tokenized(ticket, outcome, f))

    async def _unstreamed(self, request: web.Request, up: aiohttp.ClientResponse, kind: str,
                          outcome: Outcome, reply: ReplyCollector, as_messages: bool) -> web.StreamResponse:
        """A stream asked for a non-streamed request, answered as llama-server answers that request
        (``unstream``); a client that leaves meanwhile closes the stream, which stops the task."""
        gathered, events = Unstreamed(kind), SseReader()
        try:
            async for chunk in up.content.iter_any():
                for event in events.feed(chunk):
                    gathered.feed(event)
        except aiohttp.ClientPayloadError:  # cut off mid-stream: llama-server went away
            gathered = Unstreamed(kind)
        answer = gathered.answer()
        if answer is None:
            outcome.processed = True  # the server may have worked on it before it went
            return error_response(503, WENT_AWAY, "unavailable_error", retry_after=BUSY_RETRY_SECONDS)
        status, body = answer
        outcome.status = status
        outcome.processed = status == 200
        if outcome.processed:
            if as_messages:
                body = message_answer_bytes(body)
            reply.feed_body(body)
            outcome.timings = reply.timings
        headers = answer_headers(up)
        headers["Content-Type"] = "application/json; charset=utf-8"
        resp = web.Response(body=body, status=status, headers=headers)
        await resp.prepare(request)
        await resp.write_eof()
        return resp

    def _finish_tokenized(self, ticket: Ticket, outcome: Outcome,
                          f: asyncio.Future[TokenArray | None]) -> None:
        ticket.tokens = None if f.cancelled() or f.exception() is not None else f.result()
        self.desk.finish(ticket, outcome)

    async def _forward(self, request: web.Request, path: str, query: str, data: bytes, ticket: Ticket,
                       outcome: Outcome, reply: ReplyCollector, ping: float,
                       as_messages: bool = False, unstream: str | None = None) -> web.StreamResponse:
        """Send the request on and the answer back (``reply`` assembles it for the transcript); the
        client has all of it before ``finish``. ``as_messages``: a Messages request sent as its chat
        completion, whose answer is written back as llama-server writes a Messages answer."""
        assert self._fresh is not None
        headers = self._headers(request)
        headers["Content-Type"] = "application/json"
        outcome.processed = True  # from here on llama-server may work on it (until it answers otherwise)
        headers_in = False
        try:
            async with self._fresh.post(self._url(path, query), data=data, headers=headers) as up:
                headers_in = True
                outcome.status = up.status
                if up.content_type == "text/event-stream" and unstream is not None:
                    return await self._unstreamed(request, up, unstream, outcome, reply, as_messages)
                if up.content_type == "text/event-stream":
                    outcome.processed = up.status == 200
                    try:
                        if as_messages:
                            return await self._relay_as_messages(request, up, reply, ping)
                        return await self._relay(request, up, reply.feed_stream, ping)
                    finally:
                        outcome.timings = reply.timings
                body = await up.read()
                outcome.processed = up.status == 200
                if outcome.processed:
                    if as_messages:
                        body = message_answer_bytes(body)
                    reply.feed_body(body)
                    outcome.timings = reply.timings
                resp = web.Response(body=body, status=up.status,
                                    headers=answer_headers(up))
                await resp.prepare(request)
                await resp.write_eof()
                return resp
        except asyncio.CancelledError:
            if not headers_in and ticket.slot is not None:
                # A reply not streamed yet: llama-server notices the client left only after a second
                # with no news of any task, which polling /slots would keep from coming.
                self.desk.abandoned(ticket.slot)
            raise
        except aiohttp.ClientConnectionError:
            outcome.processed = ticket.slot is not None  # the server may have worked on it before it went
            return error_response(503, WENT_AWAY, "unavailable_error", retry_after=BUSY_RETRY_SECONDS)



WENT_AWAY = "llama-server went away during the request (it is being restarted)"


def _transcript(path: str, prompt: str | None, body: dict[str, Any], as_chat: dict[str, Any] | None,
                reply: ReplyCollector) -> transcripts.Transcript | None:
    """The conversation as it stands after a request (built after the reply went out; never sent
    anywhere): a chat, or a Messages or Responses request, read from ``as_chat`` (``_as_chat``: the
    messages llama-server's template rendered), a text completion from its prompt. A body it cannot
    be read from is logged and kept without one: the request's slot is released and the door goes
    on serving whatever this raises."""
    try:
        if as_chat is not None:
            given = transcripts.from_request(path, endpoints.PROMPT_CHAT, as_chat)
        else:
            text = single_prompt(body.get("prompt")) if prompt == endpoints.PROMPT_TEXT else None
            given = transcripts.from_request(path, prompt, body, text if isinstance(text, str) else None)
        return conversation(given, reply)
    except Exception:
        log.exception("the conversation of a request to %s could not be written down", path)
        return None


async def _no_server_header(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.pop("Server", None)  # llama-server sends none; neither does its front door


def _pinned(prompt: str | None, body: dict[str, Any], n_slots: int) -> int | None:
    """The slot a request names (``id_slot``), as llama-server reads it: a Messages request's is
    dropped by llama-server's conversion, a Responses request's is wrapped around the slots as
    llama-server wraps it; elsewhere one beyond the slots is refused (the front desk: 400)."""
    pinned = body.get("id_slot")
    if prompt == endpoints.PROMPT_MESSAGES or not isinstance(pinned, int) or isinstance(pinned, bool) \
            or pinned < 0:
        return None
    return pinned % n_slots if prompt == endpoints.PROMPT_RESPONSES and n_slots > 0 else pinned


def _ping_interval(prompt: str | None, body: dict[str, Any], policy: DoorPolicy) -> float:
    """Seconds of silence after which a streamed answer gets an SSE comment: the request's
    ``sse_ping_interval`` as llama-server reads it (its Messages conversion drops the field), else
    the server's."""
    given = body.get("sse_ping_interval")
    if prompt != endpoints.PROMPT_MESSAGES and type(given) is int:
        return given
    return policy.sse_ping


def _several_slots(path: str, body: dict[str, Any]) -> str | None:
    """Why a request would run on more than one slot (so on slots Slotkeeper did not choose)."""
    n = body.get("n_cmpl", body.get("n", 1))
    if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 1:
        return ("Slotkeeper gives each request one slot; several completions at once (n > 1) would take "
                "other slots it did not choose: send them as separate requests")
    return None


def _as_chat(prompt: str | None, body: dict[str, Any]) -> dict[str, Any] | None:
    """The request as the chat completion llama-server rendered its prompt from: a chat as it is, a
    Messages or Responses body converted as llama-server converts it (the conversion the door
    routed by, ``prompts.CONVERSIONS``). Its transcript is read from it, and restore points find its
    last user message in it. None for a request that is no chat."""
    if prompt == endpoints.PROMPT_CHAT:
        return body
    convert = CONVERSIONS.get(prompt or "")
    if convert is None:
        return None
    try:
        return convert(body)
    except Exception:  # noqa: BLE001 - a body llama-server takes but the conversion cannot: no points, no transcript
        log.debug("no chat form of this request", exc_info=True)
    return None


def prompt_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What of a request renders its prompt (the fast path keeps it to learn the tokens later):
    not the sampling settings, never more than that."""
    return {k: v for k, v in body.items() if k not in SAMPLING_FIELDS}


def read_json(raw: bytes) -> Any:
    """A request body as JSON that llama-server can read. BadBody (400, with the reason) for a
    body it would refuse or could not survive: not valid JSON or not UTF-8, a lone surrogate
    escaped in a string, NaN, a number past a double (llama-server: "number overflow"), nesting
    past the parser's depth (llama-server's recursive parser would overflow its stack). A UTF-8
    byte order mark is skipped (llama-server's parser skips it too). Every body the door sends
    on to a parser of llama-server's is read here first."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return orjson.loads(raw)  # at most 1,024 levels deep; no surrogates, NaN or infinities
    except orjson.JSONDecodeError:
        pass
    try:  # what JSON allows but orjson does not (integers past 64 bits); then checked as llama-server reads
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BadBody("the request body is nested too deeply") from None
    except ValueError as exc:
        raise BadBody(f"the request body is not valid JSON: {exc}") from None
    _check_values(body)
    return body


def parse_object(raw: bytes) -> dict[str, Any]:
    """A generation request's body: a JSON object (``read_json``). BadBody (400, with the reason)
    for anything else, so nothing the front door cannot read goes to a slot it did not choose."""
    body = read_json(raw)
    if not isinstance(body, dict):
        raise BadBody("the request body must be a JSON object")
    _check_token_ids(body.get("prompt"))
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_values(body: Any) -> None:
    """What the standard parser lets through and llama-server refuses: a lone surrogate in a string
    or a key, a number no double holds."""
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BadBody("the request body is not valid JSON: a string holds a lone surrogate "
                              f"({value[exc.start]!r}): a surrogate U+D800..U+DBFF must be followed by "
                              "U+DC00..U+DFFF") from None
        elif isinstance(value, float) and not math.isfinite(value) or (
                type(value) is int and abs(value) > MAX_DOUBLE):
            raise BadBody("the request body is not valid JSON: a number overflows a double "
                          "(llama-server: number overflow)")


def _check_token_ids(prompt: Any, depth: int = 0) -> None:
    """Token ids in a prompt fit llama-server's 32 bits (it would cut a larger one silently)."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt_string")
    if not isinstance(prompt, list) or depth > 2:
        return
    for p in prompt:
        if type(p) is int and not 0 <= p < TOKEN_LIMIT:
            raise BadBody(f"token id {p} is out of range")
        if isinstance(p, (list, dict)):
            _check_token_ids(p, depth + 1)


def answer_headers(up: aiohttp.ClientResponse) -> dict[str, str]:
    """llama-server's answer headers the client gets (not the hop-by-hop ones, nor its length)."""
    return {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer past 64 bits
        return json.dumps(body, ensure_ascii=False).encode("utf-8")


def with_slot(raw: bytes, body: dict[str, Any], slot: int | None) -> bytes:
    """The request body to send on, with ``id_slot`` set to the slot the front desk chose.

    The client's bytes are kept as they are and the field is put in front, unless the client
    named a slot itself (then the body is written anew, so the key appears once)."""
    if slot is None:
        return raw
    if "id_slot" not in body:
        start = raw.find(b"{")
        return b'{"id_slot":%d,' % slot + raw[start + 1:] if body else b'{"id_slot":%d}' % slot
    return _dumps({**body, "id_slot": slot})

