"""A small typed client for llama-server's HTTP API, on the standard library's http.client.

llama-server runs on this machine and Slotkeeper talks to it over plain HTTP: a few keep-alive
connections in a thread-safe pool are all this needs. (httpx, used for the Hub downloads only,
costs megabytes of memory and a noticeable part of start-up to import.)
"""

from __future__ import annotations

import http.client
import json
import select
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

DEFAULT_TIMEOUT = 10.0
SLOT_ACTION_TIMEOUT = 600.0  # a busy slot defers the action until it is idle; big files take time
# Idle connections kept for reuse, and for how long: llama-server (cpp-httplib) closes a
# keep-alive connection after 5 s idle; dropping it a little sooner spares a request the retry.
MAX_IDLE_CONNECTIONS = 4
KEEPALIVE_EXPIRY = 4.0
# Failures that mean a reused connection had been closed by the server before our request reached it.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class ServerError(Exception):
    """The server answered with an error; ``message`` is the server's own words."""

    def __init__(self, status: int, message: str, error_type: str | None = None) -> None:
        super().__init__(f"llama-server answered {status}: {message}")
        self.status = status
        self.message = message
        self.error_type = error_type


class ServerUnavailable(Exception):
    """Nothing answered (not started, gone, or timed out)."""


@dataclass(frozen=True)
class Health:
    ok: bool
    loading: bool
    message: str = ""


@dataclass(frozen=True)
class Props:
    model_path: str
    total_slots: int
    n_ctx_slot: int
    build_info: str
    chat_template: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class SlotInfo:
    id: int
    n_ctx: int
    is_processing: bool
    id_task: int | None = None
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_prompt_tokens_cache: int = 0
    n_decoded: int = 0
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class SaveResult:
    slot: int
    filename: str
    n_saved: int
    n_written: int
    save_ms: float


@dataclass(frozen=True)
class RestoreResult:
    slot: int
    filename: str
    n_restored: int
    n_read: int
    restore_ms: float


@dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


def _error_message(resp: _Response) -> tuple[str, str | None]:
    try:
        body = resp.json()
    except ValueError:
        return (resp.text.strip() or resp.reason), None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", resp.reason)), err.get("type")
    if isinstance(err, str):
        return err, None
    return resp.text.strip() or resp.reason, None


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """True if an idle connection can no longer be used: the server closed it (an idle keep-alive
    connection that is readable has seen the end of the stream, as in urllib3's is_connection_dropped)."""
    sock = conn.sock
    if sock is None:
        return True
    if sys.platform != "win32":  # select.select() fails on descriptors past FD_SETSIZE; Windows has no poll
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


class _StaleConnection(Exception):
    """A reused connection failed before any byte of the answer: the server had closed it."""


# A prompt's tokens as llama-server computes them for a request: a chat's messages rendered by the
# model's template (TEMPLATE_PATH, the request's own rendering fields), then the text tokenized as a
# completion's prompt is (TOKENIZE_PATH with tokenize_body: BOS added, special tokens parsed). The
# front door asks so (engine.prompts, on its own connection), for requests and transcripts alike.
TEMPLATE_PATH = "/apply-template"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"


def tokenize_body(content: str | list[Any]) -> dict[str, Any]:
    """A prompt (text, or text and token ids mixed) to tokenize as a completion's prompt."""
    return {"content": content, "add_special": True, "parse_special": True}


def rendered_prompt(answer: Any) -> str | None:
    """The prompt in /apply-template's answer (None: it gave none)."""
    prompt = answer.get("prompt") if isinstance(answer, dict) else None
    return prompt if isinstance(prompt, str) else None


class LlamaClient:
    """Safe to share between threads: each request has a connection to itself, taken from a small
    pool of keep-alive connections (or a new one) and given back when the answer is read."""

    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT, api_key: str | None = None,
                 slot_action_timeout: float = SLOT_ACTION_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.slot_action_timeout = slot_action_timeout
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http:// URL: {base_url!r}")
        self._connection_class = (http.client.HTTPSConnection if url.scheme == "https"
                                  else http.client.HTTPConnection)
        self._host, self._port, self._prefix = url.hostname, url.port, url.path  # hostname: no [brackets]
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._lock = threading.Lock()
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []  # (connection, idle since)
        self._closed = False

    def close(self) -> None:
        """Close the idle connections; a request still running finishes, and so does any made later,
        on a connection of its own that is then closed."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------
    def _request(self, method: str, path: str, params: dict[str, str] | None = None,
                 body: Any = None, timeout: float | None = None) -> _Response:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        timeout = self.timeout if timeout is None else timeout
        try:
            resp = self._send(method, target, payload, headers, timeout)
        except TimeoutError as exc:  # never retried: the server may be working on the request
            raise ServerUnavailable(f"llama-server at {self.base_url} timed out ({path})") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ServerUnavailable(f"llama-server at {self.base_url} is not answering: {exc}") from exc
        if resp.status >= 400:
            message, etype = _error_message(resp)
            raise ServerError(resp.status, message, etype)
        return resp

    def _send(self, method: str, target: str, payload: bytes | None, headers: dict[str, str],
              timeout: float) -> _Response:
        conn = self._idle_connection()
        if conn is not None:
            try:
                return self._exchange(conn, True, method, target, payload, headers, timeout)
            except _StaleConnection:
                pass  # the server closed it just as the request went out: once more, on a new one
        conn = self._connection_class(self._host, self._port, timeout=timeout)
        return self._exchange(conn, False, method, target, payload, headers, timeout)

    def _exchange(self, conn: http.client.HTTPConnection, reused: bool, method: str, target: str,
                  payload: bytes | None, headers: dict[str, str], timeout: float) -> _Response:
        """One request and its whole answer on ``conn``, which is then pooled or closed."""
        try:
            if reused:  # a new connection has it from the start, for connecting too
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, target, body=payload, headers=headers)
                answer = conn.getresponse()
            except _STALE as exc:
                if reused:
                    raise _StaleConnection from exc
                raise
            resp = _Response(answer.status, answer.reason, answer.read())
        except BaseException:
            conn.close()
            raise
        if answer.will_close:
            conn.close()
        else:
            self._release(conn)
        return resp

    def _idle_connection(self) -> http.client.HTTPConnection | None:
        """The most recently used idle connection still open, or None."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            if time.monotonic() - since < KEEPALIVE_EXPIRY and not _dropped(conn):
                return conn
            conn.close()

    def _release(self, conn: http.client.HTTPConnection) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [c for c, since in self._idle if now - since >= KEEPALIVE_EXPIRY]
            self._idle = [(c, since) for c, since in self._idle if now - since < KEEPALIVE_EXPIRY]
            keep = not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS
            if keep:
                self._idle.append((conn, now))
        for c in expired if keep else [*expired, conn]:
            c.close()

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerError(resp.status, f"invalid JSON from {path}") from exc

    # -- endpoints ------------------------------------------------------------------------
    def health(self) -> Health:
        try:
            self._request("GET", "/health")
        except ServerError as exc:
            if exc.status == 503:
                return Health(False, True, exc.message)
            return Health(False, False, exc.message)
        return Health(True, False, "ok")

    def props(self) -> Props:
        d = self._json("GET", "/props")
        gen = d.get("default_generation_settings") or {}
        return Props(
            model_path=str(d.get("model_path", "")),
            total_slots=int(d.get("total_slots", 1)),
            n_ctx_slot=int(gen.get("n_ctx", 0)),
            build_info=str(d.get("build_info", "")),
            chat_template=str(d.get("chat_template", "")),
            raw=d,
        )

    def slots(self) -> list[SlotInfo]:
        out = []
        for s in self._json("GET", "/slots"):
            next_tokens = s.get("next_token") or []
            n_decoded = 0
            if next_tokens and isinstance(next_tokens, list):
                n_decoded = int(next_tokens[0].get("n_decoded", 0))
            out.append(
                SlotInfo(
                    id=int(s["id"]),
                    n_ctx=int(s.get("n_ctx", 0)),
                    is_processing=bool(s.get("is_processing", False)),
                    id_task=s.get("id_task"),
                    n_prompt_tokens=int(s.get("n_prompt_tokens", 0) or 0),
                    n_prompt_tokens_processed=int(s.get("n_prompt_tokens_processed", 0) or 0),
                    n_prompt_tokens_cache=int(s.get("n_prompt_tokens_cache", 0) or 0),
                    n_decoded=n_decoded,
                    raw=s,
                )
            )
        return out

    def tokenize(self, text: str) -> list[int]:
        """``text`` as llama-server tokenizes a prompt (``tokenize_body``)."""
        d = self._json("POST", TOKENIZE_PATH, body=tokenize_body(text))
        return [int(t) for t in d.get("tokens", [])]

    def detokenize(self, tokens: list[int]) -> str:
        d = self._json("POST", DETOKENIZE_PATH, body={"tokens": list(tokens)})
        return str(d.get("content", ""))

    def _slot_action(self, slot: int, action: str, body: dict[str, Any] | None, timeout: float | None) -> Any:
        if slot < 0:
            raise ValueError(f"slot id {slot} is negative")
        return self._json(
            "POST",
            f"/slots/{slot}",
            params={"action": action},
            body=body or {},
            timeout=self.slot_action_timeout if timeout is None else timeout,
        )

    def save_slot(self, slot: int, filename: str, timeout: float | None = None) -> SaveResult:
        """llama-server writes the slot to ``filename`` in its slot-save folder; a busy slot is
        saved once it is idle, so this may wait up to ``timeout`` seconds."""
        d = self._slot_action(slot, "save", {"filename": filename}, timeout)
        return SaveResult(
            slot=int(d.get("id_slot", slot)),
            filename=str(d.get("filename", filename)),
            n_saved=int(d.get("n_saved", 0)),
            n_written=int(d.get("n_written", 0)),
            save_ms=float((d.get("timings") or {}).get("save_ms", 0.0)),
        )

    def restore_slot(self, slot: int, filename: str, timeout: float | None = None) -> RestoreResult:
        d = self._slot_action(slot, "restore", {"filename": filename}, timeout)
        return RestoreResult(
            slot=int(d.get("id_slot", slot)),
            filename=str(d.get("filename", filename)),
            n_restored=int(d.get("n_restored", 0)),
            n_read=int(d.get("n_read", 0)),
            restore_ms=float((d.get("timings") or {}).get("restore_ms", 0.0)),
        )

    def erase_slot(self, slot: int, timeout: float | None = None) -> int:
        """Empty the slot's cache (the next request is computed from scratch)."""
        d = self._slot_action(slot, "erase", None, timeout)
        return int(d.get("n_erased", 0))

    def complete(self, tokens: list[int], n_predict: int,
                 timeout: float | None = None) -> tuple[dict, list[int]]:
        """A greedy completion of ``tokens`` that generates exactly ``n_predict`` tokens (the end of
        text ignored), reusing what the slot holds: llama-server's timings and the tokens generated."""
        d = self._json("POST", "/completion", body={
            "prompt": list(tokens), "n_predict": n_predict, "cache_prompt": True, "temperature": 0,
            "ignore_eos": True, "return_tokens": True, "stream": False,
        }, timeout=timeout)
        if not isinstance(d, dict):
            raise ServerError(200, "a completion that is not a JSON object")
        return dict(d.get("timings") or {}), [int(t) for t in d.get("tokens") or []]

    def hold_prefix(self, slot: int, tokens: list[int], timeout: float | None = None) -> int:
        """Leave ``slot`` holding exactly ``tokens``, a prefix of what it holds: a completion of them
        with nothing to generate (``n_predict`` 0), which llama-server serves by rolling back
        through its context checkpoints (for models that cannot roll back otherwise) and keeps in
        the slot without the one token it samples. Returns the prompt tokens it had to evaluate."""
        d = self._json("POST", "/completion", body={
            "prompt": list(tokens), "n_predict": 0, "id_slot": slot, "cache_prompt": True,
            "temperature": 0, "return_tokens": False, "stream": False,
        }, timeout=self.slot_action_timeout if timeout is None else timeout)
        timings = d.get("timings") or {} if isinstance(d, dict) else {}
        if int(timings.get("cache_n", 0) or 0) + int(timings.get("prompt_n", 0) or 0) != len(tokens):
            raise ServerError(200, f"slot {slot} was asked to hold {len(tokens)} tokens but llama-server "
                                   f"read {timings.get('cache_n')} + {timings.get('prompt_n')}")
        return int(timings.get("prompt_n", 0) or 0)
