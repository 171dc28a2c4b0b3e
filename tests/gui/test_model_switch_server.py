"""Switching models against the real llama-server: the app's switch saves every changed slot
first (with progress), then relaunches on the other model; a conversation of the first model
resumes by switching back to it; the first-run dialog's "Use this model" starts the server."""

from __future__ import annotations

import os

import httpx
import pytest
from test_models import keep_screenshot

from slotkeeper.core import events as ev
from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.services.settings import SettingsService
from slotkeeper.core.settings import Settings, load_settings, save_settings
from slotkeeper.gui.application import SlotkeeperApp

pytestmark = pytest.mark.e2e

READY_MS = 120_000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("switch-models")
    return write_model(folder / "first-llama.gguf",
                       "llama"), write_model(folder / "second-llama.gguf", "llama-alt")


def chat(url: str, text: str) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, "seed": 1}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


class Recorder:
    def __init__(self, engine) -> None:
        self.events: list = []
        engine.events.subscribe(self.events.append)

    def kinds(self) -> list[str]:
        out = []
        for e in list(self.events):
            if isinstance(e, ev.SessionSaved):
                out.append(f"saved:{e.summary.reason}")
            elif isinstance(e, ev.ServerStateChanged):
                out.append(f"state:{e.state.value}")
            elif isinstance(e, ev.EngineReady):
                out.append("ready")
        return out


def build_app(qtbot, settings: Settings, overrides: dict) -> SlotkeeperApp:
    paths = app_paths().ensure()
    save_settings(paths.settings_file, settings)
    service = SettingsService(paths.settings_file, overrides)
    app = SlotkeeperApp(paths, service.effective(), service, tray_available=False, first_run=False)
    qtbot.addWidget(app.window)
    app.bridge.model_search_dirs = []
    return app


def quit_app(qtbot, app: SlotkeeperApp) -> None:
    with qtbot.waitSignal(app.finished, timeout=READY_MS):
        app.request_quit()
    app.deleteLater()


def test_switching_saves_changed_slots_first_then_relaunches_and_switches_back_to_resume(
        qtbot, models, server_bin, port):
    first, second = models
    # the second model is remembered with 2 slots: the switch brings that back
    settings = (Settings(idle_save_seconds=600).with_profile(model_path=str(second), ctx=2048, parallel=2)
                .remember_model().choose_model(str(first)).with_profile(ctx=2048,
                                                                        parallel=1).remember_model())
    app = build_app(qtbot, settings, {"profile.server_bin": server_bin, "profile.port": port})
    engine, bridge, switcher = app.engine, app.bridge, app.switcher
    try:
        bridge.start_server()
        qtbot.waitUntil(lambda: bridge.facts is not None, timeout=READY_MS)
        url = engine.base_url
        chat(url, "Tell me about the mountains and the weather up there in the spring.")
        assert not engine.sessions.listing().sessions  # idle save is far off: the slot is changed, unsaved
        log = Recorder(engine)

        switcher.choose(str(second))
        qtbot.waitUntil(lambda: switcher.dialog is not None, timeout=30_000)
        dialog = switcher.dialog
        assert dialog.windowTitle() == "Switch to second-llama.gguf"
        assert ("remembered for it" in dialog.settings_label.text()
                and "2 slots" in dialog.settings_label.text())
        waiting = dialog.waiting_label
        assert waiting is None  # nothing saved yet for the first model
        keep_screenshot(dialog, "switch-model.png")
        progress_texts: list[str] = []
        bridge.on(ev.ActivityChanged, lambda _e: switcher.progress is not None and progress_texts.append(
            switcher.progress.labelText()))
        with qtbot.waitSignal(bridge.modelSwitched, timeout=READY_MS) as switched:
            dialog.accept()
        outcome = switched.args[0]
        assert outcome.switched and outcome.report.ok
        assert [s.reason for s in outcome.report.saved] == ["before switching models"]
        qtbot.waitUntil(lambda: bridge.facts is not None and bridge.facts.n_parallel == 2, timeout=READY_MS)
        # closed once the new server is ready
        qtbot.waitUntil(lambda: switcher.progress is None, timeout=10_000)
        assert any("saving conversation 1 of 1" in t for t in progress_texts)
        kinds = log.kinds()
        # saved before the old server stopped, then the relaunch
        assert (kinds.index("saved:before switching models") < kinds.index("state:stopping")
                < kinds.index("ready"))
        assert engine.model.path.name == "second-llama.gguf"
        assert bridge.settings.profile.parallel == 2 and bridge.settings.profile.server_bin == server_bin
        on_disk = load_settings(app.paths.settings_file)
        assert on_disk.profile.model_path == str(second) and on_disk.profile.parallel == 2
        assert on_disk.profile.server_bin is None  # this run's --server-bin stays out of the file

        # The first model's conversation lists as "switch to first-llama.gguf to resume".
        (saved,) = engine.sessions.listing().sessions
        page = app.window.sessions_page
        with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000):
            bridge.refresh_sessions()
        qtbot.waitUntil(lambda: page.sessions_model.rowCount() == 1, timeout=10_000)
        page.select_session(page.sessions_model.entry(0).id)
        qtbot.waitUntil(lambda: page.resume_button.text() == "Switch to first-llama.gguf to resume",
                        timeout=10_000)
        app.window.show_tab("sessions")
        app.window.resize(1000, 360)
        keep_screenshot(app.window, "main-window-switch-to-resume.png")
        restored = []
        bridge.on(ev.SessionRestored, lambda e: restored.append(e.summary))
        page.resume_button.click()
        qtbot.waitUntil(lambda: switcher.dialog is not None, timeout=30_000)
        assert ("1 saved conversation of first-llama.gguf can be resumed"
                in switcher.dialog.sessions_label.text())
        switcher.dialog.accept()
        qtbot.waitUntil(lambda: bridge.facts is not None and engine.model.path.name == "first-llama.gguf"
                        and bool(restored), timeout=READY_MS)
        assert restored[0].id == saved.id and restored[0].n_restored > 0
        assert bridge.settings.profile.parallel == 1  # the first model's remembered settings came back
    finally:
        quit_app(qtbot, app)


def test_use_this_model_on_first_run_starts_the_server(qtbot, models, server_bin, port, monkeypatch):
    from slotkeeper.gui import application

    first, _ = models
    real_dialog = application.FirstRunDialog

    class Chooser:  # the first-run dialog as a person uses it: "Use this model" on the first one found
        DialogCode = application.FirstRunDialog.DialogCode

        def __init__(self, jobs, parent=None, search_dirs=None, welcome=True):
            self.real = real_dialog(jobs, parent, search_dirs=[("Test", first.parent)])
            self.chosen = None

        def exec(self):
            qtbot.waitUntil(lambda: self.real.use_button.isEnabled(), timeout=10_000)
            self.real.tree.setCurrentItem(next(
                self.real.tree.topLevelItem(i) for i in range(self.real.tree.topLevelItemCount())
                if self.real.tree.topLevelItem(i).text(4) == str(first)))
            self.real.use_button.click()
            self.chosen = self.real.chosen
            return self.real.result()

        def deleteLater(self):
            self.real.deleteLater()

    monkeypatch.setattr(application, "FirstRunDialog", Chooser)
    paths = app_paths().ensure()
    service = SettingsService(paths.settings_file, {"profile.server_bin": server_bin, "profile.port": port,
                                                    "profile.ctx": 2048})
    app = SlotkeeperApp(paths, service.effective(), service, tray_available=False)
    qtbot.addWidget(app.window)
    try:
        qtbot.waitUntil(lambda: app.bridge.facts is not None, timeout=READY_MS)
        assert app.bridge.state is ServerState.READY
        assert app.engine.model.path == first.resolve()
        assert chat(app.engine.base_url, "Hello")["choices"]
        on_disk = load_settings(paths.settings_file)
        assert on_disk.profile.model_path == str(first)
        assert on_disk.models[0].model_path == str(first)
        assert os.environ.get("SLOTKEEPER_HOME")  # the test's own folder, never the user's
    finally:
        quit_app(qtbot, app)
