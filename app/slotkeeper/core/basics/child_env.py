"""The environment for programs Slotkeeper starts (llama-server, a browser, a file manager)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


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


# Environment variables llama-server reads that would move it from where Slotkeeper expects it
# (another port, a path prefix, no /slots) or let the user's key open its private port.
CHILD_ENV_DROPPED = ("LLAMA_ARG_API_KEY_FILE", "LLAMA_ARG_API_PREFIX", "LLAMA_ARG_ENDPOINT_SLOTS",
                     "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_ARG_REUSE_PORT", "LLAMA_ARG_HOST", "LLAMA_ARG_PORT")


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what would change where llama-server listens or who it lets in
    (``CHILD_ENV_DROPPED``; ``AIP_*``: Vertex AI's compatibility mode moves its port and routes)."""
    return {k: v for k, v in environ.items() if k not in CHILD_ENV_DROPPED and not k.startswith("AIP_")}
