"""Facts read from a file are remembered across runs while the file is the same version, and read
again when it is rebuilt, replaced or touched: the --help probe and the GGUF header."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.engine.lifecycle import model_facts as model_module
from slotkeeper.core.engine.lifecycle.model_facts import model_facts_cache, resolve_model
from slotkeeper.core.model import gguf_info
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server import locate
from slotkeeper.core.server.locate import FLAGS_VERSION, ServerBinary, probe_flags
from slotkeeper.core.server.supervisor import HEALTH_POLL_SECONDS, health_poll_interval


def fake_server(path: Path, flags: str, runs: Path) -> Path:
    """A script standing in for a llama-server build whose --help lists ``flags``; counts its runs."""
    path.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'usage: {flags}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    monkeypatch.setattr(locate, "_flag_cache", {})


def runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.mark.skipif(os.name == "nt", reason="a shell script stands in for the binary")
def test_help_is_read_once_per_binary_version_across_runs(tmp_path, monkeypatch):
    counter = tmp_path / "runs"
    binary = ServerBinary((str(fake_server(tmp_path / "llama-server", "--cache-ram --metrics", counter)),),
                          "test")
    cache = FileFactsCache(tmp_path / "cache" / "flags.json", FLAGS_VERSION)
    assert probe_flags(binary, cache=cache) == {"--cache-ram", "--metrics"}
    monkeypatch.setattr(locate, "_flag_cache", {})  # a new process: only the file remembers
    assert probe_flags(binary, cache=cache) == {"--cache-ram", "--metrics"}
    assert runs(counter) == 1
    assert stat.S_IMODE(os.stat(cache.cache_file).st_mode) == 0o600
    # Rebuilt in place (another build, same name): asked again.
    time.sleep(0.01)
    fake_server(Path(binary.path), "--cache-ram --metrics --new-flag", counter)
    monkeypatch.setattr(locate, "_flag_cache", {})
    assert "--new-flag" in probe_flags(binary, cache=cache)
    assert runs(counter) == 2
    # Another binary moved into its place (another inode), even with the old mtime.
    st = os.stat(binary.path)
    other = fake_server(tmp_path / "other", "--only-this", counter)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, binary.path)
    monkeypatch.setattr(locate, "_flag_cache", {})
    assert probe_flags(binary, cache=cache) == {"--only-this"}
    assert runs(counter) == 3


def test_an_unreadable_cache_is_only_a_miss(tmp_path):
    cache_file = tmp_path / "facts.json"
    cache_file.write_text("{not json")
    cache = FileFactsCache(cache_file, "v1")
    target = tmp_path / "f"
    target.write_text("x")
    assert cache.get(target) is None
    cache.put(target, {"a": 1})
    assert cache.get(target) == {"a": 1}
    assert FileFactsCache(cache_file, "v2").get(target) is None  # facts from other code are read again


def test_model_facts_are_read_once_per_model_version(tmp_path, monkeypatch):
    path = write_model(tmp_path / "m.gguf", "llama")
    cache = model_facts_cache(tmp_path / "model-facts.json")
    first = resolve_model(str(path), tmp_path, cache)
    reads = []
    real = gguf_info.read_model_info
    monkeypatch.setattr(model_module.gguf_info, "read_model_info", lambda p: reads.append(p) or real(p))
    again = resolve_model(str(path), tmp_path, cache)
    assert reads == [] and again.info == first.info and again.path == first.path
    # Another model written over it (same name): read again, and the facts are the new model's.
    write_model(path, "qwen3")
    changed = resolve_model(str(path), tmp_path, cache)
    assert len(reads) == 1 and changed.info.arch == "qwen3"


def test_model_facts_round_trip_every_field(tmp_path):
    for kind in ("llama", "gemma3", "qwen35", "gpt-oss"):
        path = write_model(tmp_path / f"{kind}.gguf", kind)
        info = gguf_info.read_model_info(path)
        assert gguf_info.model_info_from_json(gguf_info.model_info_to_json(info), path) == info
    assert gguf_info.model_info_from_json({"arch": "llama"}, path) is None
    assert gguf_info.model_info_from_json("x", path) is None


def test_health_is_polled_often_at_first_and_never_slower_than_the_cap():
    assert health_poll_interval(0.0) <= 0.005
    assert health_poll_interval(0.2) == pytest.approx(0.01)  # a small model: readiness seen within 10 ms
    assert health_poll_interval(1.0) == pytest.approx(0.05)
    assert health_poll_interval(60.0) == HEALTH_POLL_SECONDS
