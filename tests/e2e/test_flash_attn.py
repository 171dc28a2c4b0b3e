"""Flash attention's default is llama-server's own `auto`, asked of the binary and passed as on or
off; a settings file and saved conversations of the version that passed off keep working."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from e2e_helpers import USER_TURNS, chat, converse, wait_until
from test_persistence import serve, sessions, stop

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine.lifecycle.launching import (
    KEPT_OFF_FACT,
    binary_facts_cache,
    model_facts_cache,
    plan_launch,
)
from slotkeeper.core.server import flash_attn
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
def test_the_default_passes_what_llama_servers_own_auto_chooses(which, request, server_bin, port,
                                                                isolated_home):
    model = request.getfixturevalue(which)
    raw = raw_auto_verdict(server_bin, model, port)
    plan, passed = planned(isolated_home, model, server_bin)
    assert passed == raw, "Slotkeeper's default must be as fast as llama-server's own"
    assert plan.flash_attn is (raw == "on") and plan.profile.flash_attn is None  # the setting stays auto
    assert json.loads(json.dumps(plan.spec.record))["profile"]["flash_attn"] is (raw == "on")
    # Asked once: the verdict is kept per binary, command line and model.
    asked = []
    real = flash_attn._ask
    flash_attn._ask = lambda argv, timeout: asked.append(argv) or real(argv, timeout)
    try:
        assert planned(isolated_home, model, server_bin)[1] == passed
    finally:
        flash_attn._ask = real
    assert asked == []
    # A choice the user made is passed as it is, without asking.
    assert planned(isolated_home, model, server_bin, flash_attn=False)[1] == "off"


def test_a_quantized_v_cache_resolves_on_as_llama_server_forces_it(llama_model, server_bin, isolated_home):
    _plan, passed = planned(isolated_home, llama_model, server_bin, cache_type_k="q8_0", cache_type_v="q8_0")
    assert passed == "on"


def test_an_upgrade_keeps_restoring_conversations_saved_with_flash_attention_off(
        llama_model, server_bin, port, isolated_home):
    """The version before wrote `flash_attn: false` (its default) into the settings and saved with it
    off. After the upgrade the setting reads as auto, and the model's conversations still restore:
    auto keeps it off for that model, says so once, and a new model gets llama-server's choice."""
    proc, url = serve(isolated_home, llama_model, server_bin, port, "--flash-attn", "off")
    try:
        history, _ = converse(url, USER_TURNS[:2])
        saved = wait_until(lambda: [s for s in sessions(isolated_home) if s.sidecar.n_tokens > 60],
                           what="the idle save")
    finally:
        stop(proc)
    assert saved[0].sidecar.flash_attn is False
    paths = app_paths(isolated_home)
    old = {"schema_version": 3, "profile": {"model_path": str(llama_model), "server_bin": server_bin,
                                            "port": port, "ctx": 2048, "flash_attn": False},
           "models": [{"model_path": str(llama_model), "flash_attn": False}]}
    paths.settings_file.parent.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_text(json.dumps(old))
    settings = load_settings(paths.settings_file)
    assert settings.profile.flash_attn is None and settings.models[0].flash_attn is None

    proc, url = serve(isolated_home, llama_model, server_bin, port)
    try:
        follow = history + [{"role": "user", "content": USER_TURNS[2]}]
        run = chat(url, follow, max_tokens=8)
    finally:
        stop(proc)
    assert run["timings"]["cache_n"] >= 0.95 * saved[0].sidecar.n_tokens, "the conversation restored"
    assert "Flash attention stays off" in proc.stderr.read()
    assert model_facts_cache(paths.model_facts_file).get(llama_model, KEPT_OFF_FACT) is True
    # Without such conversations, a model gets llama-server's own choice.
    other = llama_model.with_name("other-" + llama_model.name)
    other.write_bytes(llama_model.read_bytes())
    assert planned(isolated_home, other, server_bin)[1] == "on"
