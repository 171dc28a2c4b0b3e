"""Which saved session a slot's tokens continue.

When a slot is about to be saved, its token list is compared with the saved sessions:

- "update": the tokens carry a saved session forward (same conversation, more turns),
  so that session's file is replaced. Identical tokens are an update too; the caller
  sees ``common_prefix == len(tokens)`` and can skip the write.
- "fork": the tokens share a real prefix with a session (system prompt plus at least
  part of the conversation) but leave it before its end: an edited or regenerated turn,
  or a rollback. It becomes a new session whose parent is that one, and the parent is
  kept, because it holds a branch the new tokens do not.
- "new": nothing worth linking to.

Tail slack: a chat template renders the assistant's last reply back into the next
prompt, and that rendering can differ from the tokens that were generated (thinking
blocks stripped, a different end-of-turn token). So a conversation that continues a
session may leave it up to ``tail_slack`` tokens before its end and still be an update.

A re-rendered reply: a client of a reasoning model resends the last reply without its
reasoning (or otherwise rewritten), so the next turn leaves the saved conversation anywhere
inside that reply. When both prompts are known, tokens that leave it after the saved prompt
(inside its reply) and whose own prompt goes on past that point (the client's history, not a
new reply) carry the conversation forward: an update, however early in the reply. A
Regenerate leaves it where its own prompt ends (a new reply to the same prompt): a fork.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from slotkeeper.core.basics.tokens import as_tokens, common_prefix_len

__all__ = ["Match", "MatchKind", "classify", "common_prefix_len"]

MatchKind = Literal["update", "contained", "fork", "new"]

DEFAULT_TAIL_SLACK = 8
DEFAULT_MIN_FORK_PREFIX = 32


@dataclass
class Match:
    """The verdict: ``session_id`` is the session updated or forked (None for "new").

    ``common_prefix`` is the number of leading tokens shared with that session; for
    "new" it is the longest prefix shared with any candidate (for logs only).
    """

    kind: MatchKind
    session_id: str | None
    common_prefix: int


def classify(
    new_tokens: Sequence[int],
    candidates: Iterable[tuple[str, Sequence[int]] | tuple[str, Sequence[int], int | None]],
    tail_slack: int = DEFAULT_TAIL_SLACK,
    min_fork_prefix: int = DEFAULT_MIN_FORK_PREFIX,
    new_n_prompt: int | None = None,
    rolls_back: bool = True,
) -> Match:
    """Decide whether ``new_tokens`` update, fork from, or are unrelated to a session.

    ``candidates`` are (session_id, tokens) or (session_id, tokens, n_prompt), most recently
    used first; that order breaks ties. ``n_prompt`` (the saved slot's last prompt length, when
    known) narrows the tail slack to the reply after that prompt: two conversations that differ
    in their last user message are never one update, however short they are. Token lists may be
    lists or token arrays (``core.basics.tokens``); arrays skip a conversion that costs a few ms per
    100k-token list, so a caller holding many sessions should cache them as arrays.

    An update beats a fork even when the fork candidate shares more tokens: the updated
    session already holds everything the new tokens repeat, so no data is lost and no
    near-duplicate file is created.

    "contained": the new tokens' prompt (``new_n_prompt``) is part of a longer saved session, and
    what follows it is a reply that session holds in its re-rendered form: nothing new to keep (a
    client that replays a conversation turn by turn). Only where restored states may be rolled
    back (``rolls_back``); otherwise a strict prefix is a fork, so models that restore only exact
    continuations keep an exact copy.
    """
    if tail_slack < 0 or min_fork_prefix < 0:
        raise ValueError("tail_slack and min_fork_prefix must not be negative")
    new = as_tokens(new_tokens)
    best_update: Match | None = None
    best_contained: Match | None = None
    best_fork: Match | None = None
    contained_at = None if new_n_prompt is None or not rolls_back else min(new_n_prompt, len(new))
    longest_shared = 0
    for session_id, tokens, *rest in candidates:
        n_prompt = rest[0] if rest else None
        saved = as_tokens(tokens)
        shared = common_prefix_len(new, saved)
        longest_shared = max(longest_shared, shared)
        # Strict ">" keeps the earlier (more recent) candidate on ties.
        if _is_update(shared, len(new), len(saved), tail_slack, min_fork_prefix, n_prompt, new_n_prompt):
            if best_update is None or shared > best_update.common_prefix:
                best_update = Match("update", session_id, shared)
        elif (contained_at is not None and shared >= contained_at and len(saved) > shared
                and shared >= min_fork_prefix):
            if best_contained is None or shared > best_contained.common_prefix:
                best_contained = Match("contained", session_id, shared)
        elif shared >= min_fork_prefix and (best_fork is None or shared > best_fork.common_prefix):
            best_fork = Match("fork", session_id, shared)
    return best_update or best_contained or best_fork or Match("new", None, longest_shared)


def _is_update(shared: int, n_new: int, n_saved: int, tail_slack: int, min_prefix: int,
               n_prompt: int | None = None, new_prompt: int | None = None) -> bool:
    if shared == n_saved:
        return True  # new tokens equal or extend the saved ones
    if shared == n_new:
        return False  # strict prefix, shorter: a rollback; the saved session holds more
    if n_prompt is not None and shared < n_prompt:
        return False  # diverged inside the saved prompt: another turn, not a re-rendered reply
    if (n_prompt is not None and new_prompt is not None and n_prompt >= min_prefix
            and new_prompt > shared):
        return True  # the client resent the saved reply otherwise (its reasoning dropped) and went on
    # Diverged before the end of the saved tokens: an update only if that is within the
    # re-rendered tail, and only if what matched is substantial. Without the second
    # rule, any two conversations sharing a chat header would "update" a session
    # shorter than the slack.
    return shared >= n_saved - tail_slack and shared >= min_prefix
