"""The release workflow cannot run here: check it parses and mirrors what `make package` does."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
SPEC = "packaging/slotkeeper.spec"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _runs(job: dict) -> list[str]:
    return [s["run"] for s in _steps(job) if "run" in s]


def _bundle_jobs(workflow) -> dict[str, dict]:
    jobs = {name: job for name, job in workflow["jobs"].items()
            if any(SPEC in run for run in _runs(job))}
    assert jobs, "no job builds the spec"
    return jobs


def _runners(job: dict) -> list[str]:
    runs_on = job["runs-on"]
    if "${{" not in runs_on:
        return [runs_on]
    matrix = job["strategy"]["matrix"]
    return [m["os"] for m in matrix.get("include", [])] + list(matrix.get("os", []))


def test_triggers_on_version_tags_and_by_hand(workflow):
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert "workflow_dispatch" in on
    assert any(t.startswith("v") for t in on["push"]["tags"])


def test_builds_on_linux_macos_and_windows(workflow):
    runners = [r for job in _bundle_jobs(workflow).values() for r in _runners(job)]
    for family in ("ubuntu", "macos", "windows"):
        assert any(r.startswith(family) for r in runners), (family, runners)


def test_runs_pyinstaller_on_the_one_spec_like_the_makefile(workflow):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    make_cmd = re.search(r"pyinstaller (.*%s.*)$" % re.escape(SPEC), makefile, re.M)
    assert make_cmd, "the Makefile's package target runs pyinstaller on the spec"
    make_args = shlex.split(make_cmd.group(1))
    for job in _bundle_jobs(workflow).values():
        cmds = [line.strip() for run in _runs(job) for line in run.splitlines() if "pyinstaller" in line]
        assert cmds, "pyinstaller is run"
        assert all(SPEC in c for c in cmds)
        args = shlex.split(cmds[0].split("pyinstaller", 1)[1])
        assert sorted(args) == sorted(make_args), (args, make_args)
    assert (ROOT / SPEC).is_file()


def test_installs_the_server_extra_with_the_makefiles_cmake_args(workflow):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    make_cmake = re.search(r"^export CMAKE_ARGS \?= (.*)$", makefile, re.M).group(1).split()
    env = dict(workflow.get("env", {}))
    for job in _bundle_jobs(workflow).values():
        env.update(job.get("env", {}))
        installs = [r for r in _runs(job) if "pip install" in r]
        assert any(re.search(r"\.\[[^\]]*server[^\]]*dev|\.\[[^\]]*dev[^\]]*server", r)
                   for r in installs), installs
        assert sorted(env["CMAKE_ARGS"].split()) == sorted(make_cmake)
        setup = [s for s in _steps(job) if s.get("uses", "").startswith("actions/setup-python@")]
        assert setup and str(setup[0]["with"]["python-version"]) == "3.11"


def test_linux_runs_the_frozen_app_test(workflow):
    for job in _bundle_jobs(workflow).values():
        steps = [s for s in _steps(job) if "tests/packaging" in s.get("run", "")]
        assert steps, "the frozen-app test runs"
        step = steps[0]
        assert "Linux" in step.get("if", ""), step
        assert str(step["env"]["SLOTKEEPER_TEST_PACKAGE"]) == "1"


def test_archives_and_uploads_the_artifacts(workflow):
    for job in _bundle_jobs(workflow).values():
        steps = _steps(job)
        runs = " ".join(_runs(job))
        assert "tar " in runs and ".tar.gz" in runs  # Linux
        assert ".zip" in runs  # macOS, Windows
        uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert uploads, "artifacts are uploaded"
        assert uploads[0]["with"].get("path")
        build = next(i for i, s in enumerate(steps) if SPEC in s.get("run", ""))
        assert steps.index(uploads[0]) > build


def test_checkout_comes_first(workflow):
    for job in _bundle_jobs(workflow).values():
        assert _steps(job)[0]["uses"].startswith("actions/checkout@")
