"""One key per folder, however its path is spelt: what the data folder's lock by path and the
app's single-instance socket are named after.

Two spellings of one folder must give one key, or two engines share a folder, each believing it
alone: links and ``..`` are resolved, and where the disk ignores case (Windows always; macOS's
default APFS, though a volume can be case-sensitive) case is folded too. Folding case on a
case-sensitive disk would make two folders one, so on macOS the volume is asked.
"""

from __future__ import annotations

import ntpath
import os
import sys


def folder_key(path: str | os.PathLike[str]) -> str:
    """The folder's path, absolute with links resolved, in the case the disk tells apart."""
    resolved = os.path.realpath(os.path.abspath(path))
    if sys.platform == "win32":
        # ntpath's, not os.path's: the same function on Windows, and a test faking the platform
        # elsewhere gets Windows's rule.
        return ntpath.normcase(resolved)
    if sys.platform == "darwin" and ignores_case(resolved):
        return resolved.casefold()
    return resolved


def ignores_case(path: str) -> bool:
    """Whether the disk holding ``path`` (or its nearest existing folder) ignores case: the same
    name with its case swapped is the same file. False when no name on the way has letters."""
    existing = path
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            return False
        existing = parent
    while True:
        parent, name = os.path.split(existing)
        swapped = name.swapcase()
        if swapped != name:
            other = os.path.join(parent, swapped)
            try:
                return os.path.samefile(existing, other)
            except OSError:  # no such file: the disk tells the two names apart
                return False
        if not name or parent == existing:
            return False
        existing = parent
