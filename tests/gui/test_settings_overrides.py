"""Values from this run's command line: the Settings dialog says which, and saving it without
touching them leaves the saved values alone."""

from __future__ import annotations

import pytest

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import DEMO_MODEL, Engine
from slotkeeper.core.services.settings import SettingsService, field_names
from slotkeeper.core.settings import Settings, load_settings, save_settings
from slotkeeper.gui.settings.dialog import SettingsDialog
from slotkeeper.gui.settings.form import COMMAND_LINE_FLAGS, command_line_flag

GIB = 1024**3
OVERRIDES = {"profile.port": 9000, "profile.model_path": DEMO_MODEL, "budget_bytes": 123 * GIB}


@pytest.fixture
def overrides():
    return OVERRIDES  # as from `slotkeeper --port 9000 --demo --budget 123G`


@pytest.fixture
def service(overrides):
    paths = app_paths().ensure()
    save_settings(paths.settings_file, Settings(budget_bytes=7 * GIB).with_profile(port=8123, ctx=8192))
    return SettingsService(paths.settings_file, overrides)


@pytest.fixture
def bridge(qtbot, service):
    from slotkeeper.gui.bridge import EngineBridge

    engine = Engine(app_paths(), service.effective())
    b = EngineBridge(engine, service, watch_sessions=False)
    yield b
    b.close()
    b.deleteLater()
    engine.close(save=False)


@pytest.fixture
def dialog(qtbot, bridge, tmp_path):
    d = SettingsDialog(bridge, search_dirs=[("test", tmp_path / "models")])
    qtbot.addWidget(d)
    d.show()
    return d


def test_the_dialog_shows_this_runs_values(dialog):
    server = dialog.server_tab
    assert server.port.value() == 9000
    assert server.model_value() == DEMO_MODEL
    assert dialog.disk_tab.budget_edit.text() == "123 GiB"


def test_overridden_fields_carry_a_note_and_the_others_do_not(dialog):
    server, sessions, disk = dialog.server_tab, dialog.sessions_tab, dialog.disk_tab
    assert set(server.override_notes) == {server.host, server.model_combo}  # the port shares the host's row
    assert set(disk.override_notes) == {disk.budget_slider}
    assert not sessions.override_notes
    port_note = server.override_notes[server.host]
    assert port_note.text() == "from the command line (--port)"
    assert "saved value stays unchanged unless you change it here" in port_note.toolTip()
    assert server.row_shown(port_note) and port_note.isVisible()
    assert server.override_notes[server.model_combo].text() == "from the command line (--demo)"
    assert disk.override_notes[disk.budget_slider].text() == "from the command line (--budget)"
    # the note sits right under its field's row
    form = server.forms[0]
    host_row = server._row_of(server.host)[1]
    assert form.getWidgetPosition(port_note)[0] == host_row + 1
    for widget in (server.ctx, server.parallel, server.flash_attn, server.cache_k, server.extra_args,
                   server.server_bin, sessions.idle_save, sessions.restore_count):
        assert widget not in server.override_notes and widget not in sessions.override_notes


def test_saving_without_touching_an_override_keeps_the_saved_value(qtbot, dialog, bridge, service):
    dialog.server_tab.ctx.setValue(4096)
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        assert dialog.save()
    on_disk = load_settings(service.path)
    assert on_disk.profile.ctx == 4096  # what the user changed is saved
    assert on_disk.profile.port == 8123  # the command line's 9000 is not
    assert on_disk.profile.model_path is None
    assert on_disk.budget_bytes == 7 * GIB
    assert bridge.settings.profile.port == 9000  # and this run still uses it
    assert bridge.settings.budget_bytes == 123 * GIB
    assert "profile.port" in service.overrides


def test_changing_an_overridden_field_saves_it(qtbot, dialog, bridge, service):
    note = dialog.server_tab.override_notes[dialog.server_tab.host]
    dialog.server_tab.port.setValue(9100)
    assert note.text().startswith("changed here")
    assert "--port" in note.text()
    dialog.server_tab.port.setValue(9000)
    assert note.text() == "from the command line (--port)"
    dialog.server_tab.port.setValue(9100)
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        assert dialog.save()
    assert load_settings(service.path).profile.port == 9100
    assert bridge.settings.profile.port == 9100
    assert "profile.port" not in service.overrides
    assert load_settings(service.path).budget_bytes == 7 * GIB  # the untouched override stays out


@pytest.mark.parametrize("overrides", [{"profile.swa_full": True, "profile.model_path": DEMO_MODEL}])
def test_a_note_hides_with_its_row(dialog):
    server = dialog.server_tab
    note = server.override_notes[server.swa_box]
    assert note.text() == "from the command line (--swa-full)"
    assert not server.row_shown(server.swa_box)  # the demo model has no sliding window
    assert not server.row_shown(note)
    server.show_row(server.swa_box, True)
    assert server.row_shown(note)


def test_every_command_line_setting_has_its_flag():
    from slotkeeper.cli.commands import build_parser
    from slotkeeper.cli.run import run_overrides

    argv = ["--model", "/m.gguf", "--server-bin", "/bin/ls", "--host", "0.0.0.0", "--port", "9000",
            "--ctx", "4096", "--parallel", "2", "--flash-attn", "on", "--cache-type-k", "q8_0",
            "--cache-type-v", "q8_0", "--swa-full", "--idle-save", "5", "--restore", "1", "--budget", "5G"]
    overrides = run_overrides(build_parser().parse_args(argv), ["-t", "8"])
    assert set(overrides) == set(COMMAND_LINE_FLAGS)
    for name, value in overrides.items():
        flag = command_line_flag(name, value)
        assert flag == "arguments after --" or flag in argv
    assert set(COMMAND_LINE_FLAGS) <= set(field_names(Settings()))
    assert command_line_flag("profile.model_path", DEMO_MODEL) == "--demo"
