"""The model a profile names, before anything runs it: the demo's marker, its name, the file with
its header (``ModelChoice``), and whether the machine can hold a launch of it (``check_launch``).

Pure rules over values (a profile, a model's header, the machine's memory): the engine refuses a
launch by them, and the faces say the same before they ask for one (``services.choosing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model import gguf_info, gguf_memory
from slotkeeper.core.settings import ServerProfile

__all__ = ["DEMO_MODEL", "LaunchCheck", "ModelChoice", "check_launch", "profile_model_name"]

DEMO_MODEL = ":demo:"  # the profile's model_path value that means "the starter model" (demo_model)


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    info: gguf_info.ModelInfo
    is_demo: bool

    @property
    def display_name(self) -> str:
        return "starter model (SmolLM2 135M)" if self.is_demo else self.path.name


def profile_model_name(model_path: str | None) -> str:
    """What to call the profile's model before it has been read."""
    if not model_path:
        return "no model chosen"
    return "starter model (SmolLM2 135M)" if model_path == DEMO_MODEL else Path(model_path).name


@dataclass(frozen=True)
class LaunchCheck:
    refusal: str | None  # the launch would fail or take the machine down: do not start
    warnings: tuple[str, ...] = ()


def check_launch(model: ModelChoice, profile: ServerProfile, total_memory: int,
                 available_memory: int) -> LaunchCheck:
    """What to say before starting llama-server with this model and profile: a context the machine
    cannot hold is refused (llama-server would otherwise run until the kernel kills it), one beyond
    the model's training context is a warning."""
    info = model.info
    est = gguf_memory.kv_estimate(info, profile.ctx, profile.parallel, type_k=profile.cache_type_k,
                                type_v=profile.cache_type_v,
                                flash_attn=profile.flash_attn is not False)  # auto: on, mostly
    kv = (est.bytes_full if profile.swa_full else est.bytes_swa) + est.recurrent_bytes
    need = kv + info.file_size
    if need > total_memory:
        return LaunchCheck(
            f"The KV cache for a context of {profile.ctx:,} tokens needs about {human_bytes(kv)}, plus "
            f"{human_bytes(info.file_size)} for the model, but this machine has {human_bytes(total_memory)} "
            "of memory. Lower the context (--ctx) or the number of slots, or use a quantized KV cache.")
    warnings = []
    if need > available_memory:
        warnings.append(
            f"llama-server will need about {human_bytes(need)} (model and KV cache) and only "
            f"{human_bytes(available_memory)} of memory is free now: the system may slow down or stop it.")
    if info.context_length and profile.ctx_per_slot > info.context_length:
        warnings.append(
            f"Each slot's context ({profile.ctx_per_slot:,} tokens) is beyond what {model.display_name} was "
            f"trained on ({info.context_length:,}): replies may degrade past that length.")
    return LaunchCheck(None, tuple(warnings))
