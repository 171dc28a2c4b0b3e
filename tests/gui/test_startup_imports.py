"""What the app loads before anyone asks for a download: no Hub client, no httpx.

httpx (and, in a dev install, click, rich and pygments through httpx._main) costs megabytes and a
noticeable part of start-up; only the Hub download uses it, and the download dialog imports it
when it is opened.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import slotkeeper.gui

LOADED_FOR_DOWNLOADS = ("slotkeeper.core.model.hub_download", "huggingface_hub", "httpx", "httpx2")


def test_every_gui_module_but_the_download_dialog_leaves_the_hub_client_unloaded():
    gui = sorted(m.name for m in pkgutil.walk_packages(slotkeeper.gui.__path__, "slotkeeper.gui.")
                 if m.name != "slotkeeper.gui.download_dialog")
    assert "slotkeeper.gui.application" in gui and "slotkeeper.gui.main_window" in gui
    code = (f"import sys, importlib\nfor m in {gui + ['slotkeeper.cli.commands', 'slotkeeper.cli.run']!r}:\n"
            "    importlib.import_module(m)\n"
            f"print(sorted(m for m in {LOADED_FOR_DOWNLOADS!r} if m in sys.modules))")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
