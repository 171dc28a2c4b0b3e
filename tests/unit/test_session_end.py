"""Windows' session ends that Python's signals do not see (core/basics/session_end.py), with a
recorded kernel32 and user32: the console closed, logoff, shutdown; the reason shown while saving."""

from __future__ import annotations

import sys
import threading
import time

from slotkeeper.core.basics import session_end
from slotkeeper.core.basics.session_end import (
    CTRL_CLOSE_EVENT,
    CTRL_LOGOFF_EVENT,
    CTRL_SHUTDOWN_EVENT,
    ShutdownBlock,
    on_console_end,
)


class FakeKernel32:
    def __init__(self) -> None:
        self.handlers: list = []
        self.calls: list[bool] = []

    def SetConsoleCtrlHandler(self, callback, add: bool) -> int:  # noqa: N802 - the Win32 name
        self.calls.append(add)
        if add:
            self.handlers.append(callback)
        else:
            self.handlers.remove(callback)
        return 1


def test_closing_the_console_asks_for_the_stop_and_waits_for_the_saves():
    kernel32, asked, stopped = FakeKernel32(), [], threading.Event()
    undo = on_console_end(asked.append, stopped, kernel32=kernel32, callback_type=lambda f: f)
    [handler] = kernel32.handlers
    result: list[bool] = []
    windows = threading.Thread(target=lambda: result.append(handler(CTRL_CLOSE_EVENT)))
    windows.start()
    time.sleep(0.2)
    assert asked == ["console closed"] and windows.is_alive(), "held until the saves are done"
    stopped.set()
    windows.join(5)
    assert result == [True]
    assert handler(CTRL_LOGOFF_EVENT) and handler(CTRL_SHUTDOWN_EVENT)
    assert asked == ["console closed", "logoff", "shutdown"]
    assert handler(0) is False and handler(1) is False  # Ctrl+C, Ctrl+Break: Python's signals
    undo()
    assert kernel32.handlers == [] and kernel32.calls == [True, False]


def test_the_wait_is_shorter_than_windows_own(monkeypatch):
    assert session_end.CONSOLE_END_WAIT_S < 5  # Windows ends the process about 5 s after the event
    monkeypatch.setattr(session_end, "CONSOLE_END_WAIT_S", 0.1)
    kernel32 = FakeKernel32()
    on_console_end(lambda why: None, threading.Event(), kernel32=kernel32, callback_type=lambda f: f)
    start = time.monotonic()
    assert kernel32.handlers[0](CTRL_CLOSE_EVENT) is True
    assert time.monotonic() - start < 2


def test_a_loop_already_closed_lets_windows_go_on():
    def closed(_why):
        raise RuntimeError("Event loop is closed")

    kernel32 = FakeKernel32()
    on_console_end(closed, threading.Event(), kernel32=kernel32, callback_type=lambda f: f)
    assert kernel32.handlers[0](CTRL_CLOSE_EVENT) is False


def test_nothing_to_install_elsewhere(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    on_console_end(lambda why: None, threading.Event())()  # a no-op, and its undo too


class FakeUser32:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def ShutdownBlockReasonCreate(self, hwnd, reason):  # noqa: N802
        self.calls.append(("create", hwnd, reason))
        return 1

    def ShutdownBlockReasonDestroy(self, hwnd):  # noqa: N802
        self.calls.append(("destroy", hwnd))
        return 1


def test_the_logoff_screen_says_why_the_app_waits_once_and_is_cleared():
    user32 = FakeUser32()
    block = ShutdownBlock(user32=user32)
    block.begin(42)
    block.begin(42)  # asked twice (WM_QUERYENDSESSION again): one reason
    block.end()
    block.end()
    assert user32.calls == [("create", 42, session_end.SAVING_REASON), ("destroy", 42)]
    assert "conversations" in session_end.SAVING_REASON
    ShutdownBlock().begin(1)  # Linux: nothing to call
