"""What `slotkeeper serve` says in a terminal: the address clients use, llama-server's own one named
as private, the demo's notice once; its launch is kept in the request history."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_serve_says_the_address_clients_use_and_the_demo_notice_once(server_bin, port, isolated_home):
    from slotkeeper.core.model.demo_model import DEMO_NOTICE

    cmd = [sys.executable, "-m", "slotkeeper", "serve", "--demo", "--server-bin", server_bin, "--port",
           str(port), "--data-dir", str(isolated_home), "--ctx", "512"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().strip()
        assert ready == f"ready http://127.0.0.1:{port}", ready
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count(DEMO_NOTICE) == 1, err
    [private] = [line for line in err.splitlines() if "llama-server ready" in line]
    assert "on its private address http://127.0.0.1:" in private and f":{port} " not in private
    assert "server ready: http" not in err
    # the launch is kept for the desktop app's History markers
    from slotkeeper.core.basics.paths import app_paths
    from slotkeeper.core.history import RequestHistory

    assert len(RequestHistory(app_paths(isolated_home).history_file).launches()) == 1
