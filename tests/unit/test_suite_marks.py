"""The suite's own marks land where pytest reads them: a `timeout` or `parametrize` mark on a helper
is silently ignored, and the test it was meant for runs under the 300 s default instead."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parents[1]


def marked_helpers(source: str) -> list[str]:
    """Names of the module-level functions and methods that carry a `pytest.mark.*` decorator but
    are not tests (pytest collects `test*` functions only), nor fixtures."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("test"):
            continue
        for dec in node.decorator_list:
            text = ast.unparse(dec)
            if text.startswith("pytest.mark.") or text.startswith("mark."):
                found.append(f"{node.name} ({text})")
    return found


def test_the_check_finds_a_mark_on_a_helper():
    source = "import pytest\n@pytest.mark.timeout(1800)\ndef outside_turn():\n    pass\n" \
             "@pytest.mark.timeout(60)\ndef test_real():\n    pass\n"
    assert marked_helpers(source) == ["outside_turn (pytest.mark.timeout(1800))"]


def test_no_helper_carries_a_mark():
    bad = {str(p.relative_to(TESTS)): found for p in sorted(TESTS.rglob("*.py"))
           if (found := marked_helpers(p.read_text(encoding="utf-8")))}
    assert bad == {}
