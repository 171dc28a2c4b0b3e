"""The environment for programs Slotkeeper starts (llama-server, a browser, a file manager)."""

from __future__ import annotations

import os
import sys


def child_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for llama-server (and the browser), free of a frozen app's library paths."""
    env = dict(os.environ if base is None else base)
    if getattr(sys, "frozen", False):
        for var in ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_FRAMEWORK_PATH"):
            orig = env.pop(f"{var}_ORIG", None)  # PyInstaller keeps the user's value here
            if orig is not None:
                env[var] = orig
            else:
                env.pop(var, None)
        for var in ("QT_PLUGIN_PATH", "QML2_IMPORT_PATH", "PYTHONHOME", "PYTHONPATH", "_MEIPASS2"):
            env.pop(var, None)
        for var in [v for v in env if v.startswith("_PYI_")]:
            env.pop(var)
    return env
