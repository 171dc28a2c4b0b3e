"""Disk budget: what a prune deletes, and that apply() does exactly that."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.pruner import (
    PruneCandidate,
    PruneError,
    PrunePlan,
    PruneResult,
    apply,
    plan,
)
from slotkeeper.core.sessions.sidecar import Sidecar

MB = 1_000_000


def session(
    sid: str, size: int = 10 * MB, day: int = 1, pinned: bool = False, created: str = ""
) -> PruneCandidate:
    return PruneCandidate(
        id=sid,
        title=f"Chat {sid}",
        size_bytes=size,
        last_used_at=f"2026-11-{day:02d}T12:00:00Z",
        pinned=pinned,
        created_at=created,
    )


def test_a_kv_file_named_by_several_sidecars_counts_once_and_only_its_owner_frees_it() -> None:
    # b.json is a copy of a.json's sidecar under another id: it names a's file, which it does not own.
    a = dataclasses.replace(session("a", day=2), kv_file="a.1.kv")
    b = dataclasses.replace(session("b", day=1), kv_file="a.1.kv", owns_kv_file=False)
    c = dataclasses.replace(session("c", day=9), kv_file="c.3.kv")
    result = plan([a, b, c], budget_bytes=15 * MB)
    assert result.bytes_before == 20 * MB  # not 30: one file is one file
    # Deleting b frees nothing (its delete leaves a's file alone), so a goes too, and no more.
    assert ids(result) == ["b", "a"] and result.bytes_after == 10 * MB and result.bytes_freed == 10 * MB
    assert plan([a, b, c], budget_bytes=20 * MB).delete == []


def ids(p: PrunePlan) -> list[str]:
    return [c.id for c in p.delete]


def test_under_budget_deletes_nothing() -> None:
    sessions = [session("a"), session("b")]
    result = plan(sessions, budget_bytes=20 * MB)
    assert result == PrunePlan(
        delete=[],
        bytes_freed=0,
        bytes_before=20 * MB,
        bytes_after=20 * MB,
        budget=20 * MB,
        over_budget_after=False,
    )


def test_least_recently_used_goes_first_and_only_as_many_as_needed() -> None:
    sessions = [session("new", day=9), session("old", day=1), session("mid", day=5)]
    result = plan(sessions, budget_bytes=15 * MB)
    assert ids(result) == ["old", "mid"]
    assert (result.bytes_before, result.bytes_freed, result.bytes_after) == (
        30 * MB,
        20 * MB,
        10 * MB,
    )
    assert not result.over_budget_after


def test_a_big_recent_session_is_kept_while_small_old_ones_go() -> None:
    # LRU, not largest-first: recency is what the user cares about.
    sessions = [session("big", size=50 * MB, day=9), session("s1", size=5 * MB, day=1),
                session("s2", size=5 * MB, day=2)]  # fmt: skip
    assert ids(plan(sessions, budget_bytes=50 * MB)) == ["s1", "s2"]


def test_usage_equal_to_the_budget_fits() -> None:
    assert ids(plan([session("a"), session("b")], budget_bytes=20 * MB)) == []
    assert ids(plan([session("a"), session("b", day=2)], budget_bytes=20 * MB - 1)) == ["a"]


def test_pinned_and_protected_survive_even_when_oldest() -> None:
    sessions = [
        session("pinned", day=1, pinned=True),
        session("in-slot", day=2),
        session("victim", day=3),
        session("recent", day=4),
    ]
    result = plan(sessions, budget_bytes=15 * MB, protected_ids={"in-slot"})
    assert ids(result) == ["victim", "recent"]
    assert result.bytes_after == 20 * MB
    assert result.over_budget_after


def test_budget_zero_deletes_everything_deletable() -> None:
    sessions = [session("a", day=2), session("b", day=1)]
    result = plan(sessions, budget_bytes=0)
    assert ids(result) == ["b", "a"]
    assert result.bytes_after == 0 and not result.over_budget_after


def test_budget_zero_with_a_pin_is_over_budget_after() -> None:
    result = plan([session("a"), session("p", pinned=True)], budget_bytes=0)
    assert ids(result) == ["a"]
    assert result.over_budget_after


def test_everything_pinned_is_over_budget_after() -> None:
    sessions = [session("a", pinned=True), session("b", pinned=True)]
    result = plan(sessions, budget_bytes=5 * MB)
    assert result.delete == []
    assert result.bytes_after == result.bytes_before == 20 * MB
    assert result.over_budget_after


# Files Slotkeeper did not write never cause a session to be pruned (they used to count towards
# the budget, so a local user who made llama-server write junk files got every real conversation
# pruned): the plan reports them and leaves them out of the usage it prunes to.
def test_unmanaged_bytes_never_cause_a_deletion() -> None:
    sessions = [session("a", day=1), session("b", day=2)]
    result = plan(sessions, budget_bytes=25 * MB, unmanaged_bytes=10 * MB)
    assert ids(result) == []
    assert (result.bytes_before, result.bytes_after, result.unmanaged_bytes) == (20 * MB, 20 * MB, 10 * MB)
    assert not result.over_budget_after


def test_unmanaged_bytes_alone_over_budget_prune_nothing() -> None:
    result = plan([session("a", size=1 * MB)], budget_bytes=5 * MB, unmanaged_bytes=10**15)
    assert ids(result) == []
    assert result.bytes_after == 1 * MB
    assert not result.over_budget_after


def test_sessions_over_budget_are_pruned_as_if_unmanaged_files_were_not_there() -> None:
    sessions = [session("a", day=1), session("b", day=2), session("c", day=3)]
    with_junk = plan(sessions, 15 * MB, unmanaged_bytes=10**15)
    assert ids(with_junk) == ["a", "b"]
    assert with_junk == dataclasses.replace(plan(sessions, 15 * MB), unmanaged_bytes=10**15)


def test_no_sessions() -> None:
    assert plan([], budget_bytes=0) == PrunePlan([], 0, 0, 0, 0, False)


def test_ties_break_by_created_at_then_id() -> None:
    sessions = [
        session("c", created="2026-10-02T00:00:00Z"),
        session("b", created="2026-10-01T00:00:00Z"),
        session("a", created="2026-10-02T00:00:00Z"),
    ]
    assert ids(plan(sessions, budget_bytes=0)) == ["b", "a", "c"]
    assert ids(plan(reversed(sessions), budget_bytes=0)) == ["b", "a", "c"]


def test_timestamps_are_compared_as_times_not_text() -> None:
    # As text "…:00Z" > "…:00.5Z"; as times it is the older one.
    whole = dataclasses.replace(session("whole"), last_used_at="2026-11-01T12:00:00Z")
    fraction = dataclasses.replace(session("fraction"), last_used_at="2026-11-01T12:00:00.5Z")
    assert ids(plan([fraction, whole], budget_bytes=10 * MB)) == ["whole"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget_bytes": -1}, "budget_bytes must not be negative"),
        ({"budget_bytes": 0, "unmanaged_bytes": -1}, "unmanaged_bytes must not be negative"),
    ],
)
def test_rejects_negative_amounts(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan([session("a")], **kwargs)


def test_rejects_duplicate_ids_and_negative_sizes_and_bad_times() -> None:
    with pytest.raises(ValueError, match="session a is listed twice"):
        plan([session("a"), session("a")], budget_bytes=0)
    with pytest.raises(ValueError, match="session a: negative size"):
        plan([session("a", size=-1)], budget_bytes=0)
    bad_time = dataclasses.replace(session("a"), last_used_at="yesterday")
    with pytest.raises(ValueError, match="session a: not an ISO-8601"):
        plan([bad_time], budget_bytes=0)


# Sizes come from the file system, not the sidecar (a sidecar claiming 10 TB made the next save
# prune every real session): a candidate is built from a listed entry, sized by its KV file.
def test_from_entry_takes_the_size_on_disk_not_the_sidecars_claim() -> None:
    sidecar = Sidecar(
        id="0123456789ab", kv_file="0123456789ab.kv", title="T", preview="", model_path="m",
        model_sha256="0" * 64, arch="llama", swa=False, swa_full=False, flash_attn=True,
        cache_type_k="f16", cache_type_v="f16", n_parallel=1, kv_unified=False,
        n_ctx_slot=4096, n_tokens=10, tokens_digest="0" * 16, size_bytes=10 * 10**12,
        content_hash="xxh3_128:" + "0" * 32, llama_build="b1",
        created_at="2026-11-01T00:00:00Z", last_used_at="2026-11-02T00:00:00Z", pinned=True,
    )  # fmt: skip
    entry = SessionEntry(sidecar.id, sidecar, None, [], size_bytes=1234)
    assert PruneCandidate.from_entry(entry) == PruneCandidate(
        id="0123456789ab", title="T", size_bytes=1234, last_used_at="2026-11-02T00:00:00Z",
        pinned=True, created_at="2026-11-01T00:00:00Z", kv_file="0123456789ab.kv",
    )  # fmt: skip
    with pytest.raises(ValueError, match="cannot be read"):
        PruneCandidate.from_entry(SessionEntry("x", None, None, ["unreadable"]))


# --- apply --------------------------------------------------------------------------


def test_apply_deletes_exactly_the_dry_run_in_order() -> None:
    sessions = [session(sid, day=day) for sid, day in [("c", 3), ("a", 1), ("d", 4), ("b", 2)]]
    dry_run = plan(sessions, budget_bytes=15 * MB)
    calls: list[str] = []
    result = apply(dry_run, calls.append)
    assert calls == ids(dry_run) == ["a", "b", "c"]
    assert result == PruneResult(deleted=["a", "b", "c"], failed=[])
    assert result.ok
    result.raise_for_failures()  # no-op


def test_apply_continues_after_a_failure_and_reports_it() -> None:
    dry_run = plan([session("a", day=1), session("b", day=2), session("c", day=3)], budget_bytes=0)
    error = PermissionError("file is locked")
    calls: list[str] = []

    def delete(sid: str) -> None:
        calls.append(sid)
        if sid == "b":
            raise error

    result = apply(dry_run, delete)
    assert calls == ["a", "b", "c"]
    assert result.deleted == ["a", "c"]
    assert result.failed == [("b", error)]
    assert not result.ok
    with pytest.raises(
        PruneError, match="1 session\\(s\\) could not be deleted: b: file is locked"
    ) as excinfo:
        result.raise_for_failures()
    assert excinfo.value.__cause__ is error


def test_apply_lets_keyboard_interrupt_through() -> None:
    def interrupted(sid: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        apply(plan([session("a")], budget_bytes=0), interrupted)


def test_apply_of_an_empty_plan_does_nothing() -> None:
    def never(sid: str) -> None:
        raise AssertionError("should not be called")

    assert apply(plan([session("a")], budget_bytes=100 * MB), never) == PruneResult()


# --- invariants ---------------------------------------------------------------------


@st.composite
def populations(draw: st.DrawFn) -> tuple[list[PruneCandidate], set[str], int, int]:
    n = draw(st.integers(0, 8))
    sessions = [
        session(
            f"s{i}",
            size=draw(st.integers(0, 100)),
            day=draw(st.integers(1, 28)),
            pinned=draw(st.booleans()),
        )
        for i in range(n)
    ]
    protected = set(draw(st.lists(st.sampled_from([s.id for s in sessions]))) if sessions else [])
    return sessions, protected, draw(st.integers(0, 500)), draw(st.integers(0, 50))


@given(populations())
def test_plan_invariants(case: tuple[list[PruneCandidate], set[str], int, int]) -> None:
    sessions, protected, budget, unmanaged = case
    result = plan(sessions, budget, protected, unmanaged)
    deleted = ids(result)

    assert len(set(deleted)) == len(deleted)
    assert not any(c.pinned or c.id in protected for c in result.delete)
    assert result.bytes_before == sum(s.size_bytes for s in sessions)  # unmanaged bytes never count
    assert result.unmanaged_bytes == unmanaged
    assert result.bytes_freed == sum(c.size_bytes for c in result.delete)
    assert result.bytes_after == result.bytes_before - result.bytes_freed
    assert result.over_budget_after == (result.bytes_after > budget)
    # Minimal: before the last deletion usage was still over budget.
    if result.delete:
        assert result.bytes_after + result.delete[-1].size_bytes > budget
    # Over budget afterwards only if nothing deletable is left.
    if result.over_budget_after:
        kept = {s.id for s in sessions} - set(deleted)
        assert all(s.pinned or s.id in protected for s in sessions if s.id in kept)
    # Least recently used first: every kept deletable session is at least as recent.
    if result.delete:
        newest_deleted = max(c.last_used_at for c in result.delete)
        for s in sessions:
            if s.id not in deleted and not s.pinned and s.id not in protected:
                assert s.last_used_at >= newest_deleted


def test_pieces_two_conversations_share_count_once_and_are_freed_with_the_last_of_them() -> None:
    # a and b start alike (a 6 MB system prompt's pieces); each has 2 MB of its own and a 1 KB manifest.
    shared, own_a, own_b = {"s": 6 * MB}, {"a": 2 * MB}, {"b": 2 * MB}
    a = dataclasses.replace(session("a", size=1000 + 2 * MB + 3 * MB, day=1), pieces={**shared, **own_a})
    b = dataclasses.replace(session("b", size=1000 + 2 * MB + 3 * MB, day=2), pieces={**shared, **own_b})
    first = plan([a, b], budget_bytes=9 * MB)
    assert first.bytes_before == 2000 + 10 * MB  # the disk holds the shared pieces once
    assert [s.id for s in first.delete] == ["a"]
    assert first.bytes_freed == 1000 + 2 * MB  # its own: the shared pieces stay with b
    both = plan([a, b], budget_bytes=1 * MB)
    assert [s.id for s in both.delete] == ["a", "b"] and both.bytes_after == 0


def test_a_conversations_stale_branches_go_before_any_other_conversation() -> None:
    main = session("main", day=20)  # used since its branch was
    stale = dataclasses.replace(session("branch", day=10), parent="main")
    fresh = dataclasses.replace(session("fresh-branch", day=25), parent="main")  # used after it
    other = session("other", day=5)  # the least recently used conversation
    out = plan([main, stale, fresh, other], budget_bytes=30 * MB)
    assert [s.id for s in out.delete] == ["branch"]
    out = plan([main, stale, fresh, other], budget_bytes=20 * MB)
    assert [s.id for s in out.delete] == ["branch", "other"]
