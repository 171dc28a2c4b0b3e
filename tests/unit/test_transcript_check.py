"""The transcript check's rules, with a template and tokenizer stand-in (the real server's are
in tests/e2e/test_transcripts_saved.py): a match, a reply cut by its last token, a mismatch, and a
template that renders history differently as the conversation grows (it cannot tell)."""

from __future__ import annotations

from slotkeeper.core.services.transcript_check import MISMATCH, OK, UNCHECKABLE, check_transcript
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


T = Transcript("chat", (Message("user", "hi"), Message("assistant", "hello there"), Message("user", "more?"),
                        Message("assistant", "yes")))


def held(render) -> list[int]:
    asked = [m.to_openai() for m in T.messages[:-1]]
    # the last token not yet in
    return tokenize(render({"messages": asked, "add_generation_prompt": True}) + "ye")


def test_a_transcript_that_says_what_the_file_holds():
    assert check_transcript(T, held(chatml), chatml, tokenize, detokenize).verdict == OK


def test_one_that_does_not():
    other = Transcript("chat", (Message("user", "bye"), *T.messages[1:]))
    assert check_transcript(other, held(chatml), chatml, tokenize, detokenize).verdict == MISMATCH
    wrong_reply = Transcript("chat", (*T.messages[:-1], Message("assistant", "no way")))
    assert check_transcript(wrong_reply, held(chatml), chatml, tokenize, detokenize).verdict == MISMATCH


def test_what_a_template_makes_its_own_cannot_be_checked():
    thought = Transcript("chat",
                         (Message("user", "hi"), Message("assistant", "hello there", reasoning="greet"),
                          *T.messages[2:]))
    check = check_transcript(thought, tokenize("<user>hi</><assistant><think>greet</>..."), chatml, tokenize,
                             detokenize)
    assert check.verdict == UNCHECKABLE and "reasoning or tool calls" in check.words
    pictured = Transcript("chat",
                          (Message("user", "this?", media=("image:ab",)), Message("assistant", "a heron")))
    assert check_transcript(pictured, [-5, 1, 2], chatml, tokenize, detokenize).verdict == UNCHECKABLE
    check = check_transcript(T, held(chatml), dated, tokenize, detokenize)
    assert check.verdict == UNCHECKABLE and "differently each time" in check.words
