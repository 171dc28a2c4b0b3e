"""`slotkeeper models list-curated` and `slotkeeper models download` (against a local fake Hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_hub import FakeHub, isolate_huggingface_hub
from slotkeeper.cli.commands import main
from slotkeeper.core.model.model_catalog import CATALOG, find_curated
from slotkeeper.core.model.modelgen import write_model

REPO = "test-org/tiny-llama-GGUF"
FILE = "tiny-llama-Q8_0.gguf"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    data = write_model(tmp_path / "m.gguf", "llama").read_bytes()
    with FakeHub() as server:
        server.add_file(REPO, FILE, data)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        isolate_huggingface_hub(monkeypatch, tmp_path)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        yield server, data


def test_list_curated_shows_every_model(capsys):
    assert main(["models", "list-curated"]) == 0
    out = capsys.readouterr().out
    for m in CATALOG:
        assert m.id in out and m.title in out
    assert "needs --swa-full" in out and "MEMORY @ 8192" in out


def test_list_curated_json_matches_the_catalog(capsys):
    assert main(["models", "list-curated", "--json", "--ctx", "16384"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    need = find_curated("qwen3-8b").memory_need(16384)
    assert rows["qwen3-8b"]["memory_bytes"] == need.total and rows["qwen3-8b"]["context"] == 16384
    assert rows["gpt-oss-20b"]["memory_bytes_swa_full"] > rows["gpt-oss-20b"]["memory_bytes"]
    assert rows["llama3.2-3b"]["restore_mode"] == "works"


def test_download_prints_progress_and_the_path(hub, capsys, tmp_path):
    _server, data = hub
    assert main(["models", "download", REPO, FILE]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    assert path.read_bytes() == data
    assert path.is_relative_to(tmp_path / "hf-cache")
    assert f"downloading {REPO}/{FILE}" in captured.err and "100.0%" in captured.err


def test_download_refuses_a_corrupted_file(hub, capsys):
    server, _data = hub
    server.files[(REPO, FILE)].corrupt = True
    assert main(["models", "download", REPO, FILE, "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "not the Hub's file" in captured.err


def test_download_of_an_unknown_curated_id_is_a_usage_error(capsys):
    assert main(["models", "download", "no-such-model"]) == 2
    assert "qwen3-4b" in capsys.readouterr().err


def test_download_logs_no_http_requests_unless_verbose(hub, tmp_path):
    # The app's own process: the levels are set by main(), before any HTTP client is imported.
    import os
    import subprocess
    import sys

    def download(*flags: str) -> str:
        env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / f"cache{flags}")}
        done = subprocess.run([sys.executable, "-m", "slotkeeper", "models", "download", *flags, REPO, FILE],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert "HTTP Request" not in download("--quiet")
    verbose = download("-v")
    assert "httpx: HTTP Request: GET" in verbose and "httpx2: HTTP Request: HEAD" in verbose, verbose


def test_the_models_default_context_is_the_catalogs():
    from slotkeeper.cli import models as models_cli
    from slotkeeper.core.model import model_catalog

    assert models_cli.DEFAULT_CTX == model_catalog.DEFAULT_CTX
