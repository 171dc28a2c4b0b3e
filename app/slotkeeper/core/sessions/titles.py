"""A person-readable title and preview from a conversation's detokenized text.

The text still carries the chat template's markers (ChatML, Llama 3, Gemma, Mistral ...).
We split it into turns where we recognise a template, and fall back to stripping anything
that looks like a special token.
"""

from __future__ import annotations

import re

TITLE_CHARS = 80
PREVIEW_CHARS = 200

# (role, text) turns for the templates we know.
_TURN_PATTERNS = [
    # SentencePiece tokenizers put a space after special tokens: "<|im_start|> user\n".
    re.compile(r"<\|im_start\|>\s*(\w+)[ \t]*\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL),  # ChatML
    re.compile(r"<\|start_header_id\|>\s*(\w+)\s*<\|end_header_id\|>\n*(.*?)(?:<\|eot_id\|>|$)", re.DOTALL),
    re.compile(r"<start_of_turn>\s*(\w+)[ \t]*\n(.*?)(?:<end_of_turn>|$)", re.DOTALL),  # Gemma
    re.compile(r"<\|(user|assistant|system)\|>\n?(.*?)(?=<\|(?:user|assistant|system|end)\|>|$)", re.DOTALL),
]
_MISTRAL = re.compile(r"\[INST\](.*?)\[/INST\]([^\[]*)", re.DOTALL)
_SPECIAL = re.compile(r"<\|[^|>]{1,40}\|>|<(?:s|/s|bos|eos|unk|pad)>|<(?:start|end)_of_turn>")


def _squash(text: str) -> str:
    return " ".join(_SPECIAL.sub(" ", text).split())


def clip(text: str, n: int) -> str:
    """At most n characters: cut with an ellipsis."""
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def turns(text: str) -> list[tuple[str, str]]:
    for pattern in _TURN_PATTERNS:
        found = [(role.lower(), _squash(body)) for role, body in pattern.findall(text)]
        if found:
            return found
    found = []
    for user, reply in _MISTRAL.findall(text):
        found.append(("user", _squash(user)))
        if reply.strip():
            found.append(("assistant", _squash(reply)))
    return found


def title_and_preview(text: str) -> tuple[str, str]:
    conv = [(r, t) for r, t in turns(text) if t]
    if not conv:
        plain = _squash(text)
        return (clip(plain, TITLE_CHARS) or "(empty conversation)",
                clip(plain[-PREVIEW_CHARS:], PREVIEW_CHARS))
    users = [t for r, t in conv if r in ("user", "human")]
    title = clip(users[0] if users else conv[0][1], TITLE_CHARS)
    last_user = max((i for i, (r, _) in enumerate(conv) if r in ("user", "human")), default=None)
    tail = conv[last_user:] if last_user is not None else conv[-2:]
    preview = " / ".join(f"{'You' if r in ('user', 'human') else r.capitalize()}: {t}" for r, t in tail)
    return title, clip(preview, PREVIEW_CHARS)


def conversation_text(text: str) -> str:
    """What was said, for the search index: each turn's text on a line of its own, the template's
    markers (and role names) left out."""
    conv = [t for _r, t in turns(text) if t]
    return "\n".join(conv) if conv else _squash(text)
