"""The sessions index: the longest saved prefix of a prompt, lineage's few candidates, and the
listing kept true to the folder (and on disk) without reading every file."""

import json
import os
import shutil
import stat
import time

import orjson
import pytest
from sessions_helpers import make_session, run_cli, save_incoming, write_slot_save

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.sessions import lineage, saving
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.index import BLOCK, HEAD_TOKENS, TAIL_SLACK, TokenIndex
from slotkeeper.core.sessions.index_file import index_bytes, load_index, write_index
from slotkeeper.core.sessions.store import SessionStore

A = list(range(1, 10 * BLOCK + 1))
SHA = "1a2b3c4d000000000000000000000000000000000000000000000000deadbeef"  # the fixture sidecar's model


def test_lineage_rules_and_the_index_agree():
    assert (HEAD_TOKENS, TAIL_SLACK) == (lineage.DEFAULT_MIN_FORK_PREFIX, lineage.DEFAULT_TAIL_SLACK)


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


def test_ten_thousand_sessions_one_answer():
    idx = TokenIndex()
    for i in range(10_000):
        idx.add_tokens(f"s{i}", "m", "k", 1, 1, [i] * (2 * BLOCK))
    [hit] = idx.longest_prefix([3] * (2 * BLOCK) + [1], "m")
    assert hit.session_id == "s3" and hit.n_blocks == 2


def _classify(idx, tokens, n_prompt=None, prefer=None, saved=None):
    ids = idx.lineage_candidates(tokens, "m", prefer=prefer, n_prompt=n_prompt)
    return lineage.classify(tokens, [(i, saved[i]) for i in ids], new_n_prompt=n_prompt), ids


def test_lineage_candidates_find_what_comparing_everything_finds_among_ten_thousand():
    """10,000 sessions share a system prompt; lineage compares at most a few of them and reaches the
    verdict comparing all of them would: update, fork, contained, short sessions, and new."""
    system = list(range(1000, 1000 + 3 * BLOCK + 5))
    saved: dict[str, list[int]] = {}
    idx = TokenIndex()
    for i in range(10_000):
        tokens = system + [50_000 + i] * (i % 200 + 1)
        saved[f"s{i:05d}"] = tokens
    saved["short"] = [7, 8, 9]  # shorter than a fork's least shared prefix
    saved["edge"] = A[: 2 * BLOCK + 3]  # ends within TAIL_SLACK after a whole block
    saved["long"] = list(range(20_000, 20_300))
    for sid, tokens in saved.items():
        idx.add_tokens(sid, "m", f"{sid}.kv", 1, 1, tokens)
    cases = [
        saved["s01234"] + [1, 2, 3],  # continues one: update
        saved["s01234"][:-2] + [4, 4, 4, 4],  # re-rendered tail: update
        system + [50_000 + 77] * 60 + [9] * 40,  # leaves s00077 inside it: a fork
        [7, 8, 9, 10, 11],  # continues the short one
        A[: 2 * BLOCK + 1] + [5] * 20,  # re-rendered tail of "edge", across its last block
        [3] * 100,  # nothing shared
        system[:20],  # too little shared with anyone
    ]
    for tokens in cases:
        everything = lineage.classify(tokens, list(saved.items()))
        got, ids = _classify(idx, tokens, saved=saved)
        assert len(ids) <= 9
        assert (got.kind, got.session_id) == (everything.kind, everything.session_id), tokens[-5:]
        if got.kind != "new":  # a "new" verdict's common_prefix is for logs only
            assert got.common_prefix == everything.common_prefix
    # contained: a prompt that a longer session holds, then a reply it holds re-rendered
    tokens = saved["long"][:200] + [1]
    everything = lineage.classify(tokens, list(saved.items()), new_n_prompt=len(tokens) - 1)
    got, _ = _classify(idx, tokens, n_prompt=len(tokens) - 1, saved=saved)
    assert everything.kind == got.kind == "contained"


def test_lineage_candidates_put_the_slots_own_session_first_among_equals():
    idx = TokenIndex()
    for i in range(50):
        idx.add_tokens(f"copy{i:02d}", "m", "k", 1, 1, A)  # the same conversation, saved 50 times
    ids = idx.lineage_candidates(A + [1], "m", prefer="copy33", order=lambda s: (s != "copy33", s))
    assert ids[0] == "copy33" and len(ids) <= 8


# -- the listing, kept true to the folder ---------------------------------------------------
class CountingStore(SessionStore):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reads: list[str] = []

    def _read_record(self, session_id, stamp):
        self.reads.append(session_id)
        return super()._read_record(session_id, stamp)


def old_enough(*paths):
    """Files written a while ago (an index trusts a stat only once its file is not being written)."""
    past = time.time() - 10
    for p in paths:
        os.utime(p, (past, past), follow_symlinks=False)


def test_a_listing_reads_only_the_sidecars_that_changed_and_repairs_the_rest(tmp_path):
    folder = tmp_path / "sessions"
    for sid in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"):
        make_session(folder, sid, tokens=A[:100])
    old_enough(*folder.iterdir())
    store = CountingStore(folder, index_file=tmp_path / "index.json")
    assert len(store.listing().sessions) == 3
    assert sorted(store.reads) == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"]
    store.reads.clear()
    assert len(store.listing().sessions) == 3 and store.reads == []

    # Behind its back: another process pins one, a user deletes one, adds one, damages a KV file.
    SessionStore(folder).set_pinned("aaaaaaaaaaaa", True)
    (folder / "bbbbbbbbbbbb.json").unlink()
    make_session(folder, "dddddddddddd", tokens=A[:50])
    with open(folder / "cccccccccccc.00000000.kv", "ab") as f:
        f.write(b"junk")
    listing = store.listing()
    assert sorted(store.reads) == ["aaaaaaaaaaaa", "dddddddddddd"]
    by_id = {e.id: e for e in listing.sessions}
    assert set(by_id) == {"aaaaaaaaaaaa", "cccccccccccc", "dddddddddddd"}
    assert by_id["aaaaaaaaaaaa"].sidecar.pinned
    assert by_id["cccccccccccc"].problems and "were saved" in by_id["cccccccccccc"].problems[0]
    assert by_id["cccccccccccc"].size_bytes == (folder / "cccccccccccc.00000000.kv").stat().st_size
    assert [u.name for u in listing.unmanaged] == ["bbbbbbbbbbbb.00000000.kv"]  # its sidecar is gone

    # The JSON rows are the entries' own JSON, byte for byte, in the same order.
    assert store.listing_rows() == [orjson.dumps(e.to_json()) for e in store.listing().sessions]


def test_a_look_at_the_folder_reads_sidecars_without_holding_the_index_lock(tmp_path):
    """Routing takes the index's lock on the engine's loop: a first look at many sidecars must not
    hold it while it reads them. A change noted meanwhile is not undone by the older read."""
    import threading

    folder = tmp_path / "sessions"
    for sid in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        make_session(folder, sid, tokens=A[:100])
    old_enough(*folder.iterdir())
    taken: list[bool] = []

    class Store(SessionStore):
        def _read_record(self, session_id, stamp):
            def other_thread():  # as routing would, while this sidecar is read
                got = self.index.lock.acquire(timeout=2)
                taken.append(got)
                if got:
                    if session_id == "aaaaaaaaaaaa":  # a newer record noted in between
                        self.index.set_record(session_id, newer)
                    self.index.lock.release()

            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
            return super()._read_record(session_id, stamp)

    store = Store(folder)
    newer = SessionStore(folder)._read_record("aaaaaaaaaaaa", (0, 0, 0, 0, 0))
    store.listing()
    assert taken == [True, True]
    assert store.index.records["aaaaaaaaaaaa"] is newer  # kept, not replaced by the older read
    assert store.index.records["bbbbbbbbbbbb"].error is None


def test_a_sidecar_replaced_behind_its_back_by_a_fifo_or_a_link_is_a_problem_not_a_hang(tmp_path):
    folder = tmp_path / "sessions"
    make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    make_session(folder, "bbbbbbbbbbbb", tokens=A[:100])
    old_enough(*folder.iterdir())
    store = SessionStore(folder, index_file=tmp_path / "index.json")
    assert all(not e.problems for e in store.listing().sessions)
    (folder / "aaaaaaaaaaaa.json").unlink()
    os.mkfifo(folder / "aaaaaaaaaaaa.json")
    (folder / "bbbbbbbbbbbb.00000000.kv").unlink()
    (folder / "bbbbbbbbbbbb.00000000.kv").symlink_to("/etc/passwd")
    by_id = {e.id: e for e in store.listing().sessions}
    assert by_id["aaaaaaaaaaaa"].sidecar is None and "FIFO" in by_id["aaaaaaaaaaaa"].problems[0]
    assert "symbolic link" in by_id["bbbbbbbbbbbb"].problems[0] and by_id["bbbbbbbbbbbb"].size_bytes == 0
    rows = {r["id"]: r for r in map(orjson.loads, store.listing_rows())}
    assert rows["aaaaaaaaaaaa"]["status"] == rows["bbbbbbbbbbbb"]["status"] == "corrupt"


def test_the_index_is_kept_private_on_disk_and_the_next_process_reads_nothing_unchanged(tmp_path):
    folder, index_file = tmp_path / "sessions", tmp_path / "cache" / "index.json"
    index_file.parent.mkdir(mode=0o700)
    for i in range(20):
        make_session(folder, f"{i:012x}", tokens=A[: 70 + i])
    old_enough(*folder.iterdir())
    first = SessionStore(folder, index_file=index_file)
    first.listing()
    assert first.index_tokens() == 20  # the token part: only the engine needs it
    assert first.save_index() and stat.S_IMODE(index_file.stat().st_mode) == 0o600
    assert not first.save_index()  # nothing changed since

    second = CountingStore(folder, index_file=index_file)
    assert len(second.listing().sessions) == 20 and second.reads == []
    assert second.index_tokens() == 0 and len(second.index) == 20
    assert second.index.longest_prefix(A[:200], SHA)[0].n_blocks == 1

    # Damaged, of another layout, or of another folder: rebuilt from the files.
    for text in ("{ damaged", json.dumps({"version": 1, "sessions": {}}), "[]"):
        index_file.write_text(text)
        third = CountingStore(folder, index_file=index_file)
        assert len(third.listing().sessions) == 20 and len(third.reads) == 20
    first.save_index() if first.index.dirty else write_index(index_file, index_bytes(first.index))
    elsewhere = tmp_path / "copy"
    shutil.copytree(folder, elsewhere)
    assert len(load_index(index_file, elsewhere).records) == 0
    # A tampered entry that would make a path of an id is dropped, never used: in the sidecar
    # (a listing) and in the facts a JSON listing reads instead.
    lines = index_file.read_bytes().split(b"\n")
    meta, sidecar, row, tokens = lines[1].split(b"\t")
    meta_d, sidecar_d = orjson.loads(meta), orjson.loads(sidecar)
    sid = meta_d["id"]
    meta_d["facts"]["kv_file"] = sidecar_d["kv_file"] = "../../settings.json"
    lines[1] = b"\t".join((orjson.dumps(meta_d), orjson.dumps(sidecar_d), row, tokens))
    index_file.write_bytes(b"\n".join(lines))
    fifth = CountingStore(folder, index_file=index_file)
    row = next(r for r in map(orjson.loads, fifth.listing_rows()) if r["id"] == sid)
    assert row["kv_file"] == f"{sid}.00000000.kv" and row["status"] == "ok" and fifth.reads == [sid]
    index_file.write_bytes(b"\n".join(lines))
    fourth = CountingStore(folder, index_file=index_file)
    entry = next(e for e in fourth.listing().sessions if e.id == sid)
    assert entry.kv_path.parent == folder and not entry.problems and fourth.reads == [sid]


def test_a_save_reads_the_token_lists_of_a_few_sessions_not_of_every_one(tmp_path, monkeypatch):
    folder = tmp_path / "sessions"
    system = list(range(1000, 1000 + 2 * BLOCK))
    for i in range(300):
        make_session(folder, f"{i:012x}", tokens=system + [5000 + i] * 30, model_sha256=SHA)
    store = SessionStore(folder, index_file=tmp_path / "index.json")
    store.listing()
    store.index_tokens()
    read = []
    real = store.tokens
    monkeypatch.setattr(store, "tokens", lambda e: read.append(e.id) or real(e))
    facts = ServerFacts(model_sha256=SHA, model_path="/m.gguf", flash_attn=True, cache_type_k="q8_0",
                        cache_type_v="q8_0", swa_full=False, n_parallel=2, n_ctx_slot=16384, swa=False)
    name = "incoming-0000000000000000.kv"
    size = write_slot_save(folder / name, system + [5000 + 123] * 30 + [1, 2, 3]).stat().st_size
    out = save_incoming(store, name, size, 0, saving.SaveContext(facts, "qwen3", "b1"),
                               lambda t: ("title", "preview"))
    assert out.kind == "update" and out.sidecar.id == f"{123:012x}"
    assert len(set(read)) <= saving.LINEAGE_FINALISTS
    # The index learnt the save itself: the next listing reads nothing it wrote (once it is
    # old enough to trust).
    again = CountingStore(folder)
    again._index = store.index
    for rec in store.index.records.values():
        rec.racy = False
    again.listing()
    assert again.reads == []


def test_the_cli_lists_from_the_index_and_keeps_it(tmp_path):
    paths = app_paths(tmp_path / "data").ensure()
    for i in range(5):
        make_session(paths.sessions_dir, f"{i:012x}", tokens=A[:80])
    r = run_cli(paths.data_dir, "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["id"] for x in rows] == [e.id for e in SessionStore(paths.sessions_dir).listing().sessions]
    assert (paths.sessions_index_file.exists()
            and stat.S_IMODE(paths.sessions_index_file.stat().st_mode) == 0o600)
    (paths.sessions_dir / f"{3:012x}.json").unlink()
    rows = json.loads(run_cli(paths.data_dir, "list", "--json").stdout)
    assert len(rows) == 4 and f"{3:012x}" not in {x["id"] for x in rows}


@pytest.mark.parametrize("n", [10_000])
def test_a_listing_of_many_sessions_reads_no_sidecar_twice(tmp_path, n):
    folder = tmp_path / "sessions"
    make_session(folder, "000000000000", tokens=A[:80])
    old_enough(*folder.iterdir())
    for i in range(1, n):  # copies: a listing cares about files, not how they were made
        sid = f"{i:012x}"
        shutil.copyfile(folder / "000000000000.00000000.kv", folder / f"{sid}.00000000.kv")
        data = json.loads((folder / "000000000000.json").read_text())
        data.update(id=sid, kv_file=f"{sid}.00000000.kv")
        (folder / f"{sid}.json").write_text(json.dumps(data))
    old_enough(*folder.iterdir())
    store = CountingStore(folder, index_file=tmp_path / "index.json")
    assert len(store.listing().sessions) == n and len(store.reads) == n
    store.save_index()
    again = CountingStore(folder, index_file=tmp_path / "index.json")
    assert len(again.listing_rows()) == n and again.reads == []


def test_loading_the_index_decodes_only_what_is_asked_for(tmp_path):
    """A JSON listing reads each session's facts and ready row, never its sidecar or token part;
    tokens are decoded when first asked for, and a save writes undecoded parts back unchanged."""
    folder, index_file = tmp_path / "sessions", tmp_path / "index.json"
    for i in range(6):
        make_session(folder, f"{i:012x}", tokens=A[: 100 + i])
    old_enough(*folder.iterdir())
    first = SessionStore(folder, index_file=index_file)
    expected = [orjson.dumps(e.to_json()) for e in first.listing().sessions]
    assert first.index_tokens() == 6 and first.save_index()

    lister = SessionStore(folder, index_file=index_file)
    assert lister.listing_rows() == expected
    index = lister.index
    assert all(rec._data is None for rec in index.records.values())  # no sidecar decoded
    assert len(index._pending_tokens) == 6 and not index._sessions  # no token part decoded
    index.forget(f"{5:012x}")  # forgetting one needs none decoded
    index.dirty = True
    lister.save_index()  # the undecoded token parts go back as they were

    router = SessionStore(folder, index_file=index_file)
    assert router.index._pending_tokens and not router.index.dirty
    assert router.index.longest_prefix(A[:300], SHA)[0].n_blocks == 1  # decoded on first use
    assert not router.index._pending_tokens and not router.index.dirty  # decoding is not a change
    router.listing()
    assert router.index_tokens() == 1  # only the forgotten one is read from its file again
    assert len(router.index) == 6


def test_json_rows_of_an_unchanged_folder_are_printed_again_and_any_change_makes_new_ones(tmp_path):
    folder, index_file = tmp_path / "sessions", tmp_path / "index.json"
    for i in range(4):
        make_session(folder, f"{i:012x}", tokens=A[: 100 + i])
    old_enough(*folder.iterdir())
    rows = SessionStore(folder, index_file=index_file).listing_rows()
    assert index_file.with_suffix(".rows").exists()

    again = CountingStore(folder, index_file=index_file)
    assert again.listing_rows() == rows and again._index is None  # the index was not even loaded

    def fresh_rows():
        store = CountingStore(folder, index_file=index_file)
        got = store.listing_rows()
        assert got == [orjson.dumps(e.to_json()) for e in SessionStore(folder).listing().sessions]
        return store, got

    # A KV file that grew (same sidecar): its row says so.
    with open(folder / f"{1:012x}.00000000.kv", "ab") as f:
        f.write(b"junk")
    old_enough(folder / f"{1:012x}.00000000.kv")
    store, got = fresh_rows()
    assert store._index is not None and got != rows
    assert orjson.loads(got[[orjson.loads(r)["id"] for r in got].index(f"{1:012x}")])["status"] == "corrupt"
    # A file added, a sidecar rewritten with its old times put back: new rows.
    (folder / "notes.txt").write_text("x")
    old_enough(folder / "notes.txt")
    assert fresh_rows()[0]._index is not None
    SessionStore(folder).set_pinned(f"{2:012x}", True)
    old_enough(*folder.iterdir())
    store, got = fresh_rows()
    assert {orjson.loads(r)["id"]: orjson.loads(r)["pinned"] for r in got}[f"{2:012x}"]
    # A folder that changed a moment ago keeps no rows (a stat may not show a change yet).
    index_file.with_suffix(".rows").unlink()
    SessionStore(folder).set_pinned(f"{3:012x}", True)
    fresh_rows()
    assert not index_file.with_suffix(".rows").exists()
    # A damaged rows file is not used.
    old_enough(*folder.iterdir())
    fresh_rows()
    index_file.with_suffix(".rows").write_bytes(b"junk")
    assert fresh_rows()[0]._index is not None


def test_the_rows_format_names_the_index_and_sidecar_layouts_it_was_made_for():
    from slotkeeper.core.sessions import rows
    from slotkeeper.core.sessions.index import INDEX_VERSION
    from slotkeeper.core.sessions.sidecar import SCHEMA_VERSION

    assert rows.ROWS_FORMAT.split("/")[1:] == [f"index-{INDEX_VERSION}", f"sidecar-{SCHEMA_VERSION}"]


def _cli_list_json(data_dir) -> tuple[list, bool]:
    """`sessions list --json` in a fresh interpreter: its rows, and whether it imported the store."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import json, sys
        from slotkeeper.cli.commands import main
        code = main(["sessions", "--data-dir", {str(data_dir)!r}, "list", "--json"])
        loaded = "slotkeeper.core.sessions.store" in sys.modules
        sys.stderr.write(json.dumps({{"code": code, "store": loaded}}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    info = json.loads(r.stderr.strip().splitlines()[-1])
    assert info["code"] == 0
    return json.loads(r.stdout), info["store"]


def test_the_cli_prints_an_unchanged_folders_rows_without_loading_the_sessions_code(tmp_path):
    paths = app_paths(tmp_path / "data").ensure()
    for i in range(3):
        make_session(paths.sessions_dir, f"{i:012x}", tokens=A[:80 + i])
    old_enough(*paths.sessions_dir.iterdir())
    first, loaded = _cli_list_json(paths.data_dir)
    assert loaded and len(first) == 3  # the full way, which keeps the rows
    again, loaded = _cli_list_json(paths.data_dir)
    assert not loaded and again == first  # the kept rows, nothing else
    (paths.sessions_dir / f"{1:012x}.json").unlink()  # a change: the full way again
    third, loaded = _cli_list_json(paths.data_dir)
    assert loaded and [r["id"] for r in third] == [r["id"] for r in first if r["id"] != f"{1:012x}"]
    (paths.sessions_dir / f"{0:012x}.json").unlink()
    (paths.sessions_dir / f"{2:012x}.json").unlink()
    old_enough(paths.sessions_dir)
    assert _cli_list_json(paths.data_dir)[0] == []
    assert _cli_list_json(paths.data_dir) == ([], False)  # an empty listing is kept too
