"""A short curated list of well-known instruct GGUFs, for people who have no model yet.

Each entry names a file on the Hugging Face Hub and carries what a person needs to choose:
how much it downloads, the memory it needs at Slotkeeper's default context, and how saved
conversations restore with it. Sizes are approximate (the Hub's own figure is used when the
download starts); the memory figure is the weights plus the KV cache that
``gguf_memory.kv_estimate`` computes from the architecture facts recorded here (the same numbers
``slotkeeper model-info`` prints once the file is on disk). It leaves out llama-server's
compute buffers (a few hundred MiB) and the operating system.

Every repository below is public and ungated, so no Hugging Face token is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slotkeeper.core.model import families
from slotkeeper.core.settings import ServerProfile

if TYPE_CHECKING:  # the GGUF reader (numpy) only when an estimate is asked for: the CLI starts faster
    from slotkeeper.core.model import gguf_info

__all__ = [
    "CATALOG",
    "DEFAULT_CTX",
    "CuratedModel",
    "MemoryNeed",
    "find_curated",
]

DEFAULT_CTX = ServerProfile().ctx  # the context a new profile launches with
DEFAULT_PARALLEL = ServerProfile().parallel


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a launch needs at one context: the weights plus the KV cache."""

    weights: int
    kv_default: int  # the cache llama-server builds by default
    kv_swa_full: int  # with --swa-full (equal to kv_default without sliding layers)
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_default

    @property
    def total_swa_full(self) -> int:
        return self.weights + self.kv_swa_full


@dataclass(frozen=True)
class CuratedModel:
    """One downloadable model and the architecture facts its KV cache size follows from."""

    id: str  # short name for the command line: `slotkeeper models download qwen3-4b`
    title: str
    repo_id: str
    filename: str
    quant: str
    download_bytes: int  # approximate; the Hub's X-Linked-Size is authoritative
    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    context_length: int  # the training context the GGUF states
    sliding_window: int | None = None
    swa_period: int | None = None  # every Nth layer is full attention (llama.cpp's pattern)
    recurrent: bool = False
    summary: str = ""

    @property
    def restore_mode(self) -> str:
        """What a saved conversation of it is good for (``core.model.families``; no server in mind)."""
        kind = "hybrid" if self.recurrent else "attention"
        return families.restore_mode(kind, self.model_info().has_swa, None)

    def model_info(self) -> gguf_info.ModelInfo:
        """The facts ``gguf_info.read_model_info`` would read from the file's header."""
        from slotkeeper.core.model import gguf_info

        swa = self.sliding_window is not None and self.swa_period is not None
        return gguf_info.ModelInfo(
            path=Path(self.filename),
            file_size=self.download_bytes,
            arch=self.arch,
            name=self.title,
            n_layers=self.n_layers,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            n_embd=self.n_embd,
            head_dim_k=self.head_dim,
            head_dim_v=self.head_dim,
            context_length=self.context_length,
            sliding_window=self.sliding_window,
            swa_layers=(gguf_info.swa_pattern_layers(self.n_layers, self.swa_period)
                        if swa and self.swa_period is not None else (False,) * self.n_layers),
            swa_type="standard" if swa else "none",
        )

    def memory_need(self, n_ctx: int = DEFAULT_CTX, n_parallel: int = DEFAULT_PARALLEL,
                    cache_type: str = "f16") -> MemoryNeed:
        from slotkeeper.core.model import gguf_memory

        est = gguf_memory.kv_estimate(self.model_info(), n_ctx, n_parallel, type_k=cache_type,
                                      type_v=cache_type)
        return MemoryNeed(weights=self.download_bytes, kv_default=est.bytes_swa, kv_swa_full=est.bytes_full,
                          n_ctx=est.n_ctx)

    @property
    def url_path(self) -> str:
        return f"{self.repo_id}/{self.filename}"


# Ordered small to large. Architecture facts are from each model's config (and the GGUF
# metadata llama.cpp writes from it).
CATALOG: tuple[CuratedModel, ...] = (
    CuratedModel(
        id="qwen3-0.6b", title="Qwen3 0.6B", repo_id="Qwen/Qwen3-0.6B-GGUF", filename="Qwen3-0.6B-Q8_0.gguf",
        quant="Q8_0", download_bytes=639_000_000, arch="qwen3", n_layers=28, n_embd=1024, n_head=16,
        n_head_kv=8, head_dim=128, context_length=40960,
        summary="Tiny and fast; fine for trying things out, weak at facts and reasoning.",
    ),
    CuratedModel(
        id="llama3.2-3b", title="Llama 3.2 3B Instruct", repo_id="bartowski/Llama-3.2-3B-Instruct-GGUF",
        filename="Llama-3.2-3B-Instruct-Q4_K_M.gguf", quant="Q4_K_M", download_bytes=2_020_000_000,
        arch="llama", n_layers=28, n_embd=3072, n_head=24, n_head_kv=8, head_dim=128, context_length=131072,
        summary="Small general-purpose assistant from Meta.",
    ),
    CuratedModel(
        id="gemma3-4b", title="Gemma 3 4B Instruct", repo_id="unsloth/gemma-3-4b-it-GGUF",
        filename="gemma-3-4b-it-Q4_K_M.gguf", quant="Q4_K_M", download_bytes=2_490_000_000, arch="gemma3",
        n_layers=34, n_embd=2560, n_head=8, n_head_kv=4, head_dim=256, context_length=131072,
        sliding_window=1024, swa_period=6,
        summary="Google's small model; good writing and many languages.",
    ),
    CuratedModel(
        id="qwen3-4b", title="Qwen3 4B", repo_id="Qwen/Qwen3-4B-GGUF", filename="Qwen3-4B-Q4_K_M.gguf",
        quant="Q4_K_M", download_bytes=2_500_000_000, arch="qwen3", n_layers=36, n_embd=2560, n_head=32,
        n_head_kv=8, head_dim=128, context_length=40960,
        summary="Strong for its size, with a thinking mode; a good first choice on a laptop.",
    ),
    CuratedModel(
        id="qwen3-8b", title="Qwen3 8B", repo_id="Qwen/Qwen3-8B-GGUF", filename="Qwen3-8B-Q4_K_M.gguf",
        quant="Q4_K_M", download_bytes=5_030_000_000, arch="qwen3", n_layers=36, n_embd=4096, n_head=32,
        n_head_kv=8, head_dim=128, context_length=40960,
        summary="Noticeably better answers; wants 16 GB of memory.",
    ),
    CuratedModel(
        id="gpt-oss-20b", title="gpt-oss 20B", repo_id="ggml-org/gpt-oss-20b-GGUF",
        filename="gpt-oss-20b-mxfp4.gguf", quant="MXFP4", download_bytes=12_100_000_000, arch="gpt-oss",
        n_layers=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, context_length=131072,
        sliding_window=128, swa_period=2,
        summary="OpenAI's open-weight mixture-of-experts model; fast for its size, wants 16 GB or more.",
    ),
)


def find_curated(name: str) -> CuratedModel | None:
    """The entry whose id (or "repo/file") is ``name``, ignoring case."""
    key = name.strip().lower()
    for entry in CATALOG:
        if key in (entry.id, entry.url_path.lower()):
            return entry
    return None
