"""A pinned conversation that goes on: the snapshot stays, the pin follows the conversation."""

from __future__ import annotations

from sessions_helpers import save_incoming, write_slot_save

from slotkeeper.core.sessions import saving
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.naming import new_incoming_name
from slotkeeper.core.sessions.store import SessionStore

FACTS = ServerFacts(model_sha256="a" * 64, model_path="/m.gguf", flash_attn=True, cache_type_k="f16",
                    cache_type_v="f16", swa_full=False, n_parallel=1, n_ctx_slot=4096, swa=False)


def save(store: SessionStore, tokens: list[int], current: str | None = None) -> saving.SaveOutcome:
    name = new_incoming_name()
    path = write_slot_save(store.dir / name, tokens)
    return save_incoming(store, name, path.stat().st_size, 0, saving.SaveContext(FACTS, "llama", "b1"),
                                lambda t: ("Rivers", "p"), current_id=current)


def test_the_continuation_of_a_pinned_snapshot_carries_the_pin_and_is_then_updated_in_place(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    store.ensure_folder()
    first = save(store, list(range(100))).sidecar
    store.set_pinned(first.id, True)

    went_on = save(store, list(range(150)), first.id)
    child = went_on.sidecar
    assert went_on.kind == "fork" and child.id != first.id
    assert child.parent == first.id and child.continues and child.pinned
    assert store.get(first.id).sidecar.n_tokens == 100  # the snapshot as it was pinned

    again = save(store, list(range(200)), child.id)
    assert again.kind == "update" and again.sidecar.id == child.id  # no new snapshot every turn
    assert again.sidecar.pinned and again.sidecar.continues and again.sidecar.n_tokens == 200
    assert len(store.listing().sessions) == 2
