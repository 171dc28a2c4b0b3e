"""Real sessions folders for the unit tests: sidecars and KV files on disk, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.sessions import saving
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.kvfile import LLAMA_STATE_SEQ_MAGIC
from slotkeeper.core.sessions.sidecar import Sidecar, content_hash_file, tokens_digest, write_sidecar_atomic
from slotkeeper.core.sessions.store import SessionStore

FIXTURE = Path(__file__).parent.parent / "data" / "sidecar_v1.json"


def write_slot_save(path: Path, tokens: list[int], kv_bytes: int = 64) -> Path:
    """A file laid out like llama-server's slot save (see kvfile): header, token blob, KV state."""
    blob = [-1, 1, len(tokens), *tokens, 0]
    header = struct.pack("<III", LLAMA_STATE_SEQ_MAGIC, 4, len(blob))
    path.write_bytes(header + struct.pack(f"<{len(blob)}i", *blob) + b"\1" * kv_bytes)
    return path


def save_incoming(store: SessionStore, incoming_name: str, n_written: int, slot: int, ctx: saving.SaveContext,
                  describe: saving.Describe, current_id: str | None = None) -> saving.SaveOutcome:
    """The save protocol as the engine runs it on the file llama-server just wrote (``check_written``,
    then ``commit_written``); the incoming file is gone afterwards whatever happens. Raises SaveError."""
    written = saving.check_written(store, store.dir / incoming_name, n_written, slot)
    if written is None:
        return saving.SaveOutcome("empty", None)
    return saving.commit_written(store, written, ctx, describe, current_id)


def facts_of(sc: Sidecar) -> ServerFacts:
    """The facts of a server a session was saved by (what a save or restore checks against)."""
    return ServerFacts(model_sha256=sc.model_sha256, model_path=sc.model_path, flash_attn=sc.flash_attn,
                       cache_type_k=sc.cache_type_k, cache_type_v=sc.cache_type_v, swa_full=sc.swa_full,
                       n_parallel=sc.n_parallel, n_ctx_slot=sc.n_ctx_slot, swa=sc.swa,
                       kv_args=tuple(sc.kv_args), restore_mode=sc.restore_mode,
                       mmproj_sha256=sc.mmproj_sha256)


def locked_elsewhere(other: SessionStore) -> bool:
    """Whether another thread finds the sessions folder locked now (``other``: a store of the same
    folder with a short lock timeout)."""
    import threading

    from slotkeeper.core.sessions.folder_lock import FolderBusy

    busy = []

    def try_lock() -> None:
        try:
            with other.exclusive():
                pass
        except FolderBusy:
            busy.append(True)

    t = threading.Thread(target=try_lock)
    t.start()
    t.join()
    return bool(busy)


def make_session(sessions_dir: Path, sid: str, size: int = 1000, used: str = "2026-01-01T00:00:00Z",
                 tokens: list[int] | None = None, **changes) -> Sidecar:
    """A sidecar and a KV file of ``size`` bytes (its real hash), as a save leaves them; with
    ``tokens``, the KV file is a slot save holding them (for lineage)."""
    sessions_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    kv_name = f"{sid}.00000000.kv"
    kv = sessions_dir / kv_name
    if tokens is None:
        kv.write_bytes(b"\1" * size)
    else:
        size = write_slot_save(kv, tokens).stat().st_size
    sc = replace(Sidecar.from_json(json.loads(FIXTURE.read_text())), id=sid, kv_file=kv_name, size_bytes=size,
                 last_used_at=used, created_at=used, pinned=False, parent=None, last_restore=None,
                 content_hash=content_hash_file(kv), tokens_digest=tokens_digest(tokens or []))
    sc = replace(sc, **changes)
    write_sidecar_atomic(sessions_dir / f"{sid}.json", sc)
    return sc


def run_cli(data_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60,
            user: int | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m slotkeeper sessions --data-dir DATA ARGS...` in a real process (as ``user`` if given:
    root drops to that uid with setpriv, so permission tests mean something under root too)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SLOTKEEPER_HOME", None)
    argv = [sys.executable, "-m", "slotkeeper", "sessions", "--data-dir", str(data_dir), *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=str(Path(__file__).parent))
