"""The running app keeps numpy out of memory (~17-20 MB and ~0.2 s to import): token lists are
``core.basics.tokens`` arrays, not numpy arrays, on every path a request or a save takes.

Each check runs in a fresh interpreter, since this one has numpy loaded by other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

# Modules that still read GGUF files with the gguf package (itself built on numpy) when they are
# imported; they are another piece of work. Until then numpy may be loaded, but only through them.
GGUF_READERS = frozenset({"slotkeeper.core.model.modelgen", "slotkeeper.core.model.gguf_info"})

_PROBE = r"""
import builtins, inspect, json, sys

direct, chain = set(), []
real_import = builtins.__import__

def spying_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "numpy" or name.startswith("numpy.")):
        direct.add((globals or {}).get("__name__", "?"))
    return real_import(name, globals, locals, fromlist, level)

class FirstLoad:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not chain:
            chain.extend(f.frame.f_globals.get("__name__", "?") for f in inspect.stack())
        return None

builtins.__import__ = spying_import
sys.meta_path.insert(0, FirstLoad())
for module in sys.argv[1:]:
    __import__(module)
print(json.dumps({"loaded": "numpy" in sys.modules, "direct": sorted(direct), "chain": chain}))
"""


def _probe(*modules: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APP), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _PROBE, *modules], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_session_files_lineage_and_the_index_never_load_numpy():
    found = _probe("slotkeeper.core.basics.tokens", "slotkeeper.core.sessions.kvfile",
                   "slotkeeper.core.sessions.lineage", "slotkeeper.core.sessions.index",
                   "slotkeeper.core.sessions.store", "slotkeeper.core.sessions.saving")
    assert not found["loaded"], found


def test_the_front_door_and_the_front_desk_never_load_numpy():
    found = _probe("slotkeeper.core.engine.door.frontdoor", "slotkeeper.core.engine.desk.frontdesk",
                   "slotkeeper.core.sessions.kvfile", "slotkeeper.core.sessions.lineage",
                   "slotkeeper.core.sessions.index")
    own = {m for m in found["direct"] if m.startswith("slotkeeper")}
    assert own <= GGUF_READERS, f"imports numpy: {sorted(own - GGUF_READERS)}"
    if found["loaded"]:  # how it was first loaded: through one of those, nothing else
        assert GGUF_READERS & set(found["chain"]), found["chain"]
