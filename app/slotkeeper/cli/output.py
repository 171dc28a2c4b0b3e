"""Printing the sessions listing's rows as they are kept (bytes, not str): shared by the fast way
(``cli.sessions_list``) and the full one (``cli.sessions``)."""

from __future__ import annotations

import sys


def list_json(rows: list[bytes]) -> bytes:
    """A JSON array, one session per line (thousands of sessions print in a blink; jq pretty-prints)."""
    if not rows:
        return b"[]"
    return b"[\n" + b",\n".join(rows) + b"\n]"


def print_bytes(data: bytes) -> None:
    """``data`` (UTF-8) and a newline on stdout, as they are (megabytes of rows: no round trip
    through str)."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # no byte stream under it (a test's capture, a windowed app)
        print(data.decode("utf-8"))
        return
    sys.stdout.flush()
    out.write(data + b"\n")
    out.flush()
