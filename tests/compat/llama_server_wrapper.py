"""Stands in for llama-server in llama.cpp's own server tests (``make test-compat``).

llama.cpp's ``tools/server/tests/utils.py`` (``ServerProcess``) starts ``$LLAMA_SERVER_BIN_PATH``
with llama-server's arguments; ``run_compat.py`` points that variable at a small launcher that runs
this file. Every model argument (``--hf-repo``, ``--hf-file``, ``-m``, ...) becomes the one local
model the harness fetched (no network here), and download-only arguments are dropped. Then:

- ``COMPAT_MODE=raw``: exec llama-server with those arguments;
- ``COMPAT_MODE=door``: run ``python -m slotkeeper serve`` on the test's host and port with a fresh
  data folder; the arguments Slotkeeper manages itself (its ``OWNED_FLAGS``) become serve's
  options or are dropped, the rest go to llama-server after ``--``. llama-server's log
  (Slotkeeper writes it to the data folder) is copied to this process's stdout, where the tests
  read it. On SIGTERM Slotkeeper is asked to stop; whatever still runs after ``STOP_SECONDS``
  (``ServerProcess.stop`` kills us after 5 s) is killed, llama-server included.

Environment (set by run_compat.py): COMPAT_MODE, COMPAT_MODEL, COMPAT_LLAMA_SERVER, COMPAT_TMP
(where data folders go), COMPAT_PYTHON (the interpreter that has Slotkeeper), COMPAT_NOTES (a
file that collects one line per launch: what was mapped or dropped), COMPAT_SLOTKEEPER_PATH (if
set, put first on Slotkeeper's PYTHONPATH: a committed snapshot of app/).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STOP_SECONDS = 4.0
NUMBER = re.compile(r"^-\d")

# Arguments that fetch a model: replaced by COMPAT_MODEL.
MODEL_ARGS = {"-m", "--model", "-hfr", "--hf-repo", "-hf", "-hff", "--hf-file", "-mu", "--model-url", "-dr",
              "--docker-repo"}
# Only about downloading: dropped on both sides.
DOWNLOAD_ONLY = {"--offline", "-hft", "--hf-token", "-mmu", "--mmproj-url"}
# Slotkeeper manages some arguments itself (command.py OWNED_FLAGS) and refuses them after `--`;
# the door maps these to serve's options and drops the other owned ones.
TO_SERVE_OPTION = {"--host": "--host", "--port": "--port", "-c": "--ctx", "--ctx-size": "--ctx",
                   "-np": "--parallel", "--parallel": "--parallel", "-ctk": "--cache-type-k",
                   "--cache-type-k": "--cache-type-k", "-ctv": "--cache-type-v",
                   "--cache-type-v": "--cache-type-v"}
# OWNED_FLAGS as of this harness, for a Slotkeeper that cannot be imported to ask.
OWNED_FALLBACK = frozenset({
    "-m", "--model", "--host", "--port", "-c", "--ctx-size", "-np", "--parallel", "-fa", "--flash-attn",
    "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "--swa-full", "--no-swa-full", "--slot-save-path",
    "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified", "--cache-idle-slots", "--no-cache-idle-slots",
    "--cache-ram", "-cram", "--api-prefix", "--reuse-port", "-mm", "--mmproj", "-mmu", "--mmproj-url",
    "--no-mmproj", "--mmproj-auto", "--no-mmproj-auto"})


def owned_flags() -> tuple[frozenset[str], str]:
    """The OWNED_FLAGS of the Slotkeeper the door runs (COMPAT_SLOTKEEPER_PATH first, as for it)."""
    if os.environ.get("COMPAT_SLOTKEEPER_PATH"):
        sys.path.insert(0, os.environ["COMPAT_SLOTKEEPER_PATH"])
    try:
        from slotkeeper.core.server.command import OWNED_FLAGS

        return frozenset(OWNED_FLAGS), ""
    except Exception as exc:  # e.g. a working tree mid-edit
        return OWNED_FALLBACK, f"OWNED_FLAGS not importable ({type(exc).__name__}): used the harness's copy"


def split(args: list[str]) -> list[tuple[str, str | None]]:
    """The arguments as (flag, value) pairs; a value is any word after a flag that is not a flag
    itself (a negative number is a value). A flag with no value is (flag, None)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if "=" in arg and arg.startswith("--"):
            flag, value = arg.split("=", 1)
            out.append((flag, value))
        elif i + 1 < len(args) and (not args[i + 1].startswith("-") or NUMBER.match(args[i + 1])):
            out.append((arg, args[i + 1]))
            i += 1
        else:
            out.append((arg, None))
        i += 1
    return out


def flatten(pairs: list[tuple[str, str | None]]) -> list[str]:
    return [w for flag, value in pairs for w in ((flag,) if value is None else (flag, value))]


def translate(args: list[str], mode: str, model: str) -> tuple[list[str], list[str], list[str]]:
    """(serve options, arguments for llama-server, notes). In raw mode the serve options are
    llama-server's own (--model ...), in door mode Slotkeeper's."""
    pairs = split(args)
    notes: list[str] = []
    serve: list[str] = ["--model", model]
    rest: list[tuple[str, str | None]] = []
    replaced = [f"{f} {v}" if v else f for f, v in pairs if f in MODEL_ARGS]
    if replaced:
        notes.append("model " + " ".join(replaced) + " -> " + Path(model).name)
    else:
        notes.append("no model given (router mode): " + ("Slotkeeper gets " + Path(model).name
                                                         if mode == "door" else "left as is"))
        if mode == "raw":
            serve = []
    owned: frozenset[str] = frozenset()
    if mode == "door":
        owned, problem = owned_flags()
        if problem:
            notes.append(problem)
    for flag, value in pairs:
        if flag in MODEL_ARGS:
            continue
        if flag in DOWNLOAD_ONLY:
            notes.append(f"dropped {flag} (download only)")
            continue
        if mode == "door":
            if flag in TO_SERVE_OPTION and value is not None:
                serve += [TO_SERVE_OPTION[flag], value]
                continue
            if flag in ("-fa", "--flash-attn"):
                if value in ("on", "off"):
                    serve += ["--flash-attn", value]
                else:
                    notes.append(f"dropped {flag} {value} (Slotkeeper takes on|off only; it runs off)")
                continue
            if flag in ("--swa-full", "--no-swa-full"):
                serve.append(flag)
                continue
            if flag in owned:
                notes.append(f"dropped {flag}{' ' + value if value else ''} (owned by Slotkeeper)")
                continue
        rest.append((flag, value))
    return serve, flatten(rest), notes


class LogCopier(threading.Thread):
    """Copies a file that is being written (and may be replaced) to our stdout."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        f = None
        ino = None
        out = sys.stdout.buffer
        while True:
            finishing = self.done.is_set()
            try:
                st = self.path.stat()
                if f is None or st.st_ino != ino or st.st_size < f.tell():
                    if f is not None:
                        f.close()
                    f = open(self.path, "rb")  # noqa: SIM115 - kept open across iterations
                    ino = st.st_ino
            except OSError:
                pass
            if f is not None:
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
            if finishing:
                break
            time.sleep(0.05)
        if f is not None:
            f.close()


def kill_leftovers(marker: str) -> None:
    """Kill every process of ours whose command line mentions ``marker`` (the data folder)."""
    try:
        import psutil
    except ImportError:
        return
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != me and any(marker in a for a in (p.info["cmdline"] or [])):
                p.kill()
        except psutil.Error:
            pass


def run_door(serve: list[str], rest: list[str]) -> int:
    tmp_root = os.environ.get("COMPAT_TMP") or None
    if tmp_root:
        os.makedirs(tmp_root, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="door-", dir=tmp_root)
    python = os.environ.get("COMPAT_PYTHON") or sys.executable
    argv = [python, "-m", "slotkeeper", "serve", *serve, "--data-dir", data_dir,
            "--server-bin", os.environ["COMPAT_LLAMA_SERVER"], *(["--", *rest] if rest else [])]
    print("compat wrapper (door): " + " ".join(argv), flush=True)
    copier = LogCopier(Path(data_dir) / "logs" / "llama-server.log")
    copier.start()
    env = dict(os.environ)
    if os.environ.get("COMPAT_SLOTKEEPER_PATH"):  # run_compat.py --slotkeeper REV: a committed app/
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ["COMPAT_SLOTKEEPER_PATH"],
                                                          os.environ.get("PYTHONPATH")]))
    child = subprocess.Popen(argv, start_new_session=True, env=env)
    stopping = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        stopping.set()
        try:
            os.killpg(child.pid, signal.SIGTERM) if signum != signal.SIGINT else child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while child.poll() is None and not stopping.is_set():
            time.sleep(0.05)
        if stopping.is_set():
            try:
                child.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                print("compat wrapper: Slotkeeper did not stop in time; killing it", flush=True)
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
        code = child.returncode
    finally:
        kill_leftovers(data_dir)  # llama-server runs in its own session: it never gets our signals
        copier.done.set()
        copier.join(timeout=2)
        shutil.rmtree(data_dir, ignore_errors=True)
    return code


def main() -> int:
    mode = os.environ.get("COMPAT_MODE", "raw")
    model = os.environ["COMPAT_MODEL"]
    serve, rest, notes = translate(sys.argv[1:], mode, model)
    notes_file = os.environ.get("COMPAT_NOTES")
    if notes_file:
        with open(notes_file, "a", encoding="utf-8") as f:
            f.write(f"{mode}\t{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{'; '.join(notes)}\n")
    if mode == "raw":
        binary = os.environ["COMPAT_LLAMA_SERVER"]
        argv = [binary, *serve, *rest]
        print("compat wrapper (raw): " + " ".join(argv), flush=True)
        os.execv(binary, argv)
    if mode != "door":
        print(f"compat wrapper: COMPAT_MODE must be raw or door, not {mode!r}", file=sys.stderr)
        return 2
    return run_door(serve, rest)


if __name__ == "__main__":
    sys.exit(main())
