"""The history plot: axis maths, painting, hover lookup."""

from __future__ import annotations

from PySide6.QtCore import QPointF

from slotkeeper.core.history import RequestRecord
from slotkeeper.gui.history_plot import HistoryPlot, PlotPoint, short_count


def records(n: int) -> list[RequestRecord]:
    return [RequestRecord(at=1_700_000_000 + 60 * i, slot=i % 2, n_prompt=1000 + 100 * i,
                          cache_n=(900 + 100 * i) if i % 3 else 0, prompt_n=100 if i % 3 else 1000 + 100 * i,
                          prompt_ms=10.0 * i) for i in range(n)]


def test_axis_helpers():
    assert short_count(2500) == "2.5k"
    assert short_count(2_000_000) == "2M"
    assert short_count(10) == "10"


def test_point_from_record_and_share():
    pt = PlotPoint.from_record(RequestRecord(at=1.0, slot=0, n_prompt=0, cache_n=30, prompt_n=10,
                                             prompt_ms=1))
    assert pt.n_prompt == 40  # derived when the prompt size was not reported
    assert pt.share == 0.75


def test_empty_plot_says_so(qtbot):
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    assert plot.summary() == "No requests recorded yet."
    assert not plot.grab().isNull()


def test_plot_paints_bars_and_finds_them_under_the_mouse(qtbot):
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(640, 300)
    plot.set_records(list(reversed(records(12))))  # sorted by time whatever the input order
    assert plot.points[0].at < plot.points[-1].at
    plot.grab()
    assert len(plot._bars) == 12
    first_rect, first = plot._bars[0]
    assert plot.point_at(first_rect.center()) is first
    assert plot.point_at(QPointF(-5, -5)) is None
    assert "12 requests" in plot.summary()


def test_many_records_show_only_what_fits(qtbot):
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(500, 260)
    plot.set_records(records(1000))
    plot.grab()
    assert 0 < len(plot._bars) < 1000
    assert plot._bars[-1][1].at == plot.points[-1].at  # the newest is always shown


def test_where_the_cache_came_from_and_the_time_it_saved(qtbot):
    from slotkeeper.core.history import RequestRecord

    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.set_records([RequestRecord(1.0, 0, 1000, 900, 100, 50.0, "restored", 1800.0),
                      RequestRecord(2.0, 0, 1100, 1000, 100, 50.0, "slot", 2000.0)])
    assert plot.summary().endswith("; 3.8 s of prefill saved")


def test_token_ticks_are_whole_numbers(qtbot):
    """The token axis had ticks of 62.5 and 2.5 tokens; now 1, 2, 5 x 10^n (25, 250 from 10 up)."""
    from slotkeeper.gui.history_plot import nice_step

    assert [nice_step(v) for v in (0.3, 1, 1.75, 3, 7, 12, 49.75, 62.5, 240, 1234)] == [
        1, 1, 2, 5, 10, 20, 50, 100, 250, 2000]
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(640, 300)
    plot.set_records([RequestRecord(at=1.0, slot=0, n_prompt=7, cache_n=0, prompt_n=7, prompt_ms=1.0)])
    plot.grab()
    assert plot.tick_labels == ["0", "2", "4", "6", "8"]


def test_the_newest_request_and_the_first_after_a_launch_have_time_labels(qtbot):
    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(520, 300)
    t0 = 1_790_000_000.0
    ats = [t0 + 3 * i for i in range(8)] + [t0 + 100, t0 + 103, t0 + 106, t0 + 109]  # relaunched at t0 + 90
    plot.set_records([RequestRecord(at=a, slot=0, n_prompt=100, cache_n=50, prompt_n=50, prompt_ms=1.0)
                      for a in ats])
    plot.set_launches([t0 + 90])
    plot.grab()
    import time as _time

    def label(at):
        return _time.strftime("%H:%M:%S", _time.localtime(at))

    assert label(t0 + 100) in plot.time_labels and label(t0 + 109) in plot.time_labels
    assert plot.time_labels[0] == label(t0)
    assert len(set(plot.time_labels)) == len(plot.time_labels)


def test_a_request_served_by_a_launch_restore_says_so(qtbot):
    """After a relaunch that restored slot 0, its first request found the conversation "already in
    the slot": it was brought back from disk (the tooltip said "already in the slot")."""
    from slotkeeper.core.history import LaunchRecord
    from slotkeeper.gui.history_plot import SOURCES

    plot = HistoryPlot()
    qtbot.addWidget(plot)
    plot.resize(640, 300)
    t0 = 1_790_000_000.0
    plot.set_records([RequestRecord(t0, 0, 100, 0, 100, 5.0, "none"),
                      RequestRecord(t0 + 5, 0, 150, 100, 50, 5.0, "slot"),
                      RequestRecord(t0 + 60, 0, 200, 150, 50, 5.0, "slot"),  # first after the relaunch
                      RequestRecord(t0 + 65, 0, 250, 200, 50, 5.0, "slot")])
    # The same launch as this run saw it (no restores known yet) and as the history file keeps
    # it (slot 0 restored): one launch, its restores merged.
    plot.set_launches([LaunchRecord(t0 - 1), LaunchRecord(t0 + 30), LaunchRecord(t0 + 30, (0,))])
    assert plot.launches == [t0 - 1, t0 + 30]
    assert [p.source for p in plot.points] == ["none", "slot", "launch", "slot"]
    assert SOURCES["launch"] == ", restored from disk when the server was launched"
    plot.grab()
    assert ("restored", 2) in plot.markers and ("launch", 2) in plot.markers
    assert ("restored", 1) not in plot.markers
