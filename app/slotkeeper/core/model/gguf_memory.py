"""The KV-cache memory llama-server allocates for a model's facts (``gguf_info.ModelInfo``).

A sliding-window (SWA) model's default KV cache keeps only the last window of cells on its sliding
layers, and such a state cannot be fully restored (llama-server re-processes the whole prompt after
a restore). ``--swa-full`` fixes that at the price of a full-size cache; ``kv_estimate`` tells the
user what that price is.

The arithmetic follows llama.cpp b11434 (src/llama-context.cpp, src/llama-kv-cache.cpp,
src/llama-kv-cache-iswa.cpp, src/llama-memory-recurrent.cpp): n_ctx and each stream padded to 256
cells; a sliding layer keeps the window plus one ubatch; MLA caches only K, the compressed latent;
hybrid and recurrent models keep, per slot, a recurrent state of ``n_embd_r + n_embd_s`` f32 values
per recurrent layer. Without flash attention llama.cpp stores V transposed and pads every layer's V
rows to the widest layer's ([TAG_V_CACHE_VARIABLE] in llama-kv-cache.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slotkeeper.core.basics.units import human_bytes

if TYPE_CHECKING:
    from slotkeeper.core.model.gguf_info import ModelInfo

__all__ = ["CACHE_TYPES", "KvEstimate", "kv_estimate", "swa_explanation"]


# --cache-type-k / --cache-type-v names -> (elements per block, bytes per block), as ggml; in the
# order llama-server's --help lists them.
_CACHE_BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
CACHE_TYPES = tuple(_CACHE_BLOCKS)  # the names (settings validate with them; the Settings dialog lists them)

# llama.cpp pads n_ctx, each stream's context and the SWA cache to 256 cells.
_CELL_PAD = 256


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _row_bytes(cache_type: str, n_elements: int) -> int:
    block, block_bytes = _CACHE_BLOCKS[cache_type]
    return math.ceil(n_elements / block) * block_bytes


def _check_cache_type(name: str) -> str:
    key = name.lower()
    if key not in _CACHE_BLOCKS:
        raise ValueError(f"unknown KV cache type {name!r}; valid types: {', '.join(CACHE_TYPES)}")
    return key


@dataclass
class KvEstimate:
    """KV-cache bytes for one server configuration, with and without ``--swa-full``.

    n_ctx is the total context across slots after llama.cpp's padding to 256 cells.
    """

    n_ctx: int
    n_parallel: int
    unified: bool
    ubatch: int
    type_k: str
    type_v: str
    bytes_full: int  # --swa-full, or any model without sliding layers
    bytes_swa: int  # the default cache (equals bytes_full for a model without SWA)
    swa_cells: int = 0  # cells a sliding layer keeps in the default cache (all streams)
    recurrent_bytes: int = 0  # recurrent state of every slot (hybrid and recurrent models)
    known: bool = True  # False: llama.cpp builds this model's cache in a way not modelled here
    flash_attn: bool = True
    per_token_full: float = field(init=False)
    per_token_swa: float = field(init=False)
    saving_ratio: float = field(init=False)
    swa_full_extra_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.per_token_full = self.bytes_full / self.n_ctx if self.n_ctx else 0.0
        self.per_token_swa = self.bytes_swa / self.n_ctx if self.n_ctx else 0.0
        self.saving_ratio = self.bytes_full / self.bytes_swa if self.bytes_swa else 1.0
        self.swa_full_extra_bytes = self.bytes_full - self.bytes_swa


def kv_estimate(
    info: ModelInfo,
    n_ctx: int,
    n_parallel: int = 1,
    ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
    unified: bool = False,
    flash_attn: bool = True,
) -> KvEstimate:
    """KV-cache bytes llama-server allocates for ``info`` at ``-c n_ctx -np n_parallel``, and
    the recurrent state of hybrid and recurrent models (f32, one per slot).

    ``n_ctx`` is the total context across slots (llama-server's ``-c``); 0 means the model's
    training context, as ``-c 0`` does. ``flash_attn`` False stores V transposed, padded to the
    widest layer's V rows.
    """
    type_k = _check_cache_type(type_k)
    type_v = _check_cache_type(type_v)
    if n_parallel < 1:
        raise ValueError(f"n_parallel must be at least 1, not {n_parallel}")
    if ubatch < 1:
        raise ValueError(f"ubatch must be at least 1, not {ubatch}")
    if n_ctx <= 0:
        n_ctx = info.context_length
    if n_ctx <= 0:
        raise ValueError("n_ctx must be positive (the model does not state a training context)")

    # llama_context: n_ctx is padded; without a unified cache each slot gets its own stream
    # of n_ctx / n_parallel cells (padded again).
    n_ctx = _round_up(n_ctx, _CELL_PAD)
    n_streams = 1 if unified else n_parallel
    ctx_per_stream = n_ctx if unified else _round_up(n_ctx // n_parallel, _CELL_PAD)
    full_cells = ctx_per_stream * n_streams

    # llama_kv_cache_iswa: a sliding layer keeps the window (per sequence when unified) plus
    # one ubatch, padded to 256, never more than the full cache.
    swa_cells = full_cells
    if info.has_swa and info.sliding_window:
        window = info.sliding_window * (n_parallel if unified else 1)
        swa_cells = _round_up(min(ctx_per_stream, window + ubatch), _CELL_PAD) * n_streams

    bytes_full = 0
    bytes_swa = 0
    v_pad = 0 if flash_attn or info.mla else _max_v_row(info)
    if info.memory != "none":
        for il in range(info.n_layers):
            cell = _layer_cell_bytes(info, il, type_k, type_v, v_pad)
            bytes_full += cell * full_cells
            bytes_swa += cell * (swa_cells if info.layer_slides(il) else full_cells)

    return KvEstimate(
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        unified=unified,
        ubatch=ubatch,
        type_k=type_k,
        type_v=type_v,
        bytes_full=bytes_full,
        bytes_swa=bytes_swa,
        swa_cells=swa_cells if info.has_swa else 0,
        recurrent_bytes=info.recurrent_bytes_per_seq * n_parallel,  # rs_size = max(1, n_seq_max)
        known=info.sizes_known,
        flash_attn=flash_attn,
    )


def _max_v_row(info: ModelInfo) -> int:
    """llama_hparams::n_embd_v_gqa_max: the widest V row over every layer."""
    return max((info.layer_head_dims(il)[1] * info.layer_head_kv(il) for il in range(info.n_layers)),
               default=0)


def _layer_cell_bytes(info: ModelInfo, il: int, type_k: str, type_v: str, v_pad: int = 0) -> int:
    """Bytes one cell (one token) takes in layer ``il``: its K row plus its V row (none for MLA,
    whose K row is the compressed latent; the widest layer's V row without flash attention)."""
    if not info.layer_has_kv(il):
        return 0
    n_kv = info.layer_head_kv(il)
    dim_k, dim_v = info.layer_head_dims(il)
    k = _row_bytes(type_k, dim_k * n_kv)
    if info.mla:
        return k
    return k + _row_bytes(type_v, v_pad or dim_v * n_kv)


def swa_explanation(info: ModelInfo, ctx: int, parallel: int, type_k: str, type_v: str) -> str:
    """What --swa-full does for a sliding-window model and what it costs at these settings
    (the Settings dialog says it beside the checkbox); ValueError for unknown cache types."""
    est = kv_estimate(info, ctx, parallel, type_k=type_k, type_v=type_v)
    return (
        f"This model uses sliding-window attention ({info.n_swa_layers} of {info.n_layers} layers "
        f"look back only {info.sliding_window or '?'} tokens). By default llama-server keeps just that "
        "window for those layers, so a saved conversation restores but the next request re-reads it "
        "from the start: restoring saves no time. --swa-full keeps the full context for them, which "
        f"makes restores work and costs {human_bytes(est.swa_full_extra_bytes)} more KV memory at this "
        f"context and slot count ({human_bytes(est.bytes_swa)} → {human_bytes(est.bytes_full)}). "
        "Sessions saved with and without it cannot be mixed."
    )
