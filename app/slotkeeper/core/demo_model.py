"""The demo model's file name and notice, importable without what writes the model.

``modelgen`` writes the demo model and needs gguf and numpy to do it (~22 MB, ~0.3 s to import);
code that only names the demo model or warns about it imports these from here, and imports
``modelgen`` inside the function that writes the model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["DEMO_FILENAME", "DEMO_NOTICE", "bundled_demo_model", "ensure_demo_model"]

DEMO_NOTICE = (
    "The demo model has random weights: it answers with gibberish. It exists so you can "
    "try Slotkeeper without downloading a model."
)
DEMO_FILENAME = "slotkeeper-demo-llama.gguf"


# The packaged app carries the demo model, written when the app was built (packaging/slotkeeper.spec),
# so it needs neither gguf nor numpy (~45 MB of the bundle) to offer it.
BUNDLED_DIR = "slotkeeper_demo"


def bundled_demo_model() -> Path | None:
    """The demo model the packaged app carries, or None (running from source)."""
    base = getattr(sys, "_MEIPASS", None)
    if base is None:
        return None
    path = Path(base) / BUNDLED_DIR / DEMO_FILENAME
    return path if path.is_file() else None


def ensure_demo_model(models_dir: str | Path) -> Path:
    """The demo model's path in ``models_dir``: copied from the packaged app's own copy, or written
    (``modelgen``) on first use, and reused after."""
    bundled = bundled_demo_model()
    if bundled is None:
        from slotkeeper.core import modelgen  # gguf and numpy, only to write the demo model

        return modelgen.ensure_demo_model(models_dir)
    path = Path(models_dir) / DEMO_FILENAME
    data = bundled.read_bytes()
    try:
        if path.is_file() and path.read_bytes() == data:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
