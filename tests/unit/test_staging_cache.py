"""The staging folder's cache of whole states: kept only in memory, found by the manifest's hash,
checked whole before use, the least recently used removed beyond its limits."""

from __future__ import annotations

import os
import time

from slotkeeper.core.sessions import staging


def _folder(root, name="abc"):
    folder = root / "slotkeeper-0" / name
    folder.mkdir(parents=True)
    return folder


def _staged(folder, name="incoming-1.kv", data=b"state bytes " * 100):
    path = folder / name
    path.write_bytes(data)
    return path


def test_a_committed_state_is_kept_whole_and_found_by_its_manifests_hash(tmp_path):
    folder = _folder(tmp_path)
    staged = _staged(folder)
    assert staging.cache_state(staged, "xxh3_128:aa11", memory_root=tmp_path)
    assert not staged.exists()
    name = staging.cached_state(folder, "xxh3_128:aa11")
    assert name is not None and (folder / name).read_bytes() == b"state bytes " * 100
    assert staging.cached_state(folder, "xxh3_128:bb22") is None  # another state's manifest


def test_a_cached_state_that_no_longer_matches_its_hash_is_never_used_and_goes(tmp_path):
    folder = _folder(tmp_path)
    staging.cache_state(_staged(folder), "xxh3_128:aa11", memory_root=tmp_path)
    [name] = os.listdir(folder)
    data = bytearray((folder / name).read_bytes())
    data[5] ^= 1
    (folder / name).write_bytes(bytes(data))
    assert staging.cached_state(folder, "xxh3_128:aa11") is None
    assert os.listdir(folder) == []


def test_in_the_data_folder_nothing_is_kept(tmp_path):
    folder = tmp_path / "data" / "staging"
    folder.mkdir(parents=True)
    staged = _staged(folder)
    assert not staging.cache_state(staged, "xxh3_128:aa11", memory_root=tmp_path / "shm")
    assert os.listdir(folder) == []


def test_beyond_its_files_the_least_recently_used_go(tmp_path):
    folder = _folder(tmp_path)
    for i in range(staging.CACHE_FILES + 2):
        staging.cache_state(_staged(folder, data=f"state {i}".encode() * 50), f"xxh3_128:{i:04x}",
                            memory_root=tmp_path)
        past = time.time() - 1000 + i  # each older than the next
        for name in os.listdir(folder):
            if name.startswith(f"state-{i:04x}-"):
                os.utime(folder / name, (past, past))
    names = os.listdir(folder)
    assert len(names) == staging.CACHE_FILES
    assert not [n for n in names if n.startswith(("state-0000-", "state-0001-"))]  # the two oldest
    assert staging.cached_state(folder, f"xxh3_128:{2:04x}") is not None


def test_the_byte_limit_counts_every_staging_folder_of_the_user(tmp_path, monkeypatch):
    """A data folder deleted (a test's, a benchmark's) leaves its staging folder's states in memory
    until the machine restarts: the next state cached anywhere takes the oldest of them first."""
    gone = _folder(tmp_path, "d" * 16)  # a staging folder whose data folder is gone
    live = _folder(tmp_path, "e" * 16)
    monkeypatch.setattr(staging, "CACHE_MAX_BYTES", 2500)
    staging.cache_state(_staged(gone, data=b"x" * 1000), "xxh3_128:0001", memory_root=tmp_path)
    staging.cache_state(_staged(gone, data=b"y" * 1000), "xxh3_128:0002", memory_root=tmp_path)
    for i, name in enumerate(sorted(os.listdir(gone))):
        past = time.time() - 1000 + i
        os.utime(gone / name, (past, past))
    staging.cache_state(_staged(live, data=b"z" * 1000), "xxh3_128:0003", memory_root=tmp_path)
    assert len(os.listdir(live)) == 1  # the new one stays
    assert len(os.listdir(gone)) == 1  # the least recently used of the others went
