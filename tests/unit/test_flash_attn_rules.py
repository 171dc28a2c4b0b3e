"""Flash attention's "auto": the verdict read in llama-server's log, the command line that asks
for it, and the rule that keeps it off for a model whose saved conversations were made so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.engine.lifecycle import launching
from slotkeeper.core.server import flash_attn
from slotkeeper.core.sessions.compat import saved_flash_attn

ARGV = ["llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "4000", "--flash-attn", "off",
        "--cache-type-v", "q8_0"]


@pytest.mark.parametrize("line, said", [
    ("0.00.201.052 I resolve_fused_ops: Flash Attention enabled", True),
    ("W resolve_fused_ops: Flash Attention not supported, set to disabled", False),
    ("I llama_context: flash_attn            = disabled", False),  # settled before (Grok)
    ("I llama_context: flash_attn            = enabled", True),
    ("llama_context: Flash Attention was auto, set to enabled", True),  # older builds
    ("I llama_context: flash_attn            = auto", None),
    ("I resolve_fused_ops: fused Gated Delta Net enabled", None),
])
def test_the_verdict_is_read_from_llama_servers_own_lines(line, said):
    assert flash_attn.verdict(line) is said


def test_the_probe_runs_the_launchs_command_line_asking_for_auto():
    argv = flash_attn.probe_argv(ARGV, 5555, frozenset({"--log-verbosity", "--no-warmup"}))
    assert argv[argv.index("--flash-attn") + 1] == "auto" and argv[argv.index("--port") + 1] == "5555"
    assert argv[-3:] == ["--log-verbosity", "4", "--no-warmup"]
    assert "--cache-type-v" in argv
    assert ARGV[ARGV.index("--flash-attn") + 1] == "off"  # the launch's own untouched
    assert flash_attn.probe_argv(ARGV, 1, frozenset())[-2:] == ["--cache-type-v", "q8_0"]  # an old build


def test_the_verdict_is_kept_per_arguments_and_model_version_not_port(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    key = flash_attn.cache_key(ARGV, model)
    other_port = ARGV[:6] + ["4001"] + ARGV[7:]
    assert flash_attn.cache_key(other_port, model) == key
    assert flash_attn.cache_key([*ARGV, "--threads", "2"], model) != key
    model.write_bytes(b"x" * 11)
    assert flash_attn.cache_key(ARGV, model) != key


def sidecar(folder: Path, sid: str, model: Path, fa: bool) -> None:
    (folder / f"{sid}.json").write_text(json.dumps({"model_path": str(model), "flash_attn": fa}))


def test_saved_flash_attn_reads_the_models_sidecars(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    assert saved_flash_attn(sessions, a) == set()
    sidecar(sessions, "000000000001", a, False)
    sidecar(sessions, "000000000002", b, True)
    (sessions / "000000000003.json").write_text("{not json")
    assert saved_flash_attn(sessions, a) == {False}
    sidecar(sessions, "000000000004", a, True)
    assert saved_flash_attn(sessions, a) == {False, True}
    assert saved_flash_attn(tmp_path / "missing", a) == set()


class Model:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.display_name = path.name


@pytest.fixture
def asked(monkeypatch):
    calls: list[list[str]] = []

    def auto(binary, argv, model, flags, cache=None, timeout=0):
        calls.append(list(argv))
        return True

    monkeypatch.setattr(flash_attn, "auto_choice", auto)
    return calls


def test_auto_keeps_off_for_a_model_whose_conversations_were_all_saved_off(tmp_path, asked):
    model = tmp_path / "a.gguf"
    model.write_bytes(b"gguf")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    sidecar(sessions, "000000000001", model, False)
    facts = FileFactsCache(tmp_path / "model-facts.json", "1")
    binary = FileFactsCache(tmp_path / "server-flags.json", "1")
    argv = list(ARGV)
    choice, note = launching.resolve_flash_attn("llama-server", argv, Model(model), frozenset(), sessions,
                                                binary, facts)
    assert (choice, argv[argv.index("--flash-attn") + 1]) == (False, "off")
    assert note and "stays off" in note and "a.gguf" in note
    assert asked == []  # no need to ask the binary
    # Decided once: said once, and a conversation saved on later does not turn it.
    sidecar(sessions, "000000000002", model, True)
    assert launching.resolve_flash_attn("llama-server", list(ARGV), Model(model), frozenset(), sessions,
                                        binary, facts) == (False, None)


def test_auto_passes_the_binarys_choice_for_a_model_without_such_conversations(tmp_path, asked):
    model = tmp_path / "a.gguf"
    model.write_bytes(b"gguf")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    sidecar(sessions, "000000000001", model, True)  # made with it on: nothing to keep
    facts = FileFactsCache(tmp_path / "model-facts.json", "1")
    argv = list(ARGV)
    choice, note = launching.resolve_flash_attn("llama-server", argv, Model(model), frozenset(), sessions,
                                                FileFactsCache(tmp_path / "server-flags.json", "1"), facts)
    assert (choice, note, argv[argv.index("--flash-attn") + 1]) == (True, None, "on")
    assert len(asked) == 1
