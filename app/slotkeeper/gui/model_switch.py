"""Choosing a model, from any face (tray, window, first run, a session of another model).

``ModelSwitcher.choose(path)`` reads the model's header and the settings remembered for it off
the GUI thread, then says what the switch means before it happens (``SwitchModelDialog``): the
memory the launch needs against the machine's, a context beyond the model's training context,
``--swa-full`` with its cost for a sliding-window model, and the saved conversations the switch
leaves waiting. When there is nothing to say and no server to restart it switches at once.
The switch saves every changed slot first, with progress, then restarts llama-server on the
new model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFrame,
    QLabel,
    QMessageBox,
    QProgressDialog,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model import gguf_info
from slotkeeper.core.model.gguf_memory import swa_explanation
from slotkeeper.core.model.model_choice import profile_model_name
from slotkeeper.core.model.starter_model import find_starter_model
from slotkeeper.core.services.choosing import (
    LaunchSanity,
    ModelIdentity,
    expected_facts,
    launch_sanity,
    left_behind,
)
from slotkeeper.core.services.settings import ModelPlan
from slotkeeper.core.sessions.compat import ServerFacts, check_compatible
from slotkeeper.core.sessions.entries import Listing
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import SavesReport, ServerState
from slotkeeper.gui import icons
from slotkeeper.gui.bridge import EngineBridge, SwitchOutcome, resolved_model_file
from slotkeeper.gui.jobs import describe_error
from slotkeeper.gui.starter_fetch import StarterFetch, StarterMissing
from slotkeeper.gui.theme import error_style, warning_style
from slotkeeper.gui.widgets import describe_profile, waiting_dialog

log = logging.getLogger(__name__)



def WrappedLabel(text: str = "") -> QLabel:  # noqa: N802 - reads like the widget it makes
    """A word-wrapped label (a box layout gives it the height its text needs)."""
    label = QLabel(text)
    label.setWordWrap(True)
    return label


@dataclass(frozen=True)
class SwitchPreview:
    """Everything the switch dialog says, worked out off the GUI thread."""

    model_path: str  # what gets chosen (the name the model is remembered under)
    name: str
    info: gguf_info.ModelInfo
    plan: ModelPlan
    running: bool  # the server runs now: the switch restarts it
    same_model: bool
    sanity: dict[bool, LaunchSanity]  # by swa_full
    swa_text: str | None  # what --swa-full does for this model and costs (sliding-window models)
    waiting: tuple[str, ...]  # saved conversations the switch leaves behind
    resumable: dict[bool, int]  # saved conversations of the chosen model that will restore, by swa_full

    @property
    def swa_full(self) -> bool:
        return self.plan.settings.profile.swa_full

    @property
    def needs_asking(self) -> bool:
        """Whether to show the dialog rather than switch at once."""
        return (self.running or self.swa_text is not None or bool(self.waiting)
                or bool(self.sanity[self.swa_full].problems))


def prepare_switch(bridge: EngineBridge, model_path: str, listing: Listing | None, facts: ServerFacts | None,
                   current: Settings, running: bool) -> SwitchPreview:
    """Read the model and the settings remembered for it; work out what switching means (a job)."""
    plan = bridge.plan_model(model_path)
    profile = plan.settings.profile
    key = profile.model_path or model_path
    models_dir = bridge.paths.models_dir
    if key == DEMO_MODEL:
        found = find_starter_model(models_dir)
        if found is None:
            raise StarterMissing(key)
        file = found
    else:
        file = Path(key).expanduser()
        if not file.is_file():
            raise ValueError(f"{key} is not a file (was it moved or deleted?)")
    info = gguf_info.read_model_info(file)
    memory = psutil.virtual_memory()
    variants = (False, True) if info.has_swa else (profile.swa_full,)
    sanity = {v: launch_sanity(info, replace(profile, swa_full=v), memory.total, memory.available,
                               is_demo=key == DEMO_MODEL) for v in variants}
    swa_text = None
    if info.has_swa:
        swa_text = swa_explanation(info, profile.ctx, profile.parallel, profile.cache_type_k,
                                   profile.cache_type_v)
    real = resolved_model_file(key, models_dir) or str(file)
    after_model = ModelIdentity(real, bridge.known_model_sha256(real), info.has_swa)

    entries = list(listing.sessions) if listing is not None else []
    before_model: ModelIdentity | None = None
    before: ServerFacts | None = None
    if facts is not None:
        before_model, before = ModelIdentity(facts.model_path, facts.model_sha256, facts.swa), facts
    elif current.profile.model_path:
        current_file = resolved_model_file(current.profile.model_path, models_dir)
        try:
            current_info = gguf_info.read_model_info(current_file or "")
        except (gguf_info.ModelFileError, OSError) as exc:  # the old model is gone: nothing to compare
            log.info("not comparing with the current model: %s", exc)
        else:
            before_model = ModelIdentity(current_file or "", bridge.known_model_sha256(current_file or ""),
                                         current_info.has_swa)
            before = expected_facts(current.profile, before_model)
    waiting: list[str] = []
    if before is not None and before_model is not None:
        waiting = left_behind(entries, before, before_model, expected_facts(profile, after_model),
                              after_model)
    resumable = {}
    for v in variants:
        after = expected_facts(replace(profile, swa_full=v), after_model)
        resumable[v] = sum(
            1 for e in entries
            if e.sidecar is not None and not e.problems and after_model.owns(e.sidecar)
            and not check_compatible(e.sidecar, replace(after, model_sha256=e.sidecar.model_sha256,
                                                        model_path=e.sidecar.model_path)))
    same = before_model is not None and (before_model.path == real or (
        before_model.sha256 is not None and before_model.sha256 == after_model.sha256))
    return SwitchPreview(key, profile_model_name(key), info, plan, running, same, sanity, swa_text,
                         tuple(waiting), resumable)


# The per-model settings in words, for "the context size you gave on the command line".
SETTING_WORDS = {
    "profile.ctx": "context size",
    "profile.parallel": "number of slots",
    "profile.flash_attn": "flash attention setting",
    "profile.cache_type_k": "K cache type",
    "profile.cache_type_v": "V cache type",
    "profile.swa_full": "full sliding-window cache (--swa-full)",
    "profile.extra_args": "extra llama-server arguments",
    "profile.mmproj_path": "image projector",
}


def dropped_words(names: tuple[str, ...]) -> str:
    """Command-line settings that stop applying, in words ("context size and number of slots"); the
    model itself is left out: choosing another one is the point."""
    words = [SETTING_WORDS.get(n, n.removeprefix("profile.").replace("_", " ")) for n in names
             if n != "profile.model_path"]
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


class SwitchModelDialog(QDialog):
    """What switching to a model means, before it happens; ``swa_full`` is the user's choice."""

    def __init__(self, preview: SwitchPreview, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.preview = preview
        p = preview
        verb = "Switch to" if p.running else "Start"
        self.setWindowTitle(f"{verb} {p.name}")
        self.setWindowIcon(icons.app_icon())
        layout = QVBoxLayout(self)

        title = QLabel(f"<b>{verb} {p.name}</b>")
        layout.addWidget(title)
        info = p.info
        swa = f", sliding window of {info.sliding_window}" if info.has_swa else ""
        facts = WrappedLabel(f"{info.arch}, {info.n_layers} layers, trained for "
                             f"{info.context_length:,} tokens{swa}; {human_bytes(info.file_size)}.")
        layout.addWidget(facts)
        where = ("the settings remembered for it" if p.plan.remembered
                 else "the current settings (the first time with this model)")
        self.settings_label = WrappedLabel()
        layout.addWidget(self.settings_label)
        self._where = where
        dropped = dropped_words(p.plan.dropped_overrides)
        self.dropped_label: QLabel | None = None
        if dropped:
            self.dropped_label = WrappedLabel(
                f"The {dropped} you gave on the command line "
                f"{'was' if ' and ' not in dropped else 'were'} for the model Slotkeeper started with; "
                f"{p.name} runs with its own settings.")
            layout.addWidget(self.dropped_label)

        self.memory_label = WrappedLabel()
        layout.addWidget(self.memory_label)
        self.problems_label = WrappedLabel()
        layout.addWidget(self.problems_label)

        self.swa_full: QCheckBox | None = None
        if p.swa_text is not None:
            box = QFrame()
            box.setFrameShape(QFrame.Shape.StyledPanel)
            inner = QVBoxLayout(box)
            self.swa_full = QCheckBox("--swa-full: keep the full cache for sliding-window layers")
            self.swa_full.setChecked(p.swa_full)
            self.swa_full.toggled.connect(self._update)
            inner.addWidget(self.swa_full)
            inner.addWidget(WrappedLabel(p.swa_text))
            layout.addWidget(box)

        self.sessions_label = WrappedLabel()
        layout.addWidget(self.sessions_label)
        self.waiting_label: QLabel | None = None
        if p.waiting:
            waiting = WrappedLabel(" ".join(p.waiting))
            waiting.setStyleSheet(warning_style() if not p.same_model else error_style())
            self.waiting_label = waiting
            layout.addWidget(waiting)
        if p.running:
            layout.addWidget(WrappedLabel("Changed conversations are saved first; then llama-server restarts "
                                          f"on {p.name}."))

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.switch_button = self.buttons.addButton(verb, QDialogButtonBox.ButtonRole.AcceptRole)
        self.switch_button.setDefault(True)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._update()
        self.setMinimumWidth(560)

    def chosen_swa_full(self) -> bool:
        return self.swa_full.isChecked() if self.swa_full is not None else self.preview.swa_full

    def changes(self) -> dict:
        """The per-model settings the user changed here."""
        v = self.chosen_swa_full()
        return {"swa_full": v} if v != self.preview.swa_full else {}

    def _update(self, *_args) -> None:
        p = self.preview
        v = self.chosen_swa_full()
        profile = replace(p.plan.settings.profile, swa_full=v)
        self.settings_label.setText(f"With {self._where}: {describe_profile(profile)}.")
        sanity = p.sanity[v]
        self.memory_label.setText(sanity.summary)
        self.problems_label.setText(" ".join(sanity.problems))
        self.problems_label.setStyleSheet(error_style() if sanity.refusal else warning_style())
        self.problems_label.setVisible(bool(sanity.problems))
        self.switch_button.setEnabled(sanity.refusal is None)
        self.switch_button.setToolTip(sanity.refusal or "")
        n = p.resumable.get(v, 0)
        self.sessions_label.setText(
            f"{n} saved conversation{'s' if n != 1 else ''} of {p.name} can be resumed after the switch." if n
            and not p.same_model else "")
        self.sessions_label.setVisible(bool(n) and not p.same_model)


class ModelSwitcher(QObject):
    """One flow for choosing a model: preview -> dialog when there is something to say -> switch
    with progress. ``finished(outcome)`` when the switch is over (or was refused or cancelled:
    ``SwitchOutcome.switched`` False)."""

    finished = Signal(object)

    def __init__(self, bridge: EngineBridge, parent_widget: QWidget | None = None) -> None:
        super().__init__(parent_widget)
        self.bridge = bridge
        self.parent_widget = parent_widget
        self.dialog: SwitchModelDialog | None = None
        self.progress: QProgressDialog | None = None
        self.fetch: StarterFetch | None = None  # the starter model's download, before it is chosen
        self.preview: SwitchPreview | None = None
        self._target = ""
        self._starting = False
        self._launched = False
        bridge.on(ev.ActivityChanged, self._on_activity)
        bridge.on(ev.EngineReady, self._on_ready)
        bridge.on(ev.ServerStateChanged, self._on_state)

    @property
    def busy(self) -> bool:
        return self.dialog is not None or self.progress is not None or self.fetch is not None

    def choose(self, model_path: str, resume_id: str | None = None, ask: bool = True) -> None:
        """Switch to ``model_path`` (a path or ``DEMO_MODEL``), then resume ``resume_id`` if given."""
        if self.busy:
            self._say("Switching models", "A model switch is already under way.")
            return
        b = self.bridge
        listing, facts, current, running = b.listing, b.facts, b.settings, b.running

        def done(preview: SwitchPreview) -> None:
            self.preview = preview
            if ask and preview.needs_asking:
                self._ask(preview, resume_id)
            else:
                self.switch(preview.model_path, resume_id)

        def failed(exc: BaseException) -> None:
            if isinstance(exc, StarterMissing):  # downloaded first (with progress), then chosen
                self._fetch_starter(lambda: self.choose(model_path, resume_id, ask), model_path)
                return
            message = f"Cannot use {profile_model_name(model_path)}: {describe_error(exc)}"
            self._say("Choosing a model", message)
            self.finished.emit(SwitchOutcome(model_path, False, SavesReport(), None, message))

        b.jobs.run(prepare_switch, b, model_path, listing, facts, current, running, on_success=done,
                   on_failure=failed, description="Reading the model")

    def _fetch_starter(self, then: Callable[[], None], model_path: str) -> None:
        fetch = StarterFetch(self.bridge.jobs, self.bridge.paths.models_dir, self.parent_widget)
        self.fetch = fetch

        def fetched(path: str, why: str) -> None:
            self.fetch = None
            if path:
                then()
                return
            if why != "cancelled":
                self._say("Choosing a model", why)
            self.finished.emit(SwitchOutcome(model_path, False, SavesReport(), None, why))

        fetch.finished.connect(fetched)
        fetch.start()

    def _ask(self, preview: SwitchPreview, resume_id: str | None) -> None:
        dialog = SwitchModelDialog(preview, self.parent_widget)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.dialog = dialog

        def closed(result: int) -> None:
            self.dialog = None
            if result == QDialog.DialogCode.Accepted:
                self.switch(preview.model_path, resume_id, **dialog.changes())
            else:
                self.finished.emit(SwitchOutcome(preview.model_path, False, SavesReport(), None, "cancelled"))

        dialog.finished.connect(closed)
        dialog.open()

    def switch(self, model_path: str, resume_id: str | None = None, force: bool = False, **changes) -> None:
        """Save changed slots, then run ``model_path`` (no questions asked)."""
        name = profile_model_name(model_path)
        self._target = name
        self._starting = False
        self._launched = False
        if self.bridge.running:
            progress = waiting_dialog(f"Switching to {name}: saving changed conversations…",
                                      "Switching models", Qt.WindowModality.NonModal, self.parent_widget)
            self.progress = progress
            progress.show()
        self.bridge.switch_model(model_path, resume_id=resume_id, force=force,
                                 on_done=lambda outcome: self._switched(outcome, resume_id, changes),
                                 **changes)

    def _switched(self, outcome: SwitchOutcome, resume_id: str | None, changes: dict) -> None:
        if outcome.switched:
            if self.progress is not None:
                self._starting = True
                self.progress.setRange(0, 0)
                self.progress.setLabelText(f"Starting llama-server on {self._target}…")
                if self.bridge.facts is not None:
                    self._close_progress()
            self.finished.emit(outcome)
            return
        self._close_progress()
        if outcome.error is None and outcome.report.unsaved:
            n = len(outcome.report.unsaved)
            answer = QMessageBox.question(
                self.parent_widget, "Switch anyway?",
                f"{n} changed conversation{'s' if n != 1 else ''} could not be saved (the reason is in the "
                f"notifications and the log). Switching now loses {'them' if n != 1 else 'it'}. "
                "Switch anyway?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel)
            if answer == QMessageBox.StandardButton.Yes:
                self.switch(outcome.model_path, resume_id, force=True, **changes)
                return
        self.finished.emit(outcome)

    # -- progress -------------------------------------------------------------------------
    def _on_activity(self, event: ev.ActivityChanged) -> None:
        if self.progress is None or self._starting:
            return
        a = event.activity
        if a.activity == "saving" and a.total:
            self.progress.setRange(0, a.total)
            self.progress.setValue(a.done)
            self.progress.setLabelText(f"Switching to {self._target}: saving conversation "
                                       f"{min(a.total, a.done + 1)} of {a.total} ({a.detail})…")

    def _on_ready(self, _event: ev.EngineReady) -> None:
        if self._starting:
            self._close_progress()

    def _on_state(self, event: ev.ServerStateChanged) -> None:
        # The old server's STOPPED comes before the new one starts: only a failure (or a stop
        # after the new launch began) ends the wait.
        if event.state is ServerState.STARTING and self.progress is not None:
            self._launched = True
        elif self._starting and (event.state is ServerState.FAILED
                                 or (event.state is ServerState.STOPPED and self._launched)):
            self._close_progress()

    def _close_progress(self) -> None:
        self._starting = False
        self._launched = False
        if self.progress is not None:
            self.progress.close()
            self.progress.deleteLater()
            self.progress = None

    def _say(self, title: str, message: str) -> None:
        self.bridge.errorOccurred.emit(title, message)

    def dispose(self) -> None:
        if self.dialog is not None:
            self.dialog.reject()
        self._close_progress()

