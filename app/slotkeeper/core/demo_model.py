"""The demo model's file name and notice, importable without what writes the model.

``modelgen`` writes the demo model and needs gguf and numpy to do it (~22 MB, ~0.3 s to import);
code that only names the demo model or warns about it imports these from here, and imports
``modelgen`` inside the function that writes the model.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

__all__ = ["DEMO_FILENAME", "DEMO_NOTICE", "bundled_demo_model", "ensure_demo_model", "is_demo_model"]

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


# What modelgen writes for the demo model (tests/unit/test_demo_model.py keeps these true): a copy
# on disk that matches is used as it is, without importing modelgen and numpy into the app.
DEMO_SIZE = 1_584_672
DEMO_SHA256 = "50783a8d6d4caa95ae49b7aa26856b80825b51a71bd6fbbd304e99af826e0bc4"


def is_demo_model(path: Path) -> bool:
    """``path`` is a regular file holding exactly the demo model."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size != DEMO_SIZE:
                return False
            return hashlib.sha256(fh.read()).hexdigest() == DEMO_SHA256
    except OSError:
        return False


def ensure_demo_model(models_dir: str | Path) -> Path:
    """The demo model's path in ``models_dir``: used as it is when it is the demo model, else
    copied from the packaged app's own copy, or written (``modelgen``)."""
    path = Path(models_dir) / DEMO_FILENAME
    if is_demo_model(path):
        return path
    bundled = bundled_demo_model()
    if bundled is None:
        from slotkeeper.core import modelgen  # gguf and numpy, only to write the demo model

        return modelgen.write_model(path, "demo", seed=0)
    data = bundled.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
