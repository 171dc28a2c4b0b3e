"""A model's facts and KV-cache memory in words (``slotkeeper model-info``) and as JSON
(``model-info --json``)."""

from __future__ import annotations

from typing import Any

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.model import families
from slotkeeper.core.model.gguf_info import ModelInfo
from slotkeeper.core.model.gguf_memory import KvEstimate

__all__ = ["format_model_info", "model_info_json"]


def _compact_indices(indices: list[int], head: int = 4) -> str:
    """ "0, 2, 4, ..., 22" for long lists, every index for short ones."""
    if len(indices) <= head + 2:
        return ", ".join(str(i) for i in indices)
    return ", ".join(str(i) for i in indices[:head]) + f", ..., {indices[-1]}"


def _swa_indices(info: ModelInfo) -> list[int]:
    return [il for il in range(info.n_layers) if info.layer_slides(il)]


def _per_token(n: float) -> str:
    return f"{human_bytes(n)}/token"


def format_model_info(info: ModelInfo, est: KvEstimate) -> str:
    """A few aligned lines describing the model and its KV-cache memory, for people."""
    lines = [
        ("Model", info.name or info.path.name),
        ("File", f"{info.path} ({human_bytes(info.file_size)})"),
        ("Architecture", info.arch),
        ("Layers", str(info.n_layers)),
        ("KV heads", _kv_heads_text(info)),
        ("Head dims", _head_dims_text(info)),
        ("Training ctx", f"{info.context_length} tokens" if info.context_length else "unknown"),
        ("Family", _family_text(info)),
        ("Sliding window", _swa_text(info)),
    ]
    if info.mla:
        lines.append(("MLA", f"the KV cache stores the compressed latent: kv_lora_rank {info.kv_lora_rank} + "
                              f"{info.rope_dim} RoPE dims = {info.head_dim_k} values per token and layer, no "
                              "V"))
    if info.n_expert:
        used = f", {info.n_expert_used} per token" if info.n_expert_used else ""
        lines.append(("MoE", f"{info.n_expert} experts{used} (changes the weights, not the KV cache)"))
    lines.append(("Restore", _restore_text(info)))
    slots = f"{est.n_parallel} slot{'s' if est.n_parallel != 1 else ''}"
    if est.unified:
        slots += ", unified KV"
    lines.append(
        (
            "KV cache",
            f"{est.n_ctx} tokens, {slots}, K {est.type_k} / V {est.type_v}, ubatch {est.ubatch}",
        )
    )
    if not est.known:
        lines.append(("  total",
                      "unknown: llama.cpp builds this model's cache in its own way, not modelled here"))
    elif info.memory == "none":
        lines.append(("  total", "none: this model keeps no cache (nothing to save or restore)"))
    elif info.has_swa:
        lines += [
            ("  default", f"{human_bytes(est.bytes_swa)} ({_per_token(est.per_token_swa)})"),
            ("  --swa-full", f"{human_bytes(est.bytes_full)} ({_per_token(est.per_token_full)})"),
            (
                "  saving",
                f"{est.saving_ratio:.2f}x smaller by default; --swa-full costs "
                f"{human_bytes(est.swa_full_extra_bytes)} more",
            ),
        ]
    else:
        lines.append(
            ("  total", f"{human_bytes(est.bytes_full)} ({_per_token(est.per_token_full)})")
        )
    if est.known and info.has_recurrent:
        n_rec = info.n_recurrent_layers
        lines.append((
            "Recurrent state",
            f"{human_bytes(est.recurrent_bytes)} ({human_bytes(info.recurrent_bytes_per_seq)} per slot: "
            f"{n_rec} layer{'s' if n_rec != 1 else ''} x {info.recurrent_r + info.recurrent_s} f32 values; "
            "fixed, whatever the context)",
        ))
    width = max(len(label) for label, _ in lines) + 2
    return "\n".join(f"{label + ':':<{width}}{value}" for label, value in lines)


def _kv_heads_text(info: ModelInfo) -> str:
    per_layer = set(info.n_head_kv_per_layer)
    if len(per_layer) > 1:
        return f"{min(per_layer)}-{max(per_layer)} (varies by layer; {info.n_head} query heads)"
    return f"{info.n_head_kv} ({info.n_head} query heads)"


def _head_dims_text(info: ModelInfo) -> str:
    text = f"key {info.head_dim_k}, value {info.head_dim_v}"
    if info.has_swa and (info.head_dim_k_swa or info.head_dim_v_swa):
        k_swa = info.head_dim_k_swa or info.head_dim_k
        v_swa = info.head_dim_v_swa or info.head_dim_v
        if (k_swa, v_swa) != (info.head_dim_k, info.head_dim_v):
            text += f" (sliding layers: key {k_swa}, value {v_swa})"
    return text


def _layers_phrase(flags: tuple[bool, ...] | list[bool], noun: str) -> str:
    """ "3 recurrent layers (0, 1, 2)" """
    idx = [il for il, on in enumerate(flags) if on]
    text = f"{len(idx)} {noun} layer{'s' if len(idx) != 1 else ''}"
    return f"{text} ({_compact_indices(idx)})" if idx else text


def _family_text(info: ModelInfo) -> str:
    if info.memory == "unknown":
        return (f"unknown: llama.cpp {families.LLAMA_BUILD} does not know the architecture {info.arch!r}; "
                "its cache and restore behaviour are not guessed")
    if info.memory == "none":
        return "no cache: an embedding, reranking or diffusion model"
    if info.memory == "recurrent":
        return (f"recurrent ({info.recurrent_what}): every layer keeps a fixed state per slot, "
                "no per-token KV cache")
    if info.memory == "hybrid":
        attn = [info.layer_has_kv(il) for il in range(info.n_layers)]
        what = f" ({info.recurrent_what})" if info.recurrent_what else ""
        text = (f"hybrid: {_layers_phrase(info.recurrent_layers, 'recurrent')}{what} and "
                f"{_layers_phrase(attn, 'attention')} with a KV cache")
        return text if info.sizes_known else text + "; its cache layout is not modelled here"
    if not info.sizes_known:
        return ("attention with a cache llama.cpp builds its own way (sparse-attention indexer or shared "
                "cache)")
    if info.mla:
        return "MLA (multi-head latent attention)"
    return "sliding window + full attention" if info.has_swa else "full attention"


def _restore_text(info: ModelInfo) -> str:
    mode = info.restore_mode()
    if mode == families.RESTORE_NEEDS_SWA_FULL:
        return ("needs --swa-full: without it a restored session is re-read from the start (never helps); "
                "with it only an exact continuation of the saved conversation reuses it")
    why = {
        families.RESTORE_WORKS: "the next request reuses the common prefix, even after an edit or a "
                                "regenerate",
        families.RESTORE_EXACT: ("only a request that continues the saved tokens exactly reuses them; "
                                 "a rollback (edit, regenerate) is recomputed, because the state cannot go "
                                 "back"),
        families.RESTORE_NEVER: "there is no cache to save",
        families.RESTORE_UNKNOWN: "the architecture is unknown, so Slotkeeper trusts only an exact "
                                  "continuation",
    }[mode]
    return f"{families.describe_restore_mode(mode)} ({why})"


def _swa_text(info: ModelInfo) -> str:
    if info.memory == "unknown":
        return "unknown"
    if not info.has_swa:
        if info.memory == "recurrent":
            return "none (no attention layers)"
        if info.memory == "hybrid":
            n = info.n_attention_layers
            return f"none (full attention on its {n} attention layer{'s' if n != 1 else ''})"
        if info.sliding_window:
            return (
                f"none (the GGUF says {info.sliding_window}, but llama.cpp runs "
                f"{info.arch} with full attention)"
            )
        return "none (full attention on every layer)"
    kind = " (chunked attention)" if info.swa_type == "chunked" else ""
    idx = _swa_indices(info)
    return (
        f"{info.sliding_window} tokens{kind}; {len(idx)} of {info.n_layers} layers slide "
        f"({_compact_indices(idx)})"
    )


def model_info_json(info: ModelInfo, est: KvEstimate) -> dict[str, Any]:
    """JSON-serialisable facts with stable keys (for ``slotkeeper model-info --json``)."""
    return {
        "path": str(info.path),
        "file_size": info.file_size,
        "arch": info.arch,
        "name": info.name,
        "n_layers": info.n_layers,
        "n_head": info.n_head,
        "n_head_kv": info.n_head_kv,
        "head_dim_k": info.head_dim_k,
        "head_dim_v": info.head_dim_v,
        "context_length": info.context_length,
        "sliding_window": info.sliding_window,
        "swa": info.has_swa,
        "swa_type": info.swa_type if info.has_swa else "none",
        "swa_layers": _swa_indices(info),
        "memory": info.memory,
        "family": info.family,
        "sizes_known": info.sizes_known,
        "recurrent_layers": [il for il, on in enumerate(info.recurrent_layers) if on],
        "attention_layers": [il for il in range(info.n_layers) if info.layer_has_kv(il)]
        if info.memory not in ("unknown", "none") else [],
        "mla": info.mla,
        "kv_lora_rank": info.kv_lora_rank if info.mla else None,
        "n_expert": info.n_expert,
        "n_expert_used": info.n_expert_used,
        "restore_mode": info.restore_mode(),
        "restore_mode_default": info.restore_mode(False),
        "restore_mode_swa_full": info.restore_mode(True),
        "kv": {
            "n_ctx": est.n_ctx,
            "n_parallel": est.n_parallel,
            "unified": est.unified,
            "ubatch": est.ubatch,
            "cache_type_k": est.type_k,
            "cache_type_v": est.type_v,
            "flash_attn": est.flash_attn,
            "bytes_default": est.bytes_swa if est.known else None,
            "bytes_swa_full": est.bytes_full if est.known else None,
            "recurrent_bytes": est.recurrent_bytes if est.known else None,
            "per_token_default": est.per_token_swa,
            "per_token_swa_full": est.per_token_full,
            "saving_ratio": est.saving_ratio,
        },
    }
