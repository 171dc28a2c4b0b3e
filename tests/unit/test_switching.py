"""The model switch and settings use cases (core.services.switching), without Qt or a server: the
engine is a stand-in that records the commands they await."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

from slotkeeper.core.model.model_choice import DEMO_MODEL
from slotkeeper.core.model.starter_model import STARTER_FILENAME, find_starter_model
from slotkeeper.core.services.resume import resume_verdict
from slotkeeper.core.services.switching import (
    apply_settings,
    model_files,
    resolved_model_file,
    switch_model,
)
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.sidecar import load_sidecar
from slotkeeper.core.settings import ModelMemory, Settings
from slotkeeper.core.views import SavesReport, SaveSummary, ServerState

FACTS = ServerFacts(model_sha256="a" * 64, model_path="/m/a.gguf", flash_attn=False, cache_type_k="f16",
                    cache_type_v="f16", swa_full=False, n_parallel=1, n_ctx_slot=4096, swa=False)


class FakeLoop:
    async def run_io(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class FakeEngine:
    def __init__(self, state=ServerState.STOPPED, facts=None, unsaved=(), saved=(), more=None):
        self.state, self.facts, self.loop = state, facts, FakeLoop()
        self.calls: list[tuple] = []
        self._before = SavesReport(tuple(saved), tuple(unsaved))
        self._more = more or SavesReport()

    async def save_changed_slots_async(self, timeout=60.0, reason="shutdown"):
        self.calls.append(("save_changed", reason))
        return self._before

    async def switch_model_async(self, settings, resume_id=None):
        self.calls.append(("switch", settings, resume_id))
        return self._more

    async def update_settings_async(self, settings):
        self.calls.append(("update", settings))

    async def restart_async(self):
        self.calls.append(("restart",))


class FakeService:
    def __init__(self):
        self.calls: list[tuple] = []

    def choose_model(self, model_path, **changes):
        self.calls.append(("choose", model_path, changes))
        return replace(Settings(), profile=replace(Settings().profile, model_path=model_path, **changes))

    def save(self, settings):
        self.calls.append(("save", settings))
        return settings


def summary(slot: int) -> SaveSummary:
    return SaveSummary(slot, "update", "s" * 12, "before switching models", 10, 1.0, 100, "t")


def test_a_changed_slot_that_cannot_be_saved_stops_the_switch_unless_forced():
    engine, service = FakeEngine(ServerState.READY, FACTS, unsaved=(1,)), FakeService()
    outcome = asyncio.run(switch_model(engine, service, "/m/b.gguf"))
    assert not outcome.switched and outcome.report.unsaved == (1,) and outcome.settings is None
    assert engine.calls == [("save_changed", "before switching models")] and service.calls == []

    engine = FakeEngine(ServerState.READY, FACTS, unsaved=(1,), saved=(summary(0),),
                        more=SavesReport((summary(1),), ()))
    outcome = asyncio.run(switch_model(engine, service, "/m/b.gguf", resume_id="r" * 12, force=True,
                                       swa_full=True))
    assert outcome.switched and outcome.settings.profile.model_path == "/m/b.gguf"
    assert outcome.settings.profile.swa_full
    assert outcome.report.saved == (summary(0), summary(1)) and outcome.report.unsaved == ()
    assert engine.calls[-1] == ("switch", outcome.settings, "r" * 12)


def test_a_stopped_server_is_only_told_the_settings_unless_asked_to_start():
    engine, service = FakeEngine(), FakeService()
    outcome = asyncio.run(switch_model(engine, service, "/m/b.gguf", start=False))
    assert outcome.switched and engine.calls == [("update", outcome.settings)]
    engine = FakeEngine()
    outcome = asyncio.run(switch_model(engine, service, "/m/b.gguf"))
    assert engine.calls == [("switch", outcome.settings, None)], "nothing to save before: it was stopped"


def test_applying_settings_saves_them_and_restarts_only_a_running_server():
    engine, service, settings = FakeEngine(ServerState.READY, FACTS), FakeService(), Settings()
    assert asyncio.run(apply_settings(engine, service, settings, restart=True)) is settings
    assert service.calls == [("save", settings)]
    assert engine.calls == [("update", settings), ("restart",)]

    engine, service = FakeEngine(ServerState.STOPPED), FakeService()
    asyncio.run(apply_settings(engine, service, settings, restart=True, persist=False))
    assert service.calls == [] and engine.calls == [("update", settings)]


def test_model_files_are_named_as_sidecars_record_them(tmp_path):
    real = tmp_path / "blob.gguf"
    real.write_bytes(b"GGUF")
    link = tmp_path / "snapshot.gguf"
    link.symlink_to(real)
    assert resolved_model_file(None, tmp_path) is None
    # this installation's, or the one to fetch
    starter = find_starter_model(tmp_path) or tmp_path / STARTER_FILENAME
    assert resolved_model_file(DEMO_MODEL, tmp_path) == os.path.realpath(starter)
    assert resolved_model_file(str(link), tmp_path) == str(real.resolve())
    chosen, aliases = model_files(str(link), [ModelMemory(model_path=str(link))], tmp_path)
    assert chosen == str(real.resolve()) and aliases == {str(real.resolve()): str(link)}


def test_resume_switches_to_a_model_by_the_name_it_was_chosen_by():
    sidecar = replace(load_sidecar(Path(__file__).parent.parent / "data" / "sidecar_v1.json"),
                      model_sha256="b" * 64, model_path="/blobs/b")
    entry = SessionEntry(sidecar.id, sidecar, None)
    plain = resume_verdict(entry, ServerState.READY, FACTS, True, "/m/a.gguf")
    assert plain.switch_to == "/blobs/b"
    named = resume_verdict(entry, ServerState.READY, FACTS, True, "/m/a.gguf", {"/blobs/b": "/snap/b.gguf"})
    assert named.switch_to == "/snap/b.gguf" and named.label == "Switch to b.gguf to resume"
