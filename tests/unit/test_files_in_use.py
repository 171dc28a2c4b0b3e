"""Windows: a file another program holds open (a virus scanner, `slotkeeper sessions verify`)
cannot be replaced or deleted for a moment; a save that completed must not be reported as failed.

Faked here (the machine running the tests need not be Windows): sys.platform is "win32" and
os.replace / os.unlink raise PermissionError, as a sharing violation does, for the files named.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import filelock  # noqa: F401 - imported before sys.platform is faked (it picks its kind on import)
import pytest
from sessions_helpers import make_session, write_slot_save

from slotkeeper.core.basics import fsutil
from slotkeeper.core.basics.fsutil import FileInUse, atomic_write_bytes, remove_file, replace_file
from slotkeeper.core.sessions.index import BLOCK
from slotkeeper.core.sessions.sidecar import load_sidecar
from slotkeeper.core.sessions.stamps import hash_with_stamp
from slotkeeper.core.sessions.store import SessionStore

A = list(range(1, 4 * BLOCK + 1))


class Busy:
    """os.replace / os.unlink failing ``times`` times (forever: None) for a path named ``target``,
    as Windows fails them while another program holds the file open."""

    def __init__(self, monkeypatch, call: str, target: str, times: int | None) -> None:
        self.real = getattr(os, call)
        self.target = target
        self.left = times
        self.failed = 0
        monkeypatch.setattr(os, call, self)

    def __call__(self, *paths, **kwargs):
        if Path(paths[-1]).name == self.target and (self.left is None or self.left > 0):
            self.failed += 1
            if self.left is not None:
                self.left -= 1
            raise PermissionError(13, "The process cannot access the file because it is being used by "
                                      "another process", str(paths[-1]))
        return self.real(*paths, **kwargs)


@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(fsutil, "BUSY_FIRST_WAIT_SECONDS", 0.001)


def test_on_windows_a_replace_is_tried_again_while_the_file_is_held_open(tmp_path, monkeypatch, windows):
    src, dst = tmp_path / "new", tmp_path / "old"
    src.write_text("new")
    dst.write_text("old")
    busy = Busy(monkeypatch, "replace", "old", times=2)
    waits: list[float] = []
    replace_file(src, dst, sleep=waits.append)
    assert dst.read_text() == "new" and not src.exists()
    assert busy.failed == 2 and len(waits) == 2 and waits[1] > waits[0]  # backing off


def test_on_windows_a_delete_is_tried_again_while_the_file_is_held_open(tmp_path, monkeypatch, windows):
    path = tmp_path / "old"
    path.write_text("old")
    Busy(monkeypatch, "unlink", "old", times=3)
    remove_file(path, sleep=lambda s: None)
    assert not path.exists()


def test_elsewhere_a_permission_error_is_raised_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    src, dst = tmp_path / "new", tmp_path / "old"
    src.write_text("new")
    busy = Busy(monkeypatch, "replace", "old", times=2)
    waits: list[float] = []
    with pytest.raises(PermissionError) as caught:
        replace_file(src, dst, sleep=waits.append)
    assert not isinstance(caught.value, FileInUse) and busy.failed == 1 and waits == []


def test_a_file_held_open_for_good_fails_clearly_and_leaves_no_temp_file(tmp_path, monkeypatch, windows):
    path = tmp_path / "settings.json"
    path.write_text("old")
    busy = Busy(monkeypatch, "replace", "settings.json", times=None)
    with pytest.raises(FileInUse, match=r"could not replace .*settings\.json: another program keeps it open"):
        atomic_write_bytes(path, b"new")
    assert busy.failed == fsutil.BUSY_RETRIES + 1
    assert path.read_text() == "old"  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # no temp file left


def test_on_windows_an_atomic_write_over_a_file_held_open_for_a_moment_succeeds(tmp_path, monkeypatch,
                                                                                 windows):
    path = tmp_path / "settings.json"
    path.write_text("old")
    Busy(monkeypatch, "replace", "settings.json", times=2)
    atomic_write_bytes(path, b"new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["settings.json"]


def _save(tmp_path):
    """A session, and the store with llama-server's next save of it waiting: (store, old, incoming, new)."""
    folder = tmp_path / "sessions"
    old = make_session(folder, "aaaaaaaaaaaa", tokens=A[:100])
    store = SessionStore(folder)
    store.listing()
    incoming = write_slot_save(folder / "incoming-0000000000000000.kv", A[:200])
    content_hash, _ = hash_with_stamp(incoming)
    new = replace(old, kv_file="aaaaaaaaaaaa.00000001.kv", n_tokens=200, size_bytes=incoming.stat().st_size,
                  content_hash=content_hash, verified=None)
    return store, old, incoming, new


def test_on_windows_a_save_commits_while_its_new_file_is_held_open_for_a_moment(tmp_path, monkeypatch,
                                                                                 windows):
    store, old, incoming, new = _save(tmp_path)
    Busy(monkeypatch, "replace", new.kv_file, times=2)  # a virus scanner looking at what llama-server wrote
    Busy(monkeypatch, "unlink", old.kv_file, times=2)
    sc = store.commit(incoming, new, A[:200], replaces=old.kv_file)
    folder = store.dir
    assert load_sidecar(folder / "aaaaaaaaaaaa.json") == sc and sc.kv_file == new.kv_file
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "aaaaaaaaaaaa.00000001.kv", "aaaaaaaaaaaa.json"]


def test_a_save_is_saved_though_its_previous_version_cannot_be_removed_yet(tmp_path, monkeypatch, windows,
                                                                            caplog):
    """`slotkeeper sessions verify` reads the previous version for longer than the tries last: the
    save is made all the same, and the file is a leftover the next start's sweep removes."""
    store, old, incoming, new = _save(tmp_path)
    held = Busy(monkeypatch, "unlink", old.kv_file, times=None)
    with caplog.at_level(logging.WARNING):
        sc = store.commit(incoming, new, A[:200], replaces=old.kv_file)
    assert load_sidecar(store.dir / "aaaaaaaaaaaa.json") == sc and sc.kv_file == new.kv_file
    assert (store.dir / old.kv_file).exists() and "removed at the next start" in caplog.text
    assert [e.id for e in store.listing().sessions] == ["aaaaaaaaaaaa"]
    monkeypatch.setattr(os, "unlink", held.real)  # let go
    assert store.sweep() == [old.kv_file]


def test_on_windows_a_delete_goes_ahead_while_the_sidecar_is_held_open_for_a_moment(tmp_path, monkeypatch,
                                                                                      windows):
    folder = tmp_path / "sessions"
    make_session(folder, "aaaaaaaaaaaa")
    store = SessionStore(folder)
    Busy(monkeypatch, "unlink", "aaaaaaaaaaaa.json", times=2)
    store.delete("aaaaaaaaaaaa")
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == []
