"""Flash attention's default, chosen for a warm conversation on this machine: until it is measured,
llama-server's own `auto` (asked of the binary); an idle server measures both choices once per
model and the next launch passes the faster; a request stops a measurement at once; conversations
saved under the other choice are carried over when restored, with nothing read again."""

from __future__ import annotations

import json
import re
import subprocess
import time

import psutil
import pytest
from e2e_helpers import LONG_FIRST_TURN, USER_TURNS, EventLog, chat, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine.lifecycle import tuning
from slotkeeper.core.engine.lifecycle.launching import binary_facts_cache, model_facts_cache, plan_launch
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server import calibrate, flash_attn, flash_choice
from slotkeeper.core.server.flash_choice import remembered_choice
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import ServerProfile, load_settings

pytestmark = pytest.mark.e2e

# What a person reading llama-server's log sees (its info lines, -lv 4), matched here on their own.
RAW_VERDICT = re.compile(r"resolve_fused_ops: Flash Attention (enabled|not supported)")


def raw_auto_verdict(server_bin: str, model, port: int) -> str:
    """llama-server run as its users run it, flash attention left to its default (auto)."""
    proc = subprocess.Popen([server_bin, "-m", str(model), "--port", str(port), "-c", "2048", "-np", "1",
                             "-lv", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = RAW_VERDICT.search(line)
            if m:
                return "on" if m.group(1) == "enabled" else "off"
        raise AssertionError("llama-server never said what auto chose")
    finally:
        proc.kill()
        proc.wait(10)


def planned(home, model, server_bin, **profile):
    paths = app_paths(home).ensure()
    profile = ServerProfile(model_path=str(model), server_bin=server_bin, ctx=2048, **profile)
    plan = plan_launch(paths, profile, model_facts_cache(paths.model_facts_file),
                       binary_facts_cache(paths.binary_facts_file), None)
    argv = list(plan.spec.argv)
    return plan, argv[argv.index("--flash-attn") + 1]


@pytest.mark.parametrize("which", ["starter_model", "llama_model"])
def test_until_measured_the_default_passes_llama_servers_own_auto(which, request, server_bin, port,
                                                                   isolated_home):
    model = request.getfixturevalue(which)
    raw = raw_auto_verdict(server_bin, model, port)
    plan, passed = planned(isolated_home, model, server_bin)
    assert passed == raw, "before it is measured, Slotkeeper passes what llama-server chooses"
    assert plan.flash_attn is (raw == "on") and plan.profile.flash_attn is None  # the setting stays auto
    choice = plan.flash_choice
    assert choice is not None and choice.how == flash_choice.PENDING and choice.measure
    assert "measures it once" in choice.why
    assert json.loads(json.dumps(plan.spec.record))["profile"]["flash_attn"] is (raw == "on")
    # Asked once: the probe's answer is kept per binary, command line and model.
    asked = []
    real = flash_attn._ask
    flash_attn._ask = lambda argv, timeout: asked.append(argv) or real(argv, timeout)
    try:
        assert planned(isolated_home, model, server_bin)[1] == passed
    finally:
        flash_attn._ask = real
    assert asked == []
    # A choice the user made is passed as it is.
    plan, passed = planned(isolated_home, model, server_bin, flash_attn=False)
    assert passed == "off" and plan.flash_choice.how == flash_choice.SETTING


def test_a_quantized_v_cache_resolves_on_as_llama_server_forces_it(llama_model, server_bin, isolated_home):
    plan, passed = planned(isolated_home, llama_model, server_bin, cache_type_k="q8_0", cache_type_v="q8_0")
    assert passed == "on" and plan.flash_choice.how == flash_choice.REQUIRED


def test_swa_full_passes_off_where_a_restore_is_exact(models_dir, server_bin, isolated_home):
    model = write_model(models_dir / "tiny-gemma3.gguf", "gemma3") if not (
        models_dir / "tiny-gemma3.gguf").exists() else models_dir / "tiny-gemma3.gguf"
    plan, passed = planned(isolated_home, model, server_bin, swa_full=True)
    assert passed == "off" and plan.flash_choice.how == flash_choice.EXACT and not plan.flash_choice.measure


def calibration_servers(engine) -> list[psutil.Process]:
    """The measuring llama-servers: children of this process that are not the engine's server."""
    ours = engine.supervisor.pid
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid != ours and "llama-server" in " ".join(p.cmdline() or [""])]


def test_an_idle_server_measures_both_and_the_next_launch_passes_the_faster(llama_model, server_bin, port,
                                                                            monkeypatch):
    monkeypatch.setattr(tuning, "IDLE_SECONDS", 0.5)
    engine = make_engine(llama_model, server_bin, port)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        measured = wait_until(lambda: events.of(ev.FlashAttnMeasured), timeout=120,
                              what="the measurement")[0]
        assert not engine.tuning.measuring
        wait_until(lambda: not calibration_servers(engine), what="the measuring servers to be gone")
    finally:
        engine.stop()
    assert measured.running is engine.link.flash_attn
    assert "measured on this machine for this model" in measured.words
    paths = app_paths()
    plan, passed = planned(paths.data_dir, llama_model, server_bin)
    assert plan.flash_choice.how == flash_choice.MEASURED and passed == ("on" if measured.value else "off")
    assert plan.flash_choice.why == measured.words
    remembered = remembered_choice(model_facts_cache(paths.model_facts_file), llama_model)
    assert remembered is not None and remembered.how == flash_choice.MEASURED

    engine = make_engine(llama_model, server_bin, port)  # the next launch measures nothing more
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert engine.link.flash_attn is measured.value
        time.sleep(1.5)
        assert not engine.tuning.measuring and not events.of(ev.FlashAttnMeasured)
    finally:
        engine.stop()


def test_a_request_stops_a_measurement_at_once_and_it_begins_again_when_idle(starter_model, server_bin, port,
                                                                              monkeypatch):
    monkeypatch.setattr(tuning, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(calibrate, "PROMPT_TOKENS", 512)
    engine = make_engine(starter_model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(120) is ServerState.READY
        wait_until(lambda: engine.tuning.measuring and len(calibration_servers(engine)) == 2, timeout=60,
                   what="the measurement to start")
        began = time.monotonic()
        answer = chat(engine.base_url, [{"role": "user", "content": USER_TURNS[0]}], max_tokens=4)
        assert answer["choices"][0]["message"]["content"] is not None
        wait_until(lambda: not calibration_servers(engine), timeout=10, what="the measuring servers to stop")
        assert time.monotonic() - began < 10
        assert not events.of(ev.FlashAttnMeasured), "a measurement a request stopped says nothing"
        measured = wait_until(lambda: events.of(ev.FlashAttnMeasured), timeout=300,
                              what="the measurement, begun again once idle")[0]
        assert measured.words
    finally:
        engine.stop()


def sessions_of(engine):
    return [s for s in engine.library.store.sessions() if s.sidecar is not None]


@pytest.mark.parametrize("kind, profile, saved_with", [
    ("llama", {}, True), ("llama", {}, False), ("gemma3", {"swa_full": True}, True)],
    ids=["llama-on-to-off", "llama-off-to-on", "gemma3-swa-full-points-on-to-off"])
def test_conversations_saved_under_the_other_choice_are_carried_over_when_restored(
        kind, profile, saved_with, models_dir, server_bin, port):
    model = models_dir / f"tiny-{kind}.gguf"
    if not model.exists():
        write_model(model, kind)
    engine = make_engine(model, server_bin, port, flash_attn=saved_with, **profile)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        messages = [{"role": "system", "content": "You are a helpful assistant for walkers."}]
        for text in (LONG_FIRST_TURN, USER_TURNS[1]):
            messages.append({"role": "user", "content": text})
            reply = chat(engine.base_url, messages)["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": reply})

        def saved():
            found = sessions_of(engine)
            if len(found) != 1 or engine.board[0].busy or engine.board[0].watch.changed:
                return None
            return found[0] if (found[0].sidecar.points or kind == "llama") else None

        before = wait_until(saved, what="the idle save (and its restore points)")
    finally:
        engine.stop()
    old_files = {before.sidecar.kv_file, *(p.kv_file for p in before.sidecar.points)}
    assert before.sidecar.flash_attn is saved_with

    engine = make_engine(model, server_bin, port, idle_save=3600, flash_attn=not saved_with, **profile)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert not events.of(ev.SessionRefused), events.of(ev.SessionRefused)
        [restored] = events.of(ev.SessionRestored)
        assert restored.n_restored == before.sidecar.n_tokens
        follow = messages + [{"role": "user", "content": USER_TURNS[2]}]
        run = chat(engine.base_url, follow, max_tokens=4)
        # what was saved serves it: the whole save (full attention), or for --swa-full (continued exactly
        # only, and the chat template renders the last reply anew) the restore point before that reply
        reused = (before.sidecar.n_tokens - 1 if not before.sidecar.points
                  else max(p.n_tokens for p in before.sidecar.points))
        assert run["timings"]["cache_n"] >= reused, "nothing was read again"
        [after] = sessions_of(engine)
    finally:
        engine.stop(save=False)
    sc = after.sidecar
    assert sc.flash_attn is (not saved_with) and sc.n_tokens == before.sidecar.n_tokens
    assert len(sc.points) == len(before.sidecar.points)
    assert [p.n_tokens for p in sc.points] == [p.n_tokens for p in before.sidecar.points]
    folder = app_paths().sessions_dir
    assert not any((folder / name).exists() for name in old_files), "the earlier files are gone"
    assert all((folder / p.kv_file).exists() for p in sc.points)
    assert not after.problems and not engine.library.store.verify(after.id).problems


def test_a_settings_file_of_the_version_that_passed_off_reads_as_auto(llama_model, server_bin, port):
    paths = app_paths().ensure()
    old = {"schema_version": 3, "profile": {"model_path": str(llama_model), "server_bin": server_bin,
                                            "port": port, "ctx": 2048, "flash_attn": False},
           "models": [{"model_path": str(llama_model), "flash_attn": False}]}
    paths.settings_file.write_text(json.dumps(old))
    settings = load_settings(paths.settings_file)
    assert settings.profile.flash_attn is None and settings.models[0].flash_attn is None
