"""The random-weight projector generator: deterministic bytes, the shape llama.cpp reads."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import pytest

from projgen import IMAGE_SIZE, IMAGE_TOKENS, PATCH_SIZE, write_projector


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_width_and_seed_give_identical_bytes(tmp_path: Path) -> None:
    a = write_projector(tmp_path / "a.gguf", 128, seed=3)
    b = write_projector(tmp_path / "b.gguf", 128, seed=3)
    assert a.read_bytes() == b.read_bytes()


def test_seed_changes_the_weights_not_the_size(tmp_path: Path) -> None:
    a = write_projector(tmp_path / "a.gguf", 128, seed=0)
    b = write_projector(tmp_path / "b.gguf", 128, seed=1)
    assert sha(a) != sha(b)
    assert a.stat().st_size == b.stat().st_size


def test_keys_and_output_width(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_projector(tmp_path / "p.gguf", 96))
    fields = reader.fields
    assert fields["general.architecture"].contents() == "clip"
    assert fields["clip.projector_type"].contents() == "mlp"
    assert fields["clip.has_vision_encoder"].contents() is True
    assert fields["clip.vision.image_size"].contents() == IMAGE_SIZE
    assert fields["clip.vision.patch_size"].contents() == PATCH_SIZE
    assert len(fields["clip.vision.image_mean"].contents()) == 3
    assert IMAGE_TOKENS == (IMAGE_SIZE // PATCH_SIZE) ** 2 == 16
    tensors = {t.name: t for t in reader.tensors}
    # llama.cpp takes the projector's output width from mm.2 (ggml order: [in, out]).
    assert list(tensors["mm.2.weight"].shape) == [96, 96]
    assert list(tensors["v.position_embd.weight"].shape)[1] == IMAGE_TOKENS


def test_written_atomically(tmp_path: Path) -> None:
    write_projector(tmp_path / "sub" / "p.gguf", 128)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["p.gguf"]


def test_rejects_a_zero_width(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_projector(tmp_path / "p.gguf", 0)
    assert not list(tmp_path.iterdir())
