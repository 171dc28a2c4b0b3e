"""Download a model file from the Hugging Face Hub into the Hugging Face cache other tools share.

The file lands where ``huggingface_hub.hf_hub_download`` would put it, in the same layout::

    <HF cache>/models--<owner>--<name>/
        blobs/<sha256>                      the file's bytes, named by its checksum
        blobs/<sha256>.incomplete           a download in progress (resumable)
        snapshots/<commit>/<filename>       a relative link to the blob
        refs/<revision>                     the commit the revision pointed at

so ``hf_hub_download``, ``hf cache ls``, llama.cpp's ``-hf`` and Slotkeeper's own model discovery
all see it, and a file already there is not downloaded again.

Why not ``hf_hub_download`` itself: it writes into a temporary file with a random name and
deletes it on any failure, so a cancelled or interrupted multi-gigabyte download starts over
from zero; it offers no way to cancel but raising from a progress bar; and it checks the size,
not the content. Here ``huggingface_hub`` asks the Hub for the file's metadata (the HEAD
request, with its error mapping, token and endpoint handling) and the bytes are streamed with
httpx: a partial file keeps a fixed name, a later attempt continues it with an HTTP Range
request, and the finished file's SHA-256 must equal the Hub's (the LFS object id the Hub sends
as ``X-Linked-Etag``) before it is moved into place. A file whose checksum differs is deleted,
never left where a reader would take it for the real one.

Everything here blocks; the GUI runs it on a worker thread. Cancel with a ``threading.Event``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlparse

import httpx

from slotkeeper.core.basics.units import human_bytes

# Slotkeeper talks to the Hub only to download the file asked for: huggingface_hub's telemetry and
# its other side requests stay off unless the user turned them on (it reads this once, at import,
# which is later than this: only this module imports it, and only when a download starts).
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

log = logging.getLogger(__name__)

__all__ = [
    "ChecksumMismatch",
    "DownloadCancelled",
    "DownloadError",
    "DownloadProgress",
    "HubDownloader",
    "RemoteFile",
    "cached_file",
    "hub_cache_dir",
    "hub_endpoint",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
CHUNK_BYTES = 1 << 20
PROGRESS_INTERVAL_S = 0.1
# Attempts in a row that bring no new bytes before giving up (a byte received resets the count).
MAX_ATTEMPTS_WITHOUT_PROGRESS = 5
RETRY_DELAY_S = 1.0
RETRY_DELAY_MAX_S = 30.0
LOCK_POLL_S = 0.5
TIMEOUT = httpx.Timeout(connect=15.0, read=30.0, write=30.0, pool=15.0)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class DownloadError(Exception):
    """A download that did not produce a verified file; ``str(err)`` is written for people."""


class DownloadCancelled(DownloadError):
    """Stopped on request. ``kept_bytes`` of the file stay on disk for the next attempt to continue."""

    def __init__(self, message: str, kept_bytes: int = 0) -> None:
        super().__init__(message)
        self.kept_bytes = kept_bytes


class ChecksumMismatch(DownloadError):
    """The bytes received are not the file the Hub describes; they were deleted."""


@dataclass(frozen=True)
class RemoteFile:
    """What the Hub says about one file at one revision."""

    repo_id: str
    filename: str
    revision: str
    commit_hash: str
    etag: str  # the LFS sha256 for large files; the git blob id for small ones
    size: int | None
    url: str  # where the bytes are (the Hub, or the CDN it redirects to)

    @property
    def checksum_kind(self) -> str:
        if _SHA256.match(self.etag):
            return "sha256"
        if _GIT_SHA1.match(self.etag):
            return "git-sha1"
        return "none"


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report. phase: "checking" (hashing a partial file before continuing it),
    "downloading", or "done"."""

    phase: str
    done: int
    total: int | None
    resumed_from: int = 0

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)


ProgressCallback = Callable[[DownloadProgress], None]


# --------------------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------------------


def hub_endpoint(env: Mapping[str, str] | None = None) -> str:
    """The Hub's address: $HF_ENDPOINT (a mirror, or a local test server) or huggingface.co.

    Read at call time (``huggingface_hub.constants`` reads it once, at import).
    """
    env = os.environ if env is None else env
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache as huggingface_hub resolves it: $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE,
    $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    env = os.environ if env is None else env

    def path(name: str) -> Path | None:
        value = env.get(name)
        return Path(os.path.expandvars(value)).expanduser() if value else None

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if (p := path(name)) is not None:
            return p
    if (home := path("HF_HOME")) is not None:
        return home / "hub"
    if (xdg := path("XDG_CACHE_HOME")) is not None:
        return xdg / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """``models--owner--name``, as huggingface_hub's repo_folder_name names a model repository."""
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def cached_file(repo_id: str, filename: str, revision: str = DEFAULT_REVISION,
                cache_dir: Path | None = None) -> Path | None:
    """The file already in the cache for ``revision`` (a branch, tag or commit), or None."""
    storage = repo_folder(cache_dir or hub_cache_dir(), repo_id)
    commit = revision
    if not _GIT_SHA1.match(revision):
        try:
            commit = (storage / "refs" / revision).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    pointer = storage / "snapshots" / commit / Path(*filename.split("/"))
    return pointer if pointer.is_file() else None


def _check_names(repo_id: str, filename: str, revision: str) -> None:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(re.fullmatch(r"[\w.\-]+", p) for p in parts) or ".." in repo_id:
        raise DownloadError(f"{repo_id!r} is not a Hugging Face repository name (expected owner/name)")
    segments = filename.split("/")
    if (not filename or filename.startswith("/") or "\\" in filename
            or any(s in ("", ".", "..") for s in segments)):
        raise DownloadError(f"{filename!r} is not a file name inside a repository")
    if not revision or ".." in revision or revision.startswith("/"):
        raise DownloadError(f"{revision!r} is not a revision")


# --------------------------------------------------------------------------------------
# The downloader
# --------------------------------------------------------------------------------------


class HubDownloader:
    """Downloads files into one Hugging Face cache from one Hub endpoint.

    cache_dir / endpoint default to what huggingface_hub would use (read from the environment
    when the downloader is made). ``token`` is passed to huggingface_hub: None uses the token
    saved by ``hf auth login`` or $HF_TOKEN, False sends none.
    """

    def __init__(self, cache_dir: Path | str | None = None, endpoint: str | None = None,
                 token: str | bool | None = None, retry_delay: float = RETRY_DELAY_S,
                 timeout: httpx.Timeout = TIMEOUT) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
        self.endpoint = (endpoint or hub_endpoint()).rstrip("/")
        self.token = token
        self.retry_delay = retry_delay
        self.timeout = timeout

    # -- metadata -------------------------------------------------------------------------
    def fetch_metadata(self, repo_id: str, filename: str, revision: str = DEFAULT_REVISION) -> RemoteFile:
        """Ask the Hub about the file (a HEAD on /{repo}/resolve/{revision}/{filename})."""
        _check_names(repo_id, filename, revision)
        # Submodules by name: the package's __init__ loads its names lazily, which a frozen
        # app's import analysis (PyInstaller) cannot follow.
        from huggingface_hub import errors as hf_errors
        from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        where = f"{repo_id}/{filename}"
        try:
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint, **_library())
        except hf_errors.GatedRepoError:
            raise DownloadError(f"{repo_id} is gated: accept its terms on the Hub, then log in with "
                                "`hf auth login`") from None
        except hf_errors.RepositoryNotFoundError:
            raise DownloadError(f"no repository {repo_id} on {self.endpoint} (or it is private: log in "
                                "with `hf auth login`)") from None
        except hf_errors.RevisionNotFoundError:
            raise DownloadError(f"{repo_id} has no revision {revision!r}") from None
        except hf_errors.RemoteEntryNotFoundError:
            raise DownloadError(f"{repo_id} has no file {filename!r} at {revision}") from None
        except hf_errors.OfflineModeIsEnabled:
            raise DownloadError("downloads are turned off (HF_HUB_OFFLINE is set)") from None
        except hf_errors.HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise DownloadError(f"the Hub answered HTTP {status} for {where}") from exc
        except Exception as exc:  # the network layer's own errors (its types depend on the version)
            raise DownloadError(f"cannot reach {self.endpoint}: {_reason(exc)}") from exc
        if not meta.commit_hash or not meta.etag:
            raise DownloadError(f"{self.endpoint} did not say which commit and file version {where} is; "
                                "is HF_ENDPOINT a Hugging Face Hub (or a mirror of one)?")
        remote = RemoteFile(repo_id=repo_id, filename=filename, revision=revision,
                            commit_hash=meta.commit_hash, etag=meta.etag.lower(), size=meta.size,
                            url=meta.location or url)
        if remote.checksum_kind == "none":
            raise DownloadError(f"the Hub gave no checksum for {where} (ETag {meta.etag!r}), so the download "
                                "could not be verified")
        return remote

    # -- download -------------------------------------------------------------------------
    def download(self, repo_id: str, filename: str, revision: str = DEFAULT_REVISION, *,
                 on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Path:
        """The file's path in the cache (``snapshots/<commit>/<filename>``), downloaded if needed.

        Raises DownloadCancelled when ``cancel`` is set (what was received stays for the next
        attempt), ChecksumMismatch when the bytes are not the Hub's file (they are deleted),
        DownloadError otherwise.
        """
        cancel = cancel or threading.Event()
        report = _Reporter(on_progress)
        try:
            remote = self.fetch_metadata(repo_id, filename, revision)
        except DownloadError:
            cached = cached_file(repo_id, filename, revision, self.cache_dir)
            if cached is None:
                raise
            log.info("the Hub cannot be asked about %s/%s; using the copy in the cache", repo_id, filename)
            return cached
        storage = repo_folder(self.cache_dir, repo_id)
        pointer = storage / "snapshots" / remote.commit_hash / Path(*filename.split("/"))
        blob = storage / "blobs" / remote.etag
        if pointer.is_file() and (remote.size is None or pointer.stat().st_size == remote.size):
            self._write_ref(storage, remote)
            report(DownloadProgress("done", pointer.stat().st_size, remote.size), force=True)
            return pointer

        blob.parent.mkdir(parents=True, exist_ok=True)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        lock = self._lock_for(repo_id, remote.etag)
        self._acquire(lock, cancel, f"{repo_id}/{filename}")
        try:
            if not (blob.is_file() and (remote.size is None or blob.stat().st_size == remote.size)):
                self._fetch_blob(remote, blob, report, cancel)
            self._link(blob, pointer)
            self._write_ref(storage, remote)
        finally:
            lock.release()
        report(DownloadProgress("done", pointer.stat().st_size, remote.size), force=True)
        return pointer

    def _fetch_blob(self, remote: RemoteFile, blob: Path, report: _Reporter, cancel: threading.Event) -> None:
        partial = _partial(blob)
        attempts = 0
        with httpx.Client(timeout=self.timeout, follow_redirects=True) as client:
            while True:
                before = partial.stat().st_size if partial.exists() else 0
                try:
                    self._transfer(client, remote, partial, report, cancel)
                    break
                except _Retryable as exc:
                    after = partial.stat().st_size if partial.exists() else 0
                    attempts = 0 if after > before else attempts + 1
                    if attempts >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
                        raise DownloadError(f"downloading {remote.filename} failed {attempts} times in a row "
                                            f"({exc}); {human_bytes(after)} kept, try again to "
                                            "continue") from None
                    delay = min(RETRY_DELAY_MAX_S, self.retry_delay * (2 ** max(0, attempts - 1)))
                    log.warning("download of %s interrupted (%s); continuing from %s in %.0f s",
                                remote.filename, exc, human_bytes(after), delay)
                    if cancel.wait(delay):
                        raise _cancelled(partial) from None
                    fresh = self.fetch_metadata(remote.repo_id, remote.filename, remote.revision)
                    if fresh.etag != remote.etag:
                        raise DownloadError(f"{remote.filename} changed on the Hub during the download; "
                                            "start it again") from None
                    remote = fresh  # a signed CDN address may have expired
        os.replace(partial, blob)

    def _transfer(self, client: httpx.Client, remote: RemoteFile, partial: Path, report: _Reporter,
                  cancel: threading.Event) -> None:
        """One request: continue ``partial`` to the end, then check it. Raises _Retryable for
        what another attempt can fix."""
        hasher = _hasher(remote)
        offset = partial.stat().st_size if partial.exists() else 0
        if remote.size is not None and offset > remote.size:
            partial.unlink()
            offset = 0
        if offset:
            _hash_existing(partial, offset, hasher, report, cancel, remote.size)
        if remote.size is not None and offset == remote.size:
            self._verify(remote, hasher, partial, offset)
            return
        if remote.size is not None:
            _check_space(partial.parent, remote.size - offset)

        headers = self._headers(remote.url)
        headers["Accept-Encoding"] = "identity"
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            with client.stream("GET", remote.url, headers=headers) as response:
                if response.status_code == 416 and offset:
                    partial.unlink()  # the server has fewer bytes than we kept: start over
                    raise _Retryable("the partial file was longer than the server's copy")
                if response.status_code in (408, 429) or response.status_code >= 500:
                    raise _Retryable(f"HTTP {response.status_code}")
                if response.status_code in (401, 403, 404, 410) and remote.url != self._resolve_url(remote):
                    raise _Retryable(f"HTTP {response.status_code} from the download address")
                if response.status_code not in (200, 206):
                    raise DownloadError(f"the Hub answered HTTP {response.status_code} for "
                                        f"{remote.repo_id}/{remote.filename}")
                if response.status_code == 206:
                    start = _range_start(response.headers.get("Content-Range", ""))
                    if start != offset:
                        raise DownloadError(f"the server sent bytes from {start} when asked for {offset}")
                    mode = "ab"
                else:
                    if offset:
                        log.info("the server ignored the Range request; downloading %s from the start",
                                 remote.filename)
                        hasher = _hasher(remote)
                    offset, mode = 0, "wb"
                resumed_from = offset
                done = offset
                with open(partial, mode) as fh:
                    report(DownloadProgress("downloading", done, remote.size, resumed_from), force=True)
                    for chunk in response.iter_bytes():  # as it arrives: a chunk size would hold bytes back
                        if cancel.is_set():
                            fh.flush()
                            raise _cancelled(partial, done)
                        fh.write(chunk)
                        hasher.update(chunk)
                        done += len(chunk)
                        if remote.size is not None and done > remote.size:
                            break  # checked below: the file is refused
                        report(DownloadProgress("downloading", done, remote.size, resumed_from))
        except httpx.TransportError as exc:
            raise _Retryable(_reason(exc)) from None
        if cancel.is_set():
            raise _cancelled(partial)
        if remote.size is not None and done < remote.size:
            raise _Retryable(f"the connection closed after {human_bytes(done)} of {human_bytes(remote.size)}")
        self._verify(remote, hasher, partial, done)

    def _verify(self, remote: RemoteFile, hasher: _Hasher, partial: Path, size: int) -> None:
        actual = hasher.hexdigest()
        if remote.size is not None and size != remote.size:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(f"{remote.filename} is not the Hub's file: {size} bytes arrived, the Hub "
                                   f"says {remote.size}. The download was deleted; try again.")
        if actual != remote.etag:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{remote.filename} is not the Hub's file: its {hasher.name} is {actual}, the Hub says "
                f"{remote.etag}. The download was deleted; try again, and if it happens again the Hub or "
                "something between you and it serves damaged data.")

    def _resolve_url(self, remote: RemoteFile) -> str:
        from huggingface_hub.file_download import hf_hub_url

        return hf_hub_url(remote.repo_id, remote.filename, revision=remote.revision, endpoint=self.endpoint)

    def _headers(self, url: str) -> dict[str, str]:
        """huggingface_hub's headers (user agent, token); the token only goes to the Hub itself,
        never to the CDN a file is redirected to."""
        from huggingface_hub.utils._headers import build_hf_headers

        headers = dict(build_hf_headers(token=self.token, **_library()))
        if _origin(url) != _origin(self.endpoint):
            headers.pop("authorization", None)
            headers.pop("Authorization", None)
        return headers

    # -- cache bookkeeping ----------------------------------------------------------------
    def _lock_for(self, repo_id: str, etag: str):
        """The lock huggingface_hub takes for the same blob, so the two never write it together."""
        from filelock import FileLock

        path = self.cache_dir / ".locks" / repo_folder(Path(), repo_id).name / f"{etag}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path))

    @staticmethod
    def _acquire(lock, cancel: threading.Event, what: str) -> None:
        from filelock import Timeout

        waited = False
        while True:
            if cancel.is_set():
                raise DownloadCancelled(f"download of {what} cancelled")
            try:
                lock.acquire(timeout=LOCK_POLL_S)
                return
            except Timeout:
                if not waited:
                    log.info("waiting for another download of %s to finish", what)
                    waited = True

    @staticmethod
    def _link(blob: Path, pointer: Path) -> None:
        """snapshots/<commit>/<file> -> ../../blobs/<etag>, relative, as huggingface_hub makes it.
        Where links are not allowed (Windows without developer mode) the blob moves there, as
        huggingface_hub does."""
        pointer.unlink(missing_ok=True)
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), pointer)
        except OSError:
            shutil.move(str(blob), str(pointer))

    @staticmethod
    def _write_ref(storage: Path, remote: RemoteFile) -> None:
        if remote.revision == remote.commit_hash:
            return
        ref = storage / "refs" / Path(*remote.revision.split("/"))
        ref.parent.mkdir(parents=True, exist_ok=True)
        try:
            if ref.read_text(encoding="utf-8") == remote.commit_hash:
                return
        except OSError:
            pass
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(remote.commit_hash, encoding="utf-8")
        os.replace(tmp, ref)


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


class _Library(TypedDict):
    library_name: str
    library_version: str


def _library() -> _Library:
    """Who is asking, for the Hub's user agent."""
    from slotkeeper import __version__

    return {"library_name": "slotkeeper", "library_version": __version__}


class _Retryable(Exception):
    pass


class _Hasher:
    """SHA-256 of the content, or git's blob id (sha1 of "blob <size>\\0" + content) for the
    small files the Hub names by their git object id."""

    def __init__(self, kind: str, size: int | None) -> None:
        self.name = "SHA-256" if kind == "sha256" else "git blob id"
        if kind == "sha256":
            self._h = hashlib.sha256()
        else:
            if size is None:
                raise DownloadError("the Hub did not say how large the file is, so it cannot be verified")
            self._h = hashlib.sha1(usedforsecurity=False)
            self._h.update(f"blob {size}\0".encode())

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _hasher(remote: RemoteFile) -> _Hasher:
    return _Hasher(remote.checksum_kind, remote.size)


def _partial(blob: Path) -> Path:
    # huggingface_hub's own name for an interrupted download (its cache scan lists these)
    return blob.with_name(blob.name + ".incomplete")


def _hash_existing(partial: Path, size: int, hasher: _Hasher, report: _Reporter, cancel: threading.Event,
                   total: int | None) -> None:
    """Feed the bytes already on disk to the hash, so the finished file is checked whole."""
    done = 0
    with open(partial, "rb") as fh:
        while done < size:
            if cancel.is_set():
                raise _cancelled(partial, size)
            data = fh.read(min(CHUNK_BYTES * 8, size - done))
            if not data:
                break
            hasher.update(data)
            done += len(data)
            report(DownloadProgress("checking", done, total))


def _check_space(folder: Path, needed: int) -> None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < needed:
        raise DownloadError(f"not enough disk space in {folder}: the download needs {human_bytes(needed)} "
                            f"more, {human_bytes(free)} is free")


def _range_start(content_range: str) -> int | None:
    m = _CONTENT_RANGE.match(content_range.strip())
    return int(m.group(1)) if m else None


def _cancelled(partial: Path, kept: int | None = None) -> DownloadCancelled:
    if kept is None:
        try:
            kept = partial.stat().st_size
        except OSError:
            kept = 0
    tail = f"; {human_bytes(kept)} kept, downloading it again continues from there" if kept else ""
    return DownloadCancelled(f"download cancelled{tail}", kept)


def _origin(url: str) -> tuple[str, str, int | None]:
    p = urlparse(url)
    default = {"http": 80, "https": 443}.get(p.scheme)
    return p.scheme, (p.hostname or "").lower(), p.port or default


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Reporter:
    """Calls the progress callback at most every PROGRESS_INTERVAL_S (and always when forced)."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self._callback = callback
        self._last = 0.0

    def __call__(self, progress: DownloadProgress, force: bool = False) -> None:
        if self._callback is None:
            return
        now = time.monotonic()
        if force or now - self._last >= PROGRESS_INTERVAL_S or progress.done == progress.total:
            self._last = now
            self._callback(progress)
