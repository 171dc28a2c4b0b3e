"""Token lists as compact arrays, and the few things done with them, at C speed without numpy.

The engine holds the tokens of every slot and of every request it routes, and lineage compares
a slot's tokens with saved sessions', often 100k tokens and more. They are ``array('i')``: four
bytes a token, like the slot save files (``sessions.kvfile``) and the sessions index's hashes
(``sessions.index``). Every token id fits, and so does every media pseudo-token: those are
negative, from -2 down to -(2**31 - 1) (``kvfile._media_token``).

``common_prefix_len`` compares whole runs of tokens as bytes (``bytes.startswith``, a memcmp)
and finds the first difference by halving, so a 100k-token comparison is a few dozen C calls,
never a Python step per token.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Any

__all__ = ["TYPECODE", "TokenArray", "as_tokens", "common_prefix_len", "from_le_i32", "no_tokens",
           "tokens_from_json"]

TYPECODE = "i"  # C int: 32 bits on every platform Python supports
TokenArray = array  # an array of TYPECODE

_ITEMSIZE = array(TYPECODE).itemsize
_BIG_ENDIAN = sys.byteorder == "big"
assert _ITEMSIZE == 4


def no_tokens() -> TokenArray:
    """An empty token array."""
    return array(TYPECODE)


def as_tokens(tokens: Iterable[int]) -> TokenArray:
    """``tokens`` as a token array: itself when it is one already, else a copy (a list, a
    tuple, any iterable of ints). Raises OverflowError for a value that does not fit 32 bits,
    TypeError for one that is not an integer."""
    if isinstance(tokens, array) and tokens.typecode == TYPECODE:
        return tokens
    return array(TYPECODE, tokens)


def from_le_i32(raw: bytes) -> TokenArray:
    """The little-endian 32-bit words of ``raw`` (a multiple of 4 bytes) as a token array."""
    out = array(TYPECODE)
    out.frombytes(raw)
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def tokens_from_json(values: Any) -> TokenArray | None:
    """A JSON list of token ids (a prompt given as tokens, a /tokenize answer) as a token array,
    or None when it is anything else: not a list, a string, a float, a nested list, a value past
    32 bits, or nothing but booleans."""
    if not isinstance(values, list):
        return None
    try:
        out = array(TYPECODE, values)  # TypeError for anything but integers (bools are ints)
    except (TypeError, OverflowError):
        return None
    if values and all(type(v) is bool for v in values):  # stops at the first real integer
        return None
    return out


def common_prefix_len(a: Iterable[int], b: Iterable[int]) -> int:
    """Number of leading positions where ``a`` and ``b`` hold the same token."""
    a, b = as_tokens(a), as_tokens(b)
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    size = _ITEMSIZE
    with memoryview(b) as bv, memoryview(a) as av, av.cast("B") as view:
        hay = bv[:n].tobytes()  # b's first n tokens as bytes; a's are compared with them in place
        # The first lo tokens are equal, the first hi are not (hi = n + 1: all n may be). Halving
        # takes a few dozen memcmp calls for 100k tokens; a call that finds its range equal moves
        # past it and one that does not stops at the difference, so they compare about as many
        # bytes as the two lists share.
        lo, hi = 1, n + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hay.startswith(view[lo * size:mid * size], lo * size):
                lo = mid
            else:
                hi = mid
        return lo
