"""pyproject.toml in the forms the build tools keep reading."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_the_license_is_an_spdx_expression():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert data["project"]["license"] == "MIT", "the table form stops working in setuptools on 2027-02-18"
    assert "setuptools>=77" in data["build-system"]["requires"], "the first setuptools that reads it"


def test_make_run_opens_the_app_as_it_was_left():
    """`make run` starts the app without forcing the demo: the first run offers a model (or the
    demo), later runs serve the model chosen."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    [run] = [line for line in out.splitlines() if line.split() and line.split()[0].endswith("bin/slotkeeper")]
    assert run.split()[1:] == [], run


def test_the_readme_says_where_the_command_is():
    """`make run` puts `slotkeeper` in .venv, not on PATH: the README says so, and the pipx install it
    offers names an extra that exists."""
    tomllib = pytest.importorskip("tomllib")
    readme = (ROOT / "README.md").read_text()
    assert "`.venv/bin/slotkeeper`" in readme
    assert "pipx install '.[server]'" in readme
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "server" in data["project"]["optional-dependencies"]
    assert data["project"]["scripts"]["slotkeeper"]


def test_make_test_type_checks_the_app_as_windows_and_macos_read_it():
    """Code that runs only on Windows or macOS is checked there by mypy's platform switch: `make test`
    runs it for both (and for this machine)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    words = [line.split() for line in out.splitlines() if line.split()]
    runs = [w[1:] for w in words if w[0].endswith("bin/mypy")]
    assert [] in runs and ["--platform", "win32"] in runs and ["--platform", "darwin"] in runs, runs
