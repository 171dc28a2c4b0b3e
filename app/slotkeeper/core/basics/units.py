"""Byte sizes for people: ``human_bytes(120_586_240) == "115.0 MiB"`` and ``parse_size("20G")``.

Binary (1024-based) units throughout, because that is what llama.cpp prints for its KV
cache ("KV self size = 192.00 MiB") and what users compare our figures against.
"""

from __future__ import annotations

import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SUFFIX_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
# number, optional binary suffix, optional "B" / "iB"; spaces allowed between number and unit
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def human_bytes(n: float) -> str:
    """``n`` bytes as a short binary-unit string: "512 B", "114.0 MiB", "6.0 GiB"."""
    if n < 0:
        return "-" + human_bytes(-n)
    value = float(n)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def parse_size(text: str | int) -> int:
    """Bytes from "20G", "512MiB", "1.5 GB", "4096" (K/M/G/T are 1024-based, case-insensitive).

    Raises ValueError with a message that shows what is accepted.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if match is None:
        raise ValueError(
            f"not a size: {text!r} (expected a number of bytes, optionally with a K, M, G or T "
            f"suffix, e.g. '4096', '512M', '20G', '1.5GiB')"
        )
    number, suffix, unit_tail = match.groups()
    if unit_tail and unit_tail.lower() == "ib" and not suffix:
        raise ValueError(f"not a size: {text!r} ('iB' needs a K, M, G or T before it)")
    power = _SUFFIX_POWER[suffix.upper()]
    value = float(number) * (1024**power)
    if "." in number and power == 0:
        raise ValueError(f"not a size: {text!r} (a plain byte count must be a whole number)")
    return int(round(value))


def human_duration(seconds: float) -> str:
    """"59 s", "3 min 20 s", "1 h 2 min", "1 d 1 h 0 min"; a fraction under 10 s keeps one decimal."""
    if 0 < seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f} s"
    seconds = int(max(0, seconds))
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d} d {h} h {m} min"
    if h:
        return f"{h} h {m} min"
    if m:
        return f"{m} min {s} s"
    return f"{s} s"
