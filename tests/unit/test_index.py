"""The sessions index: the longest saved prefix of a prompt, kept true to the folder and on disk."""


from slotkeeper.core.sessions.index import BLOCK, TokenIndex

A = list(range(1, 10 * BLOCK + 1))


def test_the_longest_shared_prefix_by_whole_blocks():
    idx = TokenIndex()
    idx.add_tokens("a", "m", "a.kv", 1, 1, A)
    idx.add_tokens("b", "m", "b.kv", 1, 1, A[: 4 * BLOCK] + [0] * (3 * BLOCK))
    idx.add_tokens("other-model", "x", "c.kv", 1, 1, A)
    prompt = A[: 7 * BLOCK + 10] + [99] * 100
    [hit] = idx.longest_prefix(prompt, "m")
    assert hit.session_id == "a" and hit.n_tokens == 7 * BLOCK
    hits = idx.longest_prefix(A[: 3 * BLOCK] + [5] * BLOCK, "m")
    assert {h.session_id for h in hits} == {"a", "b"} and hits[0].n_blocks == 3
    assert idx.longest_prefix([7] * 500, "m") == []
    assert idx.longest_prefix(A[:BLOCK - 1], "m") == []  # less than a block: nothing to index by
    idx.remove("a")
    assert idx.longest_prefix(prompt, "m")[0].session_id == "b"


def test_sync_reads_only_what_changed_and_forgets_what_is_gone(tmp_path):
    idx = TokenIndex()
    reads = []

    def read(sid):
        reads.append(sid)
        return A

    idx.sync([("a", "m", "a.1.kv", 10, 1), ("b", "m", "b.1.kv", 10, 1)], read)
    assert sorted(reads) == ["a", "b"]
    reads.clear()
    idx.sync([("a", "m", "a.1.kv", 10, 1), ("b", "m", "b.2.kv", 12, 2)], read)  # b saved again
    assert reads == ["b"]
    idx.sync([("b", "m", "b.2.kv", 12, 2)], read)  # a deleted by the CLI
    assert "a" not in idx and "b" in idx


def test_the_index_on_disk_round_trips_and_a_damaged_one_is_rebuilt(tmp_path):
    idx = TokenIndex()
    idx.add_tokens("a", "m", "a.kv", 10, 5, A)
    idx.save(tmp_path / "index.json")
    again = TokenIndex.load(tmp_path / "index.json")
    assert again.get("a") == idx.get("a")
    assert again.longest_prefix(A, "m")[0].n_tokens == 10 * BLOCK
    (tmp_path / "index.json").write_text("{ damaged")
    assert len(TokenIndex.load(tmp_path / "index.json")) == 0
    assert len(TokenIndex.load(tmp_path / "missing.json")) == 0


def test_ten_thousand_sessions_one_answer():
    idx = TokenIndex()
    for i in range(10_000):
        idx.add_tokens(f"s{i}", "m", "k", 1, 1, [i] * (2 * BLOCK))
    [hit] = idx.longest_prefix([3] * (2 * BLOCK) + [1], "m")
    assert hit.session_id == "s3" and hit.n_blocks == 2
