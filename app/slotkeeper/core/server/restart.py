"""Restart policy after a crash: backoff under a named limit, with an injectable clock."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_RESTARTS = 3
RESTART_WINDOW_SECONDS = 600.0
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_seconds: float
    reason: str


class RestartPolicy:
    """At most ``max_restarts`` automatic restarts within ``window_seconds``.

    The n-th restart inside the window waits ``base * 2**(n-1)`` seconds (capped), so a server
    that dies at once does not spin; past the limit the supervisor stays FAILED until a person
    starts it again (``reset()``).
    """

    def __init__(
        self,
        max_restarts: int = MAX_RESTARTS,
        window_seconds: float = RESTART_WINDOW_SECONDS,
        backoff_base: float = BACKOFF_BASE_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_restarts = max_restarts
        self.window_seconds = window_seconds
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._clock = clock
        self._restarts: deque[float] = deque()

    def _forget_old(self, now: float) -> None:
        while self._restarts and now - self._restarts[0] >= self.window_seconds:
            self._restarts.popleft()

    def on_crash(self) -> RestartDecision:
        now = self._clock()
        self._forget_old(now)
        n = len(self._restarts)
        if n >= self.max_restarts:
            minutes = self.window_seconds / 60
            return RestartDecision(
                False,
                0.0,
                f"crashed {n + 1} times within {minutes:g} minutes; not restarting again",
            )
        self._restarts.append(now)
        delay = min(self.backoff_base * (2**n), self.backoff_max)
        return RestartDecision(True, delay, f"restart {n + 1} of {self.max_restarts}")

    def reset(self) -> None:
        self._restarts.clear()
