"""macOS App Nap, kept off while Slotkeeper runs.

macOS naps an app with no visible window: its timers are coalesced and delayed by seconds, its I/O
throttled. For a menu-bar app whose work is timers and sockets (the idle saves, the polling of
llama-server, the front door streaming a reply to a client), that means saves late and replies
stalled. The packaged app says so in its Info.plist (``NSAppSleepDisabled``); from a Python install
there is no Info.plist, so the app also tells the system itself, the documented way:
``[[NSProcessInfo processInfo] beginActivityWithOptions:reason:]`` (through the Objective-C runtime
with ctypes, objc_runtime.py: no PyObjC needed). The activity lasts as long as the process.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from slotkeeper.core.basics import objc_runtime
from slotkeeper.core.basics.objc_runtime import ObjC

log = logging.getLogger(__name__)

# NSActivityUserInitiatedAllowingIdleSystemSleep (NSProcessInfo.h): user-initiated work, no App Nap,
# and the Mac may still sleep when idle (a laptop's lid closes as usual).
NS_ACTIVITY_USER_INITIATED = 0x00FFFFFF
NS_ACTIVITY_IDLE_SYSTEM_SLEEP_DISABLED = 1 << 20
NS_ACTIVITY_OPTIONS = NS_ACTIVITY_USER_INITIATED & ~NS_ACTIVITY_IDLE_SYSTEM_SLEEP_DISABLED
REASON = "Slotkeeper saves conversations and answers clients in the background"

_held: list[Any] = []  # the activity token, for the life of the process


def keep_awake(objc: ObjC | None = None) -> bool:
    """Begin the activity that keeps App Nap off (once per process). False where there is none to
    begin (not macOS) or it could not be begun (logged)."""
    if _held:
        return True
    objc = objc or objc_runtime.runtime()
    if objc is None:
        return False
    info = objc.send(objc.cls("NSProcessInfo"), "processInfo")
    reason = objc.send(objc.cls("NSString"), "stringWithUTF8String:", ctypes.c_char_p(REASON.encode()))
    activity = objc.send(info, "beginActivityWithOptions:reason:", ctypes.c_uint64(NS_ACTIVITY_OPTIONS),
                         ctypes.c_void_p(reason))
    if not activity:
        return False
    objc.send(activity, "retain")
    _held.append(activity)
    return True
