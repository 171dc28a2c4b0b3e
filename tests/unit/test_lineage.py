"""Lineage: does a slot's token list update, fork from, or ignore each saved session?"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotkeeper.core.sessions.lineage import Match, classify, common_prefix_len

SYSTEM = list(range(1000, 1040))  # a 40-token system prompt shared by many chats


def chat(*turns: int, length: int = 20) -> list[int]:
    """System prompt followed by turns of ``length`` tokens, each turn a distinct seed."""
    tokens = list(SYSTEM)
    for seed in turns:
        tokens += [seed * 100 + i for i in range(length)]
    return tokens


# --- common_prefix_len ---------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([], [1, 2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5], [6], 0),
    ],
)
def test_common_prefix_len(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix_len(a, b) == expected
    assert common_prefix_len(np.array(a, dtype=np.int64), b) == expected


def test_common_prefix_len_on_long_lists() -> None:
    a = list(range(130_000))
    b = list(a)
    b[129_998] = -5
    assert common_prefix_len(a, b) == 129_998
    assert common_prefix_len(a, a) == 130_000
    assert isinstance(common_prefix_len(a, b), int)


@given(st.lists(st.integers(0, 3)), st.lists(st.integers(0, 3)))
def test_common_prefix_len_matches_a_plain_loop(a: list[int], b: list[int]) -> None:
    expected = 0
    for x, y in zip(a, b):
        if x != y:
            break
        expected += 1
    assert common_prefix_len(a, b) == expected


# --- classify: single candidate ------------------------------------------------


def test_no_candidates_is_new() -> None:
    assert classify(chat(1), []) == Match("new", None, 0)


def test_identical_tokens_are_an_update_of_full_length() -> None:
    tokens = chat(1, 2)
    assert classify(tokens, [("s1", list(tokens))]) == Match("update", "s1", len(tokens))


def test_extension_is_an_update() -> None:
    saved = chat(1, 2)
    assert classify(chat(1, 2, 3), [("s1", saved)]) == Match("update", "s1", len(saved))


def test_re_rendered_tail_within_slack_is_an_update() -> None:
    saved = chat(1, 2)
    new = list(saved)
    new[-3] = 7  # the template rendered the last reply slightly differently
    new += chat(3)[len(SYSTEM) :]
    assert classify(new, [("s1", saved)]) == Match("update", "s1", len(saved) - 3)


def test_slack_boundary() -> None:
    saved = chat(1, 2)
    at_slack = saved[: len(saved) - 8] + [7] * 30
    beyond_slack = saved[: len(saved) - 9] + [7] * 30
    assert classify(at_slack, [("s1", saved)]).kind == "update"
    assert classify(beyond_slack, [("s1", saved)]) == Match("fork", "s1", len(saved) - 9)


def test_tail_slack_zero_requires_a_true_extension() -> None:
    saved = chat(1, 2)
    new = saved[:-1] + [7, 7, 7]
    assert classify(new, [("s1", saved)], tail_slack=0).kind == "fork"
    assert classify(saved + [7], [("s1", saved)], tail_slack=0).kind == "update"


def test_shorter_but_re_rendered_within_slack_is_an_update() -> None:
    # A template that drops the last few generated tokens when rendering them back.
    saved = chat(1, 2)
    new = saved[:-4] + [7]
    assert classify(new, [("s1", saved)]) == Match("update", "s1", len(saved) - 4)


def test_edited_turn_is_a_fork() -> None:
    saved = chat(1, 2, 3)
    new = chat(1, 9)  # second user turn rewritten
    assert classify(new, [("s1", saved)]) == Match("fork", "s1", len(chat(1)))


def test_rollback_to_a_prefix_is_a_fork() -> None:
    saved = chat(1, 2, 3)
    new = chat(1)  # strictly shorter and a prefix: the saved session holds more
    assert classify(new, [("s1", saved)]) == Match("fork", "s1", len(new))


def test_rollback_of_a_single_token_is_still_a_fork() -> None:
    saved = chat(1, 2)
    assert classify(saved[:-1], [("s1", saved)]).kind == "fork"


def test_rollback_below_min_fork_prefix_is_new() -> None:
    saved = chat(1, 2)
    assert classify(SYSTEM[:20], [("s1", saved)]) == Match("new", None, 20)


def test_short_shared_system_prompt_is_new() -> None:
    short_system = [1, 2, 3, 4, 5]
    saved = short_system + [10] * 50
    new = short_system + [20] * 50
    assert classify(new, [("s1", saved)]) == Match("new", None, 5)


def test_min_fork_prefix_boundary() -> None:
    saved = list(range(100))
    assert classify(saved[:32] + [-7] * 10, [("s1", saved)]).kind == "fork"
    assert classify(saved[:31] + [-7] * 10, [("s1", saved)]).kind == "new"


def test_unrelated_chat_does_not_update_a_session_shorter_than_the_slack() -> None:
    # A 5-token "session" shares its first 3 tokens (a chat header) with everything.
    saved = [1, 2, 3, 40, 41]
    new = [1, 2, 3, 50, 51, 52, 53]
    assert classify(new, [("s1", saved)]) == Match("new", None, 3)


def test_tiny_session_that_is_truly_extended_is_updated() -> None:
    saved = [1, 2, 3]
    assert classify([1, 2, 3, 4], [("s1", saved)]) == Match("update", "s1", 3)


def test_empty_new_tokens() -> None:
    assert classify([], [("s1", chat(1))]) == Match("new", None, 0)


def test_rejects_negative_parameters() -> None:
    with pytest.raises(ValueError):
        classify([1], [], tail_slack=-1)
    with pytest.raises(ValueError):
        classify([1], [], min_fork_prefix=-1)


# --- classify: several candidates ------------------------------------------------


def test_fork_picks_the_longest_common_prefix() -> None:
    new = chat(1, 2, 9)
    candidates = [("recent", chat(1, 8, 8)), ("older", chat(1, 2, 3, 4)), ("oldest", chat(7))]
    assert classify(new, candidates) == Match("fork", "older", len(chat(1, 2)))


def test_fork_tie_goes_to_the_most_recent() -> None:
    new = chat(1, 9)
    candidates = [("recent", chat(1, 2)), ("older", chat(1, 3))]
    assert classify(new, candidates) == Match("fork", "recent", len(chat(1)))


def test_update_tie_goes_to_the_most_recent() -> None:
    saved = chat(1, 2)
    candidates = [("recent", list(saved)), ("older", list(saved))]
    assert classify(saved + [5], candidates) == Match("update", "recent", len(saved))


def test_update_beats_a_fork_with_a_longer_prefix() -> None:
    # "short" is entirely contained in the new tokens: updating it loses nothing,
    # while a fork of "long" would leave "short" behind as a near-duplicate.
    new = chat(1, 2, 3, 9)
    candidates = [("long", chat(1, 2, 3, 4)), ("short", chat(1, 2))]
    assert classify(new, candidates) == Match("update", "short", len(chat(1, 2)))


def test_among_updates_the_longest_match_wins() -> None:
    new = chat(1, 2, 3, 4)
    candidates = [("recent", chat(1)), ("older", chat(1, 2, 3))]
    assert classify(new, candidates) == Match("update", "older", len(chat(1, 2, 3)))


def test_new_reports_the_longest_shared_prefix_for_logs() -> None:
    candidates = [("a", [1, 2, 3, 50]), ("b", [1, 2, 3, 4, 5, 60]), ("c", [9])]
    assert classify([1, 2, 3, 4, 5, 6, 7, 8], candidates, min_fork_prefix=32) == Match(
        "new", None, 5
    )


def test_candidates_may_be_a_generator_and_numpy_arrays() -> None:
    saved = np.array(chat(1, 2), dtype=np.int64)
    candidates = ((sid, tokens) for sid, tokens in [("s0", np.array(chat(7))), ("s1", saved)])
    assert classify(np.array(chat(1, 2, 3)), candidates) == Match("update", "s1", len(saved))


# --- invariants ---------------------------------------------------------------------

SLACK = 2
MIN_FORK = 4
tokens_st = st.lists(st.integers(0, 3), max_size=24)


@st.composite
def related_candidates(draw: st.DrawFn) -> tuple[list[int], list[tuple[str, list[int]]]]:
    """New tokens plus candidates that share prefixes of varied length with them."""
    new = draw(tokens_st)
    candidates = []
    for i in range(draw(st.integers(0, 5))):
        cut = draw(st.integers(0, len(new)))
        candidates.append((f"s{i}", new[:cut] + draw(tokens_st)))
    return new, candidates


@given(tokens_st)
def test_identity_is_always_an_update(tokens: list[int]) -> None:
    assert classify(tokens, [("s", tokens)], SLACK, MIN_FORK) == Match("update", "s", len(tokens))


@given(tokens_st, st.lists(st.integers(0, 3), min_size=1, max_size=10))
def test_extension_is_always_an_update(saved: list[int], more: list[int]) -> None:
    result = classify(saved + more, [("s", saved)], SLACK, MIN_FORK)
    assert result == Match("update", "s", len(saved))


@given(st.lists(st.integers(0, 3), min_size=1, max_size=24), st.data())
def test_strict_prefix_is_never_an_update(saved: list[int], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(saved) - 1))
    result = classify(saved[:cut], [("s", saved)], SLACK, MIN_FORK)
    assert result.kind == ("fork" if cut >= MIN_FORK else "new")


@given(related_candidates())
@settings(max_examples=300)
def test_verdict_is_consistent_with_the_chosen_candidate(
    case: tuple[list[int], list[tuple[str, list[int]]]],
) -> None:
    new, candidates = case
    result = classify(new, candidates, SLACK, MIN_FORK)
    by_id = dict(candidates)
    shared = {sid: common_prefix_len(new, tokens) for sid, tokens in candidates}

    assert 0 <= result.common_prefix <= len(new)
    if result.kind == "new":
        assert result.session_id is None
        assert result.common_prefix == max(shared.values(), default=0)
        # Nothing was extended, and nothing shared enough to fork from.
        for sid, s in shared.items():
            assert s < len(by_id[sid]) and s < MIN_FORK
    else:
        assert result.session_id in by_id
        assert result.common_prefix == shared[result.session_id]
        saved = by_id[result.session_id]
        if result.kind == "update":
            extends = result.common_prefix == len(saved)
            within_slack = (
                result.common_prefix >= len(saved) - SLACK
                and result.common_prefix >= MIN_FORK
                and result.common_prefix < len(new)
            )
            assert extends or within_slack
        else:
            assert MIN_FORK <= result.common_prefix
            assert result.common_prefix == max(shared.values())


@given(related_candidates())
@settings(max_examples=200)
def test_candidate_order_only_breaks_ties(
    case: tuple[list[int], list[tuple[str, list[int]]]],
) -> None:
    new, candidates = case
    verdicts = {
        (m.kind, m.common_prefix)
        for m in (
            classify(new, list(order), SLACK, MIN_FORK)
            for order in itertools.islice(itertools.permutations(candidates), 24)
        )
    }
    assert len(verdicts) == 1


def test_a_short_conversation_is_not_updated_by_another_with_the_same_system_prompt():
    system = list(range(1000, 1040))  # a 40-token system prompt both chats share
    first = system + [3, 900, 13, 901, 4, 13, 3, 902, 13, 903]  # "hi" and a 2-token reply
    second = system + [3, 900, 13, 950, 951, 952, 953, 4, 13, 3]  # another question
    # Without the prompt length the tail slack takes the second for the first, continued:
    assert classify(second, [("X", first)]).kind == "update"
    # With it (the first's prompt ended at 48 tokens), they are two conversations:
    m = classify(second, [("X", first, 48)])
    assert m.kind == "fork" and m.session_id == "X"
    # A re-rendered reply (a difference after the prompt) is still the same conversation:
    rerendered = first[:48] + [904, 905, 4, 13, 3]
    assert classify(rerendered, [("X", first, 48)]).kind == "update"


def test_a_replayed_prompt_inside_a_longer_session_is_contained():
    saved = list(range(100, 400))
    replay = saved[:120] + [7, 8, 9, 10, 11]  # a prompt the session holds, then a reply tokenized anew
    m = classify(replay, [("S", saved, 290)], new_n_prompt=120)
    assert m.kind == "contained" and m.session_id == "S"
    # without the prompt length (models that restore only exact continuations) it is a fork
    assert classify(replay, [("S", saved, 290)]).kind == "fork"
    # a prompt that leaves the session is not contained
    assert classify(saved[:100] + [1] * 25, [("S", saved, 290)], new_n_prompt=120).kind == "fork"
