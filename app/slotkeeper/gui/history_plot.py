"""Prompt tokens per request and the share served from cache, painted with QPainter.

One bar per request, oldest on the left, newest on the right (spaced evenly: a night without
requests would otherwise squash the day into a line); its green part is what came from the
slot's cache, its blue part what the server had to process. The orange line is the cached
share (right axis, 0-100%). Time labels under the bars say when, each different from the one
before (seconds are shown when the requests came within minutes); the newest, the oldest and the
first after each launch are labelled first. A purple mark above a bar says its cache was restored
from disk for it (also by the launch before it: a slot's first request after a launch that restored
that slot); a dashed line marks where the server was (re)launched, earlier runs' launches included.
The token axis has whole-number ticks.
QtCharts is not in PySide6-Essentials, hence the hand-drawn plot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QHelpEvent, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from slotkeeper.core.basics.units import human_duration
from slotkeeper.gui.gauges import CACHE_COLOUR, PROCESSED_COLOUR

SHARE_COLOUR = QColor("#ea580c")
RESTORE_COLOUR = QColor("#8b5cf6")
LAUNCH_COLOUR = QColor("#6b7280")
# Where a request's cache came from (history records since Slotkeeper serves the requests).
SOURCES = {"slot": ", already in the slot", "restored": ", restored from disk for it",
           "launch": ", restored from disk when the server was launched",
           "ram": ", from llama-server's RAM cache",
           "recomputed": ", recomputed (a restore would have been wrong)",
           "none": ""}
RESTORED = ("restored", "launch")  # served by a restore: for this request, or by the launch before it
MIN_BAR_PX = 3.0
MAX_BAR_PX = 28.0


@dataclass(frozen=True)
class PlotPoint:
    at: float
    slot: int
    n_prompt: int
    cache_n: int
    prompt_ms: float
    source: str = ""
    saved_ms: float = 0.0

    @property
    def share(self) -> float:
        return min(1.0, self.cache_n / self.n_prompt) if self.n_prompt else 0.0

    @classmethod
    def from_record(cls, r) -> PlotPoint:
        n_prompt = int(getattr(r, "n_prompt", 0) or 0)
        cache_n = int(getattr(r, "cache_n", 0) or 0)
        if n_prompt == 0:
            n_prompt = cache_n + int(getattr(r, "prompt_n", 0) or 0)
        return cls(float(getattr(r, "at", 0.0) or 0.0), int(getattr(r, "slot", 0) or 0),
                   n_prompt, cache_n, float(getattr(r, "prompt_ms", 0.0) or 0.0),
                   str(getattr(r, "source", "") or ""), float(getattr(r, "saved_ms", 0.0) or 0.0))


def nice_step(value: float) -> int:
    """The smallest whole-number tick step at or above ``value``: 1, 2 or 5 x 10^n (and 25, 250,
    ... from 10 up), never a fraction of a token."""
    if value <= 1:
        return 1
    exp = math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * 10**exp
        if step >= value and step == int(step):
            return int(step)
    return 10 ** (exp + 1)  # pragma: no cover


def served_by_launch(points: list[PlotPoint], launches: dict[float, tuple[int, ...]]) -> set[int]:
    """Indices of requests served by a launch restore: the first request of a slot after a launch
    that restored that slot, found "already in the slot" (it was brought from disk at launch)."""
    out: set[int] = set()
    if not launches:
        return out
    moments = sorted(launches)
    seen: set[tuple[float, int]] = set()  # (launch, slot) already had its first request
    for i, pt in enumerate(points):
        before = [t for t in moments if t <= pt.at]
        if not before:
            continue
        launch = before[-1]
        if (launch, pt.slot) in seen:
            continue
        seen.add((launch, pt.slot))
        if pt.source == "slot" and pt.slot in launches[launch]:
            out.add(i)
    return out


def short_count(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:g}M"
    if n >= 1000:
        return f"{n / 1000:g}k"
    return f"{n:g}"


class HistoryPlot(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.points: list[PlotPoint] = []  # as drawn (a launch's restores marked)
        self._records: list[PlotPoint] = []  # as recorded
        self.launches: list[float] = []  # when the server was (re)launched (unix time)
        self._launch_slots: dict[float, tuple[int, ...]] = {}  # launch -> the slots it restored
        self._bars: list[tuple[QRectF, PlotPoint]] = []
        self.time_labels: list[str] = []  # the time labels drawn last (kept to test them)
        self.tick_labels: list[str] = []  # the token axis's labels drawn last, bottom up
        self.markers: list[tuple[str, int]] = []  # ("restored" | "launch", bar index) drawn last
        self.setMouseTracking(True)
        self.setAccessibleName("Request history")
        self.setAccessibleDescription(self.summary())
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setMinimumSize(420, 220)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_records(self, records) -> None:
        self._records = sorted((PlotPoint.from_record(r) for r in records), key=lambda p: p.at)
        self._relabel()

    def set_launches(self, launches) -> None:
        """When the server was launched: unix times, or ``LaunchRecord``s (with the slots each
        restored). A dashed line before the first request after each; a slot's first request after
        a launch that restored it is marked as served by that restore."""
        slots: dict[float, tuple[int, ...]] = {}
        for launch in launches:
            at = float(getattr(launch, "at", launch) or 0)
            if at:
                slots[at] = tuple(sorted({*slots.get(at, ()), *getattr(launch, "restored_slots", ())}))
        if slots != self._launch_slots:
            self._launch_slots = slots
            self.launches = sorted(slots)
            self._relabel()

    def _relabel(self) -> None:
        points = list(self._records)
        for i in served_by_launch(points, self._launch_slots):
            points[i] = replace(points[i], source="launch")
        self.points = points
        self.setAccessibleDescription(self.summary())
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(640, 300)

    # -- summary for a label beside the plot ----------------------------------------------
    def summary(self) -> str:
        if not self.points:
            return "No requests recorded yet."
        total = sum(p.n_prompt for p in self.points)
        cached = sum(p.cache_n for p in self.points)
        share = cached / total if total else 0.0
        text = (f"{len(self.points)} requests, {total:,} prompt tokens, "
                f"{round(100 * share)}% served from cache")
        saved = sum(p.saved_ms for p in self.points)
        if saved:
            text += f"; {human_duration(saved / 1000)} of prefill saved"
        return text

    # -- painting -------------------------------------------------------------------------
    def _visible(self, plot_w: float) -> list[PlotPoint]:
        fits = max(1, int(plot_w // MIN_BAR_PX))
        return self.points[-fits:]

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text = pal.color(QPalette.ColorRole.WindowText)
        muted = pal.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText)
        grid = pal.color(QPalette.ColorRole.Mid)
        grid.setAlpha(80)
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        fm = QFontMetrics(self.font())
        lh = fm.height()
        self._bars = []

        if not self.points:
            self.time_labels, self.markers = [], []
            p.setPen(muted)
            p.drawText(QRectF(self.rect()), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                       "No requests yet.\nEach request's prompt tokens, and how many came from "
                       "the cache, will show here.")
            p.end()
            return

        left = fm.horizontalAdvance("000.0k") + 14
        right = fm.horizontalAdvance("100%") + 14
        top = lh + 14  # legend row
        bottom = lh * 2 + 10  # time labels + axis title
        plot = QRectF(left, top, max(10.0, self.width() - left - right),
                      max(10.0, self.height() - top - bottom))
        points = self._visible(plot.width())
        y_step = nice_step((max(pt.n_prompt for pt in points) or 1) / 4)
        y_max = 4 * y_step

        # legend
        x = plot.left()
        legend = [("from cache", CACHE_COLOUR), ("processed", PROCESSED_COLOUR),
                  ("share from cache", SHARE_COLOUR)]
        if any(pt.source in RESTORED for pt in points):
            legend.append(("restored from disk", RESTORE_COLOUR))
        if any(points[0].at < t <= points[-1].at for t in self.launches):
            legend.append(("server launched", LAUNCH_COLOUR))
        for label, colour in legend:
            p.fillRect(QRectF(x, 6 + (lh - 10) / 2, 10, 10), colour)
            p.setPen(text)
            p.drawText(QPointF(x + 14, 6 + fm.ascent()), label)
            x += 14 + fm.horizontalAdvance(label) + 18

        # grid and axes labels
        p.setPen(QPen(grid, 1))
        for i in range(5):
            y = plot.bottom() - plot.height() * i / 4
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(muted)
        self.tick_labels = [short_count(y_step * i) for i in range(5)]
        for i in range(5):
            y = plot.bottom() - plot.height() * i / 4
            p.drawText(QRectF(0, y - lh / 2, left - 6, lh),
                       Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, self.tick_labels[i])
            p.drawText(QRectF(plot.right() + 6, y - lh / 2, right - 6, lh),
                       Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, f"{25 * i}%")

        # bars
        slot_w = plot.width() / len(points)
        bar_w = max(1.0, min(MAX_BAR_PX, slot_w * 0.75))
        share_path = QPainterPath()
        for i, pt in enumerate(points):
            cx = plot.left() + slot_w * (i + 0.5)
            h_total = plot.height() * pt.n_prompt / y_max
            h_cache = plot.height() * pt.cache_n / y_max
            bar = QRectF(cx - bar_w / 2, plot.bottom() - h_total, bar_w, h_total)
            p.fillRect(QRectF(bar.left(), plot.bottom() - h_cache, bar_w, h_cache), CACHE_COLOUR)
            p.fillRect(QRectF(bar.left(), bar.top(), bar_w, h_total - h_cache), PROCESSED_COLOUR)
            self._bars.append((QRectF(cx - slot_w / 2, plot.top(), slot_w, plot.height()), pt))
            sy = plot.bottom() - plot.height() * pt.share
            if i == 0:
                share_path.moveTo(cx, sy)
            else:
                share_path.lineTo(cx, sy)
        p.setPen(QPen(SHARE_COLOUR, 2))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawPath(share_path)
        if len(points) <= 60:
            p.setBrush(SHARE_COLOUR)
            for i, pt in enumerate(points):
                cx = plot.left() + slot_w * (i + 0.5)
                p.drawEllipse(QPointF(cx, plot.bottom() - plot.height() * pt.share), 2.5, 2.5)

        # markers: a restore served the request (above its bar), the server was launched (before it)
        self.markers = []
        launches = self.launches
        for i, pt in enumerate(points):
            cx = plot.left() + slot_w * (i + 0.5)
            prev_at = points[i - 1].at if i else float("-inf")
            if any(prev_at < t <= pt.at for t in launches):
                lx = cx - slot_w / 2
                p.setPen(QPen(LAUNCH_COLOUR, 1.5, Qt.PenStyle.DashLine))
                p.drawLine(QPointF(lx, plot.top()), QPointF(lx, plot.bottom()))
                self.markers.append(("launch", i))
            if pt.source in RESTORED:
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(RESTORE_COLOUR)
                tri = QPainterPath()
                top_y = plot.bottom() - plot.height() * pt.n_prompt / y_max - 3
                tri.moveTo(cx - 4, top_y - 7)
                tri.lineTo(cx + 4, top_y - 7)
                tri.lineTo(cx, top_y)
                tri.closeSubpath()
                p.drawPath(tri)
                self.markers.append(("restored", i))
        p.setBrush(Qt.BrushStyle.NoBrush)

        # time labels: the newest, the oldest and the first after each launch first, then evenly
        # spaced ones, as many as fit without overlapping; two that read the same say one thing
        p.setPen(muted)
        span = points[-1].at - points[0].at
        fmt = "%d %b %H:%M" if span > 20 * 3600 else ("%H:%M:%S" if span < 600 else "%H:%M")
        label_w = fm.horizontalAdvance(time.strftime(fmt, time.localtime(points[-1].at))) + 16
        n_labels = max(1, min(len(points), int(plot.width() // label_w)))
        step = max(1, math.ceil(len(points) / n_labels))
        first_after_launch = [i for i, pt in enumerate(points)
                              if any((points[i - 1].at if i else float("-inf")) < t <= pt.at
                                     for t in launches)]
        wanted = [len(points) - 1, 0, *first_after_launch, *range(0, len(points), step)]
        placed: list[tuple[float, float, str]] = []  # x0, x1, text
        for i in dict.fromkeys(wanted):
            cx = plot.left() + slot_w * (i + 0.5)
            label = time.strftime(fmt, time.localtime(points[i].at))
            w = fm.horizontalAdvance(label)
            x0 = max(0.0, min(cx - w / 2, self.width() - w))
            if any(label == text or (x0 < b + 8 and a < x0 + w + 8) for a, b, text in placed):
                continue
            placed.append((x0, x0 + w, label))
        placed.sort()
        for x0, _x1, label in placed:
            p.drawText(QPointF(x0, plot.bottom() + 4 + fm.ascent()), label)
        self.time_labels = [label for _x0, _x1, label in placed]
        p.drawText(QRectF(plot.left(), plot.bottom() + 4 + lh, plot.width(), lh),
                   Qt.AlignmentFlag.AlignHCenter, "requests, oldest to newest")
        p.setPen(QPen(grid, 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(plot)
        p.end()

    # -- hover ----------------------------------------------------------------------------
    def point_at(self, pos: QPointF) -> PlotPoint | None:
        for rect, pt in self._bars:
            if rect.contains(pos):
                return pt
        return None

    def event(self, e: QEvent) -> bool:
        # Qt delivers tooltip requests as QHelpEvent.
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            pt = self.point_at(QPointF(e.pos()))
            if pt is None:
                QToolTip.hideText()
            else:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(pt.at))
                QToolTip.showText(
                    e.globalPos(),
                    f"{when}, slot {pt.slot}\n{pt.n_prompt:,} prompt tokens, {pt.cache_n:,} from cache "
                    f"({round(100 * pt.share)}%){SOURCES.get(pt.source, '')}\n"
                    f"prompt processed in {pt.prompt_ms:,.0f} ms"
                    + (f"; the cache saved about {human_duration(pt.saved_ms / 1000)}"
                       if pt.saved_ms else ""),
                    self,
                )
            return True
        return super().event(e)
