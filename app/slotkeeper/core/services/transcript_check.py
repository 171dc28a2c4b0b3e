"""Does a saved conversation's transcript still say what its KV file holds? Rendered with the
model's own chat template and tokenized by llama-server (so only a server of that model can tell),
the transcript's prompt must be exactly where the saved tokens begin, and what follows it must
read as the last reply.

Some conversations cannot be checked this way, and the check says so rather than calling the file
damaged: images and audio (only the projector turns them into tokens), earlier turns' reasoning or
tool calls (templates render them their own way), and templates that render the same conversation
differently each time (a date in the system prompt, say).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from slotkeeper.core.sessions.transcripts import TEXT, Transcript

if TYPE_CHECKING:
    from slotkeeper.core.sessions.entries import SessionEntry
    from slotkeeper.core.sessions.store import SessionStore

OK, MISMATCH, UNCHECKABLE = "ok", "mismatch", "uncheckable"


@dataclass(frozen=True)
class TranscriptCheck:
    verdict: str  # ok, mismatch, uncheckable
    words: str  # what a person is told


class TemplateServer(Protocol):
    """A running llama-server of some model (``LlamaClient``): what the check asks of it."""

    def apply_template(self, body: dict[str, Any]) -> str: ...
    def tokenize(self, text: str) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...


def check_saved(store: SessionStore, entry: SessionEntry, transcript: Transcript | None,
                server_sha256: str | None, server: TemplateServer) -> TranscriptCheck | None:
    """A saved session's ``transcript`` checked against its KV file by ``server``, a running
    llama-server whose model's SHA-256 is ``server_sha256``. None: no transcript, or the server
    runs another model (only one of the session's own model can render and tokenize it)."""
    if transcript is None or entry.sidecar is None or server_sha256 != entry.sidecar.model_sha256:
        return None
    return check_transcript(transcript, list(store.tokens(entry)), server.apply_template, server.tokenize,
                            server.detokenize)


def check_transcript(transcript: Transcript, saved: Sequence[int], render: Callable[[dict[str, Any]], str],
                     tokenize: Callable[[str], list[int]],
                     detokenize: Callable[[list[int]], str]) -> TranscriptCheck:
    """``render(chat body) -> prompt``, ``tokenize(text)`` and ``detokenize(tokens)``: the running
    server of the session's model (``LlamaClient`` methods)."""
    saved = [t for t in saved]
    if transcript.kind == TEXT:
        prompt_tokens = tokenize(transcript.prompt)
        rest = saved[len(prompt_tokens):]
        if saved[:len(prompt_tokens)] != prompt_tokens:
            return TranscriptCheck(MISMATCH,
                                   "the transcript's prompt is not what the saved conversation begins with")
        return _reply_check(detokenize([t for t in rest if t >= 0]), transcript.completion)
    messages = [m.to_openai() for m in transcript.messages]
    reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else None
    asked = messages[:-1] if reply is not None else messages
    if not asked:
        return TranscriptCheck(UNCHECKABLE, "the transcript holds no request to render")
    options = dict(transcript.options)
    prompt = tokenize(render({"messages": asked, **options, "add_generation_prompt": True}))
    if saved[:len(prompt)] == prompt:
        if reply is None:
            return TranscriptCheck(OK, "the transcript matches the saved conversation")
        return _reply_check(detokenize([t for t in saved[len(prompt):] if t >= 0]), reply)
    # Not where the saved tokens begin: the file, or what a template makes of what it was given?
    if any(m.media for m in transcript.messages):
        return TranscriptCheck(UNCHECKABLE, "the conversation holds images or audio, which only the model's "
                                            "projector turns into tokens, so its transcript cannot be "
                                            "checked")
    earlier = [m for m in transcript.messages[:-1] if m.role == "assistant" and (m.reasoning or m.tool_calls)]
    if earlier:
        return TranscriptCheck(UNCHECKABLE, "this model's chat template renders the reasoning or tool calls "
                                            "of earlier turns its own way, so the transcript cannot be "
                                            "checked against the saved tokens")
    if tokenize(render({"messages": asked, **options, "add_generation_prompt": True})) != prompt:
        return TranscriptCheck(UNCHECKABLE, "this model's chat template renders the same conversation "
                                            "differently each time (a date, say), so the transcript cannot "
                                            "be checked")
    return TranscriptCheck(MISMATCH, "the transcript rendered with the model's template is not what the "
                                     "saved conversation begins with")


def _reply_check(said: str, reply: str) -> TranscriptCheck:
    # The slot holds the reply but for its last token (not computed yet when it was sampled), and
    # perhaps an end-of-turn marker after it.
    held, written = " ".join(said.split()), " ".join(reply.split())
    if written.startswith(held) or held.startswith(written[:200]):
        return TranscriptCheck(OK, "the transcript matches the saved conversation")
    return TranscriptCheck(MISMATCH, "the transcript's last reply is not what the saved conversation holds "
                                     "after its prompt")
