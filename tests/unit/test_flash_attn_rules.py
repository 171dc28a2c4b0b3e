"""Flash attention's "auto": what the probe reads in llama-server's log (its verdict, where the KV
cache lives), the rules that settle it, the measurement's command lines, figures and verdict, and
the launch that passes a measured value once one is kept."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.engine.lifecycle import launching
from slotkeeper.core.server import calibrate, flash_attn, flash_choice
from slotkeeper.core.server.calibrate import Session, Verdict
from slotkeeper.core.server.flash_attn import AutoFacts
from slotkeeper.core.settings import ServerProfile

ARGV = ["llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "4000", "--ctx-size", "8192",
        "--parallel", "2", "--flash-attn", "off", "--slot-save-path", "/data/sessions",
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


@pytest.mark.parametrize("line, device", [
    ("0.00.168.141 I llama_kv_cache:        CPU KV buffer size =    90.00 MiB", "CPU"),
    ("llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB", "CUDA0"),
    ("llama_kv_cache:       MTL0 KV buffer size =   512.00 MiB", "MTL0"),
    ("llama_memory_recurrent:        CPU RS buffer size =     3.14 MiB", "CPU"),
    ("load_tensors:   CPU_Mapped model buffer size =    92.10 MiB", None),  # the weights, not the cache
])
def test_where_the_kv_cache_lives_is_read_from_its_buffer_lines(line, device):
    assert flash_attn.kv_device(line) == device


@pytest.mark.parametrize("devices, on_cpu", [
    ((), True), (("CPU",), True), (("CUDA_Host",), True), (("CUDA0",), False), (("MTL0",), False),
    (("CPU", "Vulkan0"), False),  # some layers on the GPU: llama-server's own choice
])
def test_attention_runs_on_the_cpu_when_every_kv_buffer_is_in_host_memory(devices, on_cpu):
    assert AutoFacts(True, devices).on_cpu is on_cpu


def test_the_probe_runs_the_launchs_command_line_asking_for_auto():
    argv = flash_attn.probe_argv(ARGV, 5555, frozenset({"--log-verbosity", "--no-warmup"}))
    assert argv[argv.index("--flash-attn") + 1] == "auto" and argv[argv.index("--port") + 1] == "5555"
    assert argv[-3:] == ["--log-verbosity", "4", "--no-warmup"]
    assert ARGV[ARGV.index("--flash-attn") + 1] == "off"  # the launch's own untouched


def test_the_probes_answer_is_kept_per_arguments_and_model_version_not_port(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    key = flash_attn.cache_key(ARGV, model)
    other_port = ARGV[:6] + ["4001"] + ARGV[7:]
    assert flash_attn.cache_key(other_port, model) == key
    assert flash_attn.cache_key([*ARGV, "--threads", "2"], model) != key
    model.write_bytes(b"x" * 11)
    assert flash_attn.cache_key(ARGV, model) != key


def test_the_measurement_is_kept_per_binary_arguments_and_model_but_not_what_it_sets_itself(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    key = flash_choice.calibration_key(ARGV, model)
    for flag, value in (("--port", "1"), ("--flash-attn", "on"), ("--ctx-size", "4096"), ("--parallel", "4"),
                        ("--slot-save-path", "/elsewhere")):
        other = list(ARGV)
        other[other.index(flag) + 1] = value
        assert flash_choice.calibration_key(other, model) == key, flag
    assert flash_choice.calibration_key([*ARGV, "--threads", "1"], model) != key
    model.write_bytes(b"y" * 12)
    assert flash_choice.calibration_key(ARGV, model) != key


def test_a_measuring_server_is_the_launchs_own_with_one_slot_and_no_save_folder():
    argv = calibrate.calibration_argv(ARGV, True, 6000, 2700)
    assert argv[argv.index("--flash-attn") + 1] == "on" and argv[argv.index("--port") + 1] == "6000"
    assert argv[argv.index("--ctx-size") + 1] == "2700" and argv[argv.index("--parallel") + 1] == "1"
    assert "--slot-save-path" not in argv and argv[-2:] == ["--cache-type-v", "q8_0"]
    bare = calibrate.calibration_argv(["llama-server", "--port", "1", "--flash-attn", "off"], False, 2, 300)
    assert bare[-4:] == ["--ctx-size", "300", "--parallel", "1"]


def session(cold, follow, reply, n=2048):
    return Session(cold, follow, reply, n, 96)


MEASURED = Verdict(False, session(6400, 630, 2600), session(6900, 105, 816), 40)


@pytest.mark.parametrize("on, off, auto, chosen", [
    (session(3000, 150, 900), session(3600, 90, 900), False, True),  # on clearly faster
    (session(6400, 630, 2600), session(6900, 105, 816), True, False),  # off: follow-ups and replies
    (session(1000, 50, 500), session(1010, 50, 500), True, True),  # within 3%: llama-server's own
    (session(1000, 50, 500), session(1010, 50, 500), False, False),
])
def test_the_faster_session_wins_and_a_tie_keeps_llama_servers_choice(on, off, auto, chosen):
    assert calibrate.decide(on, off, auto) is chosen


def test_a_verdict_is_kept_as_json_and_one_of_another_version_is_not_trusted():
    v = Verdict(False, session(6400, 630, 2600), session(6900, 105, 816), 41.5)
    raw = v.to_json()
    assert Verdict.from_json(raw) == v
    assert Verdict.from_json({**raw, "version": calibrate.VERSION + 1}) is None
    assert Verdict.from_json({"value": True}) is None and Verdict.from_json(None) is None
    assert round(v.speedup, 2) == round(9630 / 7821, 2)


def test_the_verdict_in_words_names_the_winner_and_every_figure():
    words = flash_choice.describe_verdict(MEASURED)
    assert words.startswith("Off: measured on this machine for this model")
    assert "2,048-token chat" in words and "1.23x faster off" in words
    assert "7.8 s with flash attention off and 9.6 s with it on" in words
    for figure in ("6.9 s / 6.4 s", "105 ms / 630 ms", "816 ms / 2.6 s"):
        assert figure in words
    tie = flash_choice.describe_verdict(Verdict(True, session(1000, 50, 500), session(1010, 50, 500), 5))
    assert "within 3%" in tie


PENDING = AutoFacts(True, ("CPU",))


@pytest.mark.parametrize("setting, quantized, swa_full, facts, measured, value, how", [
    (True, False, False, PENDING, MEASURED, True, flash_choice.SETTING),  # the user's setting first
    (False, True, False, PENDING, None, False, flash_choice.SETTING),
    (None, True, False, PENDING, MEASURED, True, flash_choice.REQUIRED),  # a quantized V needs it
    (None, False, True, PENDING, None, False, flash_choice.EXACT),  # --swa-full restores exactly off
    (None, False, False, AutoFacts(False, ("CPU",)), None, False, flash_choice.UNSUPPORTED),
    (None, False, False, AutoFacts(True, ("CUDA0",)), MEASURED, True, flash_choice.GPU),
    (None, False, False, PENDING, MEASURED, False, flash_choice.MEASURED),
    (None, False, False, PENDING, None, True, flash_choice.PENDING),
    (None, False, False, AutoFacts(None), None, True, flash_choice.PENDING),  # the probe did not say
])
def test_the_rules_then_the_measurement_settle_auto(setting, quantized, swa_full, facts, measured, value,
                                                    how):
    choice = flash_choice.choose(setting, quantized, swa_full, facts, measured)
    assert (choice.value, choice.how) == (value, how)
    assert choice.measure is (how == flash_choice.PENDING)
    assert choice.why and choice.why[0].isupper()
    assert flash_choice.FlashAttnChoice.from_json(choice.to_json()) == flash_choice.FlashAttnChoice(
        choice.value, choice.how, choice.why)


class Model:
    def __init__(self, path: Path, swa: bool = False) -> None:
        self.path = path
        self.display_name = path.name
        self.info = SimpleNamespace(has_swa=swa)


@pytest.fixture
def probes(monkeypatch):
    calls: list[list[str]] = []

    def probe(binary, argv, model, flags, cache=None, timeout=0):
        calls.append(list(argv))
        return AutoFacts(True, ("CPU",))

    monkeypatch.setattr(launching, "probe", probe)
    return calls


def test_a_launch_passes_the_measured_value_once_one_is_kept(tmp_path, probes):
    model = tmp_path / "a.gguf"
    model.write_bytes(b"gguf")
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"\x7fELF")
    model_facts = FileFactsCache(tmp_path / "model-facts.json", "1")
    binary_facts = FileFactsCache(tmp_path / "server-flags.json", "1")
    argv = [str(binary), "--model", str(model), "--port", "1", "--flash-attn", "off"]
    profile = ServerProfile(model_path=str(model))
    first = launching.resolve_flash_attn(str(binary), argv, Model(model), profile, frozenset(), binary_facts,
                                         model_facts)
    assert (first.value, first.how, first.measure) == (True, flash_choice.PENDING, True)
    assert argv[-1] == "on" and len(probes) == 1
    assert flash_choice.remembered_choice(model_facts, model) == flash_choice.FlashAttnChoice(
        True, flash_choice.PENDING, first.why)
    binary_facts.put(binary, MEASURED.to_json(), flash_choice.calibration_key(argv, model))
    second = launching.resolve_flash_attn(str(binary), argv, Model(model), profile, frozenset(), binary_facts,
                                          model_facts)
    assert (second.value, second.how, second.measure) == (False, flash_choice.MEASURED, False)
    assert argv[-1] == "off" and "1.23x faster off" in second.why
    assert flash_choice.remembered_choice(model_facts, model).how == flash_choice.MEASURED
    # The user's setting is passed as it is, without asking the binary.
    set_on = launching.resolve_flash_attn(str(binary), argv, Model(model),
                                          ServerProfile(model_path=str(model), flash_attn=True), frozenset(),
                                          binary_facts, model_facts)
    assert (set_on.value, set_on.how, argv[-1], len(probes)) == (True, flash_choice.SETTING, "on", 2)
