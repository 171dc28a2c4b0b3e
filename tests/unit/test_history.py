"""Request history: JSON Lines that survive restarts, compaction and damage."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from slotkeeper.core.history import HISTORY_VERSION, RequestHistory, RequestRecord


def rec(i: int, slot: int = 0) -> RequestRecord:
    return RequestRecord(
        at=1_700_000_000.0 + i, slot=slot, n_prompt=100 + i, cache_n=i, prompt_n=100, prompt_ms=12.5
    )


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.jsonl"


def test_roundtrip_across_instances(path: Path) -> None:
    history = RequestHistory(path)
    assert history.load() == [] and history.recent(5) == []
    records = [rec(i, slot=i % 2) for i in range(5)]
    for r in records:
        history.append(r)
    # A new instance (the next app start) reads the same history back.
    again = RequestHistory(path)
    assert again.load() == records
    assert again.recent(2) == records[-2:]
    assert again.recent(0) == []
    assert again.recent(99) == records


def test_line_format_is_versioned_json(path: Path) -> None:
    RequestHistory(path).append(rec(3))
    [line] = lines(path)
    data = json.loads(line)
    assert data == {
        "v": HISTORY_VERSION,
        "at": 1_700_000_003.0,
        "slot": 0,
        "n_prompt": 103,
        "cache_n": 3,
        "prompt_n": 100,
        "prompt_ms": 12.5,
        "source": "",
        "saved_ms": 0.0,
    }


def test_cache_share() -> None:
    assert rec(50).cache_share == pytest.approx(50 / 150)
    assert RequestRecord(0, 0, 0, 0, 0, 0.0).cache_share == 0.0
    # n_prompt missing (0) but the split is known: fall back to cache_n + prompt_n.
    assert RequestRecord(0, 0, 0, 30, 10, 1.0).cache_share == pytest.approx(0.75)
    assert RequestRecord(0, 0, 10, 20, 0, 1.0).cache_share == 1.0  # clamped


def test_compaction_keeps_the_newest(path: Path) -> None:
    history = RequestHistory(path, max_records=10)
    for i in range(20):
        history.append(rec(i))
    assert len(lines(path)) == 20  # not yet past 2x
    history.append(rec(20))
    assert len(lines(path)) == 10
    assert history.load() == [rec(i) for i in range(11, 21)]
    assert not [p for p in path.parent.iterdir() if p.name != path.name]  # no temp files left
    for i in range(21, 31):
        history.append(rec(i))
    assert len(lines(path)) == 20
    assert history.load() == [rec(i) for i in range(21, 31)]


def test_compaction_counts_lines_already_in_the_file(path: Path) -> None:
    first = RequestHistory(path, max_records=5)
    for i in range(10):
        first.append(rec(i))
    second = RequestHistory(path, max_records=5)  # after a restart
    second.append(rec(10))
    assert len(lines(path)) == 5
    assert second.load() == [rec(i) for i in range(6, 11)]


def test_load_returns_at_most_max_records(path: Path) -> None:
    big = RequestHistory(path, max_records=100)
    for i in range(30):
        big.append(rec(i))
    small = RequestHistory(path, max_records=10)
    assert small.load() == [rec(i) for i in range(20, 30)]
    assert small.recent(50) == small.load()


def test_damaged_lines_are_skipped(path: Path) -> None:
    history = RequestHistory(path)
    history.append(rec(0))
    good = lines(path)[0]
    bad = [
        "",
        "not json",
        "[1, 2, 3]",
        '{"v": 2, "at": 1, "slot": 0, "n_prompt": 1, "cache_n": 0, "prompt_n": 1, "prompt_ms": 1}',
        '{"v": 1, "at": 1}',
        '{"v": 1, "at": "x", "slot": 0, "n_prompt": 1, "cache_n": 0, "prompt_n": 1, "prompt_ms": 1}',
        '{"v": 1, "at": 1, "slot": true, "n_prompt": 1, "cache_n": 0, "prompt_n": 1, "prompt_ms": 1}',
        '{"v": 1, "at": NaN, "slot": 0, "n_prompt": 1, "cache_n": 0, "prompt_n": 1, "prompt_ms": 1}',
    ]
    with open(path, "ab") as fh:
        fh.write(("\n".join(bad) + "\n").encode())
        fh.write(b"\xff\xfe garbage bytes\n")
        fh.write(good.encode()[:25])  # a crash in the middle of an append
    assert history.load() == [rec(0)]
    # The next append starts on a fresh line, so it is not lost with the torn tail.
    history.append(rec(1))
    assert RequestHistory(path).load() == [rec(0), rec(1)]


def test_unreadable_history_reads_empty(tmp_path: Path) -> None:
    folder = tmp_path / "is-a-folder"
    folder.mkdir()
    assert RequestHistory(folder).load() == []


def append_from_threads(history: RequestHistory, threads_n: int, per_thread: int) -> None:
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            history.append(rec(t * 1000 + i, slot=t))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def test_concurrent_appends_lose_nothing(path: Path) -> None:
    history = RequestHistory(path, max_records=1000)
    append_from_threads(history, threads_n=8, per_thread=50)
    loaded = history.load()
    expected = {rec(t * 1000 + i, slot=t) for t in range(8) for i in range(50)}
    assert len(loaded) == 400 and set(loaded) == expected
    for t in range(8):  # each thread's records stay in the order it wrote them
        mine = [r for r in loaded if r.slot == t]
        assert mine == sorted(mine, key=lambda r: r.at)


def test_concurrent_appends_with_compaction(path: Path) -> None:
    history = RequestHistory(path, max_records=50)
    append_from_threads(history, threads_n=8, per_thread=50)
    raw = lines(path)
    assert 50 <= len(raw) <= 100
    assert all(json.loads(line)["v"] == 1 for line in raw)  # every line whole
    loaded = history.load()
    assert len(set(loaded)) == 50
    assert loaded == [RequestRecord.from_json(json.loads(line)) for line in raw[-50:]]


def test_max_records_must_be_positive(path: Path) -> None:
    with pytest.raises(ValueError):
        RequestHistory(path, max_records=0)


def test_records_without_the_cache_source_still_read(path: Path) -> None:
    old = {"v": HISTORY_VERSION, "at": 1.0, "slot": 0, "n_prompt": 10, "cache_n": 5, "prompt_n": 5,
           "prompt_ms": 1.0}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old) + "\n")
    [r] = RequestHistory(path).load()
    assert r.source == "" and r.saved_ms == 0.0


def test_launches_are_kept_beside_the_requests(path: Path) -> None:
    """A relaunch reads the earlier launches back (the History tab's markers); request readers skip
    launch lines, as a version without them would."""
    from slotkeeper.core.history import LaunchRecord

    history = RequestHistory(path)
    history.append(LaunchRecord(1_700_000_000.0 - 5, (0,)))
    for i in range(3):
        history.append(rec(i))
    history.append(LaunchRecord(1_700_000_010.0, (0, 1)))
    history.append(rec(20))
    again = RequestHistory(path)
    assert [r.at for r in again.load()] == [rec(i).at for i in (0, 1, 2, 20)]
    assert again.launches() == [LaunchRecord(1_700_000_000.0 - 5, (0,)),
                                LaunchRecord(1_700_000_010.0, (0, 1))]
    assert json.loads(lines(path)[-2]) == {"v": HISTORY_VERSION, "launch": 1_700_000_010.0,
                                           "restored_slots": [0, 1]}


def test_compaction_keeps_the_launches_of_the_requests_it_keeps(path: Path) -> None:
    from slotkeeper.core.history import LaunchRecord

    history = RequestHistory(path, max_records=3)
    history.append(LaunchRecord(1_699_999_999.0))  # before request 0
    for i in range(4):
        history.append(rec(i))
    history.append(LaunchRecord(1_700_000_003.5, (0,)))  # between requests 3 and 4
    for i in range(4, 8):
        history.append(rec(i))  # compacted on the way: 3 requests kept
    kept = RequestHistory(path, max_records=3)
    assert [r.at for r in kept.load()] == [rec(i).at for i in (5, 6, 7)]
    assert kept.launches() == [LaunchRecord(1_700_000_003.5, (0,))]  # the launch that began their run
