"""What a new user saw wrong in the window, each fixed and kept fixed: slot titles and badges
after a chat switch, the legend with no server, history labels and markers, notification wording,
the Resume menu, the first-run text, and the one-click --swa-full fix."""

from __future__ import annotations

import dataclasses
import os
import time

from gui_helpers import emit_from_thread, make_session
from PySide6.QtCore import QPointF

from slotkeeper.core import events as ev
from slotkeeper.core.engine.desk.ledger import Figures
from slotkeeper.core.engine.lifecycle.model_facts import resolve_model, swa_note
from slotkeeper.core.engine.slots.board import PendingReuse, judge_reuse
from slotkeeper.core.history import RequestRecord
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.server.supervisor import describe_exit
from slotkeeper.core.settings import Settings
from slotkeeper.core.views import SlotView
from slotkeeper.gui.gauges import SlotGauge
from slotkeeper.gui.history_plot import HistoryPlot
from slotkeeper.gui.notifications import Notifier
from slotkeeper.gui.pages.history_page import HistoryPage
from slotkeeper.gui.pages.slots_page import SlotsPage
from slotkeeper.gui.swa_fix import SwaFixButton, swa_fix_offer
from slotkeeper.gui.tray import TrayController


async def _request_done(engine, slot, held, fig):
    engine.ledger.done(slot, held, fig)


def test_a_slot_switched_to_another_chat_drops_the_old_title_and_badge_at_once(qtbot, bridge, engine):
    page = SlotsPage(bridge)
    qtbot.addWidget(page)
    engine.board.reset(1, 8192)
    engine.board.show(0, session_id="aaaaaaaaaaaa", n_tokens=5000, warning="the next request reused 9 of …")
    fig = Figures(n_prompt=300, cache_n=12, prompt_n=288, prompt_ms=50.0, source="slot", saved_ms=0.0)
    with qtbot.waitSignal(bridge.eventArrived, check_params_cb=lambda e: isinstance(e, ev.SlotsChanged)):
        engine.loop.call(_request_done(engine, 0, 420, fig))
    qtbot.waitUntil(lambda: bridge.slots and bridge.slots[0].n_tokens == 420)
    view = bridge.slots[0]
    assert view.detached and view.warning is None
    # the session stays the slot's own until the next save (it may be the same conversation sent
    # again from its start): a Resume of it keeps what the slot holds; the in-slot guard lets it
    # go (a delete loses nothing: the next save names what the slot holds)
    assert view.session_id == "aaaaaaaaaaaa" and engine.board.holder("aaaaaaaaaaaa") == 0
    assert "aaaaaaaaaaaa" not in engine.board.in_slots()
    page.slots_panel.set_titles({"aaaaaaaaaaaa": "The old chat"})
    gauge = page.slots_panel.gauges[0]
    assert gauge.title == "" and "not saved yet" in gauge.summary()

    # the same conversation going on keeps its title
    engine.board.show(0, session_id="aaaaaaaaaaaa", n_tokens=5000, detached=False)
    fig = Figures(n_prompt=5100, cache_n=4990, prompt_n=110, prompt_ms=5.0, source="slot", saved_ms=900.0)
    engine.loop.call(_request_done(engine, 0, 5200, fig))
    assert engine.board[0].view.session_id == "aaaaaaaaaaaa" and not engine.board[0].view.detached


def test_another_conversation_after_a_restore_raises_no_badge():
    verdict = judge_reuse(PendingReuse("aaaaaaaaaaaa", 5000, "works"), cache_n=12, shared=12)
    assert verdict.effective is None  # not judged: the engine shows no badge for it (engine.request_done)


def test_the_badge_sits_right_after_the_title(qtbot):
    gauge = SlotGauge(0)
    qtbot.addWidget(gauge)
    gauge.resize(900, 90)
    gauge.set_title("Rivers")
    gauge.set_view(SlotView(0, n_ctx=4096, n_tokens=100, warning="not reused"))
    gauge.grab()
    assert not gauge._badge.isEmpty()
    assert gauge._badge.left() < gauge.width() / 3, "beside its conversation, not at the far right"


def test_no_legend_without_a_server(qtbot, bridge, engine):
    page = SlotsPage(bridge)
    qtbot.addWidget(page)
    page.show()
    assert not page.legend.isVisible() and page.slots_panel.empty_label.isVisible()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, n_ctx=4096),)))
    assert page.legend.isVisible()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.ServerStateChanged(ServerState.STOPPED))
    assert not page.legend.isVisible()


def test_history_time_labels_differ_and_restores_and_launches_are_marked(qtbot):
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 300)
    t0 = 1_790_000_000.0
    records = [RequestRecord(at=t0 + 7 * i, slot=0, n_prompt=1000 + i, cache_n=900, prompt_n=100 + i,
                             prompt_ms=10.0, source="restored" if i == 3 else "slot") for i in range(8)]
    plot.set_records(records)
    plot.set_launches([t0 + 20])
    plot.grab()
    assert len(plot.time_labels) >= 2
    assert len(set(plot.time_labels)) == len(plot.time_labels), plot.time_labels
    assert ("restored", 3) in plot.markers
    assert ("launch", 3) in plot.markers  # the launch came between requests 2 and 3
    assert plot.accessibleName() == "Request history" and "8 requests" in plot.accessibleDescription()


def test_an_empty_history_says_so_once(qtbot, bridge):
    with qtbot.waitSignal(bridge.historyLoaded, timeout=5000):
        page = HistoryPage(bridge)
        qtbot.addWidget(page)
        page.show()
    assert not page.history_summary.isVisible()
    page.history_plot.grab()


def test_notifications_say_how_the_server_ended_and_the_reuse_once(qtbot, bridge, engine):
    assert describe_exit(-9).startswith("was killed (SIGKILL")
    assert "code" not in describe_exit(-11) and "segmentation fault" in describe_exit(-11)
    assert describe_exit(1) == "exited with error code 1"
    assert describe_exit(0xC0000005) == "crashed (an access violation)"

    notifier = Notifier(bridge)
    said = []
    notifier.notify.connect(lambda t, m, lvl: said.append(m))
    reason = judge_reuse(PendingReuse("aaaaaaaaaaaa", 5176, "works"), cache_n=9, shared=5176).reason
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.RestoreReused(0, "aaaaaaaaaaaa", 9, 5300, 5176, False, reason))
    assert said[-1].count("reused") == 1 and "9 of the 5,176" in said[-1], said[-1]
    notifier.deleteLater()


def test_the_sliding_window_note_uses_one_arrow_and_offers_the_fix(qtbot, bridge, tmp_path, monkeypatch):
    model = resolve_model(str(write_model(tmp_path / "tiny-gemma2.gguf", "gemma2")), tmp_path)
    profile = Settings().profile
    note = swa_note(model, profile)
    assert "→" in note and "->" not in note
    assert swa_fix_offer(model, profile).startswith("Turn on --swa-full and restart (+")
    assert swa_fix_offer(model, profile.__class__(**{**profile.__dict__, "swa_full": True})) is None

    with_model = dataclasses.replace(bridge.engine.snapshot, model=model)
    monkeypatch.setattr(type(bridge), "snapshot", property(lambda self: with_model))
    button = SwaFixButton(bridge)
    qtbot.addWidget(button)
    button.show()
    assert button.isVisible() and "memory" in button.text()
    applied = []
    monkeypatch.setattr(bridge, "apply_settings", lambda s, restart=False, **k: applied.append((s, restart)))
    monkeypatch.setattr(type(bridge), "running", property(lambda self: True))
    button.click()
    (settings, restart), = applied
    assert settings.profile.swa_full and restart, "one click: --swa-full on, then a restart that saves first"


def test_the_resume_menu_tells_conversations_apart_and_marks_the_one_in_a_slot(qtbot, bridge, engine,
                                                                               sessions_dir):
    # a launch restored all three: their "last used" is now; what tells them apart is when they changed
    for sid, hours in (("aaaaaaaaaaaa", 0.5), ("bbbbbbbbbbbb", 5), ("cccccccccccc", 50)):
        sc = make_session(sessions_dir, sid, title=f"Chat {sid[0]}", age_hours=0)
        changed = time.time() - hours * 3600
        os.utime(sessions_dir / sc.kv_file, (changed, changed))
    tray = TrayController(bridge)
    with qtbot.waitSignal(bridge.sessionsListed):
        bridge.refresh_sessions()
    with qtbot.waitSignal(bridge.eventArrived):
        emit_from_thread(engine, ev.SlotsChanged((SlotView(0, session_id="bbbbbbbbbbbb"),)))
    tray.rebuild_resume_menu()
    texts = [a.text() for a in tray.resume_menu.actions()]
    assert texts[0] == "● Chat b  (in slot 0)"
    assert texts[1].startswith("Chat a  (30 min ago)") and texts[2].startswith("Chat c  (2 days ago)")
    tray.dispose()
    tray.deleteLater()


def test_the_first_run_says_the_demo_once(qtbot):
    from slotkeeper.gui.first_run import FirstRunDialog
    from slotkeeper.gui.jobs import JobRunner

    jobs = JobRunner()
    d = FirstRunDialog(jobs, search_dirs=[])
    qtbot.addWidget(d)
    text = d.demo_note.text().lower()
    assert text.count("starter model") == 1 and "smollm2" in text
    jobs.shutdown()
    jobs.deleteLater()


def test_gauge_and_plot_have_accessible_names(qtbot):
    gauge = SlotGauge(2)
    qtbot.addWidget(gauge)
    gauge.set_view(SlotView(2, n_ctx=4096, n_prompt=1000, cache_n=900, prompt_n=100, n_tokens=1200))
    gauge.set_title("Rivers")
    assert gauge.accessibleName() == "Slot 2"
    assert ("holds “Rivers”" in gauge.accessibleDescription()
            and "90% of 1,000" in gauge.accessibleDescription())
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    assert plot.accessibleDescription() == "No requests recorded yet."
    assert QPointF  # noqa: B018 - imported for the badge geometry above
