"""Small widgets shared by the windows."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QLabel,
    QProgressBar,
    QProgressDialog,
    QSizePolicy,
    QTreeWidget,
    QTreeWidgetItem,
    QWidget,
)

from slotkeeper.core.settings import join_args

# A progress bar counts in ints: a 12 GB file in bytes does not fit, so it counts KiB.
_BAR_UNIT = 1024


def show_bytes(bar: QProgressBar | QProgressDialog, done: int, total: int) -> None:
    """``done`` of ``total`` bytes on a progress bar (or a progress dialog's)."""
    bar.setRange(0, max(1, total // _BAR_UNIT))
    bar.setValue(min(done, total) // _BAR_UNIT)


def waiting_dialog(text: str, title: str, modality: Qt.WindowModality,
                   parent: QWidget | None = None) -> QProgressDialog:
    """A busy indicator for work that cannot be cancelled (saving before a quit or a switch): no
    Cancel button, shown at once, open until its owner closes it."""
    progress = QProgressDialog(text, "", 0, 0, parent)
    progress.setWindowTitle(title)
    progress.setCancelButton(None)
    progress.setMinimumDuration(0)
    progress.setAutoClose(False)
    progress.setAutoReset(False)
    progress.setWindowModality(modality)
    return progress


def bring_forward(window: QWidget) -> None:
    """Show a window in front of the others, restored if it was minimized."""
    if window.isMinimized():
        window.showNormal()
    window.show()
    window.raise_()
    window.activateWindow()


def top_level_items(tree: QTreeWidget) -> list[QTreeWidgetItem]:
    """The tree's top-level items in order (``topLevelItem(i)`` is None only out of range)."""
    items = (tree.topLevelItem(i) for i in range(tree.topLevelItemCount()))
    return [item for item in items if item is not None]


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


def describe_profile(profile, flash_attn: bool | None = None) -> str:
    """A launch's settings in a line: "context 8,192 (4,096 per slot), 2 slots, flash attention on
    (auto), K f16 / V f16". ``flash_attn``: what "auto" resolved to, when the server runs."""
    if profile.flash_attn is not None:
        fa = "on" if profile.flash_attn else "off"
    else:
        fa = "auto" if flash_attn is None else f"{'on' if flash_attn else 'off'} (auto)"
    parts = [f"context {profile.ctx:,} ({profile.ctx_per_slot:,} per slot)",
             f"{profile.parallel} slot{'s' if profile.parallel != 1 else ''}",
             f"flash attention {fa}",
             f"K {profile.cache_type_k} / V {profile.cache_type_v}"]
    if profile.swa_full:
        parts.append("--swa-full")
    if profile.extra_args:
        parts.append(join_args(profile.extra_args))  # as the platform's command line writes them
    return ", ".join(parts)
