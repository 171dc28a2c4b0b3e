"""Small widgets shared by the windows."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class WrappedLabel(QLabel):
    """A word-wrapped label exactly as tall as its text at its current width.

    Form layouts size a wrapped QLabel from its size hint, computed for a narrow guessed
    width, so a note that later fills the row sits in a too-tall (or too-short, clipped) row.
    This label fixes its height to ``heightForWidth`` whenever its width or text changes.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setWordWrap(True)
        policy = self.sizePolicy()  # keeps the height-for-width flag wordWrap set
        policy.setHorizontalPolicy(QSizePolicy.Policy.Expanding)
        self.setSizePolicy(policy)

    def _fit(self) -> None:
        if self.width() <= 0:
            return
        height = self.heightForWidth(self.width())
        if height > 0 and height != self.maximumHeight():
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def setText(self, text: str) -> None:
        super().setText(text)
        self._fit()
