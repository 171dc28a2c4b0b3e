"""The ends of a Windows session that Python's signals do not see, in one place.

`slotkeeper serve` saves the conversations and stops llama-server on SIGINT and SIGTERM (and, on
Windows, SIGBREAK: Ctrl+Break). Closing the console window, logging off and shutting down reach a
console program only through its console control handler: Python installs none for them, so the
process would end at once, without saving. ``on_console_end`` installs one that asks for the stop and
holds the event until the saves are done, for as long as Windows waits (about 5 s) before it ends the
process anyway.

The desktop app has no console: Windows asks it through WM_QUERYENDSESSION (Qt's commitDataRequest),
and shows the reason a program gives (``ShutdownBlockReasonCreate``) while it saves, so the person
sees why logging off waits instead of cutting a large save short.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

CTRL_CLOSE_EVENT = 2
CTRL_LOGOFF_EVENT = 5
CTRL_SHUTDOWN_EVENT = 6
SESSION_END_EVENTS = {CTRL_CLOSE_EVENT: "console closed", CTRL_LOGOFF_EVENT: "logoff",
                      CTRL_SHUTDOWN_EVENT: "shutdown"}
CONSOLE_END_WAIT_S = 4.5  # Windows ends a console process about 5 s after these events
SAVING_REASON = "Saving your conversations' memory (the KV cache) before Slotkeeper quits"


def on_console_end(request_stop: Callable[[str], None], stopped: threading.Event,
                   kernel32: Any = None, callback_type: Any = None) -> Callable[[], None]:
    """Windows: when the console is closed, or the user logs off or shuts down, call
    ``request_stop(why)`` (from Windows' handler thread) and hold that event until ``stopped`` is set
    or the wait runs out. Returns what undoes it. Elsewhere (no ``kernel32`` given) a no-op.
    ``kernel32`` and ``callback_type`` are for tests; by default ctypes' own."""
    if kernel32 is None:
        if sys.platform != "win32":
            return lambda: None
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.windll.kernel32
        callback_type = ctypes.WINFUNCTYPE(wintypes.BOOL, wintypes.DWORD)

    def handler(event: int) -> bool:
        why = SESSION_END_EVENTS.get(event)
        if why is None:
            return False  # Ctrl+C, Ctrl+Break: Python's signal handlers take them
        try:
            request_stop(why)
        except RuntimeError:  # the loop has already closed: nothing left to save
            return False
        stopped.wait(CONSOLE_END_WAIT_S)
        return True

    callback = callback_type(handler)  # kept by the closure below: it must outlive its registration
    kernel32.SetConsoleCtrlHandler(callback, True)

    def undo() -> None:
        kernel32.SetConsoleCtrlHandler(callback, False)

    return undo


class ShutdownBlock:
    """Windows: the reason shown on the logoff screen while the app saves; a no-op elsewhere."""

    def __init__(self, user32: Any = None) -> None:
        if user32 is None and sys.platform == "win32":
            import ctypes

            user32 = ctypes.windll.user32
        self._user32 = user32
        self._hwnd: int | None = None

    def begin(self, hwnd: int, reason: str = SAVING_REASON) -> None:
        if self._user32 is None or self._hwnd is not None:
            return
        if self._user32.ShutdownBlockReasonCreate(hwnd, reason):
            self._hwnd = hwnd

    def end(self) -> None:
        if self._user32 is not None and self._hwnd is not None:
            self._user32.ShutdownBlockReasonDestroy(self._hwnd)
            self._hwnd = None
