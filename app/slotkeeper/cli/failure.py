"""Telling a user why Slotkeeper could not start, where they will see it.

In a terminal that is stderr. A packaged app has none a person reads: a windowed .exe has no
stderr at all, and one opened from Finder, the Start menu or at login writes it to nothing. So
the packaged desktop app (and any desktop run without a stderr) also shows the reason in a dialog:
Qt's when it can be imported, else the system's own (a Windows message box, a macOS alert).
"""

from __future__ import annotations

import os
import subprocess
import sys

TITLE = "Slotkeeper"
ALERT_TIMEOUT_S = 600  # osascript waits for the click; never forever


def tell(message: str, desktop: bool) -> None:
    """Say ``message`` on stderr, and for the desktop app without a terminal, in a dialog too."""
    if sys.stderr is not None:
        print(f"slotkeeper: {message}", file=sys.stderr)
    if desktop and needs_dialog():
        show_dialog(message)


def needs_dialog() -> bool:
    """The packaged app (stderr goes nowhere a person reads), or no stderr at all."""
    return sys.stderr is None or bool(getattr(sys, "frozen", False))


def has_screen() -> bool:
    if sys.platform.startswith("linux"):
        return any(os.environ.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))
    return True


def show_dialog(message: str) -> bool:
    """Show ``message`` in a dialog and wait for it to be closed; False when none could be shown.
    In a dialog it reads as a sentence (on stderr it follows "slotkeeper: ", in lower case)."""
    if not has_screen():
        return False
    message = message[:1].upper() + message[1:]
    try:
        from slotkeeper.gui.failure_dialog import show_failure
    except ImportError:  # Qt's libraries missing: the system's own dialog
        return native_dialog(message)
    return show_failure(TITLE, message)


def native_dialog(message: str, platform: str = sys.platform) -> bool:
    try:
        if platform == "win32":
            import ctypes

            MB_ICONERROR = 0x10
            windll = getattr(ctypes, "windll")  # Windows only  # noqa: B009
            windll.user32.MessageBoxW(None, message, TITLE, MB_ICONERROR)
            return True
        if platform == "darwin":
            alert = f"display alert {applescript_text(TITLE)} message {applescript_text(message)}"
            script = f"{alert} as critical"
            subprocess.run(["osascript", "-e", script], timeout=ALERT_TIMEOUT_S,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return True
    except (OSError, AttributeError, subprocess.SubprocessError):
        pass
    return False


def applescript_text(text: str) -> str:
    """``text`` as an AppleScript string literal (quotes and backslashes escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
