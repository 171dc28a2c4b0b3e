"""The dialog that says why Slotkeeper could not start (cli/failure.py decides when)."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication, QMessageBox


def show_failure(title: str, message: str) -> bool:
    """A modal error box; returns once it is closed."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    box = QMessageBox(QMessageBox.Icon.Critical, title, message)
    box.setObjectName("startupFailure")
    box.exec()
    box.deleteLater()
    return True
