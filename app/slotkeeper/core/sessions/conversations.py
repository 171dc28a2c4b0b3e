"""Saved sessions grouped the way a person thinks of them: one conversation per row.

Lineage (``Sidecar.parent``) links a save to the session it came from. Two kinds of link:

- a continuation (``Sidecar.continues``): all of the parent's tokens, then more. The pinned
  snapshot a conversation went on from, and the conversation now, are one conversation: its
  title, tokens and last use are the newest save's; its pin is any save's pin.
- a fork: the save left its parent inside it (an edited or regenerated turn). It is a branch of
  its own, shown under the conversation it left.

Files written before ``continues`` existed mark a continuation only by being the longer save of
a pinned parent with the same title; that is how such a file came about.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slotkeeper.core.sessions.entries import SessionEntry

__all__ = ["Conversation", "group_conversations"]


@dataclass
class Conversation:
    """``saves``: oldest first, the last is the conversation now; ``branches``: forks off any save."""

    saves: list[SessionEntry]
    branches: list[Conversation] = field(default_factory=list)

    @property
    def head(self) -> SessionEntry:
        return self.saves[-1]

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.saves]

    @property
    def pinned(self) -> bool:
        return any(e.sidecar is not None and e.sidecar.pinned for e in self.saves)

    @property
    def size_bytes(self) -> int:
        return sum(e.size_bytes for e in self.saves)

    @property
    def problems(self) -> list[str]:
        return [p for e in self.saves for p in e.problems]

    def walk(self):
        """This conversation and every branch under it, depth first."""
        yield self
        for b in self.branches:
            yield from b.walk()


def _continues(child: SessionEntry, parent: SessionEntry) -> bool:
    c, p = child.sidecar, parent.sidecar
    if c is None or p is None or c.model_sha256 != p.model_sha256:
        return False
    if c.continues:
        return True
    return p.pinned and c.title == p.title and c.n_tokens > p.n_tokens  # written before "continues"


def _last_used(entry: SessionEntry) -> str:
    return entry.sidecar.last_used_at if entry.sidecar else ""


def group_conversations(entries: list[SessionEntry]) -> list[Conversation]:
    """The top-level conversations, in the order of their first save in ``entries``."""
    by_id = {e.id: e for e in entries}
    children: dict[str, list[SessionEntry]] = {}
    for e in entries:
        parent = e.sidecar.parent if e.sidecar else None
        if parent and parent in by_id and parent != e.id:
            children.setdefault(parent, []).append(e)

    placed: set[str] = set()

    def build(root: SessionEntry) -> Conversation:
        saves = [root]
        placed.add(root.id)
        while True:
            nxt = [c for c in children.get(saves[-1].id, ()) if c.id not in placed
                   and _continues(c, saves[-1])]
            if not nxt:
                break
            newest = max(nxt, key=_last_used)  # other continuations of the same snapshot are branches
            saves.append(newest)
            placed.add(newest.id)
        conv = Conversation(saves)
        for s in saves:
            for c in children.get(s.id, ()):
                if c.id not in placed:
                    conv.branches.append(build(c))
        return conv

    out: list[Conversation] = []
    for e in entries:
        parent = e.sidecar.parent if e.sidecar else None
        if e.id not in placed and not (parent and parent in by_id and parent != e.id):
            out.append(build(e))
    for e in entries:  # a cycle of parents (hand-edited files): each left over stands alone
        if e.id not in placed:
            out.append(build(e))
    return out
