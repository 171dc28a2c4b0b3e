"""Settings remembered per model: schema 2, the migration from 1, choosing a model through the
settings service (saved settings apart from this run's command-line overrides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotkeeper.core import settings as st
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.settings import PER_MODEL_FIELDS, ModelMemory, Settings, load_settings, save_settings

DATA = Path(__file__).parent.parent / "data"


def test_per_model_fields_are_profile_fields():
    profile_fields = set(st.ServerProfile().to_json())
    assert set(PER_MODEL_FIELDS) <= profile_fields
    assert {"ctx", "parallel", "flash_attn", "cache_type_k", "cache_type_v", "swa_full", "extra_args",
            "mmproj_path"} == set(
        PER_MODEL_FIELDS)
    assert "port" not in PER_MODEL_FIELDS and "model_path" not in PER_MODEL_FIELDS


def test_a_v1_file_migrates_and_its_model_keeps_its_settings(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text((DATA / "settings_v1_with_model.json").read_text())
    s = load_settings(path)
    assert s.schema_version == st.SCHEMA_VERSION == 4
    assert s.profile.model_path == "/models/Qwen3-8B-Q4_K_M.gguf" and s.profile.ctx == 16384
    assert s.start_server_on_launch is True
    (memory,) = s.models
    assert memory == ModelMemory("/models/Qwen3-8B-Q4_K_M.gguf", ctx=16384, parallel=2, flash_attn=True,
                                 cache_type_k="q8_0", cache_type_v="q8_0", swa_full=False,
                                 extra_args=("--threads", "4"))
    assert json.loads(path.read_text())["schema_version"] == 1  # loading never rewrites the file
    save_settings(path, s)
    assert json.loads(path.read_text())["schema_version"] == 4
    assert load_settings(path) == s


def test_a_v1_file_without_a_model_remembers_nothing():
    s = load_settings(DATA / "settings_v1.json")
    assert s.models == () and s.profile.model_path is None


def test_choosing_a_model_remembers_the_current_one_and_restores_the_chosen_one():
    a = Settings().with_profile(model_path="/m/a.gguf", ctx=4096, parallel=2, extra_args=("-t", "2"))
    b = a.choose_model("/m/b.gguf")
    # a model chosen for the first time starts from the current values
    assert b.profile.model_path == "/m/b.gguf" and b.profile.ctx == 4096 and b.profile.parallel == 2
    assert [m.model_path for m in b.models] == ["/m/b.gguf", "/m/a.gguf"]
    b2 = b.with_profile(ctx=32768, parallel=1, swa_full=True, flash_attn=True).remember_model()
    back = b2.choose_model("/m/a.gguf")
    assert back.profile.ctx == 4096 and back.profile.parallel == 2 and not back.profile.swa_full
    assert back.profile.extra_args == ("-t", "2") and not back.profile.flash_attn
    assert [m.model_path for m in back.models] == ["/m/a.gguf", "/m/b.gguf"]  # most recent first
    again = back.choose_model("/m/b.gguf")
    assert (again.profile.ctx, again.profile.parallel, again.profile.swa_full, again.profile.flash_attn) == (
        32768, 1, True, True)
    assert again.profile.port == a.profile.port  # not a per-model setting
    with pytest.raises(ValueError, match="not per-model"):
        a.choose_model("/m/b.gguf", port=1)
    assert a.choose_model("/m/b.gguf", swa_full=True).remembered("/m/b.gguf").swa_full is True


def test_remembered_models_are_bounded():
    s = Settings()
    for i in range(st.MAX_REMEMBERED_MODELS + 5):
        s = s.choose_model(f"/m/{i}.gguf")
    assert len(s.models) == st.MAX_REMEMBERED_MODELS
    assert s.models[0].model_path == f"/m/{st.MAX_REMEMBERED_MODELS + 4}.gguf"


def test_bad_per_model_entries_are_clear_errors(tmp_path):
    path = tmp_path / "settings.json"
    for bad, words in (([{"ctx": 1}], "model_path"), ({"a": 1}, "list of per-model"),
                       ([{"model_path": "/a.gguf", "ctx": "big"}], "'ctx' remembered for /a.gguf"),
                       ([{"model_path": "/a.gguf", "swa_full": 1}], "swa_full"),
                       ([{"model_path": "/a.gguf", "extra_args": "-t 4"}], "list of arguments")):
        path.write_text(json.dumps({"schema_version": 2, "models": bad}))
        with pytest.raises(st.SettingsError, match=words):
            load_settings(path)


# -- through the service: saved settings apart from this run's overrides ------------------------
@pytest.fixture
def path(tmp_path):
    p = tmp_path / "settings.json"
    save_settings(p, Settings().with_profile(model_path="/m/a.gguf", ctx=4096, port=8123).remember_model())
    return p


def test_saving_remembers_the_models_settings(path):
    service = SettingsService(path)
    service.save(service.effective().with_profile(ctx=6144))
    assert load_settings(path).remembered("/m/a.gguf").ctx == 6144


def test_choose_model_through_the_service_keeps_overrides_out_of_the_file(path):
    # as from `slotkeeper --ctx 2048 --port 9000`
    service = SettingsService(path, {"profile.ctx": 2048, "profile.port": 9000})
    assert service.effective().profile.ctx == 2048
    service.save(service.effective())  # the dialog saved without touching the context
    assert load_settings(path).remembered("/m/a.gguf").ctx == 4096  # the override is not remembered
    plan = service.plan_model("/m/b.gguf", swa_full=True)
    assert plan.dropped_overrides == ("profile.ctx",) and not plan.remembered
    assert load_settings(path).profile.model_path == "/m/a.gguf"  # a plan writes nothing
    now = service.choose_model("/m/b.gguf", swa_full=True)
    assert now.profile.model_path == "/m/b.gguf" and now.profile.swa_full
    assert now.profile.ctx == 4096  # the saved value: --ctx belonged to the model it came with
    assert now.profile.port == 9000  # not a per-model override: still this run's
    on_disk = load_settings(path)
    assert on_disk.profile.model_path == "/m/b.gguf" and on_disk.profile.port == 8123
    assert [m.model_path for m in on_disk.models] == ["/m/b.gguf", "/m/a.gguf"]
    assert "profile.ctx" not in service.overrides and "profile.port" in service.overrides
    back = service.choose_model("/m/a.gguf")
    assert back.profile.ctx == 4096 and not back.profile.swa_full
    assert service.plan_model("/m/b.gguf").remembered


def test_a_model_reached_through_a_link_finds_its_settings(tmp_path):
    real = tmp_path / "real.gguf"
    real.write_bytes(b"GGUF")
    link = tmp_path / "link.gguf"
    link.symlink_to(real)
    p = tmp_path / "settings.json"
    save_settings(p, Settings().with_profile(model_path=str(real), ctx=12288).remember_model()
                  .choose_model("/m/other.gguf"))
    service = SettingsService(p)
    plan = service.plan_model(str(link))
    assert plan.remembered and plan.settings.profile.ctx == 12288
    assert plan.settings.profile.model_path == str(real)


def test_choosing_validates_what_it_would_run(path):
    service = SettingsService(path)
    with pytest.raises(st.SettingsError):
        service.choose_model("/m/b.gguf", parallel=8192)  # 4096 tokens cannot give 8192 slots a token each
    assert load_settings(path).profile.model_path == "/m/a.gguf"


def test_command_line_values_given_with_no_model_apply_to_the_first_model_chosen(tmp_path):
    p = tmp_path / "settings.json"
    service = SettingsService(p, {"profile.ctx": 2048, "profile.port": 9000})  # no model yet
    now = service.choose_model("/m/first.gguf")
    assert now.profile.ctx == 2048 and now.profile.port == 9000
    assert "profile.ctx" in service.overrides
    assert load_settings(p).profile.ctx == Settings().profile.ctx  # still only this run's
