"""The transcript check's rules, with a template and tokenizer stand-in (the real server's are
in tests/e2e/test_transcripts_saved.py): a match, a reply cut by its last token, a mismatch, and a
template that renders history differently as the conversation grows (it cannot tell)."""

from __future__ import annotations

import asyncio

from slotkeeper.core.services.transcript_check import (
    MISMATCH,
    NOT_READ,
    OK,
    UNCHECKABLE,
    TranscriptCheck,
    check_transcript,
)
from slotkeeper.core.sessions.transcripts import Message, Transcript


def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


def detokenize(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


def chatml(body: dict) -> str:
    out = "".join(f"<{m['role']}>{m['content']}</>" for m in body["messages"])
    return out + ("<assistant>" if body.get("add_generation_prompt") else "")


def dated(body: dict, day=[0]) -> str:  # noqa: B006 - a template that says the date
    day[0] += 1
    return f"<date {day[0]}>" + chatml(body)


class Reader:
    """The door's prompt reader, stood in for by a template and a tokenizer (``refuse``: what it
    would not read)."""

    def __init__(self, render, refuse: str = "") -> None:
        self.render, self.refuse = render, refuse

    async def chat_tokens(self, body: dict) -> list[int] | None:
        return None if self.refuse == "chat" else tokenize(self.render(body))

    async def text_tokens(self, text: str) -> list[int] | None:
        return None if self.refuse == "text" else tokenize(text)

    async def detokenize(self, tokens: list[int]) -> str | None:
        return None if self.refuse == "detokenize" else detokenize(tokens)


def check(transcript: Transcript, saved: list[int], render, refuse: str = "") -> TranscriptCheck:
    return asyncio.run(check_transcript(transcript, saved, Reader(render, refuse)))


T = Transcript("chat", (Message("user", "hi"), Message("assistant", "hello there"), Message("user", "more?"),
                        Message("assistant", "yes")))


def held(render) -> list[int]:
    asked = [m.to_openai() for m in T.messages[:-1]]
    # the last token not yet in
    return tokenize(render({"messages": asked, "add_generation_prompt": True}) + "ye")


def test_a_transcript_that_says_what_the_file_holds():
    assert check(T, held(chatml), chatml).verdict == OK


def test_one_that_does_not():
    other = Transcript("chat", (Message("user", "bye"), *T.messages[1:]))
    assert check(other, held(chatml), chatml).verdict == MISMATCH
    wrong_reply = Transcript("chat", (*T.messages[:-1], Message("assistant", "no way")))
    assert check(wrong_reply, held(chatml), chatml).verdict == MISMATCH


def test_what_a_template_makes_its_own_cannot_be_checked():
    thought = Transcript("chat",
                         (Message("user", "hi"), Message("assistant", "hello there", reasoning="greet"),
                          *T.messages[2:]))
    said = check(thought, tokenize("<user>hi</><assistant><think>greet</>..."), chatml)
    assert said.verdict == UNCHECKABLE and "reasoning or tool calls" in said.words
    pictured = Transcript("chat",
                          (Message("user", "this?", media=("image:ab",)), Message("assistant", "a heron")))
    assert check(pictured, [-5, 1, 2], chatml).verdict == UNCHECKABLE
    said = check(T, held(chatml), dated)
    assert said.verdict == UNCHECKABLE and "differently each time" in said.words


def test_a_text_transcript_and_what_the_server_would_not_read():
    text = Transcript("text", prompt="Once upon", completion=" a time")
    assert check(text, tokenize("Once upon a tim"), chatml).verdict == OK
    assert check(text, tokenize("Twice upon a tim"), chatml).verdict == MISMATCH
    for refused in ("chat", "detokenize"):
        assert check(T, held(chatml), chatml, refuse=refused) == NOT_READ
    assert check(text, tokenize("Once upon a tim"), chatml, refuse="text") == NOT_READ


def test_a_check_travels_as_json():
    said = check(T, held(chatml), chatml)
    assert TranscriptCheck.from_json(said.to_json()) == said
    for bad in (None, {"verdict": "fine", "words": "x"}, {"verdict": OK}):
        try:
            TranscriptCheck.from_json(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} read as a check")
