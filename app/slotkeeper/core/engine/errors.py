"""Errors the engine raises for a person to act on."""

from __future__ import annotations


class EngineError(Exception):
    """A problem a person can act on (bad model, missing binary, server not ready, ...)."""
