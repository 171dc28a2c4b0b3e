"""Which sessions go into which slot at launch: the pure plan, without a server."""

from slotkeeper.core.engine.desk.planning import LaunchCandidate, plan_launch_restores


def cands(*specs):
    """(id, last_used, usable) -> candidates."""
    return [LaunchCandidate(i, t, u) for i, t, u in specs]


def test_most_recent_usable_sessions_fill_the_slots_in_order():
    c = cands(("old", 1, True), ("new", 3, True), ("mid", 2, True))
    assert plan_launch_restores(n_slots=2, candidates=c) == {0: "new", 1: "mid"}


def test_unusable_sessions_are_skipped_not_counted():
    c = cands(("broken", 9, False), ("a", 2, True), ("b", 1, True))
    assert plan_launch_restores(n_slots=2, candidates=c) == {0: "a", 1: "b"}


def test_the_limit_setting_caps_restores_and_never_exceeds_the_slots():
    c = cands(("a", 3, True), ("b", 2, True), ("c", 1, True))
    assert plan_launch_restores(n_slots=3, candidates=c, limit=1) == {0: "a"}
    assert plan_launch_restores(n_slots=3, candidates=c, limit=0) == {}
    assert plan_launch_restores(n_slots=2, candidates=c, limit=9) == {0: "a", 1: "b"}


def test_a_resume_request_goes_first_even_with_a_limit_of_zero_and_even_if_unusable():
    c = cands(("a", 3, True), ("wanted", 1, False))
    assert plan_launch_restores(n_slots=2, candidates=c, resume_id="wanted") == {0: "wanted", 1: "a"}
    assert plan_launch_restores(n_slots=2, candidates=c, limit=0, resume_id="wanted") == {0: "wanted"}
    # the resumed session is not restored twice
    c = cands(("wanted", 5, True), ("a", 3, True))
    assert plan_launch_restores(n_slots=3, candidates=c, resume_id="wanted") == {0: "wanted", 1: "a"}


def test_after_a_crash_each_slot_gets_back_what_it_held():
    c = cands(("newest", 9, True))
    plan = plan_launch_restores(n_slots=3, candidates=c, after_crash={2: "x", 0: "y", 7: "gone"})
    assert plan == {0: "y", 2: "x"}  # the saved order is ignored; a slot that no longer exists is dropped


def test_slots_a_client_already_used_keep_what_they_hold():
    c = cands(("a", 3, True), ("b", 2, True))
    # slot 0 took a request while the engine was identifying the model: "a" moves to slot 2
    assert plan_launch_restores(n_slots=3, candidates=c, used_slots={0}) == {1: "b", 2: "a"}
    # no spare slot left: the planned session waits for another launch
    assert plan_launch_restores(n_slots=2, candidates=c, used_slots={0, 1}) == {}


def test_no_slots_no_plan():
    assert plan_launch_restores(n_slots=0, candidates=cands(("a", 1, True))) == {}
