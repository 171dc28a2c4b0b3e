"""How llama-server ended, in words, also when it was not our child (an adopted server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from slotkeeper.core.server.supervisor import EXIT_NOT_KNOWN, _Child, describe_exit


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell starts the orphan")
def test_a_process_that_is_not_our_child_ends_with_no_signal_named():
    # A process another program started (as an adopted llama-server was): its exit status is not ours.
    pid = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                             text=True, check=True).stdout)
    child = _Child(None, psutil.Process(pid))
    assert child.poll() is None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    code = None
    while code is None and time.monotonic() < deadline:
        code = child.wait(0.2)
    assert code == EXIT_NOT_KNOWN
    words = describe_exit(code)
    assert "SIG" not in words and "not known" in words


def test_known_exits_keep_their_words():
    assert describe_exit(-9).startswith("was killed (SIGKILL")
    assert describe_exit(-1).startswith("was stopped by signal 1") or "SIGHUP" in describe_exit(-1)
