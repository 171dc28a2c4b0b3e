"""The history plot: axis maths, painting, hover lookup."""

from __future__ import annotations

from PySide6.QtCore import QPointF

from slotkeeper.core.history import RequestRecord
from slotkeeper.gui.history_plot import HistoryPlot, PlotPoint, nice_ceiling, short_count


def records(n: int) -> list[RequestRecord]:
    return [RequestRecord(at=1_700_000_000 + 60 * i, slot=i % 2, n_prompt=1000 + 100 * i,
                          cache_n=(900 + 100 * i) if i % 3 else 0, prompt_n=100 if i % 3 else 1000 + 100 * i,
                          prompt_ms=10.0 * i) for i in range(n)]


def test_axis_helpers():
    assert nice_ceiling(0) == 1.0
    assert nice_ceiling(7) == 10
    assert nice_ceiling(1234) == 2000
    assert nice_ceiling(2100) == 2500
    assert nice_ceiling(4999) == 5000
    assert short_count(2500) == "2.5k"
    assert short_count(2_000_000) == "2M"
    assert short_count(10) == "10"


def test_point_from_record_and_share():
    pt = PlotPoint.from_record(RequestRecord(at=1.0, slot=0, n_prompt=0, cache_n=30, prompt_n=10, prompt_ms=1))
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
