"""Tiny random-weight GGUF models that the real llama-server loads and chats with.

They let the tests, the benchmarks and first-time users exercise Slotkeeper without
downloading a model. The weights are random, so the answers are gibberish, but every byte
is a function of (kind, seed): the same call writes the same file.

Kinds:
    llama / demo  4 layers x 128 embd, full attention, ~1.6 MB, context 8192
    llama-alt     the llama shape with other weights: "another model of the same shape"
    gemma2        4 layers x 128 embd, sliding window 128 on even layers, context 8192
    bench         8 layers x 1024 embd, full attention, ~190 MB, context 16384; its prefill
                  is slow enough (hundreds of tokens/s on 2 cores) to measure cache reuse

One tiny model per family (128 embd, 4 query / 2 KV heads of 32 dims, context 2048), so the
tests prove each family's memory and restore rules against the real llama-server:
    qwen3         4 layers, full attention with Q/K norms
    gemma3        6 layers: 5 sliding (window 128) + 1 global, Q/K norms, post norms
    gpt-oss       4 layers alternating sliding (window 128) and full, attention sinks, MoE
                  (4 experts, 2 per token)
    qwen35        hybrid: 3 recurrent gated-delta-net layers then 1 gated attention layer
                  (full_attention_interval 4), plain FFN

The tensors each architecture needs are the ones llama.cpp b11434's loader requires
(src/models/qwen3.cpp, gemma3.cpp, openai-moe.cpp, qwen35.cpp ``load_arch_tensors``).
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

# The random-weight "demo" kind: a small llama that loads fast (tests; the demo itself is the starter model).
DEMO_FILENAME = "slotkeeper-demo-llama.gguf"

__all__ = [
    "DEMO_FILENAME",
    "MODEL_KINDS",
    "write_model",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class _Shape:
    arch: str
    name: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    context_length: int
    seed_offset: int = 0  # mixed into the seed so "llama-alt" differs from "llama"
    sliding_window: int | None = None
    n_expert: int = 0  # MoE (gpt-oss): experts per layer and experts used per token
    n_expert_used: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


_LLAMA = _Shape("llama", "Slotkeeper demo (random weights)", 4, 128, 4, 2, 256, 8192)
_KINDS: dict[str, _Shape] = {
    "llama": _LLAMA,
    "demo": _LLAMA,
    "llama-alt": _Shape(
        "llama",
        "Slotkeeper test model B (random weights)",
        4,
        128,
        4,
        2,
        256,
        8192,
        seed_offset=1_000_003,
    ),
    "gemma2": _Shape(
        "gemma2",
        "Slotkeeper test gemma2 (random weights)",
        4,
        128,
        4,
        2,
        256,
        8192,
        sliding_window=128,
    ),
    "bench": _Shape("llama", "Slotkeeper bench (random weights)", 8, 1024, 16, 8, 2816, 16384),
    # An 8B model's KV per token (128 KiB) with little compute: 8K tokens make a 1 GiB save file.
    "bench-kv": _Shape("llama", "Slotkeeper KV bench (random weights)", 128, 256, 4, 4, 256, 16384),
    "qwen3": _Shape("qwen3", "Slotkeeper test qwen3 (random weights)", 4, 128, 4, 2, 256, 2048),
    "gemma3": _Shape("gemma3", "Slotkeeper test gemma3 (random weights)", 6, 128, 4, 2, 256, 2048,
                     sliding_window=128),
    "gpt-oss": _Shape("gpt-oss", "Slotkeeper test gpt-oss (random weights)", 4, 128, 4, 2, 128, 2048,
                      sliding_window=128, n_expert=4, n_expert_used=2),
    "qwen35": _Shape("qwen35", "Slotkeeper test qwen35 hybrid (random weights)", 4, 128, 4, 2, 256, 2048),
}
# qwen35's gated delta net: key heads (ssm.group_count) x head dim (ssm.state_size), value heads
# (ssm.time_step_rank) of the same dim, so ssm.inner_size = value heads x head dim.
_GDN_CONV_KERNEL = 4
_GDN_HEAD_DIM = 32
_GDN_K_HEADS = 2
_GDN_V_HEADS = 4
_QWEN35_ATTENTION_INTERVAL = 4  # layers 0-2 recurrent, layer 3 attention

MODEL_KINDS: tuple[str, ...] = tuple(_KINDS)

_WEIGHT_STD = 0.02  # small enough that activations stay finite through every layer
_RMS_EPS = 1e-5


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

# SentencePiece's word-boundary marker: llama.cpp turns " cat" into "▁cat".
_SPACE = "\u2581"

# Common English words. SPM builds a word by merging adjacent pieces, so a word is reachable
# only if every prefix of "▁word" is a token too; _vocab() adds them all.
_WORDS = """
the be to of and a in that have i it for not on with he as you do at this but his by
from they we say her she or an will my one all would there their what so up out if about
who get which go me when make can like time no just him know take people into year your
good some could them see other than then now look only come its over think also back
after use two how our work first well way even new want because any these give day most
us is are was were been has had did does said hello hi yes thanks thank please sorry
okay model cache slot server token tokens memory save saved restore restored session
sessions chat message messages question answer world test testing example data file
files user assistant system help why where here more many much very long short big small
fast slow start stop end again still never always every each same different right left
old young great little own tell ask feel try leave call keep let put mean seem turn
begin show hear play run move live believe hold bring happen write provide sit stand
lose pay meet include continue set learn change lead understand watch follow create
speak read allow add spend grow open walk win offer remember love consider appear buy
wait serve die send expect build stay fall cut reach kill remain suggest raise pass sell
require report decide pull light night morning evening today tomorrow yesterday water
food house home city country number part place case week company group problem fact hand
point government life child world
""".split()

_CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class _Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    unk_id: int
    bos_id: int
    eos_id: int


@functools.lru_cache(maxsize=1)
def _vocab() -> _Vocab:
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(piece: str, score: float, kind: int) -> None:
        tokens.append(piece)
        scores.append(score)
        types.append(kind)

    for piece in _CONTROL:
        add(piece, 0.0, _TYPE_UNKNOWN if piece == "<unk>" else _TYPE_CONTROL)
    for byte in range(256):  # byte fallback: any UTF-8 text can be tokenized
        add(f"<0x{byte:02X}>", 0.0, _TYPE_BYTE)

    seen: set[str] = set()
    pieces: list[str] = [_SPACE]
    printable = [chr(c) for c in range(33, 127)]
    pieces += printable + [_SPACE + ch for ch in printable]
    for word in _WORDS:
        marked = _SPACE + word
        pieces += [marked[:n] for n in range(3, len(marked) + 1)]  # "▁w" is already in
        pieces.append(word)
    # Scores only order SPM merges; longer pieces score higher so whole words win.
    for index, piece in enumerate(pieces):
        if piece in seen:
            continue
        seen.add(piece)
        add(piece, float(len(piece)) - index * 1e-4, _TYPE_NORMAL)

    return _Vocab(
        tokens=tokens,
        scores=scores,
        types=types,
        unk_id=_CONTROL.index("<unk>"),
        bos_id=_CONTROL.index("<s>"),
        eos_id=_CONTROL.index("<|im_end|>"),
    )


def _add_tokenizer(writer: gguf.GGUFWriter) -> int:
    vocab = _vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_bos_token_id(vocab.bos_id)
    # <|im_end|> ends a ChatML turn, so generation stops where a chat turn ends.
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    return len(vocab.tokens)


# --------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------


def _add_hparams(writer: gguf.GGUFWriter, shape: _Shape) -> None:
    writer.add_name(shape.name)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layers)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(_RMS_EPS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if shape.arch == "llama":
        writer.add_rope_dimension_count(shape.head_dim)  # llama.cpp insists it equals head_dim
    if shape.arch in ("qwen3", "gemma3", "gpt-oss", "qwen35"):
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    if shape.arch in ("gemma3", "gpt-oss"):
        # gemma3: pattern 6 (5 sliding, 1 global); gpt-oss: pattern 2 (even layers slide).
        writer.add_sliding_window(shape.sliding_window or 128)
    if shape.n_expert:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
        writer.add_expert_feed_forward_length(shape.n_ff)
    if shape.arch == "qwen35":
        writer.add_rope_dimension_count(shape.head_dim)
        writer.add_rope_dimension_sections([6, 5, 5, 0])  # interleaved M-RoPE; text uses one position
        writer.add_ssm_conv_kernel(_GDN_CONV_KERNEL)
        writer.add_ssm_state_size(_GDN_HEAD_DIM)
        writer.add_ssm_group_count(_GDN_K_HEADS)
        writer.add_ssm_time_step_rank(_GDN_V_HEADS)
        writer.add_ssm_inner_size(_GDN_HEAD_DIM * _GDN_V_HEADS)
        writer.add_full_attention_interval(_QWEN35_ATTENTION_INTERVAL)
    if shape.arch == "gemma2":
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
        # Pattern left to llama.cpp's gemma2 default (2: even layers slide), as real
        # Gemma 2 conversions do.
        writer.add_sliding_window(shape.sliding_window or 4096)
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)


def _add_tensors(
    writer: gguf.GGUFWriter, shape: _Shape, n_vocab: int, rng: np.random.Generator
) -> None:
    """Weights in GGUF order; numpy shapes are ggml's reversed ((rows=out, cols=in))."""

    def matrix(name: str, rows: int, cols: int) -> None:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * _WEIGHT_STD
        writer.add_tensor(name, values.astype(np.float16))

    def norm(name: str) -> None:
        # llama.cpp multiplies by the stored weight (Gemma's "1 + w" is folded in at
        # conversion), so ones are a neutral norm for both architectures.
        writer.add_tensor(name, np.ones(shape.n_embd, dtype=np.float32))

    def vector(name: str, n: int, value: float | None = None) -> None:
        if value is None:
            data = rng.standard_normal(n, dtype=np.float32) * _WEIGHT_STD
        else:
            data = np.full(n, value, dtype=np.float32)
        writer.add_tensor(name, data)

    q_dim = shape.head_dim * shape.n_head
    kv_dim = shape.head_dim * shape.n_head_kv
    matrix("token_embd.weight", n_vocab, shape.n_embd)
    norm("output_norm.weight")
    if shape.arch == "gpt-oss":
        matrix("output.weight", n_vocab, shape.n_embd)  # gpt-oss requires its own output
        _add_gpt_oss_layers(writer, shape, matrix, norm, vector, rng)
        return
    if shape.arch == "qwen35":
        _add_qwen35_layers(writer, shape, matrix, norm, vector)
        return
    # No output.weight: llama, qwen3 and gemma3 tie it to token_embd; gemma2 must not have one.
    for il in range(shape.n_layers):
        blk = f"blk.{il}"
        norm(f"{blk}.attn_norm.weight")
        matrix(f"{blk}.attn_q.weight", q_dim, shape.n_embd)
        matrix(f"{blk}.attn_k.weight", kv_dim, shape.n_embd)
        matrix(f"{blk}.attn_v.weight", kv_dim, shape.n_embd)
        matrix(f"{blk}.attn_output.weight", shape.n_embd, q_dim)
        if shape.arch in ("qwen3", "gemma3"):
            vector(f"{blk}.attn_q_norm.weight", shape.head_dim, 1.0)
            vector(f"{blk}.attn_k_norm.weight", shape.head_dim, 1.0)
        if shape.arch in ("gemma2", "gemma3"):
            norm(f"{blk}.post_attention_norm.weight")
        norm(f"{blk}.ffn_norm.weight")
        matrix(f"{blk}.ffn_gate.weight", shape.n_ff, shape.n_embd)
        matrix(f"{blk}.ffn_up.weight", shape.n_ff, shape.n_embd)
        matrix(f"{blk}.ffn_down.weight", shape.n_embd, shape.n_ff)
        if shape.arch in ("gemma2", "gemma3"):
            norm(f"{blk}.post_ffw_norm.weight")


def _add_gpt_oss_layers(writer: gguf.GGUFWriter, shape: _Shape, matrix, norm, vector,
                        rng: np.random.Generator) -> None:
    """gpt-oss blocks (src/models/openai-moe.cpp): attention with sinks and an output bias,
    the post-attention norm before a MoE FFN with biased experts."""
    q_dim = shape.head_dim * shape.n_head
    kv_dim = shape.head_dim * shape.n_head_kv
    n_exp, n_ff = shape.n_expert, shape.n_ff

    def experts(name: str, rows: int, cols: int) -> None:
        values = rng.standard_normal((n_exp, rows, cols), dtype=np.float32) * _WEIGHT_STD
        writer.add_tensor(name, values.astype(np.float16))

    for il in range(shape.n_layers):
        blk = f"blk.{il}"
        norm(f"{blk}.attn_norm.weight")
        norm(f"{blk}.post_attention_norm.weight")
        matrix(f"{blk}.attn_q.weight", q_dim, shape.n_embd)
        matrix(f"{blk}.attn_k.weight", kv_dim, shape.n_embd)
        matrix(f"{blk}.attn_v.weight", kv_dim, shape.n_embd)
        matrix(f"{blk}.attn_output.weight", shape.n_embd, q_dim)
        vector(f"{blk}.attn_output.bias", shape.n_embd, 0.0)
        vector(f"{blk}.attn_sinks.weight", shape.n_head)
        matrix(f"{blk}.ffn_gate_inp.weight", n_exp, shape.n_embd)
        vector(f"{blk}.ffn_gate_inp.bias", n_exp, 0.0)
        experts(f"{blk}.ffn_gate_exps.weight", n_ff, shape.n_embd)
        experts(f"{blk}.ffn_up_exps.weight", n_ff, shape.n_embd)
        experts(f"{blk}.ffn_down_exps.weight", shape.n_embd, n_ff)
        writer.add_tensor(f"{blk}.ffn_gate_exps.bias", np.zeros((n_exp, n_ff), dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_up_exps.bias", np.zeros((n_exp, n_ff), dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_down_exps.bias", np.zeros((n_exp, shape.n_embd), dtype=np.float32))


def _add_qwen35_layers(writer: gguf.GGUFWriter, shape: _Shape, matrix, norm, vector) -> None:
    """qwen35 blocks (src/models/qwen35.cpp): gated delta net layers, then every 4th a gated
    attention layer (its Q projection also yields the gate); a plain SiLU FFN after the
    post-attention norm; no ffn_norm."""
    q_dim = shape.head_dim * shape.n_head
    kv_dim = shape.head_dim * shape.n_head_kv
    key_dim = _GDN_HEAD_DIM * _GDN_K_HEADS
    value_dim = _GDN_HEAD_DIM * _GDN_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    for il in range(shape.n_layers):
        blk = f"blk.{il}"
        norm(f"{blk}.attn_norm.weight")
        norm(f"{blk}.post_attention_norm.weight")
        if (il + 1) % _QWEN35_ATTENTION_INTERVAL == 0:
            matrix(f"{blk}.attn_q.weight", 2 * q_dim, shape.n_embd)  # query and gate
            matrix(f"{blk}.attn_k.weight", kv_dim, shape.n_embd)
            matrix(f"{blk}.attn_v.weight", kv_dim, shape.n_embd)
            matrix(f"{blk}.attn_output.weight", shape.n_embd, q_dim)
            vector(f"{blk}.attn_q_norm.weight", shape.head_dim, 1.0)
            vector(f"{blk}.attn_k_norm.weight", shape.head_dim, 1.0)
        else:
            matrix(f"{blk}.attn_qkv.weight", conv_dim, shape.n_embd)
            matrix(f"{blk}.attn_gate.weight", value_dim, shape.n_embd)
            writer.add_tensor(f"{blk}.ssm_conv1d.weight",
                              (np.ones((conv_dim, _GDN_CONV_KERNEL), dtype=np.float32) / _GDN_CONV_KERNEL))
            vector(f"{blk}.ssm_dt.bias", _GDN_V_HEADS, 0.0)
            vector(f"{blk}.ssm_a", _GDN_V_HEADS, -1.0)  # -exp(A_log): a decaying state
            matrix(f"{blk}.ssm_beta.weight", _GDN_V_HEADS, shape.n_embd)
            matrix(f"{blk}.ssm_alpha.weight", _GDN_V_HEADS, shape.n_embd)
            vector(f"{blk}.ssm_norm.weight", _GDN_HEAD_DIM, 1.0)
            matrix(f"{blk}.ssm_out.weight", shape.n_embd, value_dim)
        matrix(f"{blk}.ffn_gate.weight", shape.n_ff, shape.n_embd)
        matrix(f"{blk}.ffn_up.weight", shape.n_ff, shape.n_embd)
        matrix(f"{blk}.ffn_down.weight", shape.n_embd, shape.n_ff)


def _shape_for(kind: str) -> _Shape:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown model kind {kind!r}; known kinds: {', '.join(MODEL_KINDS)}"
        ) from None


def write_model(path: str | Path, kind: str, seed: int = 0) -> Path:
    """Write a random-weight GGUF of ``kind`` to ``path``; same (kind, seed) -> same bytes.

    The file appears atomically: it is written under a temporary name in the same folder
    and renamed, so a reader never sees half a model.
    """
    shape = _shape_for(kind)
    rng = np.random.default_rng(seed + shape.seed_offset)

    def fill(writer: gguf.GGUFWriter) -> None:
        _add_hparams(writer, shape)
        n_vocab = _add_tokenizer(writer)
        _add_tensors(writer, shape, n_vocab, rng)

    return write_gguf_atomic(path, shape.arch, fill)


def write_gguf_atomic(path: str | Path, arch: str, fill: Callable[[gguf.GGUFWriter], None]) -> Path:
    """Write a GGUF whose metadata and tensors ``fill`` adds, so that it appears whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temp name does not end in .gguf, so folder scans never pick up a partial file; the
    # writer creates it, so it gets the usual umask permissions (mkstemp would make it 0600).
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:  # including KeyboardInterrupt: never leave a .part behind
        tmp.unlink(missing_ok=True)
        raise
    return path
