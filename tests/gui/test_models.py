"""Choosing and switching models without a server: the Model menu, per-model settings in the
Settings dialog, the switch dialog (--swa-full and its cost, memory, training context), the
warning about saved conversations that would no longer restore, the no-model window."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from gui_helpers import keep_screenshot, make_bridge, make_session
from PySide6.QtWidgets import QMessageBox

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.services.choosing import n_ctx_per_slot
from slotkeeper.core.settings import Settings, load_settings, save_settings

GIB = 1024**3


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return {
        "a": write_model(folder / "alpha-llama.gguf", "llama"),
        "b": write_model(folder / "beta-llama.gguf", "llama-alt"),
        "swa": write_model(folder / "gamma-gemma2.gguf", "gemma2"),
    }


@pytest.fixture
def found_dir(tmp_path):
    folder = tmp_path / "found"
    write_model(folder / "found-here.gguf", "llama")
    return folder




@pytest.fixture
def cleanup():
    items = []
    yield items
    for bridge, engine in items:
        bridge.close()
        bridge.deleteLater()
        engine.close(save=False)


def two_models(model_files) -> Settings:
    a, b = str(model_files["a"]), str(model_files["b"])
    s = Settings().with_profile(model_path=b, ctx=2048, parallel=2).remember_model()
    return s.choose_model(a).with_profile(ctx=4096, parallel=1).remember_model()


# -- the Model menu ---------------------------------------------------------------------------
def test_the_model_menu_lists_recent_and_found_models_with_the_current_one_checked(
        qtbot, cleanup, model_files, found_dir, monkeypatch):
    from slotkeeper.gui.tray import TrayController

    bridge, engine, _ = make_bridge(qtbot, two_models(model_files), found=found_dir)
    cleanup.append((bridge, engine))
    tray = TrayController(bridge)
    try:
        assert tray.model_menu.title() == "Model: alpha-llama.gguf"
        assert tray.model_menu.menuAction() in tray.menu.actions()
        with qtbot.waitSignal(bridge.modelsFound, timeout=10_000):
            tray.model_menu.rebuild()
        texts = [a.text() for a in tray.model_menu.actions()]
        assert texts[:3] == ["Recent", "alpha-llama.gguf", "beta-llama.gguf"]
        assert "Found on this computer" in texts
        assert any(t.startswith("found-here.gguf (llama") for t in texts)
        assert texts[-3:] == ["Starter model (SmolLM2 135M)", "Choose model…", "Download a model…"]
        checked = [a.text() for a in tray.model_menu.model_actions() if a.isChecked()]
        assert checked == ["alpha-llama.gguf"]
        beta = next(a for a in tray.model_menu.model_actions() if a.text() == "beta-llama.gguf")
        assert "Remembered: context 2,048, 2 slots" in beta.toolTip()

        with qtbot.waitSignal(tray.modelRequested) as chosen:
            beta.trigger()
        assert chosen.args == [str(model_files["b"]), ""]
        from slotkeeper.gui import model_menu

        monkeypatch.setattr(model_menu.QFileDialog, "getOpenFileName",
                            staticmethod(lambda *a, **k: ("/somewhere/picked.gguf", "")))
        with qtbot.waitSignal(tray.modelRequested) as picked:
            tray.model_menu.choose_action.trigger()
        assert picked.args == ["/somewhere/picked.gguf", ""]
        monkeypatch.setattr(model_menu.QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: ("", "")))
        with qtbot.assertNotEmitted(tray.modelRequested):
            tray.model_menu.choose_action.trigger()  # cancelled: nothing chosen
    finally:
        tray.dispose()
        tray.deleteLater()


def test_with_no_model_the_tray_offers_to_choose_one(qtbot, cleanup):
    from slotkeeper.gui.tray import TrayController

    bridge, engine, _ = make_bridge(qtbot, Settings())
    cleanup.append((bridge, engine))
    tray = TrayController(bridge)
    try:
        assert tray.start_stop_action.isEnabled()
        assert tray.start_stop_action.text() == "Choose a model to start…"
        assert tray.model_menu.title() == "Model"
        with qtbot.waitSignal(tray.chooseModelRequested):
            tray.start_stop_action.trigger()
    finally:
        tray.dispose()
        tray.deleteLater()


# -- the window without a model ---------------------------------------------------------------
def test_the_window_says_no_model_is_chosen_and_offers_to_choose_one(qtbot, cleanup):
    from slotkeeper.gui.main_window import MainWindow

    bridge, engine, _ = make_bridge(qtbot, Settings())
    cleanup.append((bridge, engine))
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    window.resize(1000, 420)
    window.show()
    page = window.server_page
    assert "No model chosen yet" in page.state_message.text()
    assert not page.start_button.isEnabled()
    assert "Choose model" in page.start_button.toolTip()  # disabled, and says why
    assert page.choose_model_button.isVisible() and page.choose_model_button.isDefault()
    keep_screenshot(window, "main-window-no-model.png")
    with qtbot.waitSignal(window.chooseModelRequested):
        page.choose_model_button.click()
    assert any(a.text() == "&Model" for a in window.menuBar().actions()[1].menu().actions())


def test_choose_model_from_the_window_opens_the_chooser_and_switches(qtbot, tmp_path, model_files,
                                                                     monkeypatch):
    from slotkeeper.gui.application import SlotkeeperApp

    paths = app_paths().ensure()
    app = SlotkeeperApp(paths, Settings(), tray_available=False, first_run=False)
    qtbot.addWidget(app.window)
    chosen = []
    monkeypatch.setattr(app.switcher, "choose", lambda path, resume_id=None: chosen.append((path, resume_id)))
    app.bridge.model_search_dirs = [("Test", model_files["a"].parent)]
    try:
        app.window.server_page.choose_model_button.click()
        dialog = app.chooser
        assert dialog is not None and dialog.windowTitle() == "Choose a model"
        qtbot.waitUntil(lambda: dialog.searching == 0 and dialog.use_button.isEnabled(), timeout=10_000)
        dialog.use_selected()
        qtbot.waitUntil(lambda: bool(chosen), timeout=5000)
        assert chosen[0][0].endswith(".gguf") and app.chooser is None
    finally:
        with qtbot.waitSignal(app.finished, timeout=10_000):
            app.request_quit()
        app.deleteLater()


# -- per-model settings in the Settings dialog ------------------------------------------------
def test_the_settings_dialog_fills_in_a_models_remembered_settings_and_saves_them(qtbot, cleanup,
                                                                                  model_files):
    from slotkeeper.gui.settings.dialog import SettingsDialog

    bridge, engine, service = make_bridge(qtbot, two_models(model_files))
    cleanup.append((bridge, engine))
    d = SettingsDialog(bridge, search_dirs=[])
    qtbot.addWidget(d)
    server = d.server_tab
    assert (server.ctx.value(), server.parallel.value()) == (4096, 1)
    server.model_combo.setEditText(str(model_files["b"]))
    assert (server.ctx.value(), server.parallel.value()) == (2048, 2)
    assert server.row_shown(server.remembered_note)
    assert "remembered for this model" in server.remembered_note.text()
    server.flash_attn.set_value(True)
    server.model_combo.setEditText(str(model_files["a"]))  # back: the current model's own values
    assert (server.ctx.value(), server.parallel.value()) == (4096, 1) and server.flash_attn.value() is None
    server.model_combo.setEditText(str(model_files["b"]))
    server.flash_attn.set_value(True)
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        assert d.save()
    on_disk = load_settings(service.path)
    assert on_disk.profile.model_path == str(model_files["b"]) and on_disk.profile.ctx == 2048
    assert on_disk.remembered(str(model_files["b"])).flash_attn is True
    assert on_disk.remembered(str(model_files["a"])).ctx == 4096  # A keeps what it had
    assert on_disk.models[0].model_path == str(model_files["b"])


# -- saved conversations the new settings leave behind ----------------------------------------
def sessions_of(sessions_dir: Path, model: Path, n: int, ctx: int, parallel: int) -> None:
    for i in range(n):
        make_session(sessions_dir, f"{i:012x}", title=f"Chat {i}", age_hours=i + 1,
                     model_path=os.path.realpath(model), model_sha256="a" * 64, arch="llama", swa=False,
                     swa_full=False, flash_attn=False, cache_type_k="f16", cache_type_v="f16",
                     n_parallel=parallel, kv_unified=False, n_ctx_slot=n_ctx_per_slot(ctx, parallel),
                     n_tokens=300, kv_args=[])


def test_settings_that_strand_saved_conversations_say_so_before_saving(qtbot, cleanup, model_files,
                                                                       monkeypatch):
    from slotkeeper.gui.settings.dialog import SettingsDialog

    a = model_files["a"]
    bridge, engine, service = make_bridge(qtbot, Settings().with_profile(model_path=str(a), ctx=4096))
    cleanup.append((bridge, engine))
    sessions_of(engine.paths.sessions_dir, a, 12, ctx=4096, parallel=1)
    with qtbot.waitSignal(bridge.sessionsListed, timeout=10_000):
        bridge.refresh_sessions()
    d = SettingsDialog(bridge, search_dirs=[])
    qtbot.addWidget(d)
    d.show()
    qtbot.waitUntil(lambda: d.server_tab.identity is not None and d._current_identity is not None,
                    timeout=10_000)
    assert not d.sessions_label.isVisible()  # nothing changed yet
    d.server_tab.parallel.setValue(2)
    expected = "12 saved conversations were made with 1 slot and will not restore with 2."
    assert d.sessions_label.isVisible() and d.sessions_label.text() == expected
    keep_screenshot(d, "settings-incompatible-sessions.png")

    asked = []

    def answer(button):
        def question(parent, title, text, *args, **kwargs):
            asked.append(text)
            return button
        return question

    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.Cancel))
    assert d.save() is False
    assert expected in asked[0]
    assert load_settings(service.path).profile.parallel == 1  # nothing was saved
    d.server_tab.parallel.setValue(1)
    assert not d.sessions_label.isVisible()
    d.server_tab.parallel.setValue(2)
    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.Save))
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        assert d.save()
    assert load_settings(service.path).profile.parallel == 2


def test_sessions_of_another_model_resume_by_switching_to_it(qtbot, cleanup, model_files):
    from slotkeeper.gui.pages.sessions_page import SessionsPage
    from slotkeeper.gui.tray import TrayController

    a, b = model_files["a"], model_files["b"]
    bridge, engine, _ = make_bridge(qtbot, two_models(model_files).choose_model(str(b)))
    cleanup.append((bridge, engine))
    sessions_of(engine.paths.sessions_dir, a, 1, ctx=4096, parallel=1)
    qtbot.waitUntil(lambda: bridge.model_file == os.path.realpath(b), timeout=10_000)
    page = SessionsPage(bridge)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.sessions_model.rowCount() == 1, timeout=10_000)
    page.select_session(page.sessions_model.entry(0).id)
    assert page.resume_button.text() == "Switch to alpha-llama.gguf to resume"
    assert page.resume_button.isEnabled() and "switches to alpha-llama.gguf" in page.resume_button.toolTip()
    menu = page.build_context_menu()
    assert menu.actions()[0].text() == "Switch to alpha-llama.gguf to resume"
    with qtbot.waitSignal(page.switchRequested) as asked:
        menu.actions()[0].trigger()
    assert asked.args == [str(a), "000000000000"]

    tray = TrayController(bridge)
    try:
        tray.rebuild_resume_menu()
        (item,) = tray.resume_menu.actions()
        assert item.text().endswith("— switch to alpha-llama.gguf to resume") and item.isEnabled()
        with qtbot.waitSignal(tray.modelRequested) as via_tray:
            item.trigger()
        assert via_tray.args == [str(a), "000000000000"]
    finally:
        tray.dispose()
        tray.deleteLater()


# -- the switch dialog: --swa-full, memory, training context ------------------------------------
def preview(qtbot, bridge, path):
    from slotkeeper.gui.model_switch import prepare_switch

    got = []
    bridge.jobs.run(prepare_switch, bridge, str(path), bridge.listing, bridge.facts, bridge.settings, False,
                    on_success=got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=10_000)
    return got[0]


def test_a_sliding_window_model_offers_swa_full_with_its_cost(qtbot, cleanup, model_files, monkeypatch):
    from slotkeeper.gui.model_switch import ModelSwitcher, SwitchModelDialog

    bridge, engine, _ = make_bridge(qtbot,
                                    Settings().with_profile(model_path=str(model_files["a"]), ctx=4096))
    cleanup.append((bridge, engine))
    p = preview(qtbot, bridge, model_files["swa"])
    assert p.needs_asking and p.swa_text and "--swa-full" in p.swa_text and "more KV memory" in p.swa_text
    assert p.sanity[True].kv_bytes > p.sanity[False].kv_bytes
    d = SwitchModelDialog(p)
    qtbot.addWidget(d)
    d.show()
    assert d.swa_full is not None and not d.swa_full.isChecked()
    without = d.memory_label.text()
    d.swa_full.setChecked(True)
    assert d.memory_label.text() != without and "--swa-full" in d.settings_label.text()
    assert d.changes() == {"swa_full": True}
    keep_screenshot(d, "switch-model-swa.png")

    switched = []
    monkeypatch.setattr(bridge, "switch_model", lambda path, **kw: switched.append((path, kw)))
    switcher = ModelSwitcher(bridge)
    switcher.choose(str(model_files["swa"]))
    qtbot.waitUntil(lambda: switcher.dialog is not None, timeout=10_000)
    switcher.dialog.swa_full.setChecked(True)
    switcher.dialog.accept()
    ((path, kw),) = switched
    assert path == str(model_files["swa"]) and kw["swa_full"] is True and kw["resume_id"] is None
    switcher.dispose()


def test_a_plain_model_with_nothing_to_say_switches_at_once(qtbot, cleanup, model_files, monkeypatch):
    from slotkeeper.gui.model_switch import ModelSwitcher

    bridge, engine, _ = make_bridge(qtbot, Settings())
    cleanup.append((bridge, engine))
    switched = []
    monkeypatch.setattr(bridge, "switch_model", lambda path, **kw: switched.append(path))
    switcher = ModelSwitcher(bridge)
    switcher.choose(str(model_files["a"]))
    qtbot.waitUntil(lambda: bool(switched), timeout=10_000)
    assert switched == [str(model_files["a"])] and switcher.dialog is None


def test_a_missing_or_broken_model_is_a_clear_message(qtbot, cleanup, tmp_path):
    from slotkeeper.gui.model_switch import ModelSwitcher

    bridge, engine, _ = make_bridge(qtbot, Settings())
    cleanup.append((bridge, engine))
    switcher = ModelSwitcher(bridge)
    with qtbot.waitSignal(bridge.errorOccurred, timeout=10_000) as err:
        switcher.choose(str(tmp_path / "gone.gguf"))
    assert "Cannot use gone.gguf" in err.args[1] and "not a file" in err.args[1]
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model at all")
    with qtbot.waitSignal(bridge.errorOccurred, timeout=10_000) as err:
        switcher.choose(str(broken))
    assert "Cannot use broken.gguf" in err.args[1] and "Traceback" not in err.args[1]


def test_sanity_before_launch_context_and_memory(qtbot, cleanup, model_files, monkeypatch):
    import psutil

    from slotkeeper.core.model.gguf_info import read_model_info
    from slotkeeper.gui.model_switch import SwitchModelDialog

    bridge, engine, _ = make_bridge(qtbot, Settings().with_profile(model_path=str(model_files["a"]), ctx=4096)
                                    .remember_model())
    cleanup.append((bridge, engine))
    info_ctx = read_model_info(model_files["a"]).context_length
    huge = two_models(model_files).choose_model(str(model_files["b"])).with_profile(
        ctx=8 * info_ctx, parallel=1)
    save_settings(bridge.settings_service.path, huge.remember_model().choose_model(str(model_files["a"])))
    p = preview(qtbot, bridge, model_files["b"])
    assert any("beyond what" in w and f"{info_ctx:,}" in w for w in p.sanity[False].warnings)
    d = SwitchModelDialog(p)
    qtbot.addWidget(d)
    d.show()
    assert d.problems_label.isVisible() and "trained on" in d.problems_label.text()
    assert d.switch_button.isEnabled()  # a warning, not a refusal

    # a machine with 1 MiB of memory
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=1024**2, available=1024**2))
    small = preview(qtbot, bridge, model_files["b"])
    assert small.sanity[False].refusal and "this machine has 1.0 MiB" in small.sanity[False].summary
    d2 = SwitchModelDialog(small)
    qtbot.addWidget(d2)
    d2.show()
    assert not d2.switch_button.isEnabled() and "Lower the context" in d2.switch_button.toolTip()
    keep_screenshot(d2, "switch-model-memory.png")


def test_the_settings_dialog_shows_memory_against_the_machine(qtbot, cleanup, model_files):
    from slotkeeper.core.model.gguf_info import read_model_info
    from slotkeeper.gui.settings.dialog import SettingsDialog

    bridge, engine, _ = make_bridge(qtbot,
                                    Settings().with_profile(model_path=str(model_files["a"]), ctx=2048))
    cleanup.append((bridge, engine))
    d = SettingsDialog(bridge, search_dirs=[])
    qtbot.addWidget(d)
    d.show()
    server = d.server_tab
    qtbot.waitUntil(lambda: server.sanity is not None, timeout=10_000)
    assert server.row_shown(server.sanity_note) and server.sanity_note.text().startswith("Needs about")
    kv = server.sanity.kv_bytes
    server.ctx.setValue(4096)
    assert server.sanity.kv_bytes == 2 * kv
    trained = read_model_info(model_files["a"]).context_length
    server.ctx.setValue(4 * trained)
    assert "beyond what" in server.sanity_note.text()


def test_demo_model_is_offered_and_chosen(qtbot, cleanup):
    from slotkeeper.gui.model_menu import ModelMenu

    bridge, engine, _ = make_bridge(qtbot, Settings())
    cleanup.append((bridge, engine))
    menu = ModelMenu(bridge)
    try:
        demo = next(a for a in menu.actions() if a.text().startswith("Starter model"))
        with qtbot.waitSignal(menu.modelChosen) as chosen:
            demo.trigger()
        assert chosen.args == [DEMO_MODEL]
    finally:
        menu.deleteLater()


def test_the_switch_dialog_says_in_words_which_command_line_settings_stop_applying(qtbot, cleanup,
                                                                                   model_files):
    """`slotkeeper --ctx 4096 --parallel 2`, then another model: the dialog says it in words, no field
    names (it said "The command line's model_path, ctx applied to the model it came with")."""
    from slotkeeper.gui.model_switch import SwitchModelDialog, dropped_words

    bridge, engine, _ = make_bridge(qtbot, Settings().with_profile(model_path=str(model_files["a"])),
                                    overrides={"profile.ctx": 4096, "profile.parallel": 2})
    cleanup.append((bridge, engine))
    p = preview(qtbot, bridge, model_files["b"])
    assert set(p.plan.dropped_overrides) == {"profile.ctx", "profile.parallel"}
    d = SwitchModelDialog(p)
    qtbot.addWidget(d)
    text = d.dropped_label.text()
    assert text == (f"The context size and number of slots you gave on the command line were for the model "
                    f"Slotkeeper started with; {p.name} runs with its own settings.")
    assert "_" not in text and "ctx" not in text
    assert dropped_words(("profile.model_path",)) == ""  # choosing another model is the point
    assert dropped_words(("profile.model_path", "profile.ctx")) == "context size"
