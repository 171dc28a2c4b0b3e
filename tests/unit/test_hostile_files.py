"""One bad file in the sessions folder never breaks the rest: listing, the CLI and saving carry on.

A sidecar nested 100 000 deep, a FIFO named like a sidecar or a KV file, symbolic links (to
themselves, to files outside): each is reported as what it is, never followed, never waited on.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest
from sessions_helpers import make_session, run_cli, save_incoming, write_slot_save

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.sessions import saving
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.naming import new_incoming_name
from slotkeeper.core.sessions.sidecar import MAX_SIDECAR_BYTES
from slotkeeper.core.sessions.store import SessionStore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symbolic links as POSIX has them")

GOOD, OTHER, BAD = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"
CHAT = list(range(100, 160))


def within(seconds: float, fn, fifos=()):
    """fn() on a thread; a call still blocked after ``seconds`` fails the test (and is unblocked)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for fifo in fifos:  # a reader blocked in open() returns once a writer comes and goes
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail(f"blocked for more than {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def home(tmp_path):
    paths = app_paths(tmp_path / "home").ensure()
    sc = make_session(paths.sessions_dir, GOOD, tokens=CHAT, used="2026-03-01T00:00:00Z")
    make_session(paths.sessions_dir, OTHER, tokens=[7] * 50, used="2026-02-01T00:00:00Z")
    return paths, SessionStore(paths.sessions_dir), sc


def save(store: SessionStore, tokens: list[int], model_sha256: str) -> saving.SaveOutcome:
    """The save protocol on a file as llama-server would have written it."""
    name = new_incoming_name()
    size = write_slot_save(store.dir / name, tokens).stat().st_size
    facts = ServerFacts(model_sha256=model_sha256, model_path="/m.gguf", flash_attn=True, cache_type_k="q8_0",
                        cache_type_v="q8_0", swa_full=False, n_parallel=2, n_ctx_slot=16384, swa=False)
    ctx = saving.SaveContext(facts, "qwen3", "b1")
    return within(20, lambda: save_incoming(store, name, size, 0, ctx, lambda t: ("title", "preview")))


def assert_saving_still_works(store, sc):
    assert save(store, CHAT + [1, 2, 3], sc.model_sha256).kind == "update"  # continues GOOD
    assert save(store, [9] * 40, sc.model_sha256).kind == "new"


def assert_cli_lists(paths, *expected: str) -> str:
    r = run_cli(paths.data_dir, "list", timeout=30)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    for text in expected:
        assert text in r.stdout, r.stdout
    rows = json.loads(run_cli(paths.data_dir, "list", "--json", timeout=30).stdout)
    assert GOOD in [row["id"] for row in rows]
    return r.stdout


def test_a_sidecar_nested_100000_deep_is_a_problem_not_a_crash(home):
    paths, store, sc = home
    (store.dir / f"{BAD}.json").write_text("[" * 100_000)
    listing = store.listing()
    bad = next(e for e in listing.sessions if e.id == BAD)
    assert bad.status == "corrupt" and bad.problems[0].startswith("unreadable sidecar")
    assert [e.status for e in listing.sessions if e.id != BAD] == ["ok", "ok"]
    assert store.sweep() == []  # sweeping at start reads every sidecar too
    assert_cli_lists(paths, GOOD, BAD, "(unreadable)")
    assert_saving_still_works(store, sc)


def test_a_fifo_named_like_a_sidecar_is_never_waited_on(home):
    paths, store, sc = home
    fifo = store.dir / f"{BAD}.json"
    os.mkfifo(fifo)
    listing = within(10, store.listing, [fifo])
    bad = next(e for e in listing.sessions if e.id == BAD)
    assert "FIFO" in bad.problems[0]
    assert_cli_lists(paths, BAD)
    r = run_cli(paths.data_dir, "show", BAD, timeout=30)
    assert r.returncode == 0 and "FIFO" in r.stdout
    assert_saving_still_works(store, sc)
    assert run_cli(paths.data_dir, "delete", BAD, timeout=30).returncode == 0
    assert not os.path.lexists(fifo)


def test_a_sidecar_that_is_a_link_is_not_followed(home, tmp_path):
    paths, store, _sc = home
    elsewhere = tmp_path / "elsewhere"
    make_session(elsewhere, BAD)
    (store.dir / f"{BAD}.json").symlink_to(elsewhere / f"{BAD}.json")
    bad = next(e for e in store.sessions() if e.id == BAD)
    assert bad.sidecar is None and "symbolic link" in bad.problems[0]


def test_an_oversized_sidecar_is_not_read(home):
    _paths, store, _sc = home
    (store.dir / f"{BAD}.json").write_bytes(b" " * (MAX_SIDECAR_BYTES + 1))
    bad = next(e for e in store.sessions() if e.id == BAD)
    assert bad.sidecar is None and "at most" in bad.problems[0]


@pytest.mark.parametrize("kind", ["loop", "fifo", "link-outside", "directory"])
def test_a_kv_file_that_is_not_a_regular_file(home, tmp_path, kind):
    paths, store, sc = home
    bad_sc = make_session(store.dir, BAD, tokens=CHAT[:30], used="2026-04-01T00:00:00Z")
    kv = store.dir / bad_sc.kv_file
    kv.unlink()
    if kind == "loop":
        kv.symlink_to(kv.name)
    elif kind == "fifo":
        os.mkfifo(kv)
    elif kind == "directory":
        kv.mkdir()
    else:
        kv.symlink_to(write_slot_save(tmp_path / "outside.kv", CHAT[:30]))
    what = {"loop": "symbolic link", "link-outside": "symbolic link", "fifo": "FIFO",
            "directory": "directory"}[kind]
    listing = within(10, store.listing, [kv] if kind == "fifo" else [])
    bad = next(e for e in listing.sessions if e.id == BAD)
    assert bad.status == "corrupt" and what in bad.problems[0], bad.problems
    assert bad.size_bytes == 0  # a link's target is never measured either
    entry = within(10, lambda: store.verify(BAD), [kv] if kind == "fifo" else [])
    assert what in " ".join(entry.problems)
    assert_cli_lists(paths, BAD)
    assert_saving_still_works(store, sc)
    # Continuing the bad session's conversation never reads through its KV file.
    outcome = save(store, CHAT[:30] + [5, 5], sc.model_sha256)
    assert BAD not in (outcome.sidecar.id, outcome.sidecar.parent)


def test_other_files_are_listed_as_what_they_are_and_never_followed(home):
    paths, store, _sc = home
    os.mkfifo(store.dir / "pipe")
    (store.dir / "loop").symlink_to("loop")
    (store.dir / "passwd").symlink_to("/etc/passwd")
    (store.dir / "notes.txt").write_text("mine")
    (store.dir / "subdir").mkdir()
    listing = within(10, store.listing, [store.dir / "pipe"])
    kinds = {u.name: (u.kind, u.size_bytes) for u in listing.unmanaged}
    assert kinds == {"pipe": ("FIFO", 0), "loop": ("symbolic link", 0), "passwd": ("symbolic link", 0),
                     "notes.txt": ("file", 4), "subdir": ("directory", 0)}
    assert [e.status for e in listing.sessions] == ["ok", "ok"]
    assert_cli_lists(paths, GOOD)


def test_sweeping_goes_past_what_it_cannot_remove(home):
    _paths, store, _sc = home
    (store.dir / "incoming-0000000000000000.kv").mkdir()  # a directory where a leftover file would be
    (store.dir / "incoming-ffffffffffffffff.kv").write_bytes(b"half a save")
    (store.dir / "dddddddddddd.00000000.kv").write_bytes(b"a first save that died before its sidecar")
    removed = store.sweep()
    assert sorted(removed) == ["dddddddddddd.00000000.kv", "incoming-ffffffffffffffff.kv"]
    assert (store.dir / "incoming-0000000000000000.kv").is_dir()
