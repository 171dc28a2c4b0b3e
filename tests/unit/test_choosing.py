"""Before a model or its settings change: saved conversations left behind, and the machine's memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slotkeeper.core.services.choosing import (
    ModelIdentity,
    expected_facts,
    launch_sanity,
    left_behind,
    n_ctx_per_slot,
)
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.sidecar import load_sidecar
from slotkeeper.core.settings import ServerProfile

DATA = Path(__file__).parent.parent / "data"
GIB = 1024**3


def sessions(n: int, **changes) -> list[SessionEntry]:
    base = load_sidecar(DATA / "sidecar_v1.json")
    out = []
    for i in range(n):
        sc = replace(base, id=f"{i:012x}", **changes)
        out.append(SessionEntry(sc.id, sc, None, []))
    return out


BASE = load_sidecar(DATA / "sidecar_v1.json")
MODEL = ModelIdentity(BASE.model_path, BASE.model_sha256)
# what the sidecar was saved with: 2 slots of 16384, flash attention, q8_0 caches
PROFILE = ServerProfile(model_path=BASE.model_path, ctx=32768, parallel=2, flash_attn=True,
                        cache_type_k="q8_0", cache_type_v="q8_0")


def test_per_slot_context_as_llama_server_pads_it():
    assert n_ctx_per_slot(32768, 2) == 16384
    assert n_ctx_per_slot(8192, 3) == 2816  # 2730 rounded up to 256
    assert n_ctx_per_slot(1000, 1) == 1024


def test_expected_facts_match_the_sessions_saved_with_them():
    facts = expected_facts(PROFILE, MODEL)
    assert facts.n_ctx_slot == 16384 and facts.n_parallel == 2
    assert left_behind(sessions(3), facts, MODEL, facts, MODEL) == []


def test_more_slots_leave_conversations_behind_and_say_how_many():
    before = expected_facts(PROFILE, MODEL)
    after = expected_facts(replace(PROFILE, parallel=4, ctx=65536), MODEL)
    said = left_behind(sessions(12), before, MODEL, after, MODEL)
    assert said == ["12 saved conversations were made with 2 slots and will not restore with 4."]
    one = left_behind(sessions(1, n_parallel=1), expected_facts(replace(PROFILE, parallel=1), MODEL), MODEL,
                      expected_facts(replace(PROFILE, parallel=2), MODEL), MODEL)
    assert one == ["1 saved conversation was made with 1 slot and will not restore with 2."]


def test_each_setting_says_its_own_sentence_and_counts_only_what_it_breaks():
    long_ones = sessions(2, n_tokens=12000)
    short = sessions(3, n_tokens=100)
    before = expected_facts(PROFILE, MODEL)
    after = expected_facts(replace(PROFILE, ctx=16384, flash_attn=False, cache_type_v="f16"), MODEL)
    said = left_behind(long_ones + short, before, MODEL, after, MODEL)
    assert said == [
        "2 saved conversations are longer than the 8,192 tokens each slot would have, and will not restore.",
        "5 saved conversations were made with a V cache of q8_0 and will not restore with f16.",
    ]
    # Flash attention leaves none behind: a restore carries a conversation over to the other choice.
    assert left_behind(short, before, MODEL, replace(before, flash_attn=not before.flash_attn), MODEL) == []


def test_sessions_that_already_do_not_restore_are_not_counted():
    before = expected_facts(PROFILE, MODEL)
    after = expected_facts(replace(PROFILE, parallel=1, ctx=16384), MODEL)
    other_model = sessions(4, model_sha256="e" * 64)
    already_broken = sessions(2, cache_type_k="q4_0")
    damaged = [SessionEntry("x" * 12, BASE, None, ["KV file is missing"])]
    assert left_behind(other_model + already_broken + damaged, before, MODEL, after, MODEL) == []
    said = left_behind(other_model + sessions(1), before, MODEL, after, MODEL)
    assert said == ["1 saved conversation was made with 2 slots and will not restore with 1."]


def test_without_the_hash_sessions_are_matched_by_the_models_file():
    by_path = ModelIdentity(BASE.model_path)
    before = expected_facts(PROFILE, by_path)
    after = expected_facts(replace(PROFILE, parallel=4, ctx=65536), by_path)
    assert left_behind(sessions(2), before, by_path, after, by_path) == [
        "2 saved conversations were made with 2 slots and will not restore with 4."]
    elsewhere = ModelIdentity("/other/place.gguf")
    assert left_behind(sessions(2), before, elsewhere, after, elsewhere) == []


def test_another_model_leaves_the_current_models_conversations_waiting():
    before = expected_facts(PROFILE, MODEL)
    b = ModelIdentity("/models/gemma.gguf", "b" * 64, has_swa=True)
    after = expected_facts(PROFILE, b)
    assert left_behind(sessions(3), before, MODEL, after, b) == [
        "3 saved conversations of Qwen3-8B-Q4_K_M.gguf will wait until you switch back to it "
        "(they stay listed under Sessions)."]


def test_swa_full_and_arguments():
    swa_model = ModelIdentity(BASE.model_path, BASE.model_sha256, has_swa=True)
    swa_sessions = sessions(2, swa=True, swa_full=True)
    before = expected_facts(replace(PROFILE, swa_full=True), swa_model)
    after = expected_facts(replace(PROFILE, swa_full=False, extra_args=("--rope-freq-base", "1e6")),
                           swa_model)
    assert left_behind(swa_sessions, before, swa_model, after, swa_model) == [
        "2 saved conversations were made with --swa-full and will not restore with the default "
        "sliding-window cache.",
        "2 saved conversations were made with the arguments (none) and will not restore with "
        "--rope-freq-base 1e6.",
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from slotkeeper.core.model.gguf_info import read_model_info
    from slotkeeper.core.model.modelgen import write_model

    return read_model_info(write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", "llama"))


def test_launch_sanity_shows_memory_against_the_machine(tiny):
    ok = launch_sanity(tiny, ServerProfile(ctx=2048), total_memory=16 * GIB, available_memory=8 * GIB)
    assert ok.refusal is None and ok.warnings == () and ok.problems == ()
    assert ok.weights_bytes == tiny.file_size and ok.kv_bytes > 0
    assert ok.summary.startswith("Needs about ") and "this machine has 16.0 GiB" in ok.summary
    small = launch_sanity(tiny, ServerProfile(ctx=2048), total_memory=ok.need_bytes - 1,
                          available_memory=ok.need_bytes - 1)
    assert small.refusal and "Lower the context" in small.refusal and small.problems == (small.refusal,)
    past = launch_sanity(tiny, ServerProfile(ctx=4 * tiny.context_length), 16 * GIB, 8 * GIB)
    assert any("beyond what" in w and "trained on" in w for w in past.warnings)
    more = launch_sanity(tiny, ServerProfile(ctx=4096, parallel=1), 16 * GIB, 8 * GIB)
    assert more.kv_bytes == 2 * ok.kv_bytes


def test_another_projector_or_none_strands_only_the_conversations_holding_images(tmp_path):
    proj, other = tmp_path / "mmproj-a.gguf", tmp_path / "mmproj-b.gguf"
    with_images = sessions(2, n_media=1, mmproj_sha256="a" * 64)
    text_only = sessions(3, mmproj_sha256="a" * 64)
    entries = with_images + text_only
    before = expected_facts(replace(PROFILE, mmproj_path=str(proj)), MODEL)
    same = left_behind(entries, before, MODEL, expected_facts(replace(PROFILE, mmproj_path=str(proj)), MODEL),
                       MODEL)
    assert same == []
    # other settings still count every conversation, images or not
    more = left_behind(entries, before, MODEL,
                       expected_facts(replace(PROFILE, mmproj_path=str(proj), parallel=4, ctx=65536), MODEL),
                       MODEL)
    assert more == ["5 saved conversations were made with 2 slots and will not restore with 4."]
    assert left_behind(entries, before, MODEL, expected_facts(PROFILE, MODEL), MODEL) == [
        "2 saved conversations hold images read by the current projector and will not restore without it."]
    assert left_behind(entries, before, MODEL,
                       expected_facts(replace(PROFILE, mmproj_path=str(other)), MODEL), MODEL) == [
        "2 saved conversations hold images read by the current projector and will not restore with another "
        "projector."]
    # without a projector now, image sessions do not restore anyway: nothing more is lost by adding one
    assert left_behind(entries, expected_facts(PROFILE, MODEL), MODEL, before, MODEL) == []
