"""Conversations with images through Slotkeeper, against the real llama-server with a projector.

A session holding an image is saved with its projector's SHA-256 and restored only into a
server running that projector: without one llama-server refuses the file and empties the
slot doing so; with another projector of the same shape it would reuse image cells that
projector never computed (tests/e2e/test_mmproj_server.py measures both).
"""

from __future__ import annotations

import hashlib

import pytest
from e2e_helpers import chat, wait_until
from test_mmproj_server import IMAGE_URL
from test_persistence import serve, sessions, stop

from projgen import IMAGE_TOKENS, write_projector
from slotkeeper.core.model.modelgen import write_model

pytestmark = pytest.mark.e2e


def _image_turn(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}


def _answer(reply: dict) -> dict:
    return {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}


def test_an_image_conversation_resumes_only_with_its_projector(server_bin, port, isolated_home, tmp_path):
    model = write_model(tmp_path / "vision-model.gguf", "llama")
    projector = write_projector(tmp_path / "mmproj-vision-model.gguf", 128, seed=0)
    other = write_projector(tmp_path / "mmproj-other.gguf", 128, seed=1)
    turn1 = [_image_turn("What is in this picture?")]

    proc, url = serve(isolated_home, model, server_bin, port, "--mmproj", str(projector))
    try:
        first = chat(url, turn1, max_tokens=8)
        n_prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
        assert n_prompt > IMAGE_TOKENS
        [saved] = wait_until(lambda: [s for s in sessions(isolated_home) if s.sidecar.n_tokens >= n_prompt],
                             what="the idle save")
    finally:
        stop(proc)
    sc = saved.sidecar
    assert sc.n_media == 1
    assert sc.mmproj_sha256 == hashlib.sha256(projector.read_bytes()).hexdigest()
    follow = [*turn1, _answer(first), _image_turn("And the colours?")]

    # Another projector of the same shape: llama-server would take the file and reuse the image's
    # cells; Slotkeeper leaves it on disk, and the conversation read by this projector is saved
    # beside it, never over it.
    proc, url = serve(isolated_home, model, server_bin, port, "--mmproj", str(other))
    try:
        cold = chat(url, follow, max_tokens=8)
    finally:
        stop(proc)
    assert cold["timings"]["cache_n"] == 0
    by_id = {s.sidecar.id: s.sidecar for s in sessions(isolated_home)}
    assert by_id[sc.id].mmproj_sha256 == sc.mmproj_sha256 and by_id[sc.id].content_hash == sc.content_hash
    other_sha = hashlib.sha256(other.read_bytes()).hexdigest()
    # both turns show it
    assert [s for s in by_id.values() if s.mmproj_sha256 == other_sha and s.n_media == 2]

    # No projector: not restored (llama-server would refuse it and empty the slot doing so).
    proc, url = serve(isolated_home, model, server_bin, port)
    try:
        text_only = chat(url, [{"role": "user", "content": "hello there, a text question"}], max_tokens=8)
    finally:
        stop(proc)
    assert text_only["timings"]["prompt_n"] > 0
    assert {s.sidecar.id: s.sidecar for s in sessions(isolated_home)}[sc.id].content_hash == sc.content_hash

    # Its own projector: resumed (the most recent session is the text one, so ask for it), and
    # the next turn reads the image from the cache.
    proc, url = serve(isolated_home, model, server_bin, port, "--mmproj", str(projector), "--resume", sc.id)
    try:
        warm = chat(url, follow, max_tokens=8)
    finally:
        stop(proc)
    assert warm["timings"]["cache_n"] >= n_prompt
    entry = next(s for s in sessions(isolated_home) if s.sidecar.id == sc.id)
    assert entry.sidecar.last_restore is not None and entry.sidecar.last_restore.effective


def test_a_projector_chosen_as_the_model_is_refused_with_a_clear_message(server_bin, port, isolated_home,
                                                                         tmp_path):
    projector = write_projector(tmp_path / "mmproj-x.gguf", 128)
    with pytest.raises(AssertionError, match="is a multimodal projector \\(mmproj\\), not a language model"):
        serve(isolated_home, projector, server_bin, port)
    model = write_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(AssertionError, match="m.gguf is not a multimodal projector"):
        serve(isolated_home, model, server_bin, port, "--mmproj", str(model))
