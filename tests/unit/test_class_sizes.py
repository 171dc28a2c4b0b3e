"""No class of the core grows past 400 lines with its bases: a class that size holds more than
one job (the engine and its face, the store, the sessions index were split on this rule)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "app" / "slotkeeper" / "core"
MAX_LINES = 400


def class_sizes(root: Path) -> dict[str, int]:
    """Every class under ``root`` by ``module:Name``: its lines, with those of its bases that are
    classes of Slotkeeper (found by name)."""
    found: dict[str, tuple[str, int, list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                where = f"{path.relative_to(root.parent).with_suffix('')}:{node.name}"
                assert node.end_lineno is not None
                found.setdefault(node.name, (where, node.end_lineno - node.lineno + 1, bases))

    def size(name: str, seen: frozenset[str] = frozenset()) -> int:
        _where, lines, bases = found[name]
        return lines + sum(size(b, seen | {name}) for b in bases if b in found and b not in seen)

    return {where: size(name) for name, (where, _lines, _bases) in found.items()}


def test_no_core_class_is_over_400_lines_with_its_bases():
    sizes = class_sizes(CORE)
    assert "core/engine/engine:Engine" in sizes  # the walk finds the classes
    over = {where: n for where, n in sizes.items() if n > MAX_LINES}
    assert over == {}


def test_a_base_counts_with_the_class(tmp_path):
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "face.py").write_text("class Face:\n" + "    x = 1\n" * 300)
    (pkg / "engine.py").write_text("from face import Face\n\nclass Engine(Face):\n" + "    y = 2\n" * 150)
    sizes = class_sizes(pkg)
    assert sizes["core/face:Face"] == 301
    assert sizes["core/engine:Engine"] == 151 + 301
