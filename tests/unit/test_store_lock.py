"""The sessions folder is locked across processes: a CLI command waits for the app's save."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sessions_helpers import make_session, run_cli

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.sessions.folder_lock import FolderReadOnly
from slotkeeper.core.sessions.store import LOCK_NAME, SessionStore

FIXTURE = Path(__file__).parent.parent / "data" / "sidecar_v1.json"

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
if sys.argv[2] == "until-told":
    sys.stdin.readline()
else:
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the lock-holding child uses fcntl (POSIX only)")
def test_a_second_process_waits_for_the_folder_lock(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    sid = json.loads(FIXTURE.read_text())["id"]
    shutil.copy(FIXTURE, store.sidecar_path(sid))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.dir / LOCK_NAME), "until-told"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert store.get(sid).sidecar.pinned is True
    pinning = threading.Thread(target=store.set_pinned, args=(sid, False))
    try:
        assert holder.stdout.readline().strip() == "locked"
        pinning.start()
        pinning.join(0.5)
        assert pinning.is_alive()  # it waits for the other process
        assert store.get(sid).sidecar.pinned is True
    finally:
        holder.stdin.close()  # the other process lets go
        holder.wait(10)
        pinning.join(30)
    assert not pinning.is_alive()
    assert store.get(sid).sidecar.pinned is False
    assert LOCK_NAME not in [u.name for u in store.listing().unmanaged]


def test_the_lock_is_reentrant_within_one_process(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    sid = json.loads(FIXTURE.read_text())["id"]
    shutil.copy(FIXTURE, store.sidecar_path(sid))
    with store.exclusive():
        store.set_pinned(sid, True)  # nested: no deadlock
        assert store.listing().sessions[0].sidecar.pinned


# -- a lock that cannot be had: held too long, or a folder that cannot hold the lock file -------
@pytest.mark.skipif(sys.platform == "win32", reason="the lock-holding child uses fcntl (POSIX only)")
def test_a_held_lock_makes_the_cli_give_up_with_a_message_not_hang(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    make_session(paths.sessions_dir, "aaaaaaaaaaaa")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(paths.sessions_dir / LOCK_NAME), "60"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for action in (["list"], ["pin", "aaaaaaaaaaaa"], ["prune", "--budget", "0"]):
            t0 = time.monotonic()
            r = run_cli(paths.data_dir, *action, env={"SLOTKEEPER_LOCK_TIMEOUT": "1"}, timeout=20)
            took = time.monotonic() - t0
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert "locked by another Slotkeeper process; gave up after 1 s" in r.stderr
            assert "Traceback" not in r.stderr
            assert 1 <= took < 10
    finally:
        holder.kill()
        holder.wait(10)
    assert run_cli(paths.data_dir, "pin", "aaaaaaaaaaaa",
                   env={"SLOTKEEPER_LOCK_TIMEOUT": "1"}).returncode == 0


def test_a_bad_lock_timeout_is_a_usage_error(tmp_path):
    for value in ("soon", "0", "-1", "inf"):
        r = run_cli(tmp_path / "home", "list", env={"SLOTKEEPER_LOCK_TIMEOUT": value})
        assert r.returncode == 2 and "SLOTKEEPER_LOCK_TIMEOUT" in r.stderr, r.stderr


def read_only_checks(store: SessionStore) -> None:
    """Reading works without the lock; writing fails saying the folder is read-only."""
    listing = store.listing()
    assert {e.id for e in listing.sessions} == {GOOD, DAMAGED}
    assert store.get(GOOD).status == "ok"
    entry = store.verify(DAMAGED)  # found, though it cannot be recorded
    assert entry.status == "corrupt" and "hash" in " ".join(entry.problems)
    for write in (lambda: store.set_pinned(GOOD, True), lambda: store.delete(GOOD), store.sweep):
        with pytest.raises(FolderReadOnly, match=f"the sessions folder {store.dir} is read-only"):
            write()
    assert not store.get(GOOD).sidecar.pinned


GOOD, DAMAGED = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def two_sessions(sessions_dir: Path) -> None:
    make_session(sessions_dir, GOOD)
    make_session(sessions_dir, DAMAGED)
    kv = sessions_dir / f"{DAMAGED}.00000000.kv"
    kv.write_bytes(b"\2" * kv.stat().st_size)  # same size, other bytes


def test_a_read_only_folder_is_read_without_the_lock(tmp_path, monkeypatch):
    """The lock file cannot be created (EROFS, as on a read-only mount): simulated, since root
    (CI) can write anywhere; the test below does it for real."""
    store = SessionStore(tmp_path / "sessions")
    two_sessions(store.dir)

    def read_only(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system", str(store.lock.path))

    monkeypatch.setattr(store.lock._lock, "acquire", read_only)
    read_only_checks(store)


def as_unprivileged(tmp_path_factory):
    """(uid to run the CLI as, or None for this user, data folder that user owns)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None, tmp_path_factory.mktemp("ro") / "home"
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be made")
    base = Path(tempfile.mkdtemp(prefix="slotkeeper-ro-"))  # under /tmp, reachable by nobody
    os.chown(base, OTHER_UID, OTHER_UID)
    return OTHER_UID, base / "home"


OTHER_UID = 65534


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_read_only_folder_for_real(tmp_path_factory):
    user, home = as_unprivileged(tmp_path_factory)
    paths = app_paths(home).ensure()
    two_sessions(paths.sessions_dir)
    if user is not None:
        for root, dirs, files in os.walk(home.parent):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, user, user)
    os.chmod(paths.sessions_dir, 0o500)
    try:
        if user is None:
            read_only_checks(SessionStore(paths.sessions_dir))
        r = run_cli(home, "list", user=user)
        assert r.returncode == 0 and GOOD in r.stdout and DAMAGED in r.stdout, r.stderr
        r = run_cli(home, "verify", user=user)
        assert r.returncode == 1 and f"{DAMAGED}  CORRUPT" in r.stdout and f"{GOOD}  ok" in r.stdout, r.stderr
        r = run_cli(home, "pin", GOOD, user=user)
        assert r.returncode == 1 and f"the sessions folder {paths.sessions_dir} is read-only" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (paths.sessions_dir / LOCK_NAME).exists()
    finally:
        os.chmod(paths.sessions_dir, 0o700)
        if user is not None:
            shutil.rmtree(home.parent)


def test_listing_a_deleted_folder_finds_nothing_and_does_not_create_it(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    store.dir.rmdir()
    assert store.listing().sessions == []
    assert not store.dir.exists(), "the lock never creates the folder (it would with the umask's mode)"
    with pytest.raises(FileNotFoundError, match="is missing"):
        store.sweep()


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_the_lock_file_is_private_like_every_file_slotkeeper_writes(isolated_home):
    old = os.umask(0o022)
    try:
        store = SessionStore(app_paths().ensure().sessions_dir)
        with store.lock.held():
            pass
    finally:
        os.umask(old)
    assert oct((store.dir / LOCK_NAME).stat().st_mode & 0o777) == oct(0o600)
