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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from slotkeeper.core.sessions.transcripts import TEXT, Transcript

OK, MISMATCH, UNCHECKABLE = "ok", "mismatch", "uncheckable"


@dataclass(frozen=True)
class TranscriptCheck:
    verdict: str  # ok, mismatch, uncheckable
    words: str  # what a person is told

    def to_json(self) -> dict[str, str]:
        return {"verdict": self.verdict, "words": self.words}

    @classmethod
    def from_json(cls, data: Any) -> TranscriptCheck:
        """ValueError for anything else than ``to_json``'s."""
        if (not isinstance(data, dict) or data.get("verdict") not in (OK, MISMATCH, UNCHECKABLE)
                or not isinstance(data.get("words"), str)):
            raise ValueError(f"not a transcript check: {data!r}")
        return cls(data["verdict"], data["words"])


class PromptReader(Protocol):
    """A running llama-server of the session's model, as the front door reads prompts
    (``PromptTokens``: the one render-and-tokenize path, so a transcript is checked against the very
    tokens the door routes by). None: it would not say."""

    async def chat_tokens(self, body: dict[str, Any]) -> Sequence[int] | None: ...
    async def text_tokens(self, text: str) -> Sequence[int] | None: ...
    async def detokenize(self, tokens: list[int]) -> str | None: ...


NOT_READ = TranscriptCheck(UNCHECKABLE, "llama-server would not render or tokenize the transcript")


async def check_transcript(transcript: Transcript, saved: Sequence[int],
                           reader: PromptReader) -> TranscriptCheck:
    """``transcript`` against the ``saved`` tokens of its KV file, rendered and tokenized by ``reader``."""
    saved = list(saved)
    if transcript.kind == TEXT:
        prompt_tokens = await reader.text_tokens(transcript.prompt)
        if prompt_tokens is None:
            return NOT_READ
        prompt_tokens = list(prompt_tokens)
        if saved[:len(prompt_tokens)] != prompt_tokens:
            return TranscriptCheck(MISMATCH,
                                   "the transcript's prompt is not what the saved conversation begins with")
        return await _reply_check(reader, saved[len(prompt_tokens):], transcript.completion)
    messages = [m.to_openai() for m in transcript.messages]
    reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else None
    asked = messages[:-1] if reply is not None else messages
    if not asked:
        return TranscriptCheck(UNCHECKABLE, "the transcript holds no request to render")
    body = {"messages": asked, **dict(transcript.options), "add_generation_prompt": True}
    rendered = await reader.chat_tokens(body)
    if rendered is None:
        return NOT_READ
    prompt = list(rendered)
    if saved[:len(prompt)] == prompt:
        if reply is None:
            return TranscriptCheck(OK, "the transcript matches the saved conversation")
        return await _reply_check(reader, saved[len(prompt):], reply)
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
    again = await reader.chat_tokens(body)
    if again is None or list(again) != prompt:
        return TranscriptCheck(UNCHECKABLE, "this model's chat template renders the same conversation "
                                            "differently each time (a date, say), so the transcript cannot "
                                            "be checked")
    return TranscriptCheck(MISMATCH, "the transcript rendered with the model's template is not what the "
                                     "saved conversation begins with")


async def _reply_check(reader: PromptReader, rest: list[int], reply: str) -> TranscriptCheck:
    # The slot holds the reply but for its last token (not computed yet when it was sampled), and
    # perhaps an end-of-turn marker after it.
    said = await reader.detokenize([t for t in rest if t >= 0])
    if said is None:
        return NOT_READ
    held, written = " ".join(said.split()), " ".join(reply.split())
    if written.startswith(held) or held.startswith(written[:200]):
        return TranscriptCheck(OK, "the transcript matches the saved conversation")
    return TranscriptCheck(MISMATCH, "the transcript's last reply is not what the saved conversation holds "
                                     "after its prompt")
