"""Model SHA-256 cache: hashed once, reused while unchanged, invalidated by size, mtime, inode or ctime."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from slotkeeper.core.model import model_hash
from slotkeeper.core.model.model_hash import ModelChangedError, ModelHashCache


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    # Just over two chunks, so the chunked loop and progress are exercised.
    path.write_bytes(os.urandom(2 * model_hash.CHUNK_SIZE + 123))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> ModelHashCache:
    return ModelHashCache(tmp_path / "state" / "model-hashes.json")


def expected(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class OpenCounter:
    """Counts binary opens of one file through Path.open (how the hasher reads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
        self.count = 0
        real_open = Path.open
        target = target.resolve()

        def counting_open(path: Path, mode: str = "r", *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            if Path(path).resolve() == target and "b" in mode:
                self.count += 1
            return real_open(path, mode, *args, **kwargs)

        monkeypatch.setattr(Path, "open", counting_open)
        real_builtin_open = builtins.open

        def counting_builtin_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
            if (
                isinstance(file, (str, os.PathLike))
                and Path(file).resolve() == target
                and "b" in mode
            ):
                self.count += 1
            return real_builtin_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", counting_builtin_open)


def test_compute_hashes_and_reports_progress(cache: ModelHashCache, model: Path) -> None:
    seen: list[tuple[int, int]] = []
    sha = cache.compute(model, progress=lambda done, total: seen.append((done, total)))
    assert sha == expected(model)
    size = model.stat().st_size
    assert seen[0] == (0, size) and seen[-1] == (size, size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) == 4  # start + 3 chunks


def test_cached_is_none_before_hashing(cache: ModelHashCache, model: Path) -> None:
    assert cache.cached(model) is None
    assert cache.cached(model.parent / "missing.gguf") is None


def test_second_call_does_not_read_the_model(
    cache: ModelHashCache, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = cache.compute(model)
    counter = OpenCounter(monkeypatch, model)
    assert cache.cached(model) == first
    assert cache.compute(model) == first
    assert counter.count == 0
    # The counter does see reads: after a change, the next compute reads the file once.
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cache.compute(model) == first
    assert counter.count == 1


def test_cache_survives_a_new_instance(tmp_path: Path, cache: ModelHashCache, model: Path) -> None:
    sha = cache.compute(model)
    again = ModelHashCache(cache.cache_file)
    assert again.cached(model) == sha
    data = json.loads(cache.cache_file.read_text())
    assert data["schema_version"] == 1
    (entry,) = data["entries"].values()
    assert entry["sha256"] == sha and entry["size"] == model.stat().st_size


def test_other_spelling_of_the_path_hits(cache: ModelHashCache, model: Path) -> None:
    sha = cache.compute(model)
    assert cache.cached(model.parent / "." / model.name) == sha


def test_changed_mtime_invalidates(cache: ModelHashCache, model: Path) -> None:
    cache.compute(model)
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cache.cached(model) is None


def test_changed_content_is_rehashed(cache: ModelHashCache, model: Path) -> None:
    old = cache.compute(model)
    with model.open("ab") as fh:
        fh.write(b"more")
    assert cache.cached(model) is None
    new = cache.compute(model)
    assert new != old and new == expected(model)


def test_change_during_hashing_is_an_error(cache: ModelHashCache, model: Path) -> None:
    def touch_midway(done: int, total: int) -> None:
        if 0 < done < total:
            st = model.stat()
            os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    with pytest.raises(ModelChangedError):
        cache.compute(model, progress=touch_midway)
    assert cache.cached(model) is None


def test_corrupt_cache_file_is_ignored(cache: ModelHashCache, model: Path) -> None:
    cache.cache_file.parent.mkdir(parents=True)
    cache.cache_file.write_text("{not json")
    assert cache.cached(model) is None
    assert cache.compute(model) == expected(model)
    assert json.loads(cache.cache_file.read_text())["entries"]


def test_no_temp_files_left(cache: ModelHashCache, model: Path) -> None:
    cache.compute(model)
    assert [p.name for p in cache.cache_file.parent.iterdir()] == [cache.cache_file.name]


def test_concurrent_hashes_of_different_files_all_stored(
    cache: ModelHashCache, tmp_path: Path
) -> None:
    paths = []
    for i in range(6):
        p = tmp_path / f"m{i}.gguf"
        p.write_bytes(os.urandom(1000 + i))
        paths.append(p)
    results: dict[str, str] = {}
    lock = threading.Lock()

    def record(p: Path) -> None:  # as the engine's I/O threads hash
        sha = cache.compute(p)
        with lock:
            results[p.name] = sha

    threads = [threading.Thread(target=record, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 6
    fresh = ModelHashCache(cache.cache_file)
    for p in paths:
        assert fresh.cached(p) == expected(p)


def other_bytes_same_size(model: Path) -> bytes:
    data = model.read_bytes()
    return bytes(b ^ 0xFF for b in data[:64]) + data[64:]


def test_another_model_copied_over_with_cp_p_is_hashed_again(cache: ModelHashCache, model: Path) -> None:
    """`cp -p other model`: the same file (inode), the same size, the old mtime put back."""
    old = cache.compute(model)
    st = model.stat()
    time.sleep(0.05)  # past the file system clock's tick, as any real copy of a model is
    with model.open("r+b") as fh:  # in place, as cp does
        fh.write(other_bytes_same_size(model))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = model.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert cache.cached(model) is None
    assert cache.compute(model) == expected(model) != old


def test_another_model_moved_into_place_is_hashed_again(cache: ModelHashCache, model: Path) -> None:
    """A file of the same size and mtime renamed over the model: another inode."""
    old = cache.compute(model)
    st = model.stat()
    other = model.with_name("other.gguf")
    other.write_bytes(other_bytes_same_size(model))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, model)
    assert cache.cached(model) is None
    assert cache.compute(model) == expected(model) != old


def test_entries_without_inode_and_ctime_are_misses(cache: ModelHashCache, model: Path) -> None:
    sha = cache.compute(model)
    data = json.loads(cache.cache_file.read_text())
    (entry,) = data["entries"].values()
    assert {"size", "mtime_ns", "ino", "ctime_ns", "sha256"} <= entry.keys()
    for key in ("ino", "ctime_ns"):
        del entry[key]
    cache.cache_file.write_text(json.dumps(data))  # as an older Slotkeeper wrote it
    assert cache.cached(model) is None
    assert cache.compute(model) == sha
    assert cache.cached(model) == sha
