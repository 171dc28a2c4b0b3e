"""The start-up failure dialog the packaged app shows (cli/failure.py): a real modal box that says the
reason and returns once closed."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from slotkeeper.cli import failure


def test_the_reason_is_shown_and_closing_the_box_returns(qtbot):
    seen: list[str] = []

    def read_and_close() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, read_and_close)  # not up yet
            return
        seen.append(f"{box.objectName()}|{box.windowTitle()}|{box.text()}|{box.icon().name}")
        box.accept()

    QTimer.singleShot(0, read_and_close)
    reason = "cannot use the data folder D:\\Data: it is a file, not a folder"
    assert failure.show_dialog(reason)
    assert seen == [f"startupFailure|Slotkeeper|{reason}|Critical"]
