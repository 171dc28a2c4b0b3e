"""App Nap kept off on macOS (core/basics/app_nap.py), with a recorded Objective-C runtime; and the
packaged app's Info.plist says the same."""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import pytest

from slotkeeper.core.basics import app_nap

ROOT = Path(__file__).resolve().parents[2]


class RecordedObjC:
    def __init__(self, activity: int = 77) -> None:
        self.sent: list[tuple] = []
        self.activity = activity

    def cls(self, name: str) -> str:
        return f"class {name}"

    def send(self, receiver, selector: str, *args):
        self.sent.append((receiver, selector, *args))
        return {"processInfo": 11, "stringWithUTF8String:": 22,
                "beginActivityWithOptions:reason:": self.activity}.get(selector)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(app_nap, "_held", [])


def test_the_activity_is_begun_once_with_options_that_keep_app_nap_off_but_let_the_mac_sleep():
    objc = RecordedObjC()
    assert app_nap.keep_awake(objc) and app_nap.keep_awake(objc)
    selectors = [s[1] for s in objc.sent]
    assert selectors == ["processInfo", "stringWithUTF8String:", "beginActivityWithOptions:reason:", "retain"]
    begin = objc.sent[2]
    assert begin[0] == 11 and begin[3].value == 22
    options = begin[2]
    assert isinstance(options, ctypes.c_uint64)
    assert options.value & 0xFF  # NSActivityUserInitiated's bits (App Nap off)
    assert not options.value & (1 << 20)  # NSActivityIdleSystemSleepDisabled: not asked for
    assert objc.sent[1][2].value.decode() == app_nap.REASON
    assert objc.sent[3][0] == 77  # the activity retained, held for the life of the process


def test_nothing_to_do_elsewhere_and_a_refusal_is_no_error(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert app_nap.keep_awake() is False
    assert app_nap.keep_awake(RecordedObjC(activity=0)) is False


def test_the_packaged_app_says_so_in_its_info_plist():
    spec = (ROOT / "packaging" / "slotkeeper.spec").read_text(encoding="utf-8")
    assert re.search(r'"NSAppSleepDisabled":\s*True', spec)


def test_run_from_source_the_dock_icon_is_hidden_without_pyobjc(monkeypatch):
    pytest.importorskip("PySide6")
    from slotkeeper.gui.application import NS_ACTIVATION_POLICY_ACCESSORY, hide_dock_icon

    objc = RecordedObjC()
    objc.send = lambda receiver, selector, *args: (objc.sent.append((receiver, selector, *args)),  # type: ignore
                                                   {"sharedApplication": 5}.get(selector, 1))[1]
    assert hide_dock_icon(objc)
    assert [s[:2] for s in objc.sent] == [("class NSApplication", "sharedApplication"),
                                           (5, "setActivationPolicy:")]
    assert objc.sent[1][2].value == NS_ACTIVATION_POLICY_ACCESSORY == 1
    monkeypatch.setattr(sys, "platform", "linux")
    assert hide_dock_icon() is False
