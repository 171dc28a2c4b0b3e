"""Restore points on disk: the sidecar describes them, the store commits them as it commits a save
(crash-safe, claimed by their session, counted in its size, removed with it), an update keeps the
ones the new version still starts with, and the pure rules choose which to make, keep and use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sessions_helpers import FIXTURE, facts_of, make_session, write_slot_save

from slotkeeper.core.sessions import saving
from slotkeeper.core.sessions.points import (
    MIN_POINT_TOKENS,
    best_point,
    keep_points,
    prompt_point_back,
    wanted_points,
)
from slotkeeper.core.sessions.sidecar import (
    POINT_PROMPT,
    POINT_USER,
    RestorePoint,
    Sidecar,
    load_sidecar,
    tokens_digest,
)
from slotkeeper.core.sessions.store import SessionStore

SID = "abcdefabcdef"
CONVERSATION = list(range(1, 1001))


def point(n: int, kind: str = POINT_USER, name: str | None = None) -> RestorePoint:
    return RestorePoint(kv_file=name or f"{SID}.{n:08x}.kv", n_tokens=n,
                        tokens_digest=tokens_digest(CONVERSATION[:n]), size_bytes=10,
                        content_hash="xxh3_128:" + "0" * 32, kind=kind, made_at="2026-01-01T00:00:00Z")


# -- the sidecar ------------------------------------------------------------------------------
def test_the_sidecar_keeps_its_points_and_a_file_without_them_reads_and_writes_as_before():
    base = Sidecar.from_json(json.loads(FIXTURE.read_text()))
    assert base.points == () and "points" not in base.to_json()  # older files stay as they were
    with_points = replace(base, points=(point(700, POINT_PROMPT, f"{base.id}.000002bc.kv"),
                                        point(300, name=f"{base.id}.0000012c.kv")))
    data = with_points.to_json()
    assert [p["n_tokens"] for p in data["points"]] == [700, 300]
    assert Sidecar.from_json(json.loads(json.dumps(data))) == with_points
    assert Sidecar.from_index(data) == with_points  # the sessions index's copy


@pytest.mark.parametrize("bad", [{"kind": "elsewhere"}, {"kv_file": "../x.kv"}, {"n_tokens": 0},
                                 {"n_tokens": -5}, {"tokens_digest": "nope"}, {"content_hash": None},
                                 {"kv_file": "SAVE"}, {"kv_file": "0123456789ab.00000001.kv"},
                                 {"n_tokens": 10**9}])
def test_a_malformed_or_foreign_point_drops_that_point_only_never_a_path(bad):
    base = Sidecar.from_json(json.loads(FIXTURE.read_text()))
    good = point(300, name=f"{base.id}.0000012c.kv")
    data = replace(base, points=(point(200, name=f"{base.id}.000000c8.kv"), good)).to_json()
    data["points"][0].update({k: base.kv_file if v == "SAVE" else v for k, v in bad.items()})
    read = Sidecar.from_json(data)
    assert read.points == (good,) and read.kv_file == base.kv_file  # the conversation itself reads


def test_far_too_many_points_entries_keep_the_conversation_readable():
    base = Sidecar.from_json(json.loads(FIXTURE.read_text()))
    data = base.to_json()
    data["points"] = [point(300, name=f"{base.id}.{i:08x}.kv").to_json() for i in range(10_000)]
    read = Sidecar.from_json(json.loads(json.dumps(data)))
    assert len(read.points) == 64 and read.kv_file == base.kv_file


def test_points_that_are_not_a_list_are_none():
    data = Sidecar.from_json(json.loads(FIXTURE.read_text())).to_json()
    data["points"] = {"not": "a list"}
    assert Sidecar.from_json(data).points == ()


# -- the rules --------------------------------------------------------------------------------
def test_the_points_wanted_are_near_the_prompts_end_and_at_the_last_user_message_start():
    assert wanted_points(n_prompt=900, user_start=600, n_held=950) == [(897, POINT_PROMPT), (600, POINT_USER)]
    assert wanted_points(900, 600, 950, have=[897]) == [(600, POINT_USER)]
    assert wanted_points(900, None, 950) == [(897, POINT_PROMPT)]
    # Too short to be worth a restore; a user start at the prompt point is no point of its own.
    assert wanted_points(MIN_POINT_TOKENS, None, 100) == []
    assert wanted_points(900, 897, 950) == [(897, POINT_PROMPT)]
    # sliding-window layers roll back in RAM to the last token: their point is one token short
    assert wanted_points(900, 600, 950, back=prompt_point_back(swa=True))[0] == (899, POINT_PROMPT)
    assert prompt_point_back(swa=False) == 3


def test_the_last_turns_points_stay_then_earlier_ones_newest_first_with_user_points_spaced():
    points = [point(990, POINT_PROMPT), point(900), point(880, POINT_PROMPT), point(850), point(600),
              point(400), point(100), point(300, POINT_PROMPT)]
    kept, dropped = keep_points(points, n_tokens=1000, spacing=300)
    # the longest of each kind; earlier prompt points (llama-server's checkpoints); earlier user
    # points at least 300 below the shortest kept so far
    assert [p.n_tokens for p in kept] == [990, 900, 880, 400, 300]
    assert sorted(p.n_tokens for p in dropped) == [100, 600, 850]
    # A point the conversation no longer strictly extends is dropped; so is one past the limit.
    kept, dropped = keep_points(points, n_tokens=900, spacing=1, limit=3)
    assert [p.n_tokens for p in kept] == [880, 850, 600]


def test_points_are_kept_within_what_they_may_add_to_the_save_the_last_two_always():
    points = [point(990, POINT_PROMPT), point(900), point(880, POINT_PROMPT), point(300, POINT_PROMPT)]
    price = {990: 50, 900: 20, 880: 40, 300: 10}  # what each adds beyond the save (shared bytes aside)

    def cost(kept):
        return sum(price[p.n_tokens] for p in kept)

    kept, _ = keep_points(points, n_tokens=1000, allowance=75, cost=cost)
    assert [p.n_tokens for p in kept] == [990, 900]  # 880 would take it to 110; 300 fits after it: 80
    kept, _ = keep_points(points, n_tokens=1000, allowance=80, cost=cost)
    assert [p.n_tokens for p in kept] == [990, 900, 300]
    kept, _ = keep_points(points, n_tokens=1000, allowance=10, cost=cost)
    # over it alone: the last prompt point and the last user point are kept all the same (a
    # Regenerate's and an edit's)
    assert [p.n_tokens for p in kept] == [990, 900]


def test_the_point_chosen_is_the_longest_the_request_strictly_extends():
    points = [point(899, POINT_PROMPT), point(600)]
    # a client that re-rendered the reply: shares the whole prompt
    assert best_point(points, shared=905, n_request=1200).n_tokens == 899
    # Regenerate: the same 900-token prompt again
    assert best_point(points, shared=900, n_request=900).n_tokens == 899
    # an edited last message: shares up to its start
    assert best_point(points, shared=640, n_request=700).n_tokens == 600
    # exactly a point's tokens and nothing after: llama-server would roll back one, so not usable
    assert best_point(points, shared=600, n_request=600) is None
    assert best_point(points, shared=500, n_request=1000) is None


# -- the store ----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def points_unbounded(monkeypatch):
    """The files here are stand-ins, not states: each a piece of its own, as big as the "save". What
    points may add is tested with real states (tests/e2e); here every point fits."""
    from slotkeeper.core.sessions import point_files

    monkeypatch.setattr(point_files, "POINTS_SHARE", 1000.0)


def _session(folder: Path) -> tuple[SessionStore, Sidecar]:
    sc = make_session(folder, SID, tokens=CONVERSATION)
    store = SessionStore(folder)
    store.listing()
    return store, sc


def _incoming(folder: Path, n: int, tokens: list[int] = CONVERSATION) -> saving.Written:
    path = write_slot_save(folder / f"incoming-{n:016x}.kv", tokens[:n], kv_bytes=100 + n)
    return saving.Written(path, tokens[:n], path.stat().st_size, 0, slot=0)


def test_a_point_is_committed_beside_its_session_claimed_counted_and_deleted_with_it(tmp_path):
    folder = tmp_path / "sessions"
    store, sc = _session(folder)
    main_size = sc.size_bytes
    after = saving.commit_point(store, _incoming(folder, 899), SID, POINT_PROMPT)
    assert after is not None and [p.n_tokens for p in after.points] == [899]
    p = after.points[0]
    assert (folder / p.kv_file).stat().st_mode & 0o777 == 0o600
    assert p.verified is not None  # hashed as it was committed: a restore need not hash it again
    assert load_sidecar(folder / f"{SID}.json").points == after.points
    assert not list(folder.glob("incoming-*"))
    # One session, its size with its point (its manifest and the pieces only it uses); the point
    # and its pieces are no unmanaged files and no leftovers.
    listing = store.listing()
    assert [e.id for e in listing.sessions] == [SID] and listing.unmanaged == []
    pieces_bytes = sum(after.pieces.values())
    assert pieces_bytes > 0 and all(size > 0 for size in after.pieces.values())
    assert listing.sessions[0].size_bytes == main_size + p.size_bytes + pieces_bytes
    assert store.usage_bytes() == main_size + p.size_bytes + pieces_bytes
    assert store.sweep() == [] and (folder / p.kv_file).exists()
    assert SessionStore(folder).sweep() == []  # a new process (no index kept) claims it too
    store.delete(SID)
    assert sorted(x.name for x in folder.iterdir() if not x.name.startswith(".")) == ["pieces"]
    store.states.collect(grace_seconds=0)  # the pieces it used go with the next collection
    assert not list((folder / "pieces").rglob("*.kvp"))


def test_a_point_whose_tokens_the_session_no_longer_starts_with_is_not_kept(tmp_path):
    folder = tmp_path / "sessions"
    store, _ = _session(folder)
    written = _incoming(folder, 500)
    other = saving.Written(written.path, [7] * 500, written.size, 0, 0)
    write_slot_save(written.path, [7] * 500)
    other = replace(other, size=written.path.stat().st_size)
    assert saving.commit_point(store, other, SID, POINT_USER) is None
    assert load_sidecar(folder / f"{SID}.json").points == ()
    assert not list(folder.glob("incoming-*")) and len(list(folder.glob("*.kv"))) == 1


def test_a_point_file_left_by_a_crash_before_its_sidecar_is_swept(tmp_path):
    folder = tmp_path / "sessions"
    store, _ = _session(folder)
    stray = folder / f"{SID}.0badc0de.kv"
    write_slot_save(stray, CONVERSATION[:300])
    assert store.sweep() == [stray.name]


def test_an_update_keeps_the_points_the_new_version_starts_with_and_removes_the_rest(tmp_path):
    folder = tmp_path / "sessions"
    store, sc = _session(folder)
    kept_one = saving.commit_point(store, _incoming(folder, 400), SID, POINT_USER)
    assert kept_one is not None
    after = saving.commit_point(store, _incoming(folder, 899), SID, POINT_PROMPT)
    assert after is not None and [p.n_tokens for p in after.points] == [899, 400]
    # The conversation goes on from token 600 differently (an edit past the first point): an update
    # within the tail slack is not it, so commit the new version as lineage would for an update.
    new_tokens = CONVERSATION[:600] + [5000 + i for i in range(500)]
    incoming = write_slot_save(folder / "incoming-00000000000000aa.kv", new_tokens)
    ctx = saving.SaveContext(facts_of(after), after.arch, after.llama_build)
    written = saving.Written(incoming, new_tokens, incoming.stat().st_size, 0, 0)
    out = saving.commit_written(store, written, ctx, lambda t: ("t", "p"), current_id=SID)
    assert out.kind == "fork"  # diverged inside the session: a new one; the old keeps its points
    assert [p.n_tokens for p in load_sidecar(folder / f"{SID}.json").points] == [899, 400]
    assert out.sidecar is not None and out.sidecar.points == ()
    # A true update (the conversation extended) keeps both.
    longer = CONVERSATION + [9] * 50
    incoming = write_slot_save(folder / "incoming-00000000000000bb.kv", longer)
    out = saving.commit_written(store, saving.Written(incoming, longer, incoming.stat().st_size, 0, 0), ctx,
                                lambda t: ("t", "p"), current_id=SID)
    assert out.kind == "update" and [p.n_tokens for p in out.sidecar.points] == [899, 400]
    files = {p.kv_file for p in out.sidecar.points}
    assert all((folder / f).exists() for f in files)
    # An update that re-renders the end (inside the tail slack) drops the points past the change.
    late = saving.commit_point(store, _incoming(folder, 1046, longer), SID, POINT_PROMPT)
    # the earlier prompt point stays; the user point is an earlier turn's now, within the spacing of
    # the points kept (the next turn's own user point is made after its prompt point)
    assert late is not None and [p.n_tokens for p in late.points] == [1046, 899]
    gone = late.points[0].kv_file
    changed_end = longer[:1044] + [8] * 10
    incoming = write_slot_save(folder / "incoming-00000000000000cc.kv", changed_end)
    out = saving.commit_written(store, saving.Written(incoming, changed_end, incoming.stat().st_size, 0, 0),
                                ctx, lambda t: ("t", "p"), current_id=SID)
    assert out.kind == "update" and [p.n_tokens for p in out.sidecar.points] == [899]
    assert not (folder / gone).exists() and store.sweep() == []


def test_over_budget_the_points_of_the_least_recently_used_conversations_go_before_any_conversation(tmp_path):
    from slotkeeper.core.services.sessions import SessionsService

    folder = tmp_path / "sessions"
    store, _ = _session(folder)  # used 2026-01-01
    newer = make_session(folder, "bbbbbbbbbbbb", tokens=CONVERSATION, used="2026-02-01T00:00:00Z")
    store.listing()
    for sid, extra in ((SID, 0), (newer.id, 1000)):  # states of their own (alike, they would share pieces)
        path = write_slot_save(folder / f"incoming-{extra:016x}.kv", CONVERSATION[:900],
                               kv_bytes=1000 + extra)
        written = saving.Written(path, CONVERSATION[:900], path.stat().st_size, 0, slot=0)
        assert saving.commit_point(store, written, sid, POINT_PROMPT) is not None
    sizes = {e.id: e.size_bytes for e in store.listing().sessions}
    older = load_sidecar(folder / f"{SID}.json")
    old_points = sum(p.size_bytes for p in older.points) + sum(older.pieces.values())
    service = SessionsService(store, in_slots=frozenset, budget=lambda: 10**9)
    # A budget the older conversation's points alone bring it under: only they go.
    outcome = service.prune(budget=sum(sizes.values()) - old_points)
    assert outcome.plan.delete == []
    assert load_sidecar(folder / f"{SID}.json").points == ()
    assert len(load_sidecar(folder / f"{newer.id}.json").points) == 1
    assert sorted(e.id for e in store.sessions()) == sorted([SID, newer.id])
    assert store.sweep() == [] and len([*folder.glob("*.kv"), *folder.glob("*.kvm")]) == 3
    # Tighter: the newer one's points go too, then the least recently used conversation.
    newest = load_sidecar(folder / f"{newer.id}.json")
    newer_points = sum(p.size_bytes for p in newest.points) + sum(newest.pieces.values())
    outcome = service.prune(budget=sizes[newer.id] - newer_points + 1)
    assert load_sidecar(folder / f"{newer.id}.json").points == ()
    assert [c.id for c in outcome.plan.delete] == [SID]


def test_verify_hashes_the_points_and_drops_a_damaged_one_without_marking_the_conversation(tmp_path):
    folder = tmp_path / "sessions"
    store, _ = _session(folder)
    good = saving.commit_point(store, _incoming(folder, 400), SID, POINT_USER)
    after = saving.commit_point(store, _incoming(folder, 900), SID, POINT_PROMPT)
    assert good is not None and after is not None and len(after.points) == 2
    damaged = next(p for p in after.points if p.n_tokens == 900)
    data = bytearray((folder / damaged.kv_file).read_bytes())
    data[-1] ^= 0xFF  # same size, another byte
    (folder / damaged.kv_file).write_bytes(bytes(data))
    entry = store.verify(SID)
    assert entry.problems == [] and entry.sidecar.corrupt is None
    assert [p.n_tokens for p in entry.sidecar.points] == [400]
    assert not (folder / damaged.kv_file).exists()


def test_a_restore_of_a_damaged_point_is_refused_before_the_server_and_the_point_dropped(tmp_path):
    from slotkeeper.core.sessions.restoring import RestoreRefused, check_restorable

    folder = tmp_path / "sessions"
    store, sc = _session(folder)
    after = saving.commit_point(store, _incoming(folder, 900), SID, POINT_PROMPT)
    point = after.points[0]
    entry, chosen = check_restorable(store, SID, facts_of(sc), point.kv_file)
    assert chosen == point and entry.id == SID
    with open(folder / point.kv_file, "ab") as f:
        f.write(b"x")  # longer than saved
    with pytest.raises(RestoreRefused, match="restore point at 900 tokens"):
        check_restorable(store, SID, facts_of(sc), point.kv_file)
    assert load_sidecar(folder / f"{SID}.json").points == ()
    assert store.get(SID).problems == []  # the conversation itself is whole
