"""Token arrays (core/basics/tokens.py): the common prefix of two token lists, found by comparing bytes,
must agree token for token with a plain loop, at every length and at every place they part."""

from __future__ import annotations

import struct
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotkeeper.core.basics.tokens import (
    TYPECODE,
    as_tokens,
    common_prefix_len,
    from_le_i32,
    no_tokens,
    tokens_from_json,
)

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
IMAGE = -2 - 123_456_789  # a media pseudo-token, as kvfile makes them
LAST_MEDIA_ID = -(2**31 - 1)  # the lowest one kvfile can make


def plain_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([], [7], 0),
        ([7], [], 0),
        ([7], [7], 1),
        ([7], [8], 0),
        ([7, 8], [7, 9], 1),
        ([7, 8, 9], [7, 8, 9], 3),
        ([7, 8], [7, 8, 9], 2),
        ([7, 8, 9], [7, 8], 2),
        ([IMAGE, IMAGE, 5], [IMAGE, IMAGE, 6], 2),
        ([1, IMAGE], [1, IMAGE - 1], 1),
        ([LAST_MEDIA_ID, I32_MAX], [LAST_MEDIA_ID, I32_MAX], 2),
        ([-1, 0], [-1, 1], 1),
    ],
)
def test_common_prefix_len_small_cases(a, b, expected):
    assert common_prefix_len(a, b) == expected
    assert common_prefix_len(b, a) == expected
    assert common_prefix_len(as_tokens(a), as_tokens(b)) == expected
    assert common_prefix_len(tuple(a), as_tokens(b)) == expected


def test_tokens_that_share_some_bytes_are_still_different_tokens():
    # Little-endian, these agree in their first byte(s) and part in a later one: the answer is
    # a whole number of tokens, never a token cut in the middle.
    for x, y in [(0x0102, 0x0302), (0x01, 0x01 + 2**24), (5, 5 - 2**31), (-1, 2**31 - 1), (256, 0)]:
        assert common_prefix_len([9, x, 4], [9, y, 4]) == 1, (x, y)
        assert common_prefix_len([x], [y]) == 0, (x, y)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 31, 64, 65, 100])
def test_every_place_two_lists_can_part(n):
    a = list(range(1000, 1000 + n))
    assert common_prefix_len(a, a) == n
    for d in range(n):
        b = list(a)
        b[d] = -5
        assert common_prefix_len(a, b) == d, d
        assert common_prefix_len(a, a[:d]) == d
        assert common_prefix_len(a[:d], a) == d


@pytest.mark.parametrize("d", [0, 1, 2, 99_999, 100_000, 131_071, 131_072, 199_998, 199_999])
def test_200k_tokens(d):
    n = 200_000
    a = as_tokens(range(n))
    b = array(TYPECODE, a)
    b[d] = IMAGE
    assert common_prefix_len(a, b) == d
    assert common_prefix_len(b, a) == d
    assert common_prefix_len(a, a) == n
    assert common_prefix_len(a, a[:d]) == d
    assert common_prefix_len(a[: d + 1], a) == d + 1


def test_a_longer_list_that_differs_after_the_shorter_one_ends():
    a = as_tokens(range(200_000))
    b = as_tokens([*range(150_000), 1, 2, 3])
    assert common_prefix_len(a, b) == 150_000
    assert common_prefix_len(b, a) == 150_000


@given(st.lists(st.integers(-3, 2)), st.lists(st.integers(-3, 2)))
def test_common_prefix_len_matches_a_plain_loop(a, b):
    assert common_prefix_len(a, b) == plain_prefix(a, b)


@given(st.lists(st.integers(I32_MIN, I32_MAX), max_size=50), st.data())
def test_common_prefix_len_on_shared_heads_of_any_int32(head, data):
    a = head + data.draw(st.lists(st.integers(I32_MIN, I32_MAX), max_size=5))
    b = head + data.draw(st.lists(st.integers(I32_MIN, I32_MAX), max_size=5))
    assert common_prefix_len(a, b) == plain_prefix(a, b)


def test_the_arrays_compared_are_left_as_they_were_and_can_still_grow():
    a, b = as_tokens([1, 2, 3]), as_tokens([1, 2, 4])
    assert common_prefix_len(a, b) == 2
    a.append(4)  # no buffer left exported: an array with a live memoryview cannot be resized
    assert a.tolist() == [1, 2, 3, 4] and b.tolist() == [1, 2, 4]


def test_as_tokens():
    arr = as_tokens([1, IMAGE, I32_MAX])
    assert arr.typecode == TYPECODE and arr.tolist() == [1, IMAGE, I32_MAX]
    assert as_tokens(arr) is arr  # already one: no copy
    assert as_tokens(array("q", [5, 6])).tolist() == [5, 6]
    assert as_tokens(range(3)).tolist() == [0, 1, 2]
    assert len(no_tokens()) == 0 and no_tokens().typecode == TYPECODE
    with pytest.raises(OverflowError):
        as_tokens([2**31])
    with pytest.raises(TypeError):
        as_tokens([1.5])


def test_from_le_i32():
    raw = struct.pack("<5i", 0, 1, -1, I32_MAX, I32_MIN)
    assert from_le_i32(raw).tolist() == [0, 1, -1, I32_MAX, I32_MIN]
    assert from_le_i32(b"").tolist() == []
    assert from_le_i32(b"\x01\x02\x00\x00").tolist() == [0x0201]  # little-endian on any host


def test_tokens_from_json():
    assert tokens_from_json([1, 2, 3]).tolist() == [1, 2, 3]
    assert tokens_from_json([-5, 0]).tolist() == [-5, 0]
    assert tokens_from_json([]).tolist() == []
    assert tokens_from_json([True, 2]).tolist() == [1, 2]  # as numpy read it: bools among ints are ints
    for not_tokens in ([True, False], [1, "two"], [1.5, 2], [1.0], [[1, 2], [3, 4]], [1, [2]], [1, None],
                       [2**31], [-(2**31) - 1], [2**64], None, "1 2", {"tokens": [1]}, 3):
        assert tokens_from_json(not_tokens) is None, not_tokens
