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

from slotkeeper.core.server.child_env import child_environment


def _frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def _start_detached(argv: list[str]) -> None:
    kwargs: dict = {"env": child_environment(), "stdin": subprocess.DEVNULL,
                    "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if os.name != "nt":
        kwargs["start_new_session"] = True
    subprocess.Popen(argv, **kwargs)  # noqa: S603 - a fixed opener and our own URL/path


def _opener() -> list[str]:
    if sys.platform == "darwin":
        return ["open"]
    if os.name == "nt":
        return ["rundll32", "url.dll,FileProtocolHandler"]
    return ["xdg-open"]


def open_url(url: str) -> None:
    if _frozen():
        _start_detached([*_opener(), url])
    else:
        QDesktopServices.openUrl(QUrl(url))


def reveal_in_file_manager(path: Path) -> None:
    """Open the folder holding ``path`` with the file selected where the platform allows."""
    if sys.platform == "darwin":
        _start_detached(["open", "-R", str(path)])
    elif os.name == "nt":
        _start_detached(["explorer", "/select,", str(path)])
    elif _frozen():
        _start_detached(["xdg-open", str(path.parent)])
    else:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent)))
