"""The sessions folder is locked across processes: a CLI command waits for the app's save."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slotkeeper.core.sessions.store import LOCK_NAME, SessionStore

FIXTURE = Path(__file__).parent.parent / "data" / "sidecar_v1.json"

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the lock-holding child uses fcntl (POSIX only)")
def test_a_second_process_waits_for_the_folder_lock(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    sid = json.loads(FIXTURE.read_text())["id"]
    shutil.copy(FIXTURE, store.sidecar_path(sid))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.dir / LOCK_NAME), "1.0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        store.set_pinned(sid, True)  # must wait for the other process
        waited = time.monotonic() - t0
    finally:
        holder.wait(10)
    assert waited >= 0.5
    assert store.get(sid).sidecar.pinned is True
    assert LOCK_NAME not in [u.name for u in store.listing().unmanaged]


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    sid = json.loads(FIXTURE.read_text())["id"]
    shutil.copy(FIXTURE, store.sidecar_path(sid))
    with store.exclusive():
        store.set_pinned(sid, True)  # nested: no deadlock
        assert store.listing().sessions[0].sidecar.pinned
