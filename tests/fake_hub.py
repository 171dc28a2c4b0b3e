"""A local stand-in for the Hugging Face Hub's download API, on 127.0.0.1 only.

It answers the requests ``huggingface_hub.hf_hub_download`` makes, as the Hub does for a file
stored with LFS:

    HEAD/GET {endpoint}/{repo}/resolve/{revision}/{filename}
        302 to the CDN, with X-Repo-Commit (the commit), X-Linked-Etag (the file's sha256),
        X-Linked-Size, and ETag; 401 + X-Error-Code: RepoNotFound for an unknown repository;
        404 + X-Error-Code: EntryNotFound for an unknown file.
    GET {cdn}/blobs/{sha256}
        the bytes, honouring "Range: bytes=N-" with 206 and Content-Range.

The CDN listens on a second port: huggingface_hub follows redirects that stay on the Hub's
own origin, and the real CDN is another host.

Faults, set per file: ``drop_after`` (the next GET closes the connection after that many
bytes), ``corrupt`` (one byte of what is served differs from the file the sha256 describes),
``chunk_delay`` (seconds between 64 KiB chunks, to give a cancel time) and ``ignore_range``
(answer 200 with the whole file to a Range request). Every request is logged in ``requests``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web

SERVE_CHUNK = 64 * 1024


def isolate_huggingface_hub(monkeypatch, tmp_path) -> None:
    """Keep huggingface_hub off the user's folders and off the internet: with telemetry on, it
    fetches a registry from huggingface.co while building request headers."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)


@dataclass
class HubFile:
    repo_id: str
    filename: str
    data: bytes
    commit: str
    sha256: str
    drop_after: int | None = None  # one-shot
    corrupt: bool = False
    chunk_delay: float = 0.0
    ignore_range: bool = False

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass
class Request:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    user_agent: str = ""
    authorization: str | None = None
    status: int = 0


@dataclass
class FakeHub:
    files: dict[tuple[str, str], HubFile] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    endpoint: str = ""
    cdn: str = ""

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self._lock = threading.Lock()

    # -- content --------------------------------------------------------------------------
    def add_file(self, repo_id: str, filename: str, data: bytes, commit: str | None = None) -> HubFile:
        commit = commit or hashlib.sha1(f"{repo_id}@{len(self.files)}".encode()).hexdigest()
        f = HubFile(repo_id, filename, data, commit, hashlib.sha256(data).hexdigest())
        self.files[(repo_id, filename)] = f
        return f

    def requests_to(self, server: str, method: str = "GET") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.server == server and r.method == method]

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> FakeHub:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start_sites())
            except BaseException as exc:  # reported to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop_sites())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-hub", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _start_sites(self) -> None:
        hub = web.Application()
        hub.router.add_route("*", "/{owner}/{name}/resolve/{revision}/{filename:.+}", self._resolve)
        cdn = web.Application()
        cdn.router.add_route("*", "/blobs/{sha}", self._blob)
        for app, attr in ((hub, "endpoint"), (cdn, "cdn")):
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            setattr(self, attr, f"http://127.0.0.1:{port}")
            self._runners.append(runner)

    async def _stop_sites(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def _log(self, server: str, request: web.Request) -> Request:
        entry = Request(server, request.method, request.path, request.headers.get("Range"),
                        request.headers.get("User-Agent", ""), request.headers.get("Authorization"))
        with self._lock:
            self.requests.append(entry)
        return entry

    # -- handlers -------------------------------------------------------------------------
    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        entry = self._log("hub", request)
        m = request.match_info
        repo_id = f"{m['owner']}/{m['name']}"
        if not any(r == repo_id for r, _ in self.files):
            entry.status = 401
            return web.Response(status=401, headers={"X-Error-Code": "RepoNotFound",
                                                     "X-Error-Message": "Repository not found"})
        f = self.files.get((repo_id, m["filename"]))
        commit = next(v.commit for (r, _), v in self.files.items() if r == repo_id)
        if f is None:
            entry.status = 404
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit,
                                                     "X-Error-Message": "Entry not found"})
        if m["revision"] not in ("main", f.commit):
            entry.status = 404
            return web.Response(status=404, headers={"X-Error-Code": "RevisionNotFound",
                                                     "X-Error-Message": "Revision not found"})
        entry.status = 302
        return web.Response(status=302, headers={
            "Location": f"{self.cdn}/blobs/{f.sha256}?signed=1",
            "X-Repo-Commit": f.commit,
            "X-Linked-Etag": f'"{f.sha256}"',
            "X-Linked-Size": str(len(f.data)),
            "ETag": f'"{f.git_oid}"',
            "Accept-Ranges": "bytes",
        })

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        entry = self._log("cdn", request)
        f = next((v for v in self.files.values() if v.sha256 == request.match_info["sha"]), None)
        if f is None:
            entry.status = 404
            return web.Response(status=404)
        data = f.data
        if f.corrupt:
            mid = len(data) // 2
            data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]
        start = 0
        status = 200
        headers = {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        rng = request.headers.get("Range")
        if rng and not f.ignore_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                entry.status = 416
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        entry.status = status
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        drop_after, f.drop_after = f.drop_after, None
        sent = 0
        for i in range(0, len(body), SERVE_CHUNK):
            piece = body[i:i + SERVE_CHUNK]
            if drop_after is not None and sent + len(piece) > drop_after:
                await resp.write(piece[:drop_after - sent])
                assert request.transport is not None
                request.transport.abort()  # the connection drops mid-file
                return resp
            await resp.write(piece)
            sent += len(piece)
            if f.chunk_delay:
                await asyncio.sleep(f.chunk_delay)
        await resp.write_eof()
        return resp


# -- one generated model served the same way by every download test --------------------------
REPO = "test-org/tiny-llama-GGUF"
FILE = "tiny-llama-Q8_0.gguf"


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    """A tiny generated GGUF (modelgen's "llama"), the file the local Hub serves."""
    from slotkeeper.core.model.modelgen import write_model

    return write_model(tmp_path_factory.mktemp("gen") / "m.gguf", "llama").read_bytes()


@pytest.fixture
def hub(model_bytes):
    """A local Hub serving ``model_bytes`` as REPO/FILE."""
    with FakeHub() as server:
        server.add_file(REPO, FILE, model_bytes)
        yield server
