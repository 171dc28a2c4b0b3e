"""The Qt binding itself: defects of a PySide6 release that would crash the app are caught here."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal


class _Emitter(QObject):
    flag = Signal(bool)
    anything = Signal(object)
    outcome = Signal(int, bool, object)  # the shape of JobRunner's delivery signal


def test_emitting_bools_keeps_their_reference_counts(qtbot):
    # PySide6 6.12.0 dropped a reference to True/False on every emit with a bool argument; after
    # enough emits (each background job emits one) the interpreter aborted at exit with
    # "Fatal Python error: bool_dealloc". pyproject.toml excludes that release.
    e = _Emitter()
    e.flag.connect(lambda _v: None)
    before = sys.getrefcount(True), sys.getrefcount(False)
    for _ in range(200):
        e.flag.emit(True)
        e.flag.emit(False)
        e.anything.emit(True)
        e.outcome.emit(1, False, None)
    after = sys.getrefcount(True), sys.getrefcount(False)
    # The faulty release loses one reference per bool emitted (200 of True, 400 of False here);
    # threads a test left running may hold or let go of a few meanwhile, so allow that much.
    assert abs(after[0] - before[0]) <= 20 and abs(after[1] - before[1]) <= 20, (before, after)
