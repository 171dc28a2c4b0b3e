"""Finding the GGUF models a user already has: search folders, HF cache links, bad files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from slotkeeper.core.model import discovery
from slotkeeper.core.model.discovery import (
    MMPROJ_NOTE,
    SOURCE_HUGGING_FACE,
    SOURCE_LLAMA_CPP,
    SOURCE_LM_STUDIO,
    FoundModel,
    default_search_dirs,
    find_models,
)
from slotkeeper.core.model.modelgen import write_model

needs_symlinks = pytest.mark.skipif(
    os.name == "nt", reason="creating symlinks needs developer mode on Windows"
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """One real ~2 MB GGUF per module; tests copy or link it into their fake trees."""
    return write_model(tmp_path_factory.mktemp("discovery") / "tiny.gguf", "llama")


def put(model: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, dest)
    return dest


def by_name(models: list[FoundModel]) -> dict[str, FoundModel]:
    return {m.path.name: m for m in models}


# --------------------------------------------------------------------------------------
# default_search_dirs
# --------------------------------------------------------------------------------------


def test_default_dirs_linux_without_env(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dirs = default_search_dirs(env={}, home=home, system="Linux")
    assert dirs == [
        (SOURCE_HUGGING_FACE, home / ".cache" / "huggingface" / "hub"),
        (SOURCE_LLAMA_CPP, home / ".cache" / "llama.cpp"),
        (SOURCE_LM_STUDIO, home / ".lmstudio" / "models"),
        (SOURCE_LM_STUDIO, home / ".cache" / "lm-studio" / "models"),
    ]


def test_default_dirs_macos_and_windows_llama_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    mac = dict(default_search_dirs(env={}, home=home, system="Darwin"))
    assert mac[SOURCE_LLAMA_CPP] == home / "Library" / "Caches" / "llama.cpp"

    local = tmp_path / "AppData" / "Local"
    win = dict(default_search_dirs(env={"LOCALAPPDATA": str(local)}, home=home, system="Windows"))
    assert win[SOURCE_LLAMA_CPP] == local / "llama.cpp"
    win_no_env = dict(default_search_dirs(env={}, home=home, system="win32"))
    assert win_no_env[SOURCE_LLAMA_CPP] == home / "AppData" / "Local" / "llama.cpp"


def test_env_overrides(tmp_path: Path) -> None:
    home = tmp_path / "home"
    hub, llama = tmp_path / "hub", tmp_path / "llama"
    env = {
        "HF_HUB_CACHE": str(hub),
        "HF_HOME": str(tmp_path / "ignored"),
        "LLAMA_CACHE": str(llama),
    }
    dirs = dict(default_search_dirs(env=env, home=home, system="Linux"))
    assert dirs[SOURCE_HUGGING_FACE] == hub
    assert dirs[SOURCE_LLAMA_CPP] == llama


def test_hf_home_and_xdg_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    hf_home = dict(default_search_dirs(env={"HF_HOME": str(tmp_path / "hf")}, home=home))
    assert hf_home[SOURCE_HUGGING_FACE] == tmp_path / "hf" / "hub"

    xdg = tmp_path / "xdg"
    dirs = dict(default_search_dirs(env={"XDG_CACHE_HOME": str(xdg)}, home=home, system="Linux"))
    assert dirs[SOURCE_HUGGING_FACE] == xdg / "huggingface" / "hub"
    assert dirs[SOURCE_LLAMA_CPP] == xdg / "llama.cpp"


def test_extra_folders_and_duplicates(tmp_path: Path) -> None:
    home = tmp_path / "home"
    same = tmp_path / "shared"
    env = {"HF_HUB_CACHE": str(same), "LLAMA_CACHE": str(same)}
    mine = tmp_path / "mine"
    dirs = default_search_dirs(
        env=env, home=home, system="Linux", extra=[mine, ("Work", tmp_path / "work"), same]
    )
    assert [p for _, p in dirs].count(same) == 1
    assert dirs[0] == (SOURCE_HUGGING_FACE, same)
    assert (str(mine), mine) in dirs
    assert ("Work", tmp_path / "work") in dirs


def test_default_dirs_never_touch_the_real_home(tmp_path: Path) -> None:
    dirs = default_search_dirs(env={}, home=tmp_path, system="Linux")
    assert all(str(p).startswith(str(tmp_path)) for _, p in dirs)


# --------------------------------------------------------------------------------------
# find_models
# --------------------------------------------------------------------------------------


def test_finds_a_model_with_its_metadata(tmp_path: Path, tiny_model: Path) -> None:
    path = put(tiny_model, tmp_path / "models" / "sub" / "tiny.gguf")
    [found] = find_models([("Mine", tmp_path / "models")])
    assert found.path == path
    assert found.size_bytes == tiny_model.stat().st_size
    assert found.arch == "llama"
    assert found.name == "Slotkeeper demo (random weights)"
    assert found.source == "Mine"
    assert found.error is None and found.usable


def test_read_arch_false_reads_no_header(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    put(tiny_model, tmp_path / "m" / "tiny.gguf")

    def boom(path):
        raise AssertionError("header read although read_arch=False")

    monkeypatch.setattr(discovery, "read_model_info", boom)
    [found] = find_models([("x", tmp_path / "m")], read_arch=False)
    assert found.arch is None and found.name is None and found.error is None


@needs_symlinks
def test_hf_cache_snapshot_links_are_followed_and_deduplicated(
    tmp_path: Path, tiny_model: Path
) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--someone--Tiny-GGUF"
    blob = put(tiny_model, repo / "blobs" / ("a" * 64))
    (repo / "blobs" / ("b" * 64 + ".incomplete")).write_bytes(b"GGUF partial")
    (hub / ".locks" / "models--someone--Tiny-GGUF").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev2")
    for rev in ("rev1", "rev2"):  # two revisions sharing one blob
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tiny-Q8_0.gguf").symlink_to(Path("..") / ".." / "blobs" / blob.name)
    # A file whose blob is gone (cache cleaned) is not listed.
    (repo / "snapshots" / "rev2" / "gone.gguf").symlink_to(Path("..") / ".." / "blobs" / "nope")

    found = find_models(default_search_dirs(env={"HF_HUB_CACHE": str(hub)}, home=tmp_path))
    assert len(found) == 1
    model = found[0]
    assert model.source == SOURCE_HUGGING_FACE
    assert model.path.name == "tiny-Q8_0.gguf"  # the readable name, not the blob hash
    assert model.path.parent.parent.name == "snapshots"
    assert model.arch == "llama"
    assert model.size_bytes == tiny_model.stat().st_size


@needs_symlinks
def test_symlinked_folder_loop_ends(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    put(tiny_model, root / "a" / "tiny.gguf")
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    found = find_models([("x", root)], max_depth=20)
    assert [m.path.name for m in found] == ["tiny.gguf"]


def test_broken_gguf_is_reported_not_raised(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    put(tiny_model, root / "good.gguf")
    (root / "notes.gguf").write_text("this is not a model\n")
    truncated = root / "cut.gguf"
    truncated.write_bytes(tiny_model.read_bytes()[:200])
    (root / "empty.gguf").write_bytes(b"")

    models = by_name(find_models([("x", root)]))
    assert set(models) == {"good.gguf", "notes.gguf", "cut.gguf", "empty.gguf"}
    assert models["good.gguf"].usable
    for bad in ("notes.gguf", "cut.gguf", "empty.gguf"):
        m = models[bad]
        assert not m.usable and m.arch is None and m.error
    assert "GGUF" in models["notes.gguf"].error
    assert models["notes.gguf"].size_bytes == len("this is not a model\n")


def test_unexpected_reader_failure_becomes_an_error(
    tmp_path: Path, tiny_model: Path, monkeypatch
) -> None:
    put(tiny_model, tmp_path / "m" / "odd.gguf")

    def odd(path):
        raise ValueError("weird")

    monkeypatch.setattr(discovery, "read_model_info", odd)
    [found] = find_models([("x", tmp_path / "m")])
    assert found.error and "weird" in found.error


def test_split_models_list_only_the_first_part(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    for i in (1, 2, 3):
        put(tiny_model, root / f"big-{i:05d}-of-00003.gguf")
    # Only parts 2 and 3 of another download: nothing llama-server could load is listed.
    for i in (2, 3):
        put(tiny_model, root / f"half-{i:05d}-of-00003.gguf")
    # Part 1 present, part 2 missing: listed with an error.
    put(tiny_model, root / "gap-00001-of-00002.gguf")

    models = by_name(find_models([("x", root)]))
    assert set(models) == {"big-00001-of-00003.gguf", "gap-00001-of-00002.gguf"}
    big = models["big-00001-of-00003.gguf"]
    assert big.usable and big.size_bytes == 3 * tiny_model.stat().st_size
    gap = models["gap-00001-of-00002.gguf"]
    assert not gap.usable and "missing" in gap.error


def test_partial_downloads_and_other_files_are_skipped(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    put(tiny_model, root / "ok.gguf")
    put(tiny_model, root / "ok.gguf.incomplete")
    put(tiny_model, root / "next.gguf.downloadInProgress")
    put(tiny_model, root / "model.bin")
    put(tiny_model, root / ".hidden" / "secret.gguf")
    assert [m.path.name for m in find_models([("x", root)])] == ["ok.gguf"]


def test_mmproj_is_listed_with_a_note(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    put(tiny_model, root / "model.gguf")
    put(tiny_model, root / "mmproj-model-f16.gguf")
    models = by_name(find_models([("x", root)]))
    assert models["model.gguf"].usable
    proj = models["mmproj-model-f16.gguf"]
    assert proj.error == MMPROJ_NOTE and proj.arch is None


def test_depth_is_bounded(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    put(tiny_model, root / "a" / "b" / "c" / "deep.gguf")
    put(tiny_model, root / "shallow.gguf")
    assert [m.path.name for m in find_models([("x", root)], max_depth=2)] == ["shallow.gguf"]
    assert len(find_models([("x", root)], max_depth=3)) == 2


def test_limit(tmp_path: Path, tiny_model: Path) -> None:
    root = tmp_path / "models"
    for i in range(5):
        put(tiny_model, root / f"m{i}.gguf")
    assert len(find_models([("x", root)], limit=3, read_arch=False)) == 3


def test_entry_budget_stops_a_huge_walk(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    root = tmp_path / "models"
    for i in range(30):
        (root / f"d{i:02d}").mkdir(parents=True)
    put(tiny_model, root / "zz" / "late.gguf")
    monkeypatch.setattr(discovery, "_MAX_DIR_ENTRIES", 10)
    assert find_models([("x", root)], read_arch=False) == []


def test_sorted_by_source_order_then_name_and_nested_dirs_deduplicated(
    tmp_path: Path, tiny_model: Path
) -> None:
    hub = tmp_path / "hub"
    lm = tmp_path / "lm"
    put(tiny_model, lm / "pub" / "Zeta.gguf")
    put(tiny_model, lm / "pub" / "alpha.gguf")
    put(tiny_model, hub / "models--x--y" / "snapshots" / "r" / "tiny.gguf")
    dirs = [
        (SOURCE_HUGGING_FACE, hub),
        (SOURCE_LM_STUDIO, lm),
        ("Everything", tmp_path),  # contains both folders again
        (SOURCE_LLAMA_CPP, tmp_path / "does-not-exist"),
    ]
    found = find_models(dirs, read_arch=False)
    assert [(m.source, m.path.name) for m in found] == [
        (SOURCE_HUGGING_FACE, "tiny.gguf"),
        (SOURCE_LM_STUDIO, "alpha.gguf"),
        (SOURCE_LM_STUDIO, "Zeta.gguf"),
    ]


def test_missing_and_unreadable_roots(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    assert find_models([("a", tmp_path / "nope"), ("b", not_a_dir)]) == []


def test_projectors_beside_a_model_best_match_first(tmp_path: Path) -> None:
    model = tmp_path / "gemma-3-4b-it-Q4_K_M.gguf"
    model.write_bytes(b"GGUF")
    for name in ("mmproj-other-model-f16.gguf", "mmproj-gemma-3-4b-it-f16.gguf", "mmproj-notes.txt",
                 "unrelated.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    (tmp_path / "mmproj-folder.gguf").mkdir()  # not a file
    assert [p.name for p in discovery.projectors_beside(model)] == [
        "mmproj-gemma-3-4b-it-f16.gguf", "mmproj-other-model-f16.gguf"]


def test_projectors_beside_a_model_in_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert discovery.projectors_beside(tmp_path / "gone" / "m.gguf") == []


def test_models_that_share_a_name_are_told_apart():
    """Two quantizations of one model carry one GGUF name ("Smollm2 135M 8k Lc100K Mix1 Ep2" twice):
    the file's name tells them apart, and the folder when the file names agree too."""
    from slotkeeper.core.model.discovery import FoundModel, distinct_names

    name = "Smollm2 135M 8k Lc100K Mix1 Ep2"
    q4 = FoundModel(Path("/m/a/SmolLM2-135M-Instruct.Q4_1.gguf"), 1, "llama", name, "LM Studio", None)
    q8 = FoundModel(Path("/m/a/SmolLM2-135M-Instruct.Q8_0.gguf"), 1, "llama", name, "LM Studio", None)
    copy = FoundModel(Path("/m/b/SmolLM2-135M-Instruct.Q8_0.gguf"), 1, "llama", name, "llama.cpp", None)
    other = FoundModel(Path("/m/qwen.gguf"), 1, "qwen3", "Qwen3 4B", "llama.cpp", None)
    named = distinct_names([q4, q8, other])
    assert named[q4.path] == f"{name} (SmolLM2-135M-Instruct.Q4_1.gguf)"
    assert named[q8.path] == f"{name} (SmolLM2-135M-Instruct.Q8_0.gguf)"
    assert named[other.path] == "Qwen3 4B"  # alone with its name: as it is
    named = distinct_names([q8, copy])
    assert named[q8.path] != named[copy.path] and named[copy.path].endswith("(/m/b)")
