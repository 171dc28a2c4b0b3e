"""The demo model: the packaged app copies the one it carries (no gguf, no numpy); from source it
is written by modelgen."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

from slotkeeper.core import demo_model
from slotkeeper.core.demo_model import BUNDLED_DIR, DEMO_FILENAME, ensure_demo_model
from slotkeeper.core.modelgen import write_model


def test_from_source_the_demo_model_is_written_once_and_known_by_its_digest(tmp_path):
    path = ensure_demo_model(tmp_path / "models")
    assert path.name == DEMO_FILENAME
    written = write_model(tmp_path / "again.gguf", "demo", seed=0)
    assert path.read_bytes() == written.read_bytes()
    assert written.stat().st_size == demo_model.DEMO_SIZE
    assert hashlib.sha256(written.read_bytes()).hexdigest() == demo_model.DEMO_SHA256

    # Next time it is used as it is: no modelgen, no numpy in the process.
    script = textwrap.dedent(f"""
        import json, sys
        from slotkeeper.core.demo_model import ensure_demo_model
        path = ensure_demo_model({str(tmp_path / "models")!r})
        print(json.dumps([m for m in ("gguf", "numpy", "slotkeeper.core.modelgen") if m in sys.modules]))
    """)
    mtime = path.stat().st_mtime_ns
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [] and path.stat().st_mtime_ns == mtime
    # A damaged one (same size) is written again.
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not demo_model.is_demo_model(path)
    assert ensure_demo_model(tmp_path / "models").read_bytes() == written.read_bytes()


def test_the_packaged_app_copies_its_own_demo_model_without_gguf_or_numpy(tmp_path):
    bundle = tmp_path / "bundle"
    carried = write_model(bundle / BUNDLED_DIR / DEMO_FILENAME, "demo", seed=0)
    models = tmp_path / "models"
    script = textwrap.dedent(f"""
        import json, sys
        sys._MEIPASS = {str(bundle)!r}
        from slotkeeper.core.demo_model import ensure_demo_model
        first = ensure_demo_model({str(models)!r})
        print(json.dumps({{"path": str(first), "loaded": [m for m in ("gguf", "numpy", "slotkeeper.core.modelgen")
                                                          if m in sys.modules]}}))
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["loaded"] == []
    copied = models / DEMO_FILENAME
    assert out["path"] == str(copied) and copied.read_bytes() == carried.read_bytes()


def test_a_damaged_copy_is_replaced_and_a_good_one_reused(tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    carried = write_model(bundle / BUNDLED_DIR / DEMO_FILENAME, "demo", seed=0)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)
    models = tmp_path / "models"
    path = ensure_demo_model(models)
    assert demo_model.bundled_demo_model() == carried
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    path.write_bytes(bytes(data))
    assert ensure_demo_model(models).read_bytes() == carried.read_bytes()
    mtime = path.stat().st_mtime_ns
    assert ensure_demo_model(models) == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten
    assert not list(models.glob(".*.part"))
