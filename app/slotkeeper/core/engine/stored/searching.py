"""The engine's side of the search index: the text of what it saves, and completing entries.

A save detokenizes the conversation once (through the server that holds it) for the title and
preview; the same text goes into the search index, so a save costs no second detokenize. Entries
the index holds only from titles and previews (rebuilt without a server, sessions copied in,
saves made while the index could not be written) are completed while a server of their model
runs: their tokens are read from the KV file and detokenized. Everything here runs on I/O
threads; nothing touches engine state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from slotkeeper.core.server.client import LlamaClient, ServerError, ServerUnavailable
from slotkeeper.core.services.sessions import SessionsService
from slotkeeper.core.sessions.store import SessionNotFound, SessionStore
from slotkeeper.core.sessions.titles import conversation_text, title_and_preview
from slotkeeper.core.sessions.transcripts import Transcript

log = logging.getLogger(__name__)

COMPLETE_BATCH = 200  # sessions completed per pass (the rest on the next one)


def detokenize(http: LlamaClient, tokens: list[int]) -> str | None:
    """The conversation as the server's text; None when it cannot say. Media positions
    (negative pseudo-tokens, see kvfile) are left out: they are not token ids."""
    try:
        return http.detokenize([t for t in tokens if t >= 0])
    except Exception as exc:  # a title is nice to have; a save never fails for it
        log.warning("could not detokenize a conversation: %s", exc)
        return None


@dataclass
class Described:
    """``describe`` for the save protocol that keeps the conversation's search text (for the
    index): the slot's transcript as it is when it has one, else what llama-server detokenizes
    with the template's markers left out (the fallback)."""

    http: LlamaClient
    transcript: Transcript | None = None
    text: str | None = field(default=None, init=False)

    def __call__(self, tokens: list[int]) -> tuple[str, str]:
        if self.transcript is not None:
            self.text = self.transcript.search_text()
            title = self.transcript.title()
            return title or f"Conversation of {len(tokens)} tokens", self.transcript.preview()
        text = detokenize(self.http, tokens)
        if text is None:
            return f"Conversation of {len(tokens)} tokens", ""
        self.text = conversation_text(text)
        return title_and_preview(text)


def complete_partial(sessions: SessionsService, store: SessionStore, http: LlamaClient, model_sha256: str,
                     keep_going: Callable[[], bool] = lambda: True) -> int:
    """Detokenize the sessions of this model the index holds only by title; returns how many
    were completed (the sessions service writes them: the index's one writer). Stops early when
    the server goes away (the rest wait for the next time)."""
    done = 0
    for session_id, kv_file in sessions.partial_search_entries(model_sha256)[:COMPLETE_BATCH]:
        if not keep_going():
            break
        try:
            entry = store.get(session_id)
            sc = entry.sidecar
            if sc is None or sc.kv_file != kv_file or sc.model_sha256 != model_sha256:
                continue  # changed since: the next reconcile puts the new version in
            tokens = store.tokens(entry)
            text = http.detokenize([t for t in tokens if t >= 0])
        except (SessionNotFound, OSError, ValueError) as exc:
            log.debug("not completing %s in the search index: %s", session_id, exc)
            continue
        except (ServerUnavailable, ServerError) as exc:
            log.info("completing the search index stopped: %s", exc)
            break
        done += sessions.complete_text(session_id, kv_file, conversation_text(text))
    return done
