"""A KV file verified once is trusted while its stamp (size, mtime, inode, ctime) is unchanged;
anything that changed it, even with the old mtime put back, is hashed again and refused if damaged."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from sessions_helpers import make_session

from slotkeeper.core.sessions import file_checks
from slotkeeper.core.sessions.stamps import FileStamp, hash_with_stamp
from slotkeeper.core.sessions.store import SessionStore


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """Every whole-file hash the store computes."""
    calls: list[Path] = []

    def counting(path):
        calls.append(Path(path))
        return hash_with_stamp(path)

    monkeypatch.setattr(file_checks, "hash_with_stamp", counting)
    return calls


def verified_session(store: SessionStore, size: int = 4096):
    make_session(store.dir, "s1", size=size)
    entry = store.get("s1")
    assert store.integrity_problems(entry) == []  # the full check records the stamp
    entry = store.get("s1")
    assert entry.sidecar.verified is not None
    return entry


def later_ctime(path: Path, change) -> None:
    """Apply ``change`` once the clock has moved past the file's ctime (coarse file system clocks)."""
    before = os.lstat(path).st_ctime_ns
    while True:
        time.sleep(0.01)
        change()
        if os.lstat(path).st_ctime_ns != before:
            return


def test_a_verified_file_is_not_hashed_again(store, hashes):
    entry = verified_session(store)
    hashes.clear()
    assert store.integrity_problems(entry, trust_stamp=True) == []
    assert hashes == []


def test_verify_without_trust_always_hashes(store, hashes):
    entry = verified_session(store)
    hashes.clear()
    assert store.integrity_problems(entry) == []
    assert hashes == [entry.kv_path]


def test_a_flipped_byte_with_the_old_mtime_put_back_is_refused(store, hashes):
    entry = verified_session(store)
    st = os.lstat(entry.kv_path)

    def flip() -> None:
        with open(entry.kv_path, "r+b") as f:
            f.seek(100)
            f.write(b"\2")
        os.utime(entry.kv_path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as `cp -p` or `touch -d` would

    later_ctime(entry.kv_path, flip)
    now = os.lstat(entry.kv_path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    hashes.clear()
    problems = store.integrity_problems(store.get("s1"), trust_stamp=True)
    assert problems == ["KV file content does not match its hash (damaged on disk)"]
    assert hashes == [entry.kv_path]


def test_a_truncated_file_is_refused(store):
    entry = verified_session(store)
    os.truncate(entry.kv_path, 4095)
    problems = store.integrity_problems(store.get("s1"), trust_stamp=True)
    assert problems and "cut short" in problems[0]


def test_a_file_replaced_by_another_of_the_same_size_and_mtime_is_refused(store, hashes):
    entry = verified_session(store)
    st = os.lstat(entry.kv_path)
    other = entry.kv_path.with_name("other.tmp")
    other.write_bytes(b"\3" * st.st_size)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, entry.kv_path)
    now = os.lstat(entry.kv_path)
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and now.st_ino != st.st_ino
    hashes.clear()
    problems = store.integrity_problems(store.get("s1"), trust_stamp=True)
    assert problems == ["KV file content does not match its hash (damaged on disk)"]
    assert hashes == [entry.kv_path]


def test_a_touched_intact_file_is_hashed_once_then_trusted_again(store, hashes):
    entry = verified_session(store)
    old = entry.sidecar.verified
    later_ctime(entry.kv_path, lambda: os.utime(entry.kv_path))
    hashes.clear()
    assert store.integrity_problems(store.get("s1"), trust_stamp=True) == []
    assert hashes == [entry.kv_path]
    new = store.get("s1").sidecar.verified
    assert new is not None and new != old and new.matches(os.lstat(entry.kv_path), entry.sidecar.content_hash)
    hashes.clear()
    assert store.integrity_problems(store.get("s1"), trust_stamp=True) == []
    assert hashes == []


def test_a_stamp_for_another_content_hash_is_not_trusted(store, hashes):
    entry = verified_session(store)
    sc = entry.sidecar
    wrong = FileStamp(sc.verified.size, sc.verified.mtime_ns, sc.verified.ino, sc.verified.ctime_ns,
                      "xxh3_128:" + "0" * 32)
    store.update("s1", lambda s: replace(s, verified=wrong))
    hashes.clear()
    assert store.integrity_problems(store.get("s1"), trust_stamp=True) == []
    assert hashes == [entry.kv_path]


def test_a_corrupt_mark_wins_over_the_stamp(store, hashes):
    verified_session(store)
    store.mark_corrupt("s1", "damaged on disk")
    problems = store.integrity_problems(store.get("s1"), trust_stamp=True)
    assert problems == ["damaged: damaged on disk"]


@pytest.mark.parametrize("value",
                         [None, "x", {"size": 1}, {"size": -1, "mtime_ns": 1, "ino": 1, "ctime_ns": 1,
                                                  "content_hash": "xxh3_128:" + "0" * 32},
                          {"size": True, "mtime_ns": 1, "ino": 1, "ctime_ns": 1,
                           "content_hash": "xxh3_128:" + "0" * 32}])
def test_a_malformed_stamp_only_means_hash_again(value):
    assert FileStamp.from_json(value) is None


def test_hash_with_stamp_gives_no_stamp_when_the_file_changes_while_read(tmp_path, monkeypatch):
    path = tmp_path / "f.kv"
    path.write_bytes(b"\1" * (9 << 20))  # three chunks
    import slotkeeper.core.sessions.stamps as stamps

    real = stamps.xxhash.xxh3_128

    class Writing:
        def __init__(self):
            self.h = real()
            self.n = 0

        def update(self, chunk):
            self.n += 1
            if self.n == 1:
                time.sleep(0.02)
                with open(path, "r+b") as f:
                    f.write(b"\2")
            self.h.update(chunk)

        def hexdigest(self):
            return self.h.hexdigest()

    monkeypatch.setattr(stamps.xxhash, "xxh3_128", Writing)
    _, st = hash_with_stamp(path)
    assert st is None
