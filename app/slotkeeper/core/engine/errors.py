"""Errors the engine raises for a person to act on."""

from __future__ import annotations


class EngineError(Exception):
    """A problem a person can act on (bad model, missing binary, server not ready, ...)."""


class FrontDeskError(Exception):
    """A request the front door answers itself (``status``), with words a client can show."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after  # seconds, for a 503's Retry-After
