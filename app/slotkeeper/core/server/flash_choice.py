"""Which flash attention a launch passes, and why, in words.

The setting's "auto" is chosen for the work Slotkeeper serves, a long conversation kept warm (a cold
prefill once, then short follow-ups and replies at a long context), per machine and per model:

- a quantized V cache needs flash attention: on;
- a sliding-window model with ``--swa-full``: off. Its restored conversation is continued exactly
  only, and with flash attention on the next answer's log-probs drift from the server that never
  stopped (the CPU kernel splits the window's cells among threads where they sit, and a restore
  packs them elsewhere);
- llama-server cannot run it there (auto says disabled): off;
- the KV cache on a GPU (CUDA, Metal, Vulkan ...): llama-server's own auto, on where supported.
  Slotkeeper does not measure GPUs: nothing here has one;
- on the CPU, measured (``calibrate``): the faster of the two for a warm conversation in small,
  once per model, binary and arguments, while the server sits idle; until then llama-server's own
  choice, and the measured one from the next launch on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.server.calibrate import FOLLOW_UPS, REPLY_TOKENS, Verdict
from slotkeeper.core.server.flash_attn import AutoFacts

__all__ = ["FlashAttnChoice", "calibration_key", "choose", "remember_choice", "remembered_choice"]

MEASURE_FACT = "flash-attn-measured"
CHOICE_FACT = "flash-attn-choice"  # what a model's last launch (or measurement) chose, for the faces

SETTING, REQUIRED, EXACT, UNSUPPORTED, GPU, MEASURED, PENDING = (
    "setting", "required", "exact", "unsupported", "gpu", "measured", "pending")


@dataclass(frozen=True)
class FlashAttnChoice:
    value: bool  # what --flash-attn passes
    how: str  # SETTING, REQUIRED, EXACT, UNSUPPORTED, GPU, MEASURED, PENDING
    why: str  # the reason in words, with the figures it came from
    measure: bool = False  # on the CPU and not measured yet: the engine measures when idle

    def to_json(self) -> dict:
        return {"value": self.value, "how": self.how, "why": self.why}

    @classmethod
    def from_json(cls, raw: object) -> FlashAttnChoice | None:
        if (isinstance(raw, dict) and isinstance(raw.get("value"), bool) and isinstance(raw.get("how"), str)
                and isinstance(raw.get("why"), str)):
            return cls(raw["value"], raw["how"], raw["why"])
        return None


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def choose(setting: bool | None, quantized_v: bool, swa_full_window: bool, facts: AutoFacts,
           measured: Verdict | None) -> FlashAttnChoice:
    """The value to pass. ``setting``: the user's (None: auto); ``swa_full_window``: a model with a
    sliding window run with --swa-full; ``facts``: the probe's; ``measured``: the kept verdict."""
    if setting is not None:
        return FlashAttnChoice(setting, SETTING, f"{_on_off(setting).capitalize()}, as set.")
    if quantized_v:
        return FlashAttnChoice(True, REQUIRED, "On: llama-server quantizes the V cache only with flash "
                                               "attention.")
    if swa_full_window:
        return FlashAttnChoice(False, EXACT, (
            "Off: a sliding-window model run with --swa-full comes back from disk exactly only with "
            "flash attention off (with it on, a restored conversation's next answer differs slightly "
            "from the one the server that never stopped would give)."))
    if facts.auto is False:
        return FlashAttnChoice(False, UNSUPPORTED, "Off: llama-server cannot use flash attention for this "
                                                   "model on this device.")
    auto = facts.auto is not False
    if not facts.on_cpu:
        devices = ", ".join(d for d in facts.kv_devices if not d.upper().startswith("CPU"))
        return FlashAttnChoice(auto, GPU, (
            f"{_on_off(auto).capitalize()}, as llama-server chooses with the KV cache on {devices}. "
            "Slotkeeper measures the choice on CPUs only."))
    if measured is not None:
        return FlashAttnChoice(measured.value, MEASURED, describe_verdict(measured))
    return FlashAttnChoice(auto, PENDING, (
        f"{_on_off(auto).capitalize()} for now, as llama-server chooses. Which is faster for a long "
        "conversation depends on the CPU and the model: Slotkeeper measures it once, the first time "
        "the server sits idle, and passes the faster one from the next start."), measure=True)


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def describe_verdict(v: Verdict) -> str:
    """The measurement in words: which won, by how much, and each phase's figures (off / on)."""
    tie = abs(v.on.total_ms - v.off.total_ms) <= 0.03 * max(v.on.total_ms, v.off.total_ms)
    head = (f"{_on_off(v.value).capitalize()}: measured on this machine for this model, "
            f"a {v.on.prompt_tokens:,}-token chat with {FOLLOW_UPS} follow-ups and {REPLY_TOKENS}-token "
            f"replies took {_seconds(v.off.total_ms)} with flash attention off and "
            f"{_seconds(v.on.total_ms)} with it on")
    if tie:
        head += " (within 3%: llama-server's own choice)"
    else:
        head += f" ({v.speedup:.2f}x faster {_on_off(v.value)})"
    return (head + f". Off / on: the chat read in {_seconds(v.off.cold_ms)} / {_seconds(v.on.cold_ms)}, "
            f"the follow-ups in {_seconds(v.off.follow_ms)} / {_seconds(v.on.follow_ms)}, the replies "
            f"written in {_seconds(v.off.reply_ms)} / {_seconds(v.on.reply_ms)}.")


_OWNED = ("--port", "--flash-attn", "--ctx-size", "--parallel", "--slot-save-path")


def calibration_key(argv: Sequence[str], model_path: str | os.PathLike[str]) -> str:
    """What a measurement depends on beyond the binary: the launch's arguments but those the
    measuring servers set themselves (port, flash attention, context, slots, the save folder), and
    the model file's version (OSError when it is gone)."""
    args = list(argv)
    kept = []
    i = 0
    while i < len(args):
        if args[i] in _OWNED:
            i += 2
            continue
        kept.append(args[i])
        i += 1
    st = os.stat(model_path)
    return MEASURE_FACT + "\0" + json.dumps([kept, st.st_size, st.st_mtime_ns])


def remember_choice(model_facts: FileFactsCache, model_path: str | os.PathLike[str],
                    choice: FlashAttnChoice) -> None:
    """Keep ``choice`` for the model (the faces show it when no server runs it); a cache that
    cannot be written only leaves it unsaid."""
    try:
        model_facts.put(model_path, choice.to_json(), CHOICE_FACT)
    except OSError:
        pass


def remembered_choice(model_facts: FileFactsCache,
                      model_path: str | os.PathLike[str]) -> FlashAttnChoice | None:
    """What the model's last launch, or a measurement since, chose (None: nothing since the file
    last changed)."""
    return FlashAttnChoice.from_json(model_facts.get(model_path, CHOICE_FACT))
