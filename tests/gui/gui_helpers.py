"""Helpers for the GUI tests: sessions on disk the way the store writes them, events from threads."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.events import Event
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.sidecar import (
    Sidecar,
    content_hash_file,
    format_utc,
    write_sidecar_atomic,
)
from slotkeeper.core.settings import save_settings

DATA = Path(__file__).resolve().parent.parent / "data"
MODEL_SHA = "1a2b3c4d000000000000000000000000000000000000000000000000deadbeef"
OTHER_SHA = "9" * 64


def base_sidecar() -> Sidecar:
    return Sidecar.from_json(json.loads((DATA / "sidecar_v1.json").read_text(encoding="utf-8")))


def facts_for(sc: Sidecar, **changes) -> ServerFacts:
    """Facts of a server the sidecar is compatible with, with ``changes`` applied."""
    facts = ServerFacts(
        model_sha256=sc.model_sha256, model_path=sc.model_path, flash_attn=sc.flash_attn,
        cache_type_k=sc.cache_type_k, cache_type_v=sc.cache_type_v, swa_full=sc.swa_full,
        n_parallel=sc.n_parallel, n_ctx_slot=sc.n_ctx_slot, swa=sc.swa,
    )  # fmt: skip
    return replace(facts, **changes)


def make_session(
    sessions_dir: Path,
    sid: str,
    title: str = "A conversation",
    age_hours: float = 1.0,
    size: int = 4096,
    pinned: bool = False,
    real_hash: bool = True,
    **changes,
) -> Sidecar:
    """A real sidecar and a KV file of ``size`` bytes in the store's layout."""
    sessions_dir.mkdir(parents=True, exist_ok=True)
    kv_name = f"{sid}.0000abcd.kv"
    kv = sessions_dir / kv_name
    kv.write_bytes(bytes(range(256)) * (size // 256) + b"\0" * (size % 256))
    when = format_utc(datetime.now(timezone.utc) - timedelta(hours=age_hours))
    sc = replace(
        base_sidecar(), id=sid, kv_file=kv_name, title=title, size_bytes=size, pinned=pinned,
        last_used_at=when, created_at=when, last_restore=None,
        content_hash=content_hash_file(kv) if real_hash else base_sidecar().content_hash,
        **{"parent": None, **changes},
    )  # fmt: skip
    write_sidecar_atomic(sessions_dir / f"{sid}.json", sc)
    moment = datetime.now(timezone.utc).timestamp() - age_hours * 3600
    os.utime(kv, (moment, moment))  # saved then, as a real save would have written it
    return sc


def emit_from_thread(engine: Engine, event: Event) -> None:
    """Emit an event from another thread, as the engine's loop and the supervisor do."""
    t = threading.Thread(target=lambda: engine.events.emit(event))
    t.start()
    t.join()


def keep_screenshot(widget, name: str, rect=None) -> None:
    """With SLOTKEEPER_SCREENSHOTS=DIR the widget's picture (or the part ``rect`` of it, a QRect in
    its coordinates) is kept there (docs/screenshots)."""
    folder = os.environ.get("SLOTKEEPER_SCREENSHOTS")
    if folder and os.environ.get("SLOTKEEPER_COLOR_SCHEME", "").lower() == "dark":
        name = name.replace(".png", "-dark.png")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        picture = widget.grab() if rect is None else widget.grab(rect)
        assert picture.save(str(Path(folder) / name))


def make_bridge(qtbot, settings, overrides=None, found: Path | None = None):
    paths = app_paths().ensure()
    save_settings(paths.settings_file, settings)
    service = SettingsService(paths.settings_file, overrides)
    engine = Engine(paths, service.effective())
    from slotkeeper.gui.bridge import EngineBridge

    bridge = EngineBridge(engine, service, watch_sessions=False)
    bridge.model_search_dirs = [("Test folder", found)] if found else []
    return bridge, engine, service
