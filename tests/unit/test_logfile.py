"""The log tailer: every line reaches the listeners, across rotation; on Windows the child's log
handle appends only, so rotating under a running server leaves no zeros."""

import os
import sys

import pytest
from windows_fakes import fake_windows_files

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


# -- Windows: the child appends only through an append-only handle ----------------------------------
# Windows gives a child no O_APPEND: it writes through its inherited handle at that handle's own
# offset, unless the handle has FILE_APPEND_DATA without FILE_WRITE_DATA (writes to the end only).
# The platform is faked to Windows; CreateFileW and open_osfhandle are recorded (windows_fakes), and
# the fd they give is what the system's is: one whose writes always land at the end.

@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")  # (not os.name: pytest's own reporting reads it)


def test_on_windows_the_childs_log_handle_can_only_append(tmp_path, monkeypatch, windows):
    files = fake_windows_files(monkeypatch)
    path = tmp_path / "logs" / "llama-server.log"
    with logfile.open_for_child(path) as out:
        out.write(b"started\n")
    [(name, access, share, security, disposition, attributes, template)] = files.created
    assert name == str(path) and disposition == logfile.OPEN_ALWAYS
    assert access == logfile.FILE_APPEND_DATA | logfile.SYNCHRONIZE, "no FILE_WRITE_DATA, no GENERIC_WRITE"
    assert share == 0x7, "the tailer reads it, a rotation before the next start renames it"
    assert files.wrapped == [(4 * 101, os.O_WRONLY | os.O_APPEND)]
    assert path.read_bytes() == b"started\n"


def test_on_windows_a_log_that_cannot_be_opened_is_an_oserror_that_says_so(tmp_path, monkeypatch, windows):
    fake_windows_files(monkeypatch, fail_with=5)  # ERROR_ACCESS_DENIED
    path = tmp_path / "llama-server.log"
    with pytest.raises(OSError) as raised:
        logfile.open_for_child(path)
    assert raised.value.errno == 5 and raised.value.filename == str(path)
    assert "Windows error 5" in str(raised.value)


def test_on_windows_a_running_servers_log_is_rotated_under_it_without_zeros(tmp_path, monkeypatch, windows):
    """The tailer copies and truncates the live log (never renames it: the child keeps writing to
    its file), and the child's append-only handle writes on at the new end."""
    fake_windows_files(monkeypatch)
    path, tailer, seen = tailed_log(tmp_path, monkeypatch)
    lines = [f"line {i:03d} some text to make it longer" for i in range(40)]
    with logfile.open_for_child(path) as child:
        for i, line in enumerate(lines):
            child.write(f"{line}\n".encode())
            if i % 7 == 0:
                tailer._rotate_if_big()
            tailer.poll()
    assert seen == lines
    assert path.with_name("llama-server.log.1").exists(), "rotated while it ran"
    logs = [path.with_name(f"llama-server.log{suffix}") for suffix in (".3", ".2", ".1", "")]
    kept = b"".join(log.read_bytes() for log in logs if log.exists())
    assert b"\0" not in kept and path.stat().st_size < 200 + 64


def test_an_append_only_handle_is_what_makes_truncating_safe(tmp_path, monkeypatch):
    """Why the handle matters: a child writing at its own offset (a Windows handle with
    FILE_WRITE_DATA, faked with "r+b") leaves zeros before its next line after a truncate."""
    path, tailer, _seen = tailed_log(tmp_path, monkeypatch)
    with open(path, "r+b", buffering=0) as child:
        for i in range(10):
            child.write(f"line {i:03d} some text to make it longer\n".encode())
        tailer._rotate_if_big()
        child.write(b"next\n")
    assert path.read_bytes().startswith(b"\0")


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
