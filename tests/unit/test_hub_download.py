"""Downloads from a local server that speaks the Hub's download API (tests/fake_hub.py).

The served file is a model core.model.modelgen generates; every test checks the bytes that land in
the Hugging Face cache against it, and that huggingface_hub itself finds them there.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from fake_hub import FILE, REPO, FakeHub, isolate_huggingface_hub
from slotkeeper.core.model.hub_download import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadError,
    DownloadProgress,
    HubDownloader,
    cached_file,
    hub_cache_dir,
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    isolate_huggingface_hub(monkeypatch, tmp_path)
    return tmp_path / "hf-cache"


def downloader(hub: FakeHub, cache: Path) -> HubDownloader:
    return HubDownloader(cache_dir=cache, endpoint=hub.endpoint, token=False, retry_delay=0)


def storage(cache: Path) -> Path:
    return cache / "models--test-org--tiny-llama-GGUF"


def test_download_lands_in_the_hf_cache_layout_and_huggingface_hub_finds_it(hub, cache, model_bytes):
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    f = hub.files[(REPO, FILE)]
    reports: list[DownloadProgress] = []
    path = downloader(hub, cache).download(REPO, FILE, on_progress=reports.append)

    assert path == storage(cache) / "snapshots" / f.commit / FILE
    assert path.is_symlink() and os.readlink(path) == os.path.join("..", "..", "blobs", f.sha256)
    assert (storage(cache) / "blobs" / f.sha256).read_bytes() == model_bytes
    assert (storage(cache) / "refs" / "main").read_text() == f.commit
    assert not list((storage(cache) / "blobs").glob("*.incomplete"))
    assert reports[-1].phase == "done" and reports[-1].done == reports[-1].total == len(model_bytes)
    # Other tools read the same cache without a network call.
    assert Path(try_to_load_from_cache(REPO, FILE, cache_dir=cache)) == path
    assert Path(hf_hub_download(REPO, FILE, cache_dir=cache, local_files_only=True)) == path
    assert cached_file(REPO, FILE, cache_dir=cache) == path


def test_the_token_goes_to_the_hub_and_never_to_the_cdn(hub, cache):
    d = HubDownloader(cache_dir=cache, endpoint=hub.endpoint, token="hf_secret", retry_delay=0)
    d.download(REPO, FILE)
    (head,) = hub.requests_to("hub", "HEAD")
    (get,) = hub.requests_to("cdn")
    assert head.authorization == "Bearer hf_secret"
    assert get.authorization is None
    assert "slotkeeper/" in head.user_agent and "slotkeeper/" in get.user_agent


def test_a_file_already_in_the_cache_is_not_downloaded_again(hub, cache):
    d = downloader(hub, cache)
    first = d.download(REPO, FILE)
    gets = len(hub.requests_to("cdn"))
    assert d.download(REPO, FILE) == first
    assert len(hub.requests_to("cdn")) == gets == 1


def test_a_commit_revision_downloads_that_commit_without_a_ref(hub, cache, model_bytes):
    f = hub.files[(REPO, FILE)]
    path = downloader(hub, cache).download(REPO, FILE, revision=f.commit)
    assert path.read_bytes() == model_bytes and path.parent.name == f.commit
    assert not (storage(cache) / "refs").exists()
    assert cached_file(REPO, FILE, revision=f.commit, cache_dir=cache) == path
    assert cached_file(REPO, FILE, revision="main", cache_dir=cache) is None
    with pytest.raises(DownloadError, match="no revision 'v9'"):
        downloader(hub, cache).download(REPO, FILE, revision="v9")


def test_huggingface_hub_downloads_the_same_file_from_the_fake_hub(hub, tmp_path, model_bytes, cache):
    # The fake server speaks the protocol huggingface_hub expects (so the other tests mean something).
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(REPO, FILE, cache_dir=tmp_path / "other", endpoint=hub.endpoint, token=False)
    assert Path(path).read_bytes() == model_bytes


def test_an_interrupted_download_continues_with_a_range_request(hub, cache, model_bytes):
    f = hub.files[(REPO, FILE)]
    cut = len(model_bytes) // 3 + 123
    f.drop_after = cut
    path = downloader(hub, cache).download(REPO, FILE)

    assert path.read_bytes() == model_bytes
    gets = hub.requests_to("cdn")
    assert [g.range for g in gets] == [None, f"bytes={cut}-"]
    assert [g.status for g in gets] == [200, 206]


def test_a_cancelled_download_keeps_its_bytes_and_the_next_one_continues(hub, cache, model_bytes):
    f = hub.files[(REPO, FILE)]
    f.chunk_delay = 0.02
    cancel = threading.Event()

    def on_progress(p: DownloadProgress) -> None:
        if p.done >= 256 * 1024:
            cancel.set()

    d = downloader(hub, cache)
    with pytest.raises(DownloadCancelled) as info:
        d.download(REPO, FILE, on_progress=on_progress, cancel=cancel)
    kept = info.value.kept_bytes
    partial = storage(cache) / "blobs" / f"{f.sha256}.incomplete"
    assert 256 * 1024 <= kept < len(model_bytes)
    assert partial.stat().st_size == kept
    assert "kept" in str(info.value)
    assert cached_file(REPO, FILE, cache_dir=cache) is None  # nothing looks finished
    assert not (storage(cache) / "blobs" / f.sha256).exists()

    f.chunk_delay = 0
    reports: list[DownloadProgress] = []
    path = d.download(REPO, FILE, on_progress=reports.append)
    assert path.read_bytes() == model_bytes
    assert hub.requests_to("cdn")[-1].range == f"bytes={kept}-"
    assert any(r.phase == "downloading" and r.resumed_from == kept for r in reports)
    assert not partial.exists()


def test_a_corrupted_file_is_refused_and_not_left_in_the_cache(hub, cache):
    from huggingface_hub import try_to_load_from_cache

    f = hub.files[(REPO, FILE)]
    f.corrupt = True
    with pytest.raises(ChecksumMismatch) as info:
        downloader(hub, cache).download(REPO, FILE)
    message = str(info.value)
    assert f.sha256 in message and "deleted" in message
    blobs = storage(cache) / "blobs"
    assert not blobs.exists() or list(blobs.iterdir()) == []
    assert not list((storage(cache) / "snapshots").rglob(FILE))
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache) is None
    assert cached_file(REPO, FILE, cache_dir=cache) is None


def test_a_corrupted_tail_after_a_resume_is_refused(hub, cache, model_bytes):
    # The part kept from the first attempt is hashed too: damage in either part is caught.
    f = hub.files[(REPO, FILE)]
    f.drop_after = len(model_bytes) // 4
    f.corrupt = True
    with pytest.raises(ChecksumMismatch):
        downloader(hub, cache).download(REPO, FILE)
    assert [g.status for g in hub.requests_to("cdn")] == [200, 206]
    assert not list((storage(cache) / "blobs").iterdir())


def test_a_partial_file_with_damaged_bytes_is_caught_after_resuming(hub, cache, model_bytes):
    f = hub.files[(REPO, FILE)]
    blobs = storage(cache) / "blobs"
    blobs.mkdir(parents=True)
    damaged = bytearray(model_bytes[:5000])
    damaged[10] ^= 0xFF
    (blobs / f"{f.sha256}.incomplete").write_bytes(bytes(damaged))
    with pytest.raises(ChecksumMismatch):
        downloader(hub, cache).download(REPO, FILE)
    assert hub.requests_to("cdn")[0].range == "bytes=5000-"
    assert not list(blobs.iterdir())
    # and the next attempt starts clean and succeeds
    assert downloader(hub, cache).download(REPO, FILE).read_bytes() == model_bytes


def test_a_server_that_ignores_range_gets_the_whole_file_again(hub, cache, model_bytes):
    f = hub.files[(REPO, FILE)]
    f.drop_after = 100_000
    f.ignore_range = True
    path = downloader(hub, cache).download(REPO, FILE)
    assert path.read_bytes() == model_bytes
    assert [g.status for g in hub.requests_to("cdn")] == [200, 200]


def test_unknown_repository_and_file_are_said_plainly(hub, cache):
    d = downloader(hub, cache)
    with pytest.raises(DownloadError, match="no repository test-org/nope"):
        d.download("test-org/nope", FILE)
    with pytest.raises(DownloadError, match="has no file 'missing.gguf'"):
        d.download(REPO, "missing.gguf")
    with pytest.raises(DownloadError, match="not a Hugging Face repository name"):
        d.download("../etc", FILE)
    with pytest.raises(DownloadError, match="not a file name"):
        d.download(REPO, "../../escape.gguf")


def test_an_unreachable_hub_is_an_error_unless_the_file_is_cached(hub, cache, model_bytes):
    path = downloader(hub, cache).download(REPO, FILE)
    endpoint = hub.endpoint
    hub.stop()
    offline = HubDownloader(cache_dir=cache, endpoint=endpoint, token=False, retry_delay=0)
    assert offline.download(REPO, FILE) == path
    with pytest.raises(DownloadError, match="cannot reach"):
        HubDownloader(cache_dir=cache.parent / "empty", endpoint=endpoint, token=False).download(REPO, FILE)


def test_cache_dir_follows_huggingface_hub_environment():
    assert hub_cache_dir({"HF_HUB_CACHE": "/x/hub"}) == Path("/x/hub")
    assert hub_cache_dir({"HF_HOME": "/y"}) == Path("/y/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/z"}) == Path("/z/huggingface/hub")
    assert hub_cache_dir({}) == Path.home() / ".cache" / "huggingface" / "hub"


def test_git_blob_ids_verify_small_files():
    # Files the Hub keeps in git (not LFS) are named by their git object id.
    from slotkeeper.core.model.hub_download import _Hasher

    data = b"hello\n"
    h = _Hasher("git-sha1", len(data))
    h.update(data)
    assert (h.hexdigest() == hashlib.sha1(b"blob 6\0hello\n").hexdigest()
            == "ce013625030ba8dba906f756967f9e9ca394464a")


def test_huggingface_hub_telemetry_is_off_unless_the_user_turned_it_on() -> None:
    import subprocess
    import sys

    code = ("import slotkeeper.core.model.hub_download, huggingface_hub.constants as c; "
            "print(c.HF_HUB_DISABLE_TELEMETRY)")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_TELEMETRY"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "True"
    chosen = subprocess.run([sys.executable, "-c", code], env={**env, "HF_HUB_DISABLE_TELEMETRY": "0"},
                            capture_output=True, text=True, check=True)
    assert chosen.stdout.strip() == "False"
