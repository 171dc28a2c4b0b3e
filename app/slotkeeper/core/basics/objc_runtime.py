"""The Objective-C runtime through ctypes, for the few macOS calls Slotkeeper makes (App Nap, the Dock
icon) without PyObjC, which the app does not ship."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from typing import Any, Protocol

log = logging.getLogger(__name__)

FOUNDATION = "/System/Library/Frameworks/Foundation.framework/Foundation"
APPKIT = "/System/Library/Frameworks/AppKit.framework/AppKit"


class ObjC(Protocol):
    def cls(self, name: str) -> Any: ...

    def send(self, receiver: Any, selector: str, *args: Any) -> Any: ...


class Runtime:
    """The Objective-C runtime through ctypes: each message sent with its exact argument types
    (objc_msgSend is not variadic on Apple Silicon)."""

    def __init__(self) -> None:
        ctypes.cdll.LoadLibrary(FOUNDATION)
        ctypes.cdll.LoadLibrary(APPKIT)
        self._lib = ctypes.cdll.LoadLibrary(ctypes.util.find_library("objc") or "libobjc.dylib")
        self._lib.objc_getClass.restype = ctypes.c_void_p
        self._lib.objc_getClass.argtypes = [ctypes.c_char_p]
        self._lib.sel_registerName.restype = ctypes.c_void_p
        self._lib.sel_registerName.argtypes = [ctypes.c_char_p]

    def cls(self, name: str) -> Any:
        return self._lib.objc_getClass(name.encode())

    def send(self, receiver: Any, selector: str, *args: Any) -> Any:
        send = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                *[type(a) for a in args])(("objc_msgSend", self._lib))
        return send(receiver, self._lib.sel_registerName(selector.encode()), *args)


@functools.cache
def runtime() -> Runtime | None:
    """This process's runtime (loaded once), or None: not macOS, or it cannot be reached (logged)."""
    if sys.platform != "darwin":
        return None
    try:
        return Runtime()
    except OSError:
        log.warning("cannot reach the Objective-C runtime (App Nap stays on, the Dock icon shows)",
                    exc_info=True)
        return None
