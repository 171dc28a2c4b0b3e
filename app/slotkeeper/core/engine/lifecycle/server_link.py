"""llama-server as the engine reaches it: its private address and Slotkeeper's client of it, the
facts of the running server (model, build, KV settings), and whether it takes requests now.

Loop-owned: the engine sets what a launch planned and what the server's facts are; the front desk,
the slot actions and the poller read them. Nothing here calls back into the engine.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from slotkeeper.core.engine.errors import FrontDeskError
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import LLAMA_BUILD_FALLBACK, ModelChoice
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.server.private import PrivateAddress
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.server.supervisor import Supervisor
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import ServerProfile

SLOT_ACTION_TIMEOUT_SECONDS = 600.0  # a busy slot defers the action until it is idle
READY_WAIT_SECONDS = 600.0  # a request that arrives while the server starts waits this long
NOWHERE = ("http://127.0.0.1:1", "")  # before any launch: nothing listens there


class ServerLink:
    def __init__(self, supervisor: Supervisor, loop: EngineLoop) -> None:
        self.supervisor = supervisor
        self.loop = loop
        self.closed = False  # the engine is quitting: no request waits for a server that will not come
        self.private: PrivateAddress | None = None  # llama-server's own port and key
        self.launched: ServerProfile | None = None  # what the running server was started with
        self.flash_attn = False  # what --flash-attn passed it (the setting's "auto" resolved)
        self.staging = Path()  # its --slot-save-path: where it writes and reads slot files
        self.model: ModelChoice | None = None
        self.facts: ServerFacts | None = None  # of the running server, once it is ready
        self.llama_build = LLAMA_BUILD_FALLBACK
        self.serving = asyncio.Event()  # set while the server is ready for requests
        self.crashed = False  # since a crash, until its restart's launch restores are done
        self._http: LlamaClient | None = None
        self._starting_since: float | None = None  # when the current launch began (monotonic)
        self._load_seconds = 1.0  # how long the last launch took to be ready
        self._restart_at = 0.0  # when a restart after a crash launches (monotonic)

    # -- the private address --------------------------------------------------------------
    def upstream(self) -> tuple[str, str]:
        """llama-server's private base URL and key (the front door's way in)."""
        private = self.private
        return NOWHERE if private is None else (private.url, private.key)

    def client(self) -> LlamaClient:
        """Slotkeeper's own client of llama-server (its private address and key)."""
        if self._http is None:
            url, key = self.upstream()
            self._http = LlamaClient(url, timeout=10.0, api_key=key or None,
                                     slot_action_timeout=SLOT_ACTION_TIMEOUT_SECONDS)
        return self._http

    def close_client(self) -> None:
        """A client of the previous address is not kept (closed off the loop)."""
        http, self._http = self._http, None
        if http is not None:
            self.loop.in_background(http.close, what="closing the HTTP client")

    def launching(self, private: PrivateAddress, profile: ServerProfile, model: ModelChoice,
                  flash_attn: bool, staging: Path | None = None) -> None:
        """A launch begins with this address, profile, model, flash attention and staging folder."""
        self.private, self.launched, self.model = private, profile, model
        self.flash_attn = flash_attn
        if staging is not None:
            self.staging = staging
        self.close_client()

    # -- serving ----------------------------------------------------------------------------
    def on_state(self, state: ServerState, delay: float | None) -> None:
        """The supervisor's state changed (on the loop): what the serving gate needs of it."""
        now = time.monotonic()
        if state is ServerState.STARTING:
            self._starting_since = now
        elif state is ServerState.RESTARTING:
            self._restart_at = now + (delay or 0.0)
        elif state is ServerState.READY and self._starting_since is not None:
            self._load_seconds = now - self._starting_since
        if state is not ServerState.READY:
            self.serving.clear()
        if state is ServerState.CRASHED:
            self.crashed = True

    def slot_context(self) -> int:
        """Tokens of context each slot of the running server has (0 while not known)."""
        return self.facts.n_ctx_slot if self.facts is not None else 0

    def serving_with_facts(self) -> bool:
        """Ready for requests, and the running server's facts are known."""
        return self.serving.is_set() and self.facts is not None

    def serving_now(self) -> bool:
        """The server takes requests right now (on the loop: no waiting)."""
        return self.serving.is_set() and not self.closed

    async def wait_serving(self, timeout: float = READY_WAIT_SECONDS) -> None:
        """Until the server takes requests; FrontDeskError when it is stopped, does not come, or
        is restarting after a crash (503 with Retry-After: the client retries when it is back)."""
        deadline = time.monotonic() + timeout
        while not self.serving.is_set():
            state = self.supervisor.state
            if self.closed or state in (ServerState.STOPPED, ServerState.FAILED):
                message = self.supervisor.message
                why = f": {message}" if state is ServerState.FAILED and message else ""
                raise FrontDeskError(503, f"llama-server is not running{why}")
            if self.crashed:
                raise FrontDeskError(503, "llama-server stopped unexpectedly and is being restarted; "
                                          "try again shortly", retry_after=self.restart_eta())
            if time.monotonic() > deadline:
                raise FrontDeskError(503, "llama-server is not ready yet; try again shortly",
                                     retry_after=self.restart_eta())
            try:
                await asyncio.wait_for(self.serving.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    def restart_eta(self) -> float:
        """Seconds until llama-server should take requests again: the restart's delay, and as long
        as its last launch took to load."""
        return max(1.0, self._restart_at - time.monotonic()) + self._load_seconds

    def running_profile(self, settings_profile: ServerProfile) -> ServerProfile:
        return self.launched or settings_profile
