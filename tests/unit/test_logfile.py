"""The log tailer: every line reaches the listeners, across rotation; on Windows no rotation ever
truncates the file under a running server."""

import os
import sys

import pytest

from slotkeeper.core.server import logfile


def tailed_log(tmp_path, monkeypatch):
    """An empty server log, rotated past 200 bytes, tailed from its start: (path, tailer, lines seen)."""
    monkeypatch.setattr(logfile, "LOG_MAX_BYTES", 200)
    path = tmp_path / "llama-server.log"
    path.touch()
    seen: list[str] = []
    tailer = logfile.LogTailer(path, start_at_end=False)
    tailer.add_listener(seen.append)
    return path, tailer, seen


def test_lines_survive_rotation(tmp_path, monkeypatch):
    path, tailer, seen = tailed_log(tmp_path, monkeypatch)
    with open(path, "ab", buffering=0) as child:  # the child's O_APPEND handle
        for i in range(40):
            child.write(f"line {i:03d} some text to make it longer\n".encode())
            if i % 7 == 0:
                tailer._rotate_if_big()
            tailer.poll()
        child.write(b"half a li")
        tailer._rotate_if_big()
        child.write(b"ne, then the rest\n")
        tailer.poll()
    assert seen[:40] == [f"line {i:03d} some text to make it longer" for i in range(40)]
    assert path.with_name("llama-server.log.1").exists()
    assert seen[-1].endswith("ne, then the rest")


# -- Windows: the child does not append ------------------------------------------------------------
# Windows gives a child no append-mode writes: it writes through its inherited handle at that
# handle's own offset. Faked here with a file opened "r+b" (its own offset, no O_APPEND) and the
# platform faked to Windows.

@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")  # (not os.name: pytest's own reporting reads it)


def test_on_windows_a_running_servers_log_is_never_truncated_under_it(tmp_path, monkeypatch, windows):
    path, tailer, seen = tailed_log(tmp_path, monkeypatch)
    lines = [f"line {i:03d} some text to make it longer" for i in range(40)]
    with open(path, "r+b", buffering=0) as child:  # writes where it left off, as a Windows child does
        for i, line in enumerate(lines):
            child.write(f"{line}\n".encode())
            if i % 7 == 0:
                tailer._rotate_if_big()
            tailer.poll()
    assert b"\0" not in path.read_bytes()
    assert path.read_bytes().decode().splitlines() == lines == seen
    assert not path.with_name("llama-server.log.1").exists()  # rotated at the next start instead


def test_on_windows_the_log_is_rotated_by_renaming_it_before_the_child_opens_it(tmp_path, windows):
    path = tmp_path / "llama-server.log"
    path.write_bytes(b"the last run\n")
    path.with_name("llama-server.log.1").write_bytes(b"the run before\n")
    logfile.rotate(path, force=True)
    assert not path.exists()  # nothing copied, nothing truncated: the next child starts a new file
    assert path.with_name("llama-server.log.1").read_bytes() == b"the last run\n"
    assert path.with_name("llama-server.log.2").read_bytes() == b"the run before\n"


def test_on_windows_a_log_another_program_holds_open_is_left_as_it_is(tmp_path, monkeypatch, windows):
    path = tmp_path / "llama-server.log"
    path.write_bytes(b"a server still running\n")
    real_replace = os.replace

    def held_open(src, dst):
        if os.fspath(src) == os.fspath(path):
            raise PermissionError(13, "being used by another process", os.fspath(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", held_open)
    logfile.rotate(path, force=True)  # no error: starting the server matters more
    assert path.read_bytes() == b"a server still running\n"


def test_the_childs_handle_starts_at_the_end_of_the_log(tmp_path):
    """A Windows child writes at its handle's offset: a log left unrotated (held open) is written
    after, not over. (A guard: fdopen's "ab" already does it.)"""
    path = tmp_path / "llama-server.log"
    path.write_bytes(b"kept\n")
    with logfile.open_for_child(path) as out:
        assert os.lseek(out.fileno(), 0, os.SEEK_CUR) == len(b"kept\n")
