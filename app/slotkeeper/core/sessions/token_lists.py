"""The token lists of saved KV files kept in memory (routing's best hits, lineage's finalists).

A KV file is never rewritten under the same name, so a list read once stays true while the file's
lstat does. Lists are token arrays (4 bytes a token; a list of ints takes about 36), shared by
every caller: nobody changes one in place. The most recently used ``kept`` lists stay.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path

from slotkeeper.core.basics.fsutil import regular_size
from slotkeeper.core.basics.tokens import TokenArray, as_tokens
from slotkeeper.core.sessions import kvfile
from slotkeeper.core.sessions.rows import Stamp, stamp_of

TOKEN_LISTS_KEPT = 32


class TokenLists:
    def __init__(self, kept: int = TOKEN_LISTS_KEPT) -> None:
        self.kept = kept
        self._lists: OrderedDict[str, tuple[Stamp, TokenArray]] = OrderedDict()  # by KV file name
        self._lock = threading.Lock()

    def read(self, kv_path: Path) -> TokenArray:
        """The token list at the front of the KV file (read once per file version)."""
        st = stamp_of(os.lstat(kv_path))
        if not stat.S_ISREG(st[0]):
            regular_size(kv_path)  # raises NotARegularFile, naming what it is
        name = kv_path.name
        with self._lock:
            hit = self._lists.get(name)
            if hit is not None and hit[0] == st:
                self._lists.move_to_end(name)
                return hit[1]
        tokens = as_tokens(kvfile.read_tokens(kv_path).tokens)
        self.keep(name, st, tokens)
        return tokens

    def keep(self, name: str, st: Stamp, tokens: TokenArray) -> None:
        with self._lock:
            self._lists[name] = (st, tokens)
            self._lists.move_to_end(name)
            while len(self._lists) > self.kept:
                self._lists.popitem(last=False)

    def forget(self, name: str) -> None:
        with self._lock:
            self._lists.pop(name, None)
