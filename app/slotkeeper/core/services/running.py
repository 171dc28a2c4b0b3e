"""The Slotkeeper running on a data folder, as its command line reaches it: through its front door,
like any client, never through its private files. The engine records the door's address with its
pid as the door opens (``publish_door``: ``state/door.json``, no secret in it) and removes the
record as it closes; `slotkeeper sessions verify` asks that door to check a transcript
(``POST /slotkeeper/transcript-check``), with the key the user's settings or environment give.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.live_record import clear_record, live_record, publish_record
from slotkeeper.core.services.transcript_check import TranscriptCheck

log = logging.getLogger(__name__)

TRANSCRIPT_CHECK_PATH = "/slotkeeper/transcript-check"


class NotAnswered(Exception):
    """The running Slotkeeper did not answer the question (the words say why, for a person)."""


def publish_door(path: Path, url: str) -> None:
    """The door of this process answers at ``url``."""
    publish_record(path, "the front door's address", url=url)


def clear_door(path: Path) -> None:
    clear_record(path)


def running_door(path: Path) -> str | None:
    """The address of the door the running Slotkeeper of this data folder records; None when none
    runs (no record, or its process is gone)."""
    data = live_record(path)
    url = data.get("url") if data is not None else None
    return url if isinstance(url, str) and url.startswith("http://") else None


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
