"""The token lists the store keeps in memory (for routing and lineage) stay small and current."""

from __future__ import annotations

import gc
import tracemalloc

from sessions_helpers import make_session, write_slot_save

from slotkeeper.core.basics.tokens import TYPECODE
from slotkeeper.core.sessions.store import SessionStore
from slotkeeper.core.sessions.token_lists import TOKEN_LISTS_KEPT

N_TOKENS = 20_000


def test_kept_token_lists_take_four_bytes_a_token(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    ids = [f"{i:012x}" for i in range(TOKEN_LISTS_KEPT)]
    for i, sid in enumerate(ids):  # token ids above 256: no small-int caching flatters a list
        make_session(store.dir, sid, tokens=[1000 + (i * 7 + j) % 30_000 for j in range(N_TOKENS)])
    entries = [store.get(sid) for sid in ids]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [store.tokens(e) for e in entries]
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 32 lists of 20,000 tokens: 2.6 MB as arrays, about 23 MB as lists of ints.
    assert grown < TOKEN_LISTS_KEPT * N_TOKENS * 4 * 1.5, f"{grown / 1e6:.1f} MB kept"
    assert all(getattr(t, "typecode", None) == TYPECODE for t in kept)
    assert all(len(t) == N_TOKENS for t in kept)
    assert list(kept[3][:3]) == [1021, 1022, 1023]
    assert store.tokens(entries[0]) is kept[0], "read once per file version"


def test_a_rewritten_file_is_read_again(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    make_session(store.dir, "aaaaaaaaaaaa", tokens=[5, 6, 7])
    entry = store.get("aaaaaaaaaaaa")
    assert list(store.tokens(entry)) == [5, 6, 7]
    write_slot_save(entry.kv_path, [5, 6, 7, 8, 9], kv_bytes=200)  # another size: another version
    assert list(store.tokens(entry)) == [5, 6, 7, 8, 9]
