"""The Model menu (in the tray menu and the window's Server menu): the models chosen recently,
the ones found on this computer, the current one checked, and "Choose model…" (a file picker).

Picking one emits ``modelChosen(path)``; the app hands it to the model switcher, which says
what the switch means and then switches.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QFileDialog, QMenu, QWidget

from slotkeeper.core.basics.units import human_bytes
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model.model_choice import profile_model_name
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.first_run import download_model

RECENT_ITEMS = 8
FOUND_ITEMS = 12
NAME_CHARS = 56
SEARCH_AGAIN_AFTER_S = 60.0


def _elide(text: str, n: int = NAME_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _same_file(a: str, b: str) -> bool:
    """Two spellings of one model path (no disk access: links are not followed here)."""
    if a == DEMO_MODEL or b == DEMO_MODEL:
        return a == b
    return os.path.normpath(os.path.expanduser(a)) == os.path.normpath(os.path.expanduser(b))


def pick_model_file(parent: QWidget | None, start: str | None = None) -> str | None:
    """A file picker for a GGUF model; None when the user cancelled."""
    folder = str(Path(start).expanduser().parent) if start and start != DEMO_MODEL else str(Path.home())
    path, _ = QFileDialog.getOpenFileName(parent, "Choose a GGUF model", folder,
                                          "GGUF models (*.gguf);;All files (*)")
    return path or None


class ModelMenu(QMenu):
    modelChosen = Signal(str)  # a model path, or DEMO_MODEL
    download_model = staticmethod(download_model)  # the curated list (replaceable in tests)

    def __init__(self, bridge: EngineBridge, title: str = "Model", parent: QWidget | None = None) -> None:
        super().__init__(title, parent)
        self.bridge = bridge
        self.setToolTipsVisible(True)
        self.group = QActionGroup(self)
        self.group.setExclusive(True)
        self._searched_at: float | None = None
        self.aboutToShow.connect(self.rebuild)
        bridge.modelsFound.connect(self._on_found)
        bridge.settingsChanged.connect(self._on_settings)
        self.fill()

    # -- contents -------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Before the menu shows: look for models again now and then (a job), and fill it."""
        now = time.monotonic()
        if self._searched_at is None or now - self._searched_at > SEARCH_AGAIN_AFTER_S:
            self._searched_at = now
            self.bridge.discover_models()
        self.fill()

    def fill(self) -> None:
        b = self.bridge
        for action in self.actions():
            self.group.removeAction(action)
        self.clear()
        settings = b.settings
        current = settings.profile.model_path
        listed: list[str] = []

        recent = [m.model_path for m in settings.models][:RECENT_ITEMS]
        if current and not any(_same_file(current, r) for r in recent):
            recent.insert(0, current)
        if recent:
            self.addSection("Recent")
        for path in recent:
            memory = settings.remembered(path)
            tip = path if path != DEMO_MODEL else "The starter model: SmolLM2 135M Instruct, small and quick"
            if memory is not None:
                tip += (f"\nRemembered: context {memory.ctx:,}, {memory.parallel} slot"
                        f"{'s' if memory.parallel != 1 else ''}{', --swa-full' if memory.swa_full else ''}")
            self._add_model(path, profile_model_name(path), tip, current)
            listed.append(path)

        found = b.found_models
        others = [m for m in (found or []) if not any(_same_file(str(m.path), p) for p in listed)]
        if found is None or others:
            self.addSection("Found on this computer")
        if found is None:
            searching = self.addAction("Looking for models…")
            searching.setEnabled(False)
        for m in others[:FOUND_ITEMS]:
            label = f"{m.path.name} ({m.arch or '?'}, {human_bytes(m.size_bytes)})"
            named = f"{m.name}\n" if m.name else ""
            self._add_model(str(m.path), label, f"{named}{m.path}\nFound in {m.source}", current)

        self.addSeparator()
        if not any(_same_file(DEMO_MODEL, p) for p in listed):
            demo = self.addAction("Starter model (SmolLM2 135M)")
            demo.setToolTip("Needs no download; it answers with gibberish, but shows how saving and "
                            "restoring conversations works")
            demo.triggered.connect(lambda _=False: self.modelChosen.emit(DEMO_MODEL))
        self.choose_action = self.addAction("Choose model…")
        self.choose_action.setToolTip("Pick a GGUF file")
        self.choose_action.triggered.connect(self.choose_file)
        self.download_action = self.addAction("Download a model…")
        self.download_action.setToolTip("A few well-known models, small to large, with what each needs")
        self.download_action.triggered.connect(self.download)

    def _add_model(self, path: str, label: str, tip: str, current: str | None) -> QAction:
        action = QAction(_elide(label), self)
        action.setCheckable(True)
        action.setChecked(bool(current) and _same_file(path, current or ""))
        action.setData(path)
        action.setToolTip(tip)
        self.group.addAction(action)
        action.triggered.connect(lambda _=False, p=path: self._picked(p))
        self.addAction(action)
        return action

    def model_actions(self) -> list[QAction]:
        """The actions that choose a listed model (not the demo or "Choose model…")."""
        return [a for a in self.actions() if a.isCheckable()]

    def _picked(self, path: str) -> None:
        current = self.bridge.settings.profile.model_path
        if current and _same_file(path, current) and self.bridge.running:
            self.fill()  # already running this model: keep the check where it was
            return
        self.modelChosen.emit(path)

    def choose_file(self) -> None:
        path = pick_model_file(self.parentWidget(), self.bridge.settings.profile.model_path)
        if path:
            self.modelChosen.emit(path)

    def download(self) -> None:
        path = self.download_model(self.parentWidget(), jobs=self.bridge.jobs)
        if path is not None:
            self.bridge.discover_models()  # the new file is in the Hugging Face cache now
            self.modelChosen.emit(str(path))

    def _on_found(self, _models) -> None:
        self.fill()

    def _on_settings(self, _settings) -> None:
        self.fill()
