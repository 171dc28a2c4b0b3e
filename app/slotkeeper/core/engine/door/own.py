"""Slotkeeper's own questions at its front door (its command line asks them, as any client would,
with the door's key): ``POST /slotkeeper/transcript-check`` ``{"id": SESSION}`` checks a saved
conversation's transcript against its KV file, rendered and tokenized as the door reads requests
(``services.running`` is the asking side)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from slotkeeper.core.sessions.entries import SessionNotFound
from slotkeeper.core.sessions.naming import InvalidSessionId
from slotkeeper.core.sessions.transcripts import TranscriptError

if TYPE_CHECKING:
    from slotkeeper.core.engine.stored.library import Library
    from slotkeeper.core.services.transcript_check import PromptReader
    from slotkeeper.core.sessions.compat import ServerFacts


async def transcript_check(library: Library, facts: ServerFacts | None, reader: PromptReader,
                           raw: bytes) -> tuple[int, dict[str, Any] | str]:
    """(200, the check) or (status, what a person is told)."""
    try:
        body = orjson.loads(raw)
        session_id = body["id"]
        if not isinstance(session_id, str):
            raise TypeError(session_id)
    except (ValueError, KeyError, TypeError):
        return 400, 'the body must be {"id": SESSION_ID}'
    try:
        check = await library.check_transcript(session_id, facts, reader)
    except InvalidSessionId as exc:
        return 400, str(exc)
    except SessionNotFound as exc:
        return 404, str(exc)
    except TranscriptError as exc:
        return 422, f"its transcript cannot be read: {exc}"
    if check is None:
        return 409, ("no transcript, or Slotkeeper does not run this conversation's model now (only a server "
                     "of its model can render it)")
    return 200, check.to_json()
