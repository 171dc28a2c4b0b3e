"""A llama-server an earlier Slotkeeper left running with other settings (that Slotkeeper was
killed): what its slots hold is saved before the supervisor stops it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.engine.lifecycle.identity import ModelIdentity
from slotkeeper.core.engine.lifecycle.loop import EngineLoop
from slotkeeper.core.engine.lifecycle.model_facts import ModelChoice, llama_build_tag, server_facts
from slotkeeper.core.engine.lifecycle.server_link import SLOT_ACTION_TIMEOUT_SECONDS
from slotkeeper.core.engine.slots.saves import SlotSaves, describe_save_error, save_summary
from slotkeeper.core.events import EventBus, SaveFailed, SessionSaved, WarningRaised
from slotkeeper.core.server.client import LlamaClient
from slotkeeper.core.sessions.saving import SaveContext
from slotkeeper.core.settings import ServerProfile, SettingsError, connect_url


async def save_leftover(record: dict[str, Any], key: str, loop: EngineLoop, events: EventBus,
                        resolve: Callable[[str], ModelChoice], identity: ModelIdentity,
                        saves: SlotSaves) -> None:
    """Save every used slot of the server ``record`` (its state file) names, reached with ``key``
    (a server we left runs on the private address we keep); ``resolve(path)`` finds its model."""
    launch = record.get("launch") or {}
    try:
        profile = ServerProfile.from_json(launch["profile"])
        model = await loop.run_io(resolve, launch["model_path"])
    except (KeyError, TypeError, SettingsError, EngineError) as exc:
        events.emit(WarningRaised(
            f"a llama-server left running by an earlier Slotkeeper is stopped without saving its "
            f"conversations: what it ran with is not known ({exc})"))
        return
    url = connect_url(str(record.get("host", profile.host)), int(record.get("port", profile.port)))
    with LlamaClient(url, timeout=10.0, api_key=key or None,
                     slot_action_timeout=SLOT_ACTION_TIMEOUT_SECONDS) as http:
        try:
            sha = await loop.run_io(identity.hashes.compute, model.path)
            mmproj_sha = await loop.run_io(identity.projector_sha256, profile)
            props = await loop.run_io(http.props)
            used = [info.id for info in await loop.run_io(http.slots) if info.id_task is not None]
        except Exception as exc:
            events.emit(WarningRaised(f"could not save the conversations of the llama-server an earlier "
                                      f"Slotkeeper left running: {describe_save_error(None, exc)}"))
            return
        ctx = SaveContext(server_facts(model, sha, props, profile, mmproj_sha), model.info.arch,
                          llama_build_tag(props.build_info))
        folder = save_folder(record)
        if folder is None:
            events.emit(WarningRaised("a llama-server left running by an earlier Slotkeeper is stopped "
                                      "without saving its conversations: it has no folder to save them to"))
            return
        for slot in used:
            try:
                outcome = await saves.write_session(http, ctx, slot, None, SLOT_ACTION_TIMEOUT_SECONDS,
                                                    folder=folder)
            except Exception as exc:
                events.emit(SaveFailed(slot, describe_save_error(slot, exc)))
                continue
            events.emit(SessionSaved(save_summary(slot, "left running", outcome)))


def save_folder(record: dict[str, Any]) -> Path | None:
    """Where the server ``record`` names writes its slot files (its --slot-save-path)."""
    argv = record.get("argv")
    if not isinstance(argv, list) or "--slot-save-path" not in argv:
        return None
    i = argv.index("--slot-save-path")
    return Path(argv[i + 1]) if i + 1 < len(argv) and isinstance(argv[i + 1], str) else None
