"""Rules the Settings dialog shows, kept in the core: API keys and exposure, the V cache and
flash attention, extra arguments as one line, and what --swa-full costs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine.lifecycle.model_facts import ModelChoice, swa_note
from slotkeeper.core.model import gguf_info, gguf_memory
from slotkeeper.core.model.gguf_memory import swa_explanation
from slotkeeper.core.server.command import (
    LOOPBACK_HOSTS,
    api_key_args,
    exposes_without_key,
)
from slotkeeper.core.settings import (
    CACHE_TYPES,
    UNQUANTIZED_CACHE_TYPES,
    ServerProfile,
    join_args,
    needs_flash_attention,
    split_args,
)


def test_exposure_needs_a_key_beyond_loopback(monkeypatch):
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)  # llama-server's own way to get a key
    assert exposes_without_key("0.0.0.0", ())
    assert not exposes_without_key("0.0.0.0", ("--api-key", "s3cret"))
    assert not exposes_without_key("0.0.0.0", ("--api-key-file=k.txt",))
    assert not exposes_without_key("127.0.0.1", ())
    assert not exposes_without_key("localhost", ())
    assert not exposes_without_key("0.0.0.0", ("--api-key-file", "keys.txt"))
    assert not exposes_without_key("0.0.0.0", ("-t", "8", "--api-key=s3cret"))
    assert exposes_without_key("192.168.1.5", ("-t", "8"))
    assert exposes_without_key("::", ())
    for host in LOOPBACK_HOSTS:
        assert not exposes_without_key(f" {host.upper()} ", ())


def test_api_key_arguments_are_parsed_once_for_every_use():
    assert api_key_args(("-t", "8")) == []
    assert api_key_args(("--api-key", "a", "--api-key-file=k.txt")) == [("--api-key", "a"),
                                                                          ("--api-key-file", "k.txt")]
    assert api_key_args(("--api-key-file", "k.txt")) == [("--api-key-file", "k.txt")]
    assert api_key_args(("--api-key",)) == [("--api-key", None)]
    assert api_key_args(("--api-keys", "x")) == []  # another flag



def test_a_quantized_v_cache_needs_flash_attention():
    assert not needs_flash_attention(ServerProfile())
    # auto: llama-server turns it on itself for a quantized V cache
    assert not needs_flash_attention(ServerProfile(cache_type_v="q8_0"))
    assert needs_flash_attention(ServerProfile(cache_type_v="q8_0", flash_attn=False))
    assert not needs_flash_attention(ServerProfile(cache_type_v="q8_0", flash_attn=True))
    assert not needs_flash_attention(ServerProfile(cache_type_k="q4_0"))  # only V matters
    for t in CACHE_TYPES:
        assert (needs_flash_attention(ServerProfile(cache_type_v=t, flash_attn=False))
                == (t not in UNQUANTIZED_CACHE_TYPES))
    assert UNQUANTIZED_CACHE_TYPES == {"f16", "f32", "bf16"}


@pytest.mark.skipif(os.name == "nt", reason="POSIX quoting")
def test_extra_arguments_as_one_line():
    assert split_args("") == ()
    assert split_args("--api-key 'two words' -t 8") == ("--api-key", "two words", "-t", "8")
    assert join_args(("--api-key", "two words")) == "--api-key 'two words'"
    args = ("--alias", "it's", "--lora", "/a b/c.gguf")
    assert split_args(join_args(args)) == args
    with pytest.raises(ValueError):
        split_args("--alias 'unterminated")


def test_swa_explanation_says_what_swa_full_costs(gemma2_model: Path):
    info = gguf_info.read_model_info(gemma2_model)
    text = swa_explanation(info, 8192, 1, "f16", "f16")
    assert "sliding-window attention (2 of 4 layers" in text
    assert f"look back only {info.sliding_window} tokens" in text
    assert "3.6 MiB more KV memory" in text
    assert "4.4 MiB → 8.0 MiB" in text
    assert swa_explanation(info, 16384, 1, "f16", "f16") != text
    with pytest.raises(ValueError):
        swa_explanation(info, 8192, 1, "f16", "nope")


def test_swa_explanation_and_swa_note_agree_on_the_cost(gemma2_model: Path):
    info = gguf_info.read_model_info(gemma2_model)
    profile = ServerProfile(model_path=str(gemma2_model), ctx=8192, parallel=2, cache_type_k="q8_0",
                            cache_type_v="q8_0", flash_attn=True)
    est = gguf_memory.kv_estimate(info, 8192, 2, type_k="q8_0", type_v="q8_0")
    note = swa_note(ModelChoice(gemma2_model, info, False), profile)
    explanation = swa_explanation(info, profile.ctx, profile.parallel, profile.cache_type_k,
                                  profile.cache_type_v)
    extra = human_bytes(est.swa_full_extra_bytes)
    assert f"costs {extra} more KV memory" in note
    assert f"costs {extra} more KV memory" in explanation


def test_a_small_context_per_slot_is_warned_about_not_refused():
    from slotkeeper.core.settings import ServerProfile, SettingsError

    small = ServerProfile(ctx=128, parallel=1)
    small.validate()  # llama-server runs with it
    assert "128 tokens of context" in small.small_context_note()
    assert ServerProfile(ctx=8192, parallel=2).small_context_note() is None
    with pytest.raises(SettingsError, match="each slot needs a token"):
        ServerProfile(ctx=2, parallel=4).validate()
