"""Handing things to the desktop: URLs to the browser, files to the file manager.

A frozen (PyInstaller) app runs with the bundle's library and plugin paths in its environment;
the browser or file manager it starts must get the user's own environment back, or it may load
the bundle's Qt/ICU libraries and fail. So when frozen we start the opener ourselves with
``child_environment()``; otherwise Qt's QDesktopServices does the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from slotkeeper.core.basics.child_env import child_environment


def _frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def _start_detached(argv: list[str]) -> bool:
    kwargs: dict = {"env": child_environment(), "stdin": subprocess.DEVNULL,
                    "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if os.name != "nt":
        kwargs["start_new_session"] = True
    try:
        subprocess.Popen(argv, **kwargs)  # noqa: S603 - a fixed opener and our own URL/path
    except OSError:  # no such opener on this system
        return False
    return True


def _opener() -> list[str]:
    if sys.platform == "darwin":
        return ["open"]
    if os.name == "nt":
        return ["rundll32", "url.dll,FileProtocolHandler"]
    return ["xdg-open"]


def open_url(url: str) -> bool:
    """Open ``url`` in the user's browser; False when nothing could be started to open it."""
    if _frozen():
        return _start_detached([*_opener(), url])
    return bool(QDesktopServices.openUrl(QUrl(url)))


def reveal_in_file_manager(path: Path) -> bool:
    """Open the folder holding ``path`` with the file selected where the platform allows;
    False when no file manager could be started."""
    if sys.platform == "darwin":
        return _start_detached(["open", "-R", str(path)])
    if os.name == "nt":
        return _start_detached(["explorer", "/select,", str(path)])
    if _frozen():
        return _start_detached(["xdg-open", str(path.parent)])
    return bool(QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent))))


def no_browser_message(url: str) -> str:
    return f"No web browser could be started here; open {url} yourself (the address is on the clipboard)."


def no_file_manager_message(path: Path) -> str:
    return f"No file manager could be started here; the file is {path} (the path is on the clipboard)."
