"""Tiny random-weight multimodal projectors (mmproj GGUF) that llama-server loads.

Paired with a text model from ``modelgen``, they let the tests exercise sessions that hold
an image without downloading a vision model. The projector is a LLaVA-style "mlp"
projector (llama.cpp ``PROJECTOR_TYPE_MLP``): a 2-layer ViT over 56x56 images in 14x14
patches, then a two-matrix MLP into the text model's embedding width. Every image becomes
``IMAGE_TOKENS`` (16) positions in the text model's context.

The weights are random, so what the model "sees" is noise, but every byte is a function of
(n_embd_text, seed): the same call writes the same file, and another seed writes a projector
of the same shape with other weights ("another projector for the same model").

The text model needs nothing special for this projector type: llama-server puts its media
marker where the image goes and llama.cpp's mtmd splits the prompt there; the "mlp"
projector adds no begin/end-of-image tokens, so no special tokens are needed in the vocab.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from slotkeeper.core.model.modelgen import write_gguf_atomic

__all__ = [
    "IMAGE_SIZE",
    "IMAGE_TOKENS",
    "PATCH_SIZE",
    "PROJECTOR_TYPE",
    "write_projector",
]

PROJECTOR_TYPE = "mlp"  # llama.cpp PROJECTOR_TYPE_MLP (LLaVA 1.5 style)
IMAGE_SIZE = 56  # the server resizes every image to IMAGE_SIZE x IMAGE_SIZE
PATCH_SIZE = 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # text-model positions per image

_N_EMBD = 64  # vision tower width
_N_HEAD = 4
_N_FF = 96  # must differ from _N_EMBD: llama.cpp swaps ffn up/down when ffn_down is n_embd wide
_N_LAYERS = 2  # llava reads the second-to-last layer, so one of them runs
_LN_EPS = 1e-5
_WEIGHT_STD = 0.02
# CLIP's normalisation constants, as real LLaVA projectors carry them.
_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
_SEED_OFFSET = 7_000_003  # projector weights never repeat a text model's for the same seed


def _add_hparams(writer: gguf.GGUFWriter, n_embd_text: int) -> None:
    # Key names as llama.cpp's clip loader reads them (tools/mtmd/clip-impl.h).
    writer.add_name("Slotkeeper test projector (random weights)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_string("clip.projector_type", PROJECTOR_TYPE)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    writer.add_uint32("clip.vision.embedding_length", _N_EMBD)
    writer.add_uint32("clip.vision.feed_forward_length", _N_FF)
    writer.add_uint32("clip.vision.block_count", _N_LAYERS)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", _N_HEAD)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", _LN_EPS)
    writer.add_array("clip.vision.image_mean", list(_IMAGE_MEAN))
    writer.add_array("clip.vision.image_std", list(_IMAGE_STD))


def _add_tensors(writer: gguf.GGUFWriter, n_embd_text: int, rng: np.random.Generator) -> None:
    """Weights in GGUF order; numpy shapes are ggml's reversed ((rows=out, cols=in))."""

    def weight(name: str, *shape: int) -> None:
        values = rng.standard_normal(shape, dtype=np.float32) * _WEIGHT_STD
        writer.add_tensor(name, values.astype(np.float16))

    def bias(name: str, n: int) -> None:
        writer.add_tensor(name, np.zeros(n, dtype=np.float32))

    def norm(prefix: str) -> None:
        writer.add_tensor(f"{prefix}.weight", np.ones(_N_EMBD, dtype=np.float32))
        bias(f"{prefix}.bias", _N_EMBD)

    # ggml conv2d kernel [patch, patch, 3, n_embd] (ggml order) -> numpy reversed.
    weight("v.patch_embd.weight", _N_EMBD, 3, PATCH_SIZE, PATCH_SIZE)
    bias("v.patch_embd.bias", _N_EMBD)
    weight("v.position_embd.weight", IMAGE_TOKENS, _N_EMBD)  # no class token
    for il in range(_N_LAYERS):
        blk = f"v.blk.{il}"
        norm(f"{blk}.ln1")
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            weight(f"{blk}.{part}.weight", _N_EMBD, _N_EMBD)
            bias(f"{blk}.{part}.bias", _N_EMBD)
        norm(f"{blk}.ln2")
        weight(f"{blk}.ffn_up.weight", _N_FF, _N_EMBD)
        bias(f"{blk}.ffn_up.bias", _N_FF)
        weight(f"{blk}.ffn_down.weight", _N_EMBD, _N_FF)
        bias(f"{blk}.ffn_down.bias", _N_EMBD)
    # LLaVA projector: mm.0 (vision -> text width), GELU, mm.2 (text -> text width).
    # llama.cpp takes the projector's output width from mm.2 and refuses a text model
    # of another n_embd.
    weight("mm.0.weight", n_embd_text, _N_EMBD)
    bias("mm.0.bias", n_embd_text)
    weight("mm.2.weight", n_embd_text, n_embd_text)
    bias("mm.2.bias", n_embd_text)


def write_projector(path: str | Path, n_embd_text: int, seed: int = 0) -> Path:
    """Write a random-weight mmproj GGUF for a text model ``n_embd_text`` wide to ``path``.

    Same (n_embd_text, seed) -> same bytes. The file appears atomically: it is written
    under a temporary name in the same folder and renamed.
    """
    if n_embd_text <= 0:
        raise ValueError(f"n_embd_text must be positive, not {n_embd_text}")
    rng = np.random.default_rng(seed + _SEED_OFFSET)

    def fill(writer: gguf.GGUFWriter) -> None:
        _add_hparams(writer, n_embd_text)
        _add_tensors(writer, n_embd_text, rng)

    return write_gguf_atomic(path, "clip", fill)
