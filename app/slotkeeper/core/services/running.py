"""The Slotkeeper running on a data folder, as its command line reaches it: through its front door,
like any client, never through its private files. The engine records the door's address with its
pid as the door opens (``publish_door``: ``state/door.json``, no secret in it) and removes the
record as it closes; `slotkeeper sessions verify` asks that door to check a transcript
(``POST /slotkeeper/transcript-check``), with the key the user's settings or environment give.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.fsutil import atomic_write_text
from slotkeeper.core.services.transcript_check import TranscriptCheck

log = logging.getLogger(__name__)

TRANSCRIPT_CHECK_PATH = "/slotkeeper/transcript-check"


class NotAnswered(Exception):
    """The running Slotkeeper did not answer the question (the words say why, for a person)."""


def publish_door(path: Path, url: str) -> None:
    """The door of this process answers at ``url`` (a failure to record it only costs the command
    line its questions)."""
    try:
        atomic_write_text(path, json.dumps({"engine_pid": os.getpid(), "url": url}))
    except OSError as exc:
        log.warning("could not record the front door's address: %s", exc)


def clear_door(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not remove the front door's record: %s", exc)


def running_door(path: Path) -> str | None:
    """The address of the door the running Slotkeeper of this data folder records; None when none
    runs (no record, or its process is gone)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        pid, url = int(data["engine_pid"]), data["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(url, str) or not url.startswith("http://"):
        return None
    import psutil  # here: the command line starts faster without it

    return url if psutil.pid_exists(pid) else None


def ask_transcript_check(url: str, key: str | None, session_id: str,
                         timeout: float = 120.0) -> TranscriptCheck | None:
    """The running Slotkeeper at ``url`` checks the session's transcript as its door reads
    requests. None: it does not run the session's model (only a server of that model can render
    it). NotAnswered otherwise."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.post(url + TRANSCRIPT_CHECK_PATH, json={"id": session_id}, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise NotAnswered(f"the running Slotkeeper did not answer ({exc})") from exc
    if r.status_code == 401:
        raise NotAnswered("the running Slotkeeper wants its API key: set it in Settings or LLAMA_API_KEY")
    if r.status_code == 409:
        return None
    try:
        data: Any = r.json()
        if r.status_code == 200:
            return TranscriptCheck.from_json(data)
        words = data["error"]["message"]
    except (ValueError, KeyError, TypeError) as exc:
        raise NotAnswered(f"the running Slotkeeper answered {r.status_code}, not a check") from exc
    raise NotAnswered(str(words))
