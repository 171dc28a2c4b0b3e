"""The Disk budget tab: a log-scale slider and a size field, what is in use, and what saving
this budget would delete now (a prune preview, run as a job; nothing is deleted here)."""

from __future__ import annotations

import math
from dataclasses import replace

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.basics.units import human_bytes, parse_size
from slotkeeper.core.settings import MIN_POINT_SPACING_TOKENS, Settings, SettingsError
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.jobs import describe_error
from slotkeeper.gui.settings.form import FormTab, note
from slotkeeper.gui.theme import error_style

GIB = 1024**3
BUDGET_MIN = GIB // 2
BUDGET_MAX = 2048 * GIB
SLIDER_STEPS = 1000
PREVIEW_DELAY_MS = 300


def budget_from_slider(value: int) -> int:
    """Slider position -> bytes, on a log scale from 512 MiB to 2 TiB, rounded to a tidy size."""
    frac = max(0, min(SLIDER_STEPS, value)) / SLIDER_STEPS
    raw = BUDGET_MIN * (BUDGET_MAX / BUDGET_MIN) ** frac
    if raw < 10 * GIB:
        step = GIB // 2
    elif raw < 100 * GIB:
        step = GIB
    elif raw < 500 * GIB:
        step = 10 * GIB
    else:
        step = 50 * GIB
    return int(min(BUDGET_MAX, max(BUDGET_MIN, round(raw / step) * step)))


def slider_from_budget(budget: int) -> int:
    budget = max(BUDGET_MIN, min(BUDGET_MAX, budget))
    return round(SLIDER_STEPS * math.log(budget / BUDGET_MIN) / math.log(BUDGET_MAX / BUDGET_MIN))


def size_text(n: int) -> str:
    """A size as the budget field shows it: "20 GiB", "1.5 GiB", "512 MiB"."""
    for unit, factor in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2)):
        if n >= factor:
            value = n / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


class DiskTab(FormTab):
    def __init__(self, bridge: EngineBridge, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(bridge, parent)
        self.preview_plan = None
        self._preview_seq = 0
        self._build()
        self._preview_timer = QTimer(self)
        self._preview_timer.setSingleShot(True)
        self._preview_timer.setInterval(PREVIEW_DELAY_MS)
        self._preview_timer.timeout.connect(self._run_preview)

        self.load(settings)
        self.points_box.toggled.connect(self._points_toggled)
        self.spacing_spin.valueChanged.connect(lambda _v: self.changed.emit())
        self.budget_slider.valueChanged.connect(self._slider_moved)
        self.budget_edit.textEdited.connect(self._budget_typed)
        self.budget_edit.editingFinished.connect(self._budget_finished)
        bridge.sessionsListed.connect(self._on_listing)
        if bridge.listing is None:
            bridge.refresh_sessions()
        else:
            self._on_listing(bridge.listing, None)
        self._preview_timer.start()

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.forms.append(form)
        self.budget_slider = QSlider(Qt.Orientation.Horizontal)
        self.budget_slider.setRange(0, SLIDER_STEPS)
        self.budget_edit = QLineEdit()
        self.budget_edit.setMaximumWidth(self.budget_edit.fontMetrics().horizontalAdvance("0000.0 GiB") + 24)
        self.budget_edit.setToolTip("A size such as 20G, 512M or 1.5 TiB")
        row = QHBoxLayout()
        row.addWidget(self.budget_slider, 1)
        row.addWidget(self.budget_edit)
        form.addRow("Budget:", row)
        self.budget_error = note()
        self.budget_error.setStyleSheet(error_style())
        form.addRow("", self.budget_error)
        form.setRowVisible(self.budget_error, False)
        self.usage_note = note("Measuring…")
        form.addRow("In use:", self.usage_note)
        self.points_box = QCheckBox("Keep restore points")
        self.points_box.setToolTip(
            "Hybrid and sliding-window models (Qwen3.5, Gemma with --swa-full ...) can only go forward "
            "from a restored conversation. Restore points save it a few tokens before the end of the last "
            "prompt and where user messages start, so a regenerated reply or an edited message after a "
            "restart re-reads only what changed. They take about twice the conversation's size and go "
            "first when over budget.")
        form.addRow("Rollbacks:", self.points_box)
        self.spacing_spin = QSpinBox()
        self.spacing_spin.setRange(MIN_POINT_SPACING_TOKENS, 1_000_000)
        self.spacing_spin.setSingleStep(1024)
        self.spacing_spin.setSuffix(" tokens")
        widest = self.spacing_spin.fontMetrics().horizontalAdvance("1000000 tokens")
        self.spacing_spin.setMaximumWidth(widest + 40)
        self.spacing_spin.setToolTip("Points at earlier user messages are kept at least this far apart")
        form.addRow("Earlier points apart:", self.spacing_spin)
        layout.addLayout(form)
        self.preview_title = note("Working out what this budget would delete…")
        layout.addWidget(self.preview_title)
        self.preview_list = QListWidget()
        self.preview_list.setMinimumHeight(120)
        self.preview_list.setAccessibleName("Conversations this budget would delete")
        self.preview_list.hide()  # shown only with something in it: no empty box
        layout.addWidget(self.preview_list, 1)
        self._stretch = QWidget()  # takes the room the list leaves when it is hidden
        layout.addWidget(self._stretch, 1)
        layout.addWidget(note("Least recently used conversations go first; pinned ones and the "
                              "ones loaded in a slot are never deleted."))

    def override_fields(self) -> list[tuple[QWidget, tuple[str, ...]]]:
        return [(self.budget_slider, ("budget_bytes",))]

    # -- the fields -----------------------------------------------------------------------
    def load(self, settings: Settings) -> None:
        self._set_budget(settings.budget_bytes)
        self.points_box.setChecked(settings.restore_points)
        self.spacing_spin.setValue(settings.point_spacing_tokens)
        self.spacing_spin.setEnabled(settings.restore_points)

    def apply(self, settings: Settings) -> Settings:
        budget = self.budget_value()
        if budget is None:
            raise SettingsError(f"the disk budget {self.budget_edit.text()!r} is not a size (try 20G)")
        return replace(settings, budget_bytes=budget, restore_points=self.points_box.isChecked(),
                       point_spacing_tokens=self.spacing_spin.value())

    def _points_toggled(self, on: bool) -> None:
        self.spacing_spin.setEnabled(on)
        self.changed.emit()

    def budget_value(self) -> int | None:
        try:
            return parse_size(self.budget_edit.text())
        except ValueError:
            return None

    def _set_budget(self, budget: int) -> None:
        self.budget_slider.blockSignals(True)
        self.budget_slider.setValue(slider_from_budget(budget))
        self.budget_slider.blockSignals(False)
        self.budget_edit.setText(size_text(budget))
        self.show_row(self.budget_error, False)

    def _slider_moved(self, value: int) -> None:
        self.budget_edit.setText(size_text(budget_from_slider(value)))
        self.show_row(self.budget_error, False)
        self._budget_changed()

    def _budget_typed(self, _text: str) -> None:
        budget = self.budget_value()
        if budget is None:
            self.budget_error.setText("Not a size: type a number with K, M, G or T, e.g. 20G.")
            self.show_row(self.budget_error, True)
        else:
            self.show_row(self.budget_error, False)
            self.budget_slider.blockSignals(True)
            self.budget_slider.setValue(slider_from_budget(budget))
            self.budget_slider.blockSignals(False)
        self._budget_changed()

    def _budget_finished(self) -> None:
        budget = self.budget_value()
        if budget is not None:
            self.budget_edit.setText(size_text(budget))

    def _budget_changed(self) -> None:
        self.changed.emit()
        self._preview_timer.start()

    # -- what is there, and what the budget would delete ----------------------------------
    def _on_listing(self, listing, _facts) -> None:
        if self.closing:
            return
        n = len(listing.sessions)
        text = f"{human_bytes(listing.total_bytes)} in {n} saved conversation{'s' if n != 1 else ''}"
        if listing.unmanaged:
            text += (f" (and {human_bytes(listing.unmanaged_bytes)} in other files there, which are not "
                     "Slotkeeper's and do not count)")
        self.usage_note.setText(text)
        self._preview_timer.start()

    def _run_preview(self) -> None:
        budget = self.budget_value()
        if budget is None:
            return
        self._preview_seq += 1
        seq = self._preview_seq

        def done(plan) -> None:
            if self.closing or seq != self._preview_seq:
                return
            self.preview_plan = plan
            self.preview_list.clear()
            if not plan.delete:
                self.preview_title.setText(f"At {size_text(budget)}, nothing would be deleted.")
            else:
                self.preview_title.setText(
                    f"At {size_text(budget)}, saving would delete {len(plan.delete)} conversation"
                    f"{'s' if len(plan.delete) != 1 else ''} now, freeing {human_bytes(plan.bytes_freed)}:")
                for c in plan.delete:
                    self.preview_list.addItem(f"{c.title} — {human_bytes(c.size_bytes)}")
            self.preview_list.setVisible(bool(plan.delete))
            self._stretch.setVisible(not plan.delete)
            if plan.over_budget_after:
                self.preview_title.setText(self.preview_title.text() + "\nStill over budget afterwards: "
                                           "pinned conversations and the ones in a slot alone exceed it.")

        def failed(exc: BaseException) -> None:
            if not self.closing and seq == self._preview_seq:
                self.preview_title.setText(f"Cannot work out what would be deleted: {describe_error(exc)}")

        self.bridge.preview_prune(budget, done, failed)

    def close_down(self) -> None:
        super().close_down()
        self._preview_timer.stop()
        try:
            self.bridge.sessionsListed.disconnect(self._on_listing)
        except (RuntimeError, TypeError):
            pass
