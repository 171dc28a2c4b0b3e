"""What the running server is, as a saved conversation must record it: the model's SHA-256 (hashed
while llama-server loads the model, with progress), the projector's, and llama-server's own facts
(``/props``), turned into ``ServerFacts`` (what compatibility and the restore mode are judged by).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import (
    ModelChoice,
    llama_build_tag,
    resolve_projector,
    server_facts,
)
from slotkeeper.core.events import ActivityChanged, EventBus
from slotkeeper.core.model.model_hash import ModelHashCache
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import ServerProfile
from slotkeeper.core.views import Activity

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 0.5  # the least time between two progress reports of byte-counting work


def byte_progress(loop: EngineLoop, events: EventBus, activity: str,
                  detail: str) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` for work on an I/O thread that counts bytes (hashing the model,
    downloading the starter model): the activity announced on the loop, at most every
    ``PROGRESS_SECONDS`` and at the end."""
    last = [0.0]

    def progress(done: int, total: int) -> None:  # an I/O thread
        now = time.monotonic()
        if now - last[0] >= PROGRESS_SECONDS or done == total:
            last[0] = now
            loop.call_soon(events.emit, ActivityChanged(Activity(activity, detail, done, total)))

    return progress


class ModelIdentity:
    def __init__(self, hashes: ModelHashCache, loop: EngineLoop, events: EventBus) -> None:
        self.hashes = hashes
        self.loop = loop
        self.events = events
        self._hashing: asyncio.Future[str | None] | None = None

    def begin(self, path: Path) -> None:
        """Hash the model while llama-server loads it (both read the file; the page cache helps).
        Whether it was hashed before is asked off the loop (it reads the hash cache's file)."""
        progress = byte_progress(self.loop, self.events, "hashing", f"identifying {path.name}")

        def hash_unless_known() -> str | None:  # an I/O thread
            return self.hashes.cached(path) or self.hashes.compute(path, progress)

        self._hashing = asyncio.ensure_future(self.loop.run_io(hash_unless_known))

    async def facts(self, model: ModelChoice, profile: ServerProfile,
                    http: LlamaClient) -> tuple[ServerFacts, str]:
        """The running server's facts and llama-server's build tag (the model hashed first)."""
        hashing, self._hashing = self._hashing, None
        if hashing is not None:
            try:
                await hashing
            except Exception as exc:  # retried (and reported) just below
                log.warning("hashing %s failed: %s", model.path, exc)
        sha = await self.loop.run_io(self.hashes.compute, model.path)
        mmproj_sha = await self.loop.run_io(self.projector_sha256, profile)
        self.events.emit(ActivityChanged(Activity()))
        props = await self.loop.run_io(http.props)
        return server_facts(model, sha, props, profile, mmproj_sha), llama_build_tag(props.build_info)

    def projector_sha256(self, profile: ServerProfile) -> str | None:  # an I/O thread
        path = resolve_projector(profile.mmproj_path)
        return None if path is None else self.hashes.compute(path)
