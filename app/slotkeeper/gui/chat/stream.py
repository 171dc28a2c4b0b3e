"""A reply streamed through the front door, without ever blocking the window.

``ChatStream`` POSTs ``{base_url}/v1/chat/completions`` with ``"stream": true`` through Qt's
QNetworkAccessManager: the socket is read by Qt's event loop as data arrives (no thread waits on
it), and each server-sent event becomes a signal on the GUI thread (``delta``). ``cancel()`` aborts
the reply, which closes the connection: the front door then cancels the request upstream.

The reply is assembled by the same ``ReplyCollector`` the front door uses for transcripts; the
figures come from the stream's last event (``timings``: ``cache_n`` tokens came from the cache,
``prompt_n`` were read), the time to the first token is measured here.

Failures are said in words (``describe_failure``): a server not ready (503 with Retry-After), a key
refused (401), nothing listening, a connection dropped before the reply ended.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

from slotkeeper.core.sessions.transcripts import CHAT, Message, ReplyCollector, Transcript

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"


def chat_body(transcript: Transcript) -> dict[str, Any]:
    """What continuing ``transcript`` sends: its messages and the options it was rendered with."""
    if transcript.kind != CHAT:
        raise ValueError("only a chat transcript can be continued here")
    return {**transcript.to_openai(), "stream": True}


@dataclass(frozen=True)
class ReplyFigures:
    """How a reply was made: tokens from the cache and read (the stream's ``timings``), and the
    time to its first token as this window measured it."""

    cache_n: int | None = None
    prompt_n: int | None = None
    first_token_s: float | None = None
    predicted_n: int | None = None
    predicted_per_second: float | None = None

    @property
    def prompt_tokens(self) -> int | None:
        if self.cache_n is None or self.prompt_n is None:
            return None
        return self.cache_n + self.prompt_n

    def line(self) -> str:
        """"4,210 of 4,230 tokens from cache · first token 0.08 s"."""
        parts = []
        if self.prompt_tokens is not None:
            parts.append(f"{self.cache_n:,} of {self.prompt_tokens:,} tokens from cache")
        if self.first_token_s is not None:
            parts.append(f"first token {self.first_token_s:.2f} s")
        return " · ".join(parts)


@dataclass
class StreamResult:
    message: Message  # the reply as it stands (cut short when stopped or dropped)
    figures: ReplyFigures
    stopped: bool = False  # the user stopped it
    error: str | None = None  # why it ended early, in words (None: it ended as it should)
    events: int = 0
    finish_reason: str | None = field(default=None)


def describe_failure(status: int | None, body: bytes, retry_after: str | None, network_error: str,
                     base_url: str) -> str:
    """A failure of the request in words (never a traceback)."""
    message = _server_message(body)
    if status == 503:
        wait = ""
        if retry_after and retry_after.strip().isdigit():
            wait = f" Try again in {int(retry_after.strip())} s."
        why = f" ({message})" if message else ""
        return f"The server is not ready to answer{why}.{wait}"
    if status == 401:
        return ("The front door refused the API key (401): Slotkeeper sends the key llama-server was started "
                "with (--api-key / --api-key-file in Settings); check that it is set and readable.")
    if status is not None and status >= 400:
        return f"The server answered {status}: {message or 'no reason given'}."
    if network_error == "refused":
        return f"Nothing answers at {base_url}: start the server first."
    if network_error == "dropped":
        return ("The connection dropped before the reply ended (the server stopped or restarted?). "
                "The text so far is kept.")
    return f"The request failed: {network_error}."


def _server_message(body: bytes) -> str:
    try:
        d = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]
    if isinstance(d, dict):
        err = d.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    return ""


def _int(d: dict, key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) else None


class ChatStream(QObject):
    """One streamed request. Signals arrive on the thread that made it (the GUI thread)."""

    delta = Signal(str, str)  # content added, reasoning added
    finished = Signal(object)  # StreamResult (also after a failure or Stop: see its error / stopped)

    def __init__(self, nam: QNetworkAccessManager, base_url: str, body: dict[str, Any], api_key: str | None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._nam = nam
        self.base_url = base_url.rstrip("/")
        self._body = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self._key = api_key
        self._reply: QNetworkReply | None = None
        self._collector = ReplyCollector()
        self._buffer = b""
        self._error_body = b""
        self._status: int | None = None
        self._started = 0.0
        self._first_token_s: float | None = None
        self._timings: dict[str, Any] = {}
        self._stream_error: str | None = None
        self._finish_reason: str | None = None
        self._events = 0
        self._stopped = False
        self._done = False

    @property
    def running(self) -> bool:
        return self._reply is not None and not self._done

    def start(self) -> None:
        request = QNetworkRequest(QUrl(self.base_url + CHAT_PATH))
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        request.setRawHeader(b"Accept", b"text/event-stream")
        if self._key:
            request.setRawHeader(b"Authorization", f"Bearer {self._key}".encode())
        # No redirects, no cache: a plain request to the user's own address.
        request.setAttribute(QNetworkRequest.Attribute.RedirectPolicyAttribute,
                             QNetworkRequest.RedirectPolicy.ManualRedirectPolicy)
        request.setAttribute(QNetworkRequest.Attribute.CacheLoadControlAttribute,
                             QNetworkRequest.CacheLoadControl.AlwaysNetwork)
        self._started = time.monotonic()
        reply = self._nam.post(request, QByteArray(self._body))
        reply.setParent(self)
        reply.readyRead.connect(self._on_ready_read)
        reply.finished.connect(self._on_finished)
        self._reply = reply

    def cancel(self) -> None:
        """Stop: close the connection (the front door cancels the request upstream)."""
        if self._reply is not None and not self._done:
            self._stopped = True
            self._reply.abort()

    # -- reading --------------------------------------------------------------------------
    def _status_code(self) -> int | None:
        if self._status is None and self._reply is not None:
            v = self._reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
            self._status = int(v) if v is not None else None
        return self._status

    def _on_ready_read(self) -> None:
        reply = self._reply
        if reply is None:
            return
        data = bytes(reply.readAll().data())
        status = self._status_code()
        if status is not None and status != 200:
            self._error_body = (self._error_body + data)[:64 * 1024]
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        content: list[str] = []
        reasoning: list[str] = []
        for line in lines:
            self._event(line.strip(), content, reasoning)
        if content or reasoning:
            self.delta.emit("".join(content), "".join(reasoning))

    def _event(self, line: bytes, content: list[str], reasoning: list[str]) -> None:
        if not line.startswith(b"data:"):
            if line.startswith(b"error:"):  # llama-server names an error event so in some builds
                self._stream_error = line[6:].decode("utf-8", "replace").strip()
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            d = json.loads(payload)
        except ValueError:
            return
        if not isinstance(d, dict):
            return
        self._events += 1
        self._collector.take_event(d)  # the reply as the transcript keeps it (bounded)
        if "error" in d:
            self._stream_error = _server_message(payload) or "the server reported an error"
            return
        if isinstance(d.get("timings"), dict):
            self._timings = d["timings"]
        choices = d.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            c = choices[0]
            if isinstance(c.get("finish_reason"), str):
                self._finish_reason = c["finish_reason"]
            part = c.get("delta")
            if isinstance(part, dict):
                text, thought = part.get("content"), part.get("reasoning_content")
                got = False
                if isinstance(text, str) and text:
                    content.append(text)
                    got = True
                if isinstance(thought, str) and thought:
                    reasoning.append(thought)
                    got = True
                if part.get("tool_calls"):
                    got = True
                if got and self._first_token_s is None:
                    self._first_token_s = time.monotonic() - self._started

    def _on_finished(self) -> None:
        reply = self._reply
        if reply is None or self._done:
            return
        try:
            result = self._result(reply)
        except Exception as exc:  # never a traceback in the window, never a window left waiting
            log.exception("reading the reply failed")
            result = StreamResult(self._collector.message(), ReplyFigures(), self._stopped,
                                  f"The reply could not be read: {exc}")
        self._done = True
        reply.deleteLater()
        self.finished.emit(result)

    def _result(self, reply: QNetworkReply) -> StreamResult:
        if reply.bytesAvailable():
            self._on_ready_read()
        self._done = True
        if self._buffer.strip():
            self._on_ready_read_tail()
        status = self._status_code()
        error: str | None = None
        err = reply.error()
        if self._stopped:
            error = None
        elif status is not None and status != 200:
            retry = bytes(reply.rawHeader("Retry-After").data()).decode("latin-1") or None
            error = describe_failure(status, self._error_body, retry, "", self.base_url)
        elif err == QNetworkReply.NetworkError.ConnectionRefusedError or (
                status is None and err == QNetworkReply.NetworkError.HostNotFoundError):
            error = describe_failure(None, b"", None, "refused", self.base_url)
        elif err != QNetworkReply.NetworkError.NoError:
            if (status is None and self._events == 0
                    and err != QNetworkReply.NetworkError.RemoteHostClosedError):
                error = describe_failure(None, b"", None, reply.errorString(), self.base_url)
            else:
                error = describe_failure(None, b"", None, "dropped", self.base_url)
        elif self._stream_error:
            error = f"The server stopped the reply: {self._stream_error}"
        elif self._finish_reason is None:
            error = describe_failure(None, b"", None, "dropped", self.base_url)
        t = self._timings
        figures = ReplyFigures(_int(t, "cache_n"), _int(t, "prompt_n"), self._first_token_s,
                               _int(t, "predicted_n"),
                               float(t["predicted_per_second"]) if isinstance(t.get("predicted_per_second"),
                                                                             (int, float)) else None)
        return StreamResult(self._collector.message(), figures, self._stopped, error, self._events,
                            self._finish_reason)

    def _on_ready_read_tail(self) -> None:
        """A last event not followed by a newline."""
        content: list[str] = []
        reasoning: list[str] = []
        line, self._buffer = self._buffer, b""
        self._event(line.strip(), content, reasoning)
        if content or reasoning:
            self.delta.emit("".join(content), "".join(reasoning))
