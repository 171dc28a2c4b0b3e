"""Which slot a completion request goes to, and what must happen to it first. Pure: no I/O.

The front door knows every request's tokens and what every slot holds, and the sessions index
knows which saved conversation shares the longest prefix with it. The rules:

- The request goes to the slot holding the longest prefix of it, so a conversation continues
  where its cache is. If that slot is busy with a request of the same conversation (more than
  half the prompt), the request waits for it rather than re-reading everything elsewhere.
- A saved session that offers a longer prefix than any free slot, by more tokens than the
  restore costs in prefill time (the break-even), is restored into a free slot first. Sessions
  whose model cannot roll back inside restored state (sliding-window with --swa-full, recurrent
  and hybrid models) are restored only when the request extends them exactly; sliding-window
  sessions saved without --swa-full never help and are not offered at all (the engine filters).
- A slot is taken for another conversation preferring an empty one, then one whose content is
  saved, least recently used first; a slot with unsaved changes is saved first ("save before
  evict"): a conversation is never lost because another took its slot.
- A slot whose restored state cannot be rolled back correctly is erased first when the request
  would roll back inside it, so llama-server recomputes: never a reply that differs from a
  cold server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A request waits for the busy slot holding its conversation when that slot holds more than this
# share of its prompt; otherwise it goes to another slot at once.
WAIT_FOR_OWN_SLOT_SHARE = 0.5
# A request that shares at most this share of its prompt with a slot's different conversation goes
# to an empty slot when there is one, rather than evicting that conversation for a small reuse.
KEEP_WARM_SHARE = 0.5


@dataclass(frozen=True)
class SlotOption:
    slot: int
    prefix: int  # tokens of the request this slot holds (common prefix)
    held: int  # tokens the slot holds in all (0 = empty)
    n_prompt: int  # its last request's prompt length (a reply follows it)
    busy: bool  # a request runs on it (or Slotkeeper acts on it)
    changed: bool  # it holds changes not saved yet
    last_used: float  # monotonic time of its last request
    fragile_until: int = 0  # restored tokens a rollback must not go inside (0 = none)


@dataclass(frozen=True)
class SessionOption:
    id: str
    prefix: int  # tokens of the request it holds (common prefix)
    n_tokens: int
    exact_only: bool  # restorable only when the request extends it entirely
    point: str | None = None  # one of its restore points (its KV file) is what would be restored
    size_bytes: int = 0  # what the restore reads


@dataclass(frozen=True)
class Route:
    slot: int
    expected_prefix: int  # tokens the request should find in the cache
    save_first: bool = False  # the slot holds another conversation's unsaved changes
    restore: str | None = None  # a session to restore into the slot first
    restore_point: str | None = None  # ... from this restore point of it (its KV file)
    erase_first: bool = False  # roll back inside fragile restored state: recompute from scratch
    reason: str = ""


@dataclass(frozen=True)
class Wait:
    slot: int  # the busy slot that holds this conversation
    reason: str


def route(n_request: int, slots: Sequence[SlotOption], session: SessionOption | None = None,
          break_even_tokens: int = 0, known: bool = True) -> Route | Wait | None:
    """Where the request goes; ``Wait`` while its own slot is busy; None when every slot is busy.

    ``known``: the request's tokens are known. When they are not (a prompt the front door cannot
    tokenize), it is a new conversation to routing, and a slot holding restored state that cannot
    be rolled back is erased first: llama-server might otherwise roll back into it."""
    if not slots:
        return None
    best = max(slots, key=lambda s: (s.prefix, not s.busy, -s.slot))
    if best.busy and best.prefix > WAIT_FOR_OWN_SLOT_SHARE * n_request:
        return Wait(best.slot, f"slot {best.slot} holds this conversation and is busy")
    free = [s for s in slots if not s.busy]
    if not free:
        return None
    own = max(free, key=lambda s: (usable_prefix(s, n_request), s.prefix, -s.slot))

    if session is not None and _worth_restoring(session, usable_prefix(own, n_request), n_request,
                                                break_even_tokens):
        # Into the slot of the conversation it rolls back inside, else the one evicted.
        target = own if own.prefix > usable_prefix(own, n_request) else _evict_choice(free)
        what = f"restore point of session {session.id}" if session.point else f"restored session {session.id}"
        return Route(target.slot, session.prefix, save_first=_loses_changes(target, 0),
                     restore=session.id, restore_point=session.point,
                     reason=f"{what} ({session.prefix} tokens)")

    continues = own.prefix >= own.n_prompt and own.held > 0
    if own.prefix > 0 and not continues and own.prefix <= KEEP_WARM_SHARE * n_request:
        # Another conversation that only shares a start (a system prompt) with this slot's: an
        # empty slot keeps both warm.
        empty = [s for s in free if s.held == 0]
        if empty:
            return Route(empty[0].slot, 0, reason="a new conversation (an empty slot keeps the other warm)")
    if own.prefix > 0:
        if own.fragile_until and own.prefix < own.fragile_until:
            return Route(own.slot, 0, save_first=_loses_changes(own, own.prefix), erase_first=True,
                         reason="the request rolls back inside restored state that cannot be rolled back "
                                "correctly")
        return Route(own.slot, own.prefix, save_first=_loses_changes(own, own.prefix),
                     reason=f"slot {own.slot} holds {own.prefix} tokens of it")
    target = _evict_choice(free)
    if not known:
        return Route(target.slot, 0, save_first=_loses_changes(target, 0),
                     erase_first=target.fragile_until > 0,
                     reason="a request whose tokens are not known (treated as a new conversation)")
    return Route(target.slot, 0, save_first=_loses_changes(target, 0), reason="a new conversation")


def usable_prefix(slot: SlotOption, n_request: int) -> int:
    """The tokens of the request the slot can keep: its prefix, unless that rolls back inside
    restored state that cannot be rolled back (then none); an exact repeat of such state needs a
    token rolled back too (llama-server evaluates at least one)."""
    if slot.fragile_until and (slot.prefix < slot.fragile_until
                               or (slot.prefix == slot.held and slot.prefix >= n_request)):
        return 0
    return slot.prefix


def _worth_restoring(session: SessionOption, slot_prefix: int, n_request: int, break_even: int) -> bool:
    if session.prefix <= slot_prefix:
        return False
    if session.exact_only and not (session.prefix == session.n_tokens and n_request > session.n_tokens):
        return False  # an exact-only save is continued only by a request that strictly extends it
    return session.prefix - slot_prefix > break_even


def _loses_changes(slot: SlotOption, prefix: int) -> bool:
    """Running a request that shares ``prefix`` tokens with the slot overwrites what the slot holds
    beyond them; that loses something only when it is unsaved and not just the last reply, which
    the next prompt renders again (a prompt that reaches past the slot's last prompt continues it)."""
    return slot.changed and slot.held > 0 and prefix < slot.n_prompt


def _evict_choice(free: Sequence[SlotOption]) -> SlotOption:
    """Empty first, then saved (least recently used), then changed (least recently used)."""
    return min(free, key=lambda s: (s.held > 0, s.changed, s.last_used, s.slot))
