"""pyproject.toml in the forms the build tools keep reading."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_license_is_an_spdx_expression():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert data["project"]["license"] == "MIT", "the table form stops working in setuptools on 2027-02-18"
    assert "setuptools>=77" in data["build-system"]["requires"], "the first setuptools that reads it"
