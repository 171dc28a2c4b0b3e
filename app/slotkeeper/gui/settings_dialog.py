"""Settings: the server profile, autosave and launch behaviour, and the disk budget.

Reading a model's header, finding the server binary, discovering models and planning a prune
all touch the disk, so each runs as a job and fills its label when it answers. Changes to the
server profile take effect at the next server start; when the server is running the dialog
says so and offers "Save and restart" (changed slots are saved first).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import gguf_info, modelgen
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.engine.model import swa_explanation
from slotkeeper.core.events import ServerStateChanged
from slotkeeper.core.server.command import exposes_without_key
from slotkeeper.core.settings import (
    CACHE_TYPES,
    ServerProfile,
    Settings,
    SettingsError,
    join_args,
    needs_flash_attention,
    split_args,
)
from slotkeeper.core.units import human_bytes, parse_size
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.jobs import describe_error
from slotkeeper.gui.widgets import WrappedLabel

log = logging.getLogger(__name__)

GIB = 1024**3
BUDGET_MIN = GIB // 2
BUDGET_MAX = 2048 * GIB
SLIDER_STEPS = 1000
PREVIEW_DELAY_MS = 300
MODEL_INFO_DELAY_MS = 300
DEMO_LABEL = "Demo model (random weights: it answers with gibberish)"
WARNING_STYLE = "color: #b45309;"
ERROR_STYLE = "color: #b91c1c;"


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


class SettingsDialog(QDialog):
    """``settings()`` is what the fields say; Save applies it through the bridge."""

    saved = Signal(object, bool)  # Settings, restart requested

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None,
                 autostart: Any | None = None, search_dirs: list | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setWindowTitle("Slotkeeper settings")
        self.base = bridge.settings
        self._autostart = autostart
        self._search_dirs = search_dirs
        self._model_info: gguf_info.ModelInfo | None = None
        self._model_info_for: str | None = None
        self._preview_seq = 0
        self.preview_plan = None
        self._closing = False

        self.tabs = QTabWidget(self)
        self.tabs.addTab(self._build_server_tab(), "Server")
        self.tabs.addTab(self._build_sessions_tab(), "Sessions")
        self.tabs.addTab(self._build_disk_tab(), "Disk budget")

        self.restart_label = QLabel()
        self.restart_label.setWordWrap(True)
        self.restart_label.setStyleSheet(WARNING_STYLE)
        self.restart_label.hide()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(ERROR_STYLE)
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.restart_button = self.buttons.addButton("Save and restart server", QDialogButtonBox.ButtonRole.ApplyRole)
        self.restart_button.setToolTip("Saves changed conversations, then restarts llama-server with these settings")
        self.restart_button.hide()
        self.buttons.button(QDialogButtonBox.StandardButton.Save).clicked.connect(lambda: self.save(restart=False))
        self.restart_button.clicked.connect(lambda: self.save(restart=True))
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.restart_label)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)

        self._model_timer = QTimer(self)
        self._model_timer.setSingleShot(True)
        self._model_timer.setInterval(MODEL_INFO_DELAY_MS)
        self._model_timer.timeout.connect(self._load_model_info)
        self._preview_timer = QTimer(self)
        self._preview_timer.setSingleShot(True)
        self._preview_timer.setInterval(PREVIEW_DELAY_MS)
        self._preview_timer.timeout.connect(self._run_preview)

        self._load(self.base)
        self._connect_changes()
        bridge.sessionsListed.connect(self._on_listing)
        bridge.on(ServerStateChanged, self._on_server_state)
        self._detect_binary()
        self._discover_models()
        if bridge.listing is None:
            bridge.refresh_sessions()
        else:
            self._on_listing(bridge.listing, None)
        self._changed()
        self._model_timer.start()
        self._preview_timer.start()
        self.setMinimumWidth(640)
        self.resize(max(760, self.sizeHint().width()), max(640, self.sizeHint().height()))

    # -- building -------------------------------------------------------------------------
    @staticmethod
    def _note(text: str = "") -> QLabel:
        label = WrappedLabel(text)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return label

    def _build_server_tab(self) -> QWidget:
        page = QWidget()
        form = QFormLayout(page)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        self.server_form = form

        self.server_bin = QLineEdit()
        self.server_bin.setPlaceholderText("found automatically")
        browse_bin = QPushButton("Browse…")
        browse_bin.clicked.connect(self._browse_binary)
        row = QHBoxLayout()
        row.addWidget(self.server_bin, 1)
        row.addWidget(browse_bin)
        form.addRow("llama-server:", row)
        self.binary_note = self._note("Looking for llama-server…")
        form.addRow("", self.binary_note)

        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.model_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.model_combo.setMinimumContentsLength(40)
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.lineEdit().setPlaceholderText("a .gguf file")
        browse_model = QPushButton("Browse…")
        browse_model.clicked.connect(self._browse_model)
        row = QHBoxLayout()
        row.addWidget(self.model_combo, 1)
        row.addWidget(browse_model)
        form.addRow("Model:", row)
        self.model_note = self._note()
        form.addRow("", self.model_note)

        self.ctx = QSpinBox()
        self.ctx.setRange(256, 4 * 1024 * 1024)
        self.ctx.setSingleStep(1024)
        self.ctx.setGroupSeparatorShown(True)
        self.ctx.setSuffix(" tokens")
        self.ctx_note = QLabel()
        row = QHBoxLayout()
        row.addWidget(self.ctx)
        row.addWidget(self.ctx_note, 1)
        form.addRow("Context size:", row)
        self.parallel = QSpinBox()
        self.parallel.setRange(1, 64)
        self.parallel.setToolTip("llama-server -np: conversations served at the same time, each with its own cache")
        form.addRow("Slots:", self.parallel)
        self.flash_attn = QCheckBox("Flash attention (-fa)")
        form.addRow("", self.flash_attn)
        self.cache_k = QComboBox()
        self.cache_v = QComboBox()
        for combo in (self.cache_k, self.cache_v):
            combo.addItems(CACHE_TYPES)
        row = QHBoxLayout()
        row.addWidget(QLabel("K"))
        row.addWidget(self.cache_k)
        row.addSpacing(12)
        row.addWidget(QLabel("V"))
        row.addWidget(self.cache_v)
        row.addStretch(1)
        form.addRow("KV cache types:", row)
        self.cache_note = self._note("Quantized V cache types need flash attention.")
        self.cache_note.setStyleSheet(WARNING_STYLE)
        form.addRow("", self.cache_note)

        self.swa_box = QFrame()
        self.swa_box.setFrameShape(QFrame.Shape.StyledPanel)
        self.swa_box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        box = QVBoxLayout(self.swa_box)
        self.swa_full = QCheckBox("--swa-full: keep the full cache for sliding-window layers")
        self.swa_note = self._note()
        box.addWidget(self.swa_full)
        box.addWidget(self.swa_note)
        form.addRow("Sliding window:", self.swa_box)
        form.setRowVisible(self.swa_box, False)

        self.host = QLineEdit()
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        row = QHBoxLayout()
        row.addWidget(self.host, 1)
        row.addWidget(QLabel("Port"))
        row.addWidget(self.port)
        form.addRow("Listen on:", row)
        self.exposure_note = self._note(
            "This address lets other machines reach the server, and there is no --api-key in "
            "the extra arguments: anyone on the network could use it and read its conversations."
        )
        self.exposure_note.setStyleSheet(WARNING_STYLE)
        form.addRow("", self.exposure_note)
        self.extra_args = QLineEdit()
        self.extra_args.setPlaceholderText("more llama-server arguments, e.g. --api-key SECRET -t 8")
        form.addRow("Extra arguments:", self.extra_args)
        self.args_error = self._note()
        self.args_error.setStyleSheet(ERROR_STYLE)
        form.addRow("", self.args_error)
        return page

    def _build_sessions_tab(self) -> QWidget:
        page = QWidget()
        form = QFormLayout(page)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        self.idle_save = QDoubleSpinBox()
        self.idle_save.setRange(0, 3600)
        self.idle_save.setDecimals(0)
        self.idle_save.setSuffix(" s")
        self.idle_save.setToolTip("Save a conversation this long after its reply ends (0 = at once)")
        form.addRow("Autosave after idle:", self.idle_save)
        self.restore_count = QSpinBox()
        self.restore_count.setRange(-1, 64)
        self.restore_count.setSpecialValueText("one per slot")
        self.restore_count.setToolTip("How many of the most recent compatible conversations to restore when the server starts")
        form.addRow("Restore at launch:", self.restore_count)
        self.start_on_launch = QCheckBox("Start the server when Slotkeeper starts")
        form.addRow("", self.start_on_launch)
        self.start_at_login = QCheckBox("Start Slotkeeper when I log in")
        self.login_note = self._note(platform_login_note())
        form.addRow("", self.start_at_login)
        form.addRow("", self.login_note)
        return page

    def _build_disk_tab(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        form = QFormLayout()
        self.disk_form = form
        self.budget_slider = QSlider(Qt.Orientation.Horizontal)
        self.budget_slider.setRange(0, SLIDER_STEPS)
        self.budget_edit = QLineEdit()
        self.budget_edit.setMaximumWidth(self.budget_edit.fontMetrics().horizontalAdvance("0000.0 GiB") + 24)
        self.budget_edit.setToolTip("A size such as 20G, 512M or 1.5 TiB")
        row = QHBoxLayout()
        row.addWidget(self.budget_slider, 1)
        row.addWidget(self.budget_edit)
        form.addRow("Budget:", row)
        self.budget_error = self._note()
        self.budget_error.setStyleSheet(ERROR_STYLE)
        form.addRow("", self.budget_error)
        form.setRowVisible(self.budget_error, False)
        self.usage_note = self._note("Measuring…")
        form.addRow("In use:", self.usage_note)
        layout.addLayout(form)
        self.preview_title = self._note("Working out what this budget would delete…")
        layout.addWidget(self.preview_title)
        self.preview_list = QListWidget()
        self.preview_list.setMinimumHeight(120)
        layout.addWidget(self.preview_list, 1)
        layout.addWidget(self._note("Least recently used conversations go first; pinned ones and the "
                                    "ones loaded in a slot are never deleted."))
        return page

    # -- loading and reading the fields ---------------------------------------------------
    def _load(self, s: Settings) -> None:
        p = s.profile
        self.server_bin.setText(p.server_bin or "")
        self._set_model_text(p.model_path or "")
        self.ctx.setValue(p.ctx)
        self.parallel.setValue(p.parallel)
        self.flash_attn.setChecked(p.flash_attn)
        self.cache_k.setCurrentText(p.cache_type_k)
        self.cache_v.setCurrentText(p.cache_type_v)
        self.swa_full.setChecked(p.swa_full)
        self.host.setText(p.host)
        self.port.setValue(p.port)
        self.extra_args.setText(join_args(p.extra_args))
        self.idle_save.setValue(float(s.idle_save_seconds))
        self.restore_count.setValue(-1 if s.restore_on_start is None else s.restore_on_start)
        self.start_on_launch.setChecked(s.start_server_on_launch)
        self.start_at_login.setChecked(s.start_at_login)
        self._set_budget(s.budget_bytes)

    def _set_model_text(self, value: str) -> None:
        combo = self.model_combo
        if value == DEMO_MODEL:
            self._ensure_demo_item()
            combo.setCurrentIndex(combo.findData(DEMO_MODEL))
        else:
            combo.setEditText(value)

    def _ensure_demo_item(self) -> None:
        if self.model_combo.findData(DEMO_MODEL) < 0:
            self.model_combo.addItem(DEMO_LABEL, DEMO_MODEL)

    def model_value(self) -> str | None:
        text = self.model_combo.currentText().strip()
        if not text:
            return None
        i = self.model_combo.findText(text)
        if i >= 0 and self.model_combo.itemData(i):
            return str(self.model_combo.itemData(i))
        return text

    def budget_value(self) -> int | None:
        try:
            return parse_size(self.budget_edit.text())
        except ValueError:
            return None

    def settings(self) -> Settings:
        """The settings the fields describe; SettingsError / ValueError say what is wrong."""
        extra = split_args(self.extra_args.text())
        budget = self.budget_value()
        if budget is None:
            raise SettingsError(f"the disk budget {self.budget_edit.text()!r} is not a size (try 20G)")
        restore = self.restore_count.value()
        profile = replace(
            self.base.profile,
            model_path=self.model_value(),
            server_bin=self.server_bin.text().strip() or None,
            host=self.host.text().strip() or "127.0.0.1",
            port=self.port.value(),
            ctx=self.ctx.value(),
            parallel=self.parallel.value(),
            flash_attn=self.flash_attn.isChecked(),
            cache_type_k=self.cache_k.currentText(),
            cache_type_v=self.cache_v.currentText(),
            swa_full=self.swa_full.isChecked(),
            extra_args=extra,
        )
        settings = replace(
            self.base,
            profile=profile,
            idle_save_seconds=float(self.idle_save.value()),
            restore_on_start=None if restore < 0 else restore,
            budget_bytes=budget,
            start_server_on_launch=self.start_on_launch.isChecked(),
            start_at_login=self.start_at_login.isChecked(),
        )
        profile.validate()
        return settings

    # -- reacting -------------------------------------------------------------------------
    def _connect_changes(self) -> None:
        for w in (self.server_bin, self.host, self.extra_args):
            w.textChanged.connect(self._changed)
        for w in (self.ctx, self.parallel, self.port, self.restore_count):
            w.valueChanged.connect(self._changed)
        self.idle_save.valueChanged.connect(self._changed)
        for w in (self.flash_attn, self.swa_full, self.start_on_launch, self.start_at_login):
            w.toggled.connect(self._changed)
        for w in (self.cache_k, self.cache_v):
            w.currentTextChanged.connect(self._changed)
        self.model_combo.currentTextChanged.connect(self._model_changed)
        for w in (self.ctx, self.parallel):
            w.valueChanged.connect(self._update_swa_note)
        for w in (self.cache_k, self.cache_v):
            w.currentTextChanged.connect(self._update_swa_note)
        self.server_bin.editingFinished.connect(self._detect_binary)
        self.budget_slider.valueChanged.connect(self._slider_moved)
        self.budget_edit.textEdited.connect(self._budget_typed)
        self.budget_edit.editingFinished.connect(self._budget_finished)

    def _model_changed(self, _text: str) -> None:
        self._changed()
        self._model_timer.start()

    def _changed(self, *_args) -> None:
        p_ctx, p_par = self.ctx.value(), self.parallel.value()
        self.ctx_note.setText(f"{p_ctx // max(1, p_par):,} tokens per slot")
        try:
            extra = split_args(self.extra_args.text())
            self._show_row(self.args_error, False)
        except ValueError as exc:
            extra = ()
            self.args_error.setText(f"Cannot split these arguments: {exc}")
            self._show_row(self.args_error, True)
        self._show_row(self.exposure_note, exposes_without_key(self.host.text() or "127.0.0.1", extra))
        cache = ServerProfile(cache_type_v=self.cache_v.currentText(), flash_attn=self.flash_attn.isChecked())
        self._show_row(self.cache_note, needs_flash_attention(cache))
        try:
            candidate = self.settings()
        except (SettingsError, ValueError) as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            self.buttons.button(QDialogButtonBox.StandardButton.Save).setEnabled(False)
            self.restart_button.setEnabled(False)
            return
        self.error_label.hide()
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setEnabled(True)
        self.restart_button.setEnabled(True)
        restart = self.bridge.needs_restart(candidate)
        self.restart_label.setVisible(restart)
        self.restart_button.setVisible(restart)
        if restart:
            self.restart_label.setText(
                "The server is running with other settings: these changes take effect when it "
                "restarts. “Save and restart server” saves changed conversations first."
            )

    def _on_server_state(self, *_args) -> None:
        if not self._closing:
            self._changed()

    # -- the server binary ----------------------------------------------------------------
    def _detect_binary(self) -> None:
        from slotkeeper.core.server.locate import locate_server

        explicit = self.server_bin.text().strip() or None

        def done(binary) -> None:
            if self._closing:
                return
            self.binary_note.setStyleSheet("")
            self.binary_note.setText(f"Using {' '.join(binary.argv_prefix)} ({binary.source})")

        def failed(exc: BaseException) -> None:
            if self._closing:
                return
            self.binary_note.setStyleSheet(ERROR_STYLE)
            self.binary_note.setText(describe_error(exc))

        self.bridge.jobs.run(locate_server, explicit, on_success=done, on_failure=failed,
                             description="Looking for llama-server")

    def _browse_binary(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose llama-server", self.server_bin.text() or str(Path.home()))
        if path:
            self.server_bin.setText(path)
            self._detect_binary()

    # -- models ---------------------------------------------------------------------------
    def _discover_models(self) -> None:
        from slotkeeper.core import discovery

        dirs = self._search_dirs

        def find() -> list:
            return discovery.find_models(dirs if dirs is not None else discovery.default_search_dirs())

        def done(models: list) -> None:
            if self._closing:
                return
            current = self.model_combo.currentText()
            current_data = self.model_value()
            self.model_combo.blockSignals(True)
            for m in models:
                if m.usable and self.model_combo.findData(str(m.path)) < 0:
                    label = f"{m.display_name} ({m.arch or '?'}, {human_bytes(m.size_bytes)}) — {m.path}"
                    self.model_combo.addItem(label, str(m.path))
            self._ensure_demo_item()
            if current_data == DEMO_MODEL:
                self.model_combo.setCurrentIndex(self.model_combo.findData(DEMO_MODEL))
            else:
                self.model_combo.setEditText(current)
            self.model_combo.blockSignals(False)

        def failed(exc: BaseException) -> None:
            log.warning("model discovery failed: %s", exc)
            if not self._closing:
                self._ensure_demo_item()

        self.bridge.jobs.run(find, on_success=done, on_failure=failed, description="Looking for models")

    def _browse_model(self) -> None:
        start = self.model_value() or str(Path.home())
        if start == DEMO_MODEL:
            start = str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.model_combo.setEditText(path)

    def _load_model_info(self) -> None:
        value = self.model_value()
        self._model_info_for = value
        if not value:
            self._model_info = None
            self.model_note.setStyleSheet(WARNING_STYLE)
            self.model_note.setText("No model chosen: the server cannot start without one.")
            self._update_swa_note()
            return
        models_dir = self.bridge.paths.models_dir

        def read() -> gguf_info.ModelInfo:
            path = modelgen.ensure_demo_model(models_dir) if value == DEMO_MODEL else Path(value).expanduser()
            return gguf_info.read_model_info(path)

        def done(info: gguf_info.ModelInfo) -> None:
            if self._closing or self._model_info_for != value:
                return
            self._model_info = info
            self.model_note.setStyleSheet("")
            swa = f", sliding window of {info.sliding_window}" if info.has_swa else ""
            text = (f"{info.arch}, {info.n_layers} layers, trained for {info.context_length:,} tokens{swa}; "
                    f"{human_bytes(info.file_size)}")
            if value == DEMO_MODEL:
                text = "The demo model has random weights: it answers with gibberish. " + text
            self.model_note.setText(text)
            self._update_swa_note()

        def failed(exc: BaseException) -> None:
            if self._closing or self._model_info_for != value:
                return
            self._model_info = None
            self.model_note.setStyleSheet(ERROR_STYLE)
            self.model_note.setText(describe_error(exc))
            self._update_swa_note()

        self.bridge.jobs.run(read, on_success=done, on_failure=failed, description="Reading the model's header")

    def _update_swa_note(self, *_args) -> None:
        info = self._model_info
        if info is None or not info.has_swa:
            self._show_row(self.swa_box, False)
            return
        try:
            self.swa_note.setText(swa_explanation(info, self.ctx.value(), self.parallel.value(),
                                                  self.cache_k.currentText(), self.cache_v.currentText()))
        except ValueError as exc:
            self.swa_note.setText(str(exc))
        self._show_row(self.swa_box, True)

    def _show_row(self, widget: QWidget, visible: bool) -> None:
        """Show or hide a whole form row (its label too), so hidden notes leave no gap."""
        for form in (self.server_form, self.disk_form):
            row, _role = form.getWidgetPosition(widget)
            if row >= 0:
                form.setRowVisible(row, visible)
                return

    def row_shown(self, widget: QWidget) -> bool:
        for form in (self.server_form, self.disk_form):
            row, _role = form.getWidgetPosition(widget)
            if row >= 0:
                return form.isRowVisible(row)
        return widget.isVisible()

    # -- disk budget ----------------------------------------------------------------------
    def _set_budget(self, budget: int) -> None:
        self.budget_slider.blockSignals(True)
        self.budget_slider.setValue(slider_from_budget(budget))
        self.budget_slider.blockSignals(False)
        self.budget_edit.setText(size_text(budget))
        self._show_row(self.budget_error, False)

    def _slider_moved(self, value: int) -> None:
        self.budget_edit.setText(size_text(budget_from_slider(value)))
        self._show_row(self.budget_error, False)
        self._budget_changed()

    def _budget_typed(self, _text: str) -> None:
        budget = self.budget_value()
        if budget is None:
            self.budget_error.setText("Not a size: type a number with K, M, G or T, e.g. 20G.")
            self._show_row(self.budget_error, True)
        else:
            self._show_row(self.budget_error, False)
            self.budget_slider.blockSignals(True)
            self.budget_slider.setValue(slider_from_budget(budget))
            self.budget_slider.blockSignals(False)
        self._budget_changed()

    def _budget_finished(self) -> None:
        budget = self.budget_value()
        if budget is not None:
            self.budget_edit.setText(size_text(budget))

    def _budget_changed(self) -> None:
        self._changed()
        self._preview_timer.start()

    def _on_listing(self, listing, _facts) -> None:
        if self._closing:
            return
        n = len(listing.sessions)
        text = f"{human_bytes(listing.total_bytes)} in {n} saved conversation{'s' if n != 1 else ''}"
        if listing.unmanaged:
            text += f" (and {human_bytes(listing.unmanaged_bytes)} in other files there)"
        self.usage_note.setText(text)
        self._preview_timer.start()

    def _run_preview(self) -> None:
        budget = self.budget_value()
        if budget is None:
            return
        self._preview_seq += 1
        seq = self._preview_seq

        def done(plan) -> None:
            if self._closing or seq != self._preview_seq:
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
            if plan.over_budget_after:
                self.preview_title.setText(self.preview_title.text() + "\nStill over budget afterwards: "
                                           "pinned conversations and other files alone exceed it.")

        def failed(exc: BaseException) -> None:
            if not self._closing and seq == self._preview_seq:
                self.preview_title.setText(f"Cannot work out what would be deleted: {describe_error(exc)}")

        self.bridge.preview_prune(budget, done, failed)

    # -- saving ---------------------------------------------------------------------------
    def autostart(self):
        if self._autostart is None:
            from slotkeeper.core.autostart import autostart_for

            self._autostart = autostart_for()
        return self._autostart

    def save(self, restart: bool = False) -> bool:
        try:
            settings = self.settings()
        except (SettingsError, ValueError) as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            return False
        plan = self.preview_plan
        if settings.budget_bytes < self.base.budget_bytes and plan is not None and plan.delete:
            answer = QMessageBox.question(
                self, "Delete saved conversations?",
                f"The smaller budget deletes {len(plan.delete)} saved conversation(s) now "
                f"({human_bytes(plan.bytes_freed)}). Continue?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )  # fmt: skip
            if answer != QMessageBox.StandardButton.Yes:
                return False
        if settings.start_at_login != self.base.start_at_login:
            self._apply_autostart(settings.start_at_login)
        self.bridge.apply_settings(settings, restart=restart)
        self.saved.emit(settings, restart)
        self.accept()
        return True

    def _apply_autostart(self, enable: bool) -> None:
        from slotkeeper.core.autostart import default_command

        switch = self.autostart()

        def apply() -> None:
            if enable:
                switch.enable(default_command())
            else:
                switch.disable()

        self.bridge.jobs.run(apply, description="Turning start at login " + ("on" if enable else "off"))

    def done(self, result: int) -> None:
        self._closing = True
        self._model_timer.stop()
        self._preview_timer.stop()
        try:
            self.bridge.sessionsListed.disconnect(self._on_listing)
        except (RuntimeError, TypeError):
            pass
        super().done(result)


def platform_login_note() -> str:
    if sys.platform == "darwin":
        return "Adds a LaunchAgent in ~/Library/LaunchAgents."
    if os.name == "nt":
        return "Adds an entry under HKCU\\…\\CurrentVersion\\Run."
    return "Adds slotkeeper.desktop to ~/.config/autostart."
