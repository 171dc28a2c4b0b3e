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
    assert seen == [f"startupFailure|Slotkeeper|C{reason[1:]}|Critical"]


def test_a_refused_data_folder_is_said_in_the_box(qtbot, tmp_path):
    """What a double-clicked app shows when its data folder is refused: the data folder check's own
    words (here a folder other users can write to), pictured for docs/screenshots."""
    from gui_helpers import keep_screenshot

    from slotkeeper.cli.options import data_folder_problem

    shared = tmp_path / "Slotkeeper"
    shared.mkdir()
    shared.chmod(0o777)
    reason = data_folder_problem(str(shared))
    assert reason and str(shared) in reason and "chmod 700" in reason
    # The picture names the folder where Linux keeps it, not this test's temporary one.
    reason = reason.replace(str(tmp_path), "/home/you/.local/share")
    seen: list[str] = []

    def read_and_close() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox) or not box.isVisible():
            QTimer.singleShot(50, read_and_close)
            return
        seen.append(box.text())
        keep_screenshot(box, "startup-failure.png")
        box.accept()

    QTimer.singleShot(0, read_and_close)
    assert failure.show_dialog(reason)
    assert seen == [reason[0].upper() + reason[1:]], "said as a sentence"
