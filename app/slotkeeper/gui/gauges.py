"""A painted gauge per slot: how much of the prompt came from cache, and how full the slot is.

Row 1: slot number, state chip (idle / busy / saving / restoring), the conversation it holds,
and right after its title a warning badge (tooltip: why the last restore was not reused).
Row 2: the last (or running) request's prompt: cached share in green, tokens processed in
blue, the rest of a running prefill as an empty track.
Row 3: tokens the slot holds against its context.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QHelpEvent, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolTip, QVBoxLayout, QWidget

CACHE_COLOUR = QColor("#16a34a")
PROCESSED_COLOUR = QColor("#3b82f6")
HELD_COLOUR = QColor("#8b5cf6")
WARN_COLOUR = QColor("#d97706")
UNSAVED_TITLE = "a conversation not saved yet"
BAR_SHARE = 0.45  # of the width after the row labels; the figures in words take the rest
STATE_COLOURS = {
    "idle": QColor("#6b7280"),
    "busy": QColor("#2563eb"),
    "saving": QColor("#0891b2"),
    "restoring": QColor("#7c3aed"),
}


@dataclass(frozen=True)
class GaugeFigures:
    """What the gauge shows, worked out from a SlotView (kept apart from painting to test it)."""

    state: str
    n_prompt: int
    cache_n: int
    prompt_n: int
    n_tokens: int
    n_ctx: int
    running: bool
    warning: str | None

    @classmethod
    def from_view(cls, view) -> GaugeFigures:
        return cls(
            state=view.state, n_prompt=max(0, view.n_prompt), cache_n=max(0, view.cache_n),
            prompt_n=max(0, view.prompt_n), n_tokens=max(0, view.n_tokens), n_ctx=max(0, view.n_ctx),
            running=bool(view.running), warning=view.warning,
        )  # fmt: skip

    @property
    def prefilling(self) -> bool:
        return self.running and self.n_prompt > 0 and self.cache_n + self.prompt_n < self.n_prompt

    @property
    def cache_share(self) -> float:
        return min(1.0, self.cache_n / self.n_prompt) if self.n_prompt else 0.0

    @property
    def processed_share(self) -> float:
        return min(1.0 - self.cache_share, self.prompt_n / self.n_prompt) if self.n_prompt else 0.0

    @property
    def held_share(self) -> float:
        return min(1.0, self.n_tokens / self.n_ctx) if self.n_ctx else 0.0

    def prompt_text(self) -> str:
        if self.n_prompt == 0:
            return "no request yet" if not self.running else "waiting for the prompt…"
        if self.prefilling:
            done = self.cache_n + self.prompt_n
            return (f"reading prompt: {done:,} of {self.n_prompt:,} tokens "
                    f"({self.cache_n:,} from cache)")
        pct = round(100 * self.cache_share)
        return (f"{pct}% of {self.n_prompt:,} prompt tokens from cache "
                f"({self.cache_n:,} cached, {self.prompt_n:,} processed)")

    def held_text(self) -> str:
        if self.n_ctx == 0:
            return f"{self.n_tokens:,} tokens held"
        return f"{self.n_tokens:,} of {self.n_ctx:,} tokens held ({round(100 * self.held_share)}%)"


class SlotGauge(QWidget):
    """One slot's row. Feed it ``set_view(SlotView)``; ``set_title`` names the conversation."""

    BAR_HEIGHT = 10
    LABEL_TEXTS = ("Prompt", "Context")

    def __init__(self, slot: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.slot = slot
        self.figures = GaugeFigures("idle", 0, 0, 0, 0, 0, False, None)
        self.title = ""
        self.session_id: str | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(360)
        self._badge = QRectF()
        self.setAccessibleName(f"Slot {slot}")
        self.setAccessibleDescription(self.summary())
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)  # reachable by keyboard; a screen reader reads it

    # -- data -----------------------------------------------------------------------------
    def set_view(self, view) -> None:
        figures = GaugeFigures.from_view(view)
        if figures != self.figures:
            self.figures = figures
            self.setAccessibleDescription(self.summary())
            self.update()

    def set_title(self, title: str) -> None:
        if title != self.title:
            self.title = title
            self.setAccessibleDescription(self.summary())
            self.update()

    def summary(self) -> str:
        f = self.figures
        parts = [f"Slot {self.slot}: {f.state}"]
        if self.title or f.n_tokens:
            parts.append(f"holds “{self.title}”" if self.title else f"holds {UNSAVED_TITLE}")
        parts += [f.prompt_text(), f.held_text()]
        if f.warning:
            parts.append(f"warning: {f.warning}")
        return "; ".join(parts)

    # -- geometry -------------------------------------------------------------------------
    def _line_height(self) -> int:
        return QFontMetrics(self.font()).height()

    def sizeHint(self) -> QSize:
        lh = self._line_height()
        return QSize(520, 3 * (lh + 6) + 10)

    def minimumSizeHint(self) -> QSize:
        return QSize(360, self.sizeHint().height())

    # -- painting -------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        f = self.figures
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text_colour = pal.color(QPalette.ColorRole.WindowText)
        muted = pal.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText)
        track = pal.color(QPalette.ColorRole.Mid)
        track.setAlpha(90)
        fm = QFontMetrics(self.font())
        lh = fm.height()
        pad = 5
        w = self.width()
        row_h = lh + 6

        # Row 1: "Slot N", state chip, title, warning badge
        bold = QFont(self.font())
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(text_colour)
        name = f"Slot {self.slot}"
        bfm = QFontMetrics(bold)
        y0 = pad
        p.drawText(QRectF(pad, y0, bfm.horizontalAdvance(name) + 2, row_h),
                   Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, name)
        x: float = pad + bfm.horizontalAdvance(name) + 10
        p.setFont(self.font())
        chip_w = fm.horizontalAdvance(f.state) + 14
        chip = QRectF(x, y0 + (row_h - lh - 2) / 2, chip_w, lh + 2)
        colour = STATE_COLOURS.get(f.state, STATE_COLOURS["idle"])
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(colour)
        p.drawRoundedRect(chip, chip.height() / 2, chip.height() / 2)
        p.setPen(QColor("#ffffff"))
        p.drawText(chip, Qt.AlignmentFlag.AlignCenter, f.state)
        x = chip.right() + 10

        # The badge belongs to the conversation whose restore it judges: right after its title.
        badge_size = lh + 2
        self._badge = QRectF()
        right = w - pad - ((badge_size + 8) if f.warning else 0)
        title = self.title or (UNSAVED_TITLE if f.n_tokens else "")
        if title and right > x + 20:
            p.setPen(muted if not self.title else text_colour)
            elided = fm.elidedText(title, Qt.TextElideMode.ElideRight, int(right - x))
            p.drawText(QRectF(x, y0, right - x, row_h),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, elided)
            x += fm.horizontalAdvance(elided) + 8
        if f.warning:
            self._badge = QRectF(x, y0 + (row_h - badge_size) / 2, badge_size, badge_size)
            self._paint_warning(p, self._badge)

        # Rows 2 and 3: a label column, a bar, and the figures in words under/after it
        label_w = max(fm.horizontalAdvance(t) for t in self.LABEL_TEXTS) + 12
        bar_x = pad + label_w
        # The same share of the width in every gauge, so bars line up from slot to slot.
        bar_w = max(60.0, BAR_SHARE * (w - pad - bar_x))
        rows = (
            (self.LABEL_TEXTS[0], [(f.cache_share, CACHE_COLOUR), (f.processed_share, PROCESSED_COLOUR)],
             f.prompt_text(), f.n_prompt == 0),
            (self.LABEL_TEXTS[1], [(f.held_share, HELD_COLOUR)],
             f.held_text(), f.n_ctx == 0 and f.n_tokens == 0),
        )
        for i, (label, segments, words, empty) in enumerate(rows):
            top = y0 + row_h * (i + 1)
            p.setPen(muted)
            p.drawText(QRectF(pad, top, label_w, row_h),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, label)
            bar = QRectF(bar_x, top + (row_h - self.BAR_HEIGHT) / 2, bar_w, self.BAR_HEIGHT)
            self._paint_bar(p, bar, segments, track)
            p.setPen(muted if empty else text_colour)
            text_rect = QRectF(bar.right() + 10, top, w - pad - bar.right() - 10, row_h)
            p.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                       fm.elidedText(words, Qt.TextElideMode.ElideRight, int(text_rect.width())))
        p.end()

    @staticmethod
    def _paint_bar(p: QPainter, bar: QRectF, segments: list[tuple[float, QColor]], track: QColor) -> None:
        radius = bar.height() / 2
        clip = QPainterPath()
        clip.addRoundedRect(bar, radius, radius)
        p.save()
        p.setClipPath(clip)
        p.fillRect(bar, track)
        x = bar.left()
        for share, colour in segments:
            width = bar.width() * max(0.0, min(1.0, share))
            if width > 0:
                p.fillRect(QRectF(x, bar.top(), width, bar.height()), colour)
                x += width
        p.restore()

    @staticmethod
    def _paint_warning(p: QPainter, r: QRectF) -> None:
        path = QPainterPath()
        path.moveTo(QPointF(r.center().x(), r.top() + 1))
        path.lineTo(QPointF(r.right() - 1, r.bottom() - 1))
        path.lineTo(QPointF(r.left() + 1, r.bottom() - 1))
        path.closeSubpath()
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(WARN_COLOUR)
        p.drawPath(path)
        p.setPen(QPen(QColor("#ffffff"), max(1.5, r.width() / 9), Qt.PenStyle.SolidLine,
                      Qt.PenCapStyle.RoundCap))
        cx = r.center().x()
        p.drawLine(QPointF(cx, r.top() + r.height() * 0.38), QPointF(cx, r.top() + r.height() * 0.66))
        p.drawPoint(QPointF(cx, r.top() + r.height() * 0.80))

    # -- tooltips -------------------------------------------------------------------------
    def event(self, e: QEvent) -> bool:
        # Qt delivers tooltip requests as QHelpEvent.
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            pos = e.pos()
            if self.figures.warning and self._badge.contains(QPointF(pos)):
                text = f"The last restore into this slot was not reused:\n{self.figures.warning}"
            else:
                text = self.summary().replace("; ", "\n")
            QToolTip.showText(e.globalPos(), text, self)
            return True
        return super().event(e)


class SlotsPanel(QWidget):
    """One ``SlotGauge`` per slot, added and removed as the server's slot count changes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.gauges: list[SlotGauge] = []
        self._titles: dict[str, str] = {}
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(8)
        self.empty_label = QLabel("The server is not running: slots appear once it is ready.")
        self.empty_label.setWordWrap(True)
        self._layout.addWidget(self.empty_label)
        self._layout.addStretch(1)

    def set_titles(self, titles: dict[str, str]) -> None:
        """Session id -> title, to name the conversation each slot holds."""
        self._titles = dict(titles)
        for gauge in self.gauges:
            gauge.set_title(self._titles.get(gauge.session_id or "", "") if gauge.session_id else "")

    def set_views(self, views: list) -> None:
        while len(self.gauges) > len(views):
            gauge = self.gauges.pop()
            self._layout.removeWidget(gauge)
            gauge.deleteLater()
        while len(self.gauges) < len(views):
            gauge = SlotGauge(len(self.gauges), self)
            self._layout.insertWidget(len(self.gauges) + 1, gauge)
            self.gauges.append(gauge)
        for gauge, view in zip(self.gauges, views):
            gauge.slot = view.id
            # A slot that went on with another conversation is not named by its old session's title.
            gauge.session_id = None if view.detached else view.session_id
            gauge.set_view(view)
            gauge.set_title(self._titles.get(gauge.session_id, "") if gauge.session_id else "")
        self.empty_label.setVisible(not views)
