"""Restore points: which prefixes of a conversation to keep on disk beside it, and which to choose.

A model whose restored state cannot be rolled back (hybrid and recurrent models, sliding-window
layers with --swa-full: ``families.EXACT_ONLY_MODES``) continues a restored save only when the
next request extends it exactly. llama-server that never stopped rolls back through its RAM
context checkpoints instead (at the start of the last user message, and a few tokens before the
prompt's end); a save holds none of them. A restore point is the slot's state at such a prefix,
saved as its own KV file of the conversation (``Sidecar.points``):

- ``prompt``: the last prompt but its last few tokens (``prompt_point_back``). The next request of
  a client that re-renders the reply (reasoning dropped from the history it sends back) extends
  it, and so does a Regenerate (the same prompt again). Where it sits follows what llama-server
  that never stopped evaluates for a Regenerate, so the last batch is as big: sliding-window
  layers with --swa-full roll back in RAM to the last token (1 evaluated), hybrid and recurrent
  models to their checkpoint 4 tokens before the end (4 evaluated; the point, made from that
  checkpoint with one token, leaves 3). A batch of one token takes another path through the
  kernels than a batch of several: measured log-probs ~1e-4 apart.
- ``user``: the start of the last user message (the prompt rendered without that message): an
  edited last message extends it.

Earlier turns' points stay, as llama-server keeps a checkpoint near each request's prompt end (up
to 32 per slot): an agent that rewrites its history further back after a restart (Claude Code's
``--resume`` drops messages it had added) goes on from the nearest one before it. States share their
bytes (``pieces``), so a point costs what differs from the conversation's save and the points kept
before it: for a hybrid model its recurrent state, for sliding-window layers with --swa-full the
part of their window the save does not hold. The last prompt point and the last user point are
always kept (what the next turn of a reasoning client, a Regenerate and an edit go back to); earlier
points newest first (earlier ``user`` points at least ``spacing`` tokens apart) while all the points
add at most a share of the bytes the save itself keeps: ``POINTS_SHARE`` for a chat, which seldom
goes back more than a turn (on Gemma 3 270M with --swa-full, a 512-token window in 15 of its 18
layers, the last turn's two points add 0.33 of a 1,500-token save and an earlier turn's point 0.17
more: 0.4 keeps a reasoning client's conversation within 1.3x its save, bench_disk.py);
``AGENT_POINTS_SHARE`` for an agent (its requests carry tools), which rewrites its history further
back after a restart (Claude Code's --resume leaves it at ``messages[3]``): its earlier requests'
points, each a recurrent state or a window beside a save of thousands of tokens of tools, are what
its next request goes on from (tests/e2e/test_agent_resume.py needs 0.5-0.6 of the save).

Everything here is pure: the engine makes the points while the slot is idle, the store keeps them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from slotkeeper.core.sessions.sidecar import POINT_PROMPT, POINT_USER, RestorePoint
from slotkeeper.core.settings import DEFAULT_POINT_SPACING_TOKENS

__all__ = ["AGENT_POINTS_SHARE", "DEFAULT_POINT_SPACING_TOKENS", "MAX_POINTS", "MIN_POINT_TOKENS",
           "POINTS_SHARE", "best_point", "keep_points", "prompt_point_back", "wanted_points"]

MAX_POINTS = 32  # per conversation, as llama-server keeps 32 checkpoints per slot (--ctx-checkpoints)
POINTS_SHARE = 0.4  # what a conversation's points may add to the bytes its save keeps
AGENT_POINTS_SHARE = 1.0  # the same for an agent's (its requests carry tools)
# A prefix shorter than this is re-read in less time than a restore takes: no point is made there.
MIN_POINT_TOKENS = 64
PROMPT_POINT_BACK = 3  # the prompt point of a hybrid or recurrent model: this many tokens before the end


def prompt_point_back(swa: bool) -> int:
    """How many tokens before the prompt's end its point sits (see the module's docstring)."""
    return 1 if swa else PROMPT_POINT_BACK


def wanted_points(n_prompt: int, user_start: int | None, n_held: int, have: Iterable[int] = (),
                  back: int = PROMPT_POINT_BACK) -> list[tuple[int, str]]:
    """The points to make for a conversation of ``n_held`` tokens whose last prompt had
    ``n_prompt`` tokens and whose last user message starts at ``user_start`` (None: not known),
    longest first, leaving out the lengths ``have`` holds already; the prompt point ``back``
    tokens before the prompt's end (``prompt_point_back``)."""
    out: list[tuple[int, str]] = []
    done = set(have)
    prompt_point = n_prompt - back
    if MIN_POINT_TOKENS <= prompt_point < n_held:
        out.append((prompt_point, POINT_PROMPT))
    if user_start is not None and MIN_POINT_TOKENS <= user_start < prompt_point:
        out.append((user_start, POINT_USER))
    return [(n, kind) for n, kind in out if n not in done]


def keep_points(points: Sequence[RestorePoint], n_tokens: int, spacing: int = DEFAULT_POINT_SPACING_TOKENS,
                limit: int = MAX_POINTS, allowance: int | None = None,
                cost: Callable[[Sequence[RestorePoint]], int] = lambda kept: 0,
                ) -> tuple[tuple[RestorePoint, ...], tuple[RestorePoint, ...]]:
    """(kept, dropped) of a conversation's points once it holds ``n_tokens`` tokens: only strict
    prefixes of it, one per length; the longest ``prompt`` point (the last turn's) and the longest
    ``user`` point always (what a Regenerate and an edit of the last message go back to); then
    earlier points longest first (earlier ``user`` points at least ``spacing`` tokens below the
    shortest kept), each while ``cost(kept)`` (the bytes the points kept add to the save) stays
    within ``allowance`` (None: no limit); ``limit`` in all. Kept longest first."""
    one_each = {p.n_tokens: p for p in reversed(points) if p.n_tokens < n_tokens}  # the first of a length
    usable = sorted(one_each.values(), key=lambda p: -p.n_tokens)
    latest = {kind: next((p for p in usable if p.kind == kind), None) for kind in (POINT_PROMPT, POINT_USER)}
    last_user = latest[POINT_USER]
    if last_user is not None and any(p.kind == POINT_PROMPT and p is not latest[POINT_PROMPT]
                                     and p.n_tokens > last_user.n_tokens for p in usable):
        # An earlier turn's (the last turn's own is made after its prompt point): no longer one
        # of the two kept whatever they cost.
        latest[POINT_USER] = None
    first = [p for p in (latest[POINT_PROMPT], latest[POINT_USER]) if p is not None]
    order = first + [p for p in usable if p not in first]
    kept: list[RestorePoint] = []
    for p in order:
        if len(kept) >= limit:
            break
        if p.kind == POINT_USER and p is not latest[POINT_USER] and kept and \
                p.n_tokens > min(k.n_tokens for k in kept) - spacing:
            continue
        if p not in first and allowance is not None and cost([*kept, p]) > allowance:
            continue
        kept.append(p)
    kept.sort(key=lambda p: -p.n_tokens)
    dropped = tuple(p for p in points if p not in kept)
    return tuple(kept), dropped


def best_point(points: Sequence[RestorePoint], shared: int, n_request: int) -> RestorePoint | None:
    """The longest point a request continues exactly: it shares the point's tokens with the
    conversation (``shared``: the request's common prefix with the whole conversation) and has
    more tokens after them (llama-server evaluates at least one)."""
    usable = [p for p in points if p.n_tokens <= shared and p.n_tokens < n_request]
    return max(usable, key=lambda p: p.n_tokens, default=None)
