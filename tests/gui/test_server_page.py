"""The Server page: state, actions, address, warnings and the log, fed by the bridge."""

from __future__ import annotations

import pytest
from gui_helpers import emit_from_thread

from slotkeeper.core import events as ev
from slotkeeper.core.basics.units import human_duration as format_duration
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.settings import ServerProfile
from slotkeeper.core.views import Activity
from slotkeeper.gui.pages.server_page import ServerPage
from slotkeeper.gui.widgets import describe_profile


@pytest.fixture
def page(qtbot, bridge):
    p = ServerPage(bridge)
    qtbot.addWidget(p)
    p.show()
    return p


def test_initial_state(page):
    assert page.state_label.text() == "Stopped"
    assert page.state_message.text().startswith("No model chosen yet. Choose a GGUF model")
    assert not page.start_action.isEnabled()  # no model chosen
    assert page.start_action.toolTip() == "No model chosen yet: use “Choose model…” first"
    assert page.choose_model_button.isDefault()
    assert not page.start_button.isEnabled()
    assert page.open_chat_action.isEnabled()  # the chat window opens whether or not the server runs
    assert not page.web_ui_action.isVisible()  # llama-server's own page: only once found
    assert page.uptime_label.text() == "—"
    assert not page.warning_box.isVisible()


def test_state_changes_update_the_server_tab(qtbot, page, bridge, engine):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "loading model"))
    assert page.state_label.text() == "Starting"
    assert page.stop_action.isEnabled()
    assert page.stop_button.isEnabled()
    assert "http://127.0.0.1:8789" in page.address_label.text()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerLoading(3.2, "llama_model_load: ..."))
    assert "Loading the model… 3 s" in page.state_message.text()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.WarningRaised("restores will not help"))
    assert page.warning_box.isVisible()


def test_the_starter_models_download_shows_its_progress_in_the_server_tab(qtbot, page, bridge, engine):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "preparing"))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity("downloading", "downloading the starter model",
                                                             49_000_000, 98_362_432)))
    assert page.state_label.text() == "Starting"
    assert page.state_message.text() == "Downloading the starter model: 49% of 93.8 MiB"
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ActivityChanged(Activity()))
    assert page.state_message.text() == "preparing"


def test_a_failed_start_keeps_the_log_tail_in_a_tooltip(qtbot, page, bridge, engine):
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.FAILED, "exited with code 1",
                                                       log_tail=("line one", "error: bad flag")))
    assert page.state_label.text() == "Failed"
    assert page.state_message.toolTip() == "line one\nerror: bad flag"


def test_log_lines_reach_the_log_view(qtbot, page, bridge):
    with qtbot.waitSignal(bridge.logLines):
        bridge._on_log_line("main: server is listening on http://127.0.0.1:8789")
    assert "server is listening" in page.log_view.plain_text()


def test_settings_changes_show_at_once(qtbot, page, bridge):
    with qtbot.waitSignal(bridge.settingsChanged, timeout=10_000):
        bridge.apply_settings(bridge.settings.with_profile(model_path="/m/model.gguf", ctx=4096),
                              persist=False)
    assert page.start_action.isEnabled()
    assert page.flags_label.text().startswith("context 4,096")


def test_uptime_ticks_only_while_shown(page):
    assert page._uptime_timer.isActive()
    page.hide()
    assert not page._uptime_timer.isActive()


def test_helpers():
    assert format_duration(59) == "59 s" and format_duration(2.25) == "2.2 s"
    assert format_duration(3_725) == "1 h 2 min"
    assert format_duration(90_000) == "1 d 1 h 0 min"
    text = describe_profile(ServerProfile(ctx=8192, parallel=2, flash_attn=True, swa_full=True,
                                          extra_args=("-t", "8")))
    assert text == ("context 8,192 (4,096 per slot), 2 slots, flash attention on, K f16 / V f16, "
                    "--swa-full, -t 8")
    # auto: as such before a launch, with what it resolved to once the server runs
    assert "flash attention auto," in describe_profile(ServerProfile())
    assert "flash attention on (auto)," in describe_profile(ServerProfile(), flash_attn=True)
    assert "flash attention off," in describe_profile(ServerProfile(flash_attn=False), flash_attn=False)


def test_when_ready_the_header_gives_the_front_doors_address_not_llama_servers(qtbot, page, bridge, engine,
                                                                             monkeypatch):
    from slotkeeper.gui.bridge import EngineBridge

    monkeypatch.setattr(EngineBridge, "facts", property(lambda self: object()))  # launch work done
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.READY, "http://127.0.0.1:40111"))
    assert page.state_label.text() == "Ready"
    assert page.state_message.text() == bridge.base_url and "40111" not in bridge.base_url


def test_an_earlier_runs_log_is_marked_as_such(qtbot, bridge, engine):
    """After a start refused before llama-server ran (its port in use) the log file is the previous
    run's: the Server tab says so instead of showing it as this failure's log."""
    import os

    from slotkeeper.gui.pages.server_page import read_log

    log = engine.paths.server_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("srv  llama_server: listening on http://127.0.0.1:45000\n")
    os.utime(log, (1_700_000_000, 1_700_000_000))  # written long before this Slotkeeper started
    lines, note = read_log(engine)
    assert lines == ["srv  llama_server: listening on http://127.0.0.1:45000"]
    assert note is not None and "earlier run" in note and "has not run since Slotkeeper started" in note
    assert read_log(engine, since=1_600_000_000)[1] is None  # written since: this run's own
    page = ServerPage(bridge)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: "earlier run" in page.log_view.plain_text(), timeout=5000)
    with qtbot.waitSignal(bridge.eventArrived):  # a new llama-server: its lines follow a divider
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "preparing"))
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STARTING, "loading the model"))
    assert page.log_view.plain_text().count("——— llama-server starting") == 1
