"""One engine per data folder, also when the folder is deleted while an engine runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from slotkeeper.core.basics import datalock
    home = Path(sys.argv[1])
    try:
        datalock.acquire(home / "state" / "engine.lock", str(home))
    except datalock.DataDirBusy as exc:
        print("BUSY", exc, flush=True)
        sys.exit(3)
    print("HELD", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def _hold(home, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(home), str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def test_a_deleted_data_folder_is_still_in_use_by_the_engine_that_runs_on_it(tmp_path):
    home = tmp_path / "home"
    first = _hold(home, 30)
    try:
        assert first.stdout.readline().strip() == "HELD"
        shutil.rmtree(home)  # the lock file inside it goes too
        second = subprocess.run([sys.executable, "-c", HOLD, str(home), "0"], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 3 and "already running" in second.stdout, second.stdout + second.stderr
    finally:
        first.kill()
        first.wait()
    third = subprocess.run([sys.executable, "-c", HOLD, str(home), "0"], capture_output=True, text=True,
                           timeout=60)
    assert third.returncode == 0 and "HELD" in third.stdout  # free again once the first one is gone
