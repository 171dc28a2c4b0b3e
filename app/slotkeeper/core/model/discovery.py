"""Find GGUF models the user already has, so the first-run chooser can offer them.

Looks in the places the usual downloaders put models: the Hugging Face hub cache (also
where recent llama.cpp ``-hf`` downloads go), llama.cpp's own cache folder (older
llama.cpp versions), LM Studio's models folder, and any folder the user adds.

Speed matters because this runs while the user waits: the walk is bounded in depth and in
directory entries, and a model's header is read only up to its metadata (gguf_info
memory-maps the file and never touches tensor data).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.model.gguf_info import ModelFileError, read_model_info

__all__ = [
    "SOURCE_HUGGING_FACE",
    "SOURCE_LLAMA_CPP",
    "SOURCE_LM_STUDIO",
    "FoundModel",
    "default_search_dirs",
    "distinct_names",
    "find_models",
]

SOURCE_HUGGING_FACE = "Hugging Face"
SOURCE_LLAMA_CPP = "llama.cpp"
SOURCE_LM_STUDIO = "LM Studio"

MMPROJ_NOTE = "A vision projector (mmproj) for a multimodal model, not a language model."

# A user who adds their home folder must not make the chooser hang: stop after this many
# directory entries in total, whatever the depth limit would still allow.
_MAX_DIR_ENTRIES = 200_000

# llama.cpp's split naming (common/download.cpp): <prefix>-00001-of-00003.gguf.
_SPLIT_RE = re.compile(
    r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.gguf)$", re.IGNORECASE
)

# Folders that never hold a model but can be large (hidden folders are skipped as well).
_SKIP_DIR_NAMES = frozenset({"__pycache__", "node_modules", "site-packages"})


@dataclass(frozen=True)
class FoundModel:
    """One model file on disk.

    path: where it was found (for the HF cache, the readable snapshots/ link, not the blob).
    size_bytes: the file's size; for a split model, the sum of the parts present.
    error: why the model cannot be used (a sentence for the user), or None.
    """

    path: Path
    size_bytes: int
    arch: str | None
    name: str | None
    source: str
    error: str | None

    @property
    def usable(self) -> bool:
        return self.error is None

    @property
    def display_name(self) -> str:
        return self.name or self.path.name


def distinct_names(models: Iterable[FoundModel]) -> dict[Path, str]:
    """What to call each model so that no two read the same: its GGUF name, with its file's name
    after it when another one found has that name too (two quantizations of one model carry one
    name), and its folder when even the file names agree."""
    models = list(models)
    names = {m.path: m.display_name for m in models}
    for extra in (lambda m: m.path.name, lambda m: str(m.path.parent)):
        seen: dict[str, int] = {}
        for m in models:
            seen[names[m.path]] = seen.get(names[m.path], 0) + 1
        for m in models:
            if seen[names[m.path]] > 1 and extra(m) not in names[m.path]:
                names[m.path] = f"{names[m.path]} ({extra(m)})"
    return names


# --------------------------------------------------------------------------------------
# Where to look
# --------------------------------------------------------------------------------------


def default_search_dirs(
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    system: str | None = None,
    extra: Iterable[Path | tuple[str, Path]] = (),
) -> list[tuple[str, Path]]:
    """(source label, folder) pairs to search, most common downloader first.

    Folders are listed whether or not they exist (the chooser can say where it looked);
    ``find_models`` skips the missing ones. ``extra`` folders are labelled with their
    own path unless given as (label, folder).
    """
    env = os.environ if env is None else env
    home = Path.home() if home is None else Path(home)
    system = _normalize_system(system)

    dirs: list[tuple[str, Path]] = [
        (SOURCE_HUGGING_FACE, _hf_hub_cache(env, home)),
        (SOURCE_LLAMA_CPP, _llama_cpp_cache(env, home, system)),
        (SOURCE_LM_STUDIO, home / ".lmstudio" / "models"),
        (SOURCE_LM_STUDIO, home / ".cache" / "lm-studio" / "models"),
    ]
    for item in extra:
        if isinstance(item, tuple):
            dirs.append((item[0], Path(item[1])))
        else:
            dirs.append((str(item), Path(item)))
    return _unique_dirs(dirs)


def _normalize_system(system: str | None) -> str:
    """platform.system() style names; sys.platform style ("darwin", "win32") accepted too."""
    raw = (system or sys.platform).lower()
    if raw.startswith("win"):
        return "Windows"
    if raw == "darwin":
        return "Darwin"
    return "Linux" if raw.startswith("linux") else system or raw


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "")
    return Path(value).expanduser() if value else None


def _hf_hub_cache(env: Mapping[str, str], home: Path) -> Path:
    """The hub cache as huggingface_hub resolves it (HUGGINGFACE_HUB_CACHE is its old name)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        path = _env_path(env, name)
        if path:
            return path
    hf_home = _env_path(env, "HF_HOME")
    if hf_home:
        return hf_home / "hub"
    xdg_cache = _env_path(env, "XDG_CACHE_HOME")
    if xdg_cache:
        return xdg_cache / "huggingface" / "hub"
    return home / ".cache" / "huggingface" / "hub"


def _llama_cpp_cache(env: Mapping[str, str], home: Path, system: str) -> Path:
    """llama.cpp's fs_get_cache_directory() (common/common.cpp)."""
    override = _env_path(env, "LLAMA_CACHE")
    if override:
        return override
    if system == "Windows":
        local = _env_path(env, "LOCALAPPDATA") or home / "AppData" / "Local"
        return local / "llama.cpp"
    if system == "Darwin":
        return home / "Library" / "Caches" / "llama.cpp"
    return (_env_path(env, "XDG_CACHE_HOME") or home / ".cache") / "llama.cpp"


def _unique_dirs(dirs: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Drop repeats (LLAMA_CACHE may equal HF_HUB_CACHE); the first label wins."""
    seen: set[str] = set()
    out: list[tuple[str, Path]] = []
    for label, path in dirs:
        key = os.path.normcase(os.path.abspath(path))
        if key not in seen:
            seen.add(key)
            out.append((label, path))
    return out


# --------------------------------------------------------------------------------------
# Walking
# --------------------------------------------------------------------------------------


def find_models(
    dirs: Iterable[tuple[str, Path]],
    max_depth: int = 6,
    limit: int = 200,
    read_arch: bool = True,
) -> list[FoundModel]:
    """GGUF models under ``dirs``, sorted by source (in ``dirs`` order) then name.

    A file reached twice (two HF snapshots sharing a blob, nested search folders) is
    listed once, under the first folder that reached it. Never raises for a bad file or an
    unreadable folder: a bad model gets ``error`` set, an unreadable folder is skipped.
    """
    dirs = list(dirs)
    budget = _Budget(_MAX_DIR_ENTRIES)
    seen: set[str] = set()
    found: list[FoundModel] = []
    for source, root in dirs:
        for path in _walk_gguf(Path(root), max_depth, budget):
            model = _examine(path, source, seen, read_arch)
            if model is not None:
                found.append(model)
                if len(found) >= limit:
                    return _sorted(found, dirs)
    return _sorted(found, dirs)


def _sorted(found: list[FoundModel], dirs: list[tuple[str, Path]]) -> list[FoundModel]:
    order: dict[str, int] = {}
    for source, _ in dirs:
        order.setdefault(source, len(order))
    return sorted(
        found, key=lambda m: (order.get(m.source, len(order)), m.display_name.lower(), str(m.path))
    )


class _Budget:
    """Directory entries the walk may still look at, shared across all search folders."""

    def __init__(self, entries: int) -> None:
        self.left = entries

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _walk_gguf(root: Path, max_depth: int, budget: _Budget) -> Iterator[Path]:
    """Paths of *.gguf files under ``root``, depth-first, files of a folder in name order.

    Directory symlinks are followed (a models folder moved to another disk is often
    linked back), with visited folders remembered so a link loop ends.
    """
    visited: set[tuple[int, int]] = set()
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            st = folder.stat()
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in visited:
            continue
        visited.add(key)
        files, subdirs = _list_folder(folder, budget)
        yield from sorted(files)
        if depth < max_depth:
            stack.extend((d, depth + 1) for d in sorted(subdirs, reverse=True))


def _list_folder(folder: Path, budget: _Budget) -> tuple[list[Path], list[Path]]:
    files: list[Path] = []
    subdirs: list[Path] = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not budget.take():
                    break
                if entry.name.lower().endswith(".gguf"):
                    # Only the name is checked here; the HF cache's links are resolved later.
                    files.append(Path(entry.path))
                elif _is_searchable_dir(entry):
                    subdirs.append(Path(entry.path))
    except OSError:
        pass  # unreadable folder: nothing to offer from it
    return files, subdirs


def _is_searchable_dir(entry: os.DirEntry[str]) -> bool:
    # Hidden folders hold caches and locks (.locks, .no_exist, .git), never user models;
    # an explicitly listed hidden root such as ~/.lmstudio/models is walked all the same.
    if entry.name.startswith(".") or entry.name in _SKIP_DIR_NAMES:
        return False
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


# --------------------------------------------------------------------------------------
# One file
# --------------------------------------------------------------------------------------


def _examine(path: Path, source: str, seen: set[str], read_arch: bool) -> FoundModel | None:
    """A FoundModel for ``path``, or None when it is not worth listing (dup, shard, broken link)."""
    split = _SPLIT_RE.match(path.name)
    if split and int(split["index"]) != 1:
        return None  # llama-server loads a split model from its first part only
    try:
        resolved = path.resolve(strict=True)
        if not resolved.is_file():
            return None
        size = resolved.stat().st_size
    except (OSError, RuntimeError):
        return None  # a dangling link (HF blob deleted) or a link loop
    key = os.path.normcase(str(resolved))
    if key in seen:
        return None
    seen.add(key)

    error: str | None = None
    if split:
        size, error = _split_parts(path, split)
    if _is_mmproj(path.name):
        return FoundModel(path, size, None, None, source, MMPROJ_NOTE)
    arch, name, read_error = _read_header(path) if read_arch else (None, None, None)
    if arch == "clip":  # an mmproj file by another name
        read_error = MMPROJ_NOTE
    return FoundModel(path, size, arch, name, source, error or read_error)


def projectors_beside(model_path: str | Path) -> list[Path]:
    """The multimodal projectors (``mmproj*.gguf``) in a model's folder, the way the stores keep
    them: Hugging Face snapshots, LM Studio and llama.cpp's cache put a vision model's projector
    next to it. Best match first (a name sharing the model's stem), then by name; never raises."""
    model = Path(model_path)
    try:
        found = [p for p in model.parent.iterdir()
                 if _is_mmproj(p.name) and p.suffix.lower() == ".gguf" and p.is_file()]
    except OSError:
        return []
    name = model_base_name(model)
    return sorted(found, key=lambda p: (not name or name not in p.name.lower(), p.name.lower()))


def model_base_name(model_path: str | Path) -> str:
    """A model file's name without its quantization, lower case: "gemma-3-4b-it-Q4_K_M.gguf" ->
    "gemma-3-4b-it", the part its projector's name ("mmproj-gemma-3-4b-it-f16.gguf") shares."""
    name = Path(model_path).stem.lower()
    for cut in ("-q", ".q", "-iq", "-f16", "-bf16", "-f32"):
        if cut in name:
            name = name[: name.index(cut)]
    return name


def _is_mmproj(filename: str) -> bool:
    # The same name test llama.cpp uses to tell projectors from models (common/download.cpp).
    return "mmproj" in filename.lower()


def _split_parts(first: Path, split: re.Match[str]) -> tuple[int, str | None]:
    """Total size of a split model's parts, and an error when some part is missing."""
    count = int(split["count"])
    total = 0
    missing = 0
    for index in range(1, count + 1):
        part = first.with_name(f"{split['prefix']}-{index:05d}-of-{split['count']}{split['ext']}")
        try:
            total += part.stat().st_size
        except OSError:
            missing += 1
    if missing:
        return total, (
            f"Incomplete split model: {missing} of its {count} parts are missing. "
            "Download the missing parts to use it."
        )
    return total, None


def _read_header(path: Path) -> tuple[str | None, str | None, str | None]:
    """(arch, name, error): the metadata, or the reason it could not be read."""
    try:
        info = read_model_info(path)
    except ModelFileError as exc:
        return None, None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one odd file must not break the whole list
        return None, None, f"{path.name} could not be read as a GGUF model ({exc})."
    return info.arch, info.name, None
