"""A typed httpx client for llama-server's HTTP API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT_TIMEOUT = 10.0
SLOT_ACTION_TIMEOUT = 600.0  # a busy slot defers the action until it is idle; big files take time


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


def _error_message(resp: httpx.Response) -> tuple[str, str | None]:
    try:
        body = resp.json()
    except ValueError:
        return (resp.text.strip() or resp.reason_phrase), None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", resp.reason_phrase)), err.get("type")
    if isinstance(err, str):
        return err, None
    return resp.text.strip() or resp.reason_phrase, None


class LlamaClient:
    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT, api_key: str | None = None,
                 slot_action_timeout: float = SLOT_ACTION_TIMEOUT):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.slot_action_timeout = slot_action_timeout
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------
    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            raise ServerUnavailable(f"llama-server at {self.base_url} timed out ({url})") from exc
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"llama-server at {self.base_url} is not answering: {exc}") from exc
        if resp.status_code >= 400:
            message, etype = _error_message(resp)
            raise ServerError(resp.status_code, message, etype)
        return resp

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        resp = self._request(method, url, **kwargs)
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerError(resp.status_code, f"invalid JSON from {url}") from exc

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

    def detokenize(self, tokens: list[int]) -> str:
        d = self._json("POST", "/detokenize", json={"tokens": list(tokens)})
        return str(d.get("content", ""))

    def _slot_action(self, slot: int, action: str, body: dict[str, Any] | None, timeout: float | None) -> Any:
        if slot < 0:
            raise ValueError(f"slot id {slot} is negative")
        return self._json(
            "POST",
            f"/slots/{slot}",
            params={"action": action},
            json=body or {},
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
