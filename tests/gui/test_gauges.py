"""The slot gauge: figures in words, painting, warning badge, panel rows."""

from __future__ import annotations

from PySide6.QtCore import QPointF

from slotkeeper.core.views import SlotView
from slotkeeper.gui.gauges import GaugeFigures, SlotGauge, SlotsPanel


def test_figures_of_a_finished_request():
    f = GaugeFigures.from_view(SlotView(0, n_ctx=8192, n_prompt=5012, cache_n=4812, prompt_n=200,
                                        n_tokens=5100))
    assert not f.prefilling
    assert f.prompt_text() == "96% of 5,012 prompt tokens from cache (4,812 cached, 200 processed)"
    assert f.held_text() == "5,100 of 8,192 tokens held (62%)"
    assert abs(f.cache_share + f.processed_share - 1.0) < 1e-9


def test_figures_during_a_long_prefill():
    f = GaugeFigures.from_view(SlotView(1, n_ctx=32768, state="busy", n_prompt=20000, cache_n=3000,
                                        prompt_n=5000, running=True))
    assert f.prefilling
    assert f.prompt_text() == "reading prompt: 8,000 of 20,000 tokens (3,000 from cache)"
    assert 0.39 < f.cache_share + f.processed_share < 0.41


def test_figures_before_any_request():
    f = GaugeFigures.from_view(SlotView(0))
    assert f.prompt_text() == "no request yet"
    assert f.held_text() == "0 tokens held"
    assert f.cache_share == 0.0


def test_gauge_paints_and_explains_its_warning(qtbot):
    gauge = SlotGauge(0)
    qtbot.addWidget(gauge)
    gauge.resize(700, gauge.sizeHint().height())
    gauge.set_view(SlotView(0, n_ctx=4096, n_prompt=1000, cache_n=0, prompt_n=1000, n_tokens=1010,
                            warning="sliding-window model without --swa-full"))
    gauge.set_title("Rust borrow checker")
    image = gauge.grab().toImage()
    assert not image.isNull()
    assert gauge._badge.width() > 0  # painted at the right-hand end
    assert gauge._badge.right() <= gauge.width()
    assert "warning: sliding-window" in gauge.summary()
    assert "Slot 0: idle" in gauge.accessibleDescription()


def test_gauge_repaints_only_on_change(qtbot):
    gauge = SlotGauge(0)
    qtbot.addWidget(gauge)
    view = SlotView(0, n_ctx=4096, n_prompt=10, cache_n=5, prompt_n=5)
    gauge.set_view(view)
    before = gauge.figures
    gauge.set_view(SlotView(0, n_ctx=4096, n_prompt=10, cache_n=5, prompt_n=5))
    assert gauge.figures is before


def test_panel_follows_the_slot_count(qtbot):
    panel = SlotsPanel()
    qtbot.addWidget(panel)
    panel.show()
    assert panel.empty_label.isVisible()
    panel.set_titles({"s1": "First chat"})
    panel.set_views([SlotView(0, session_id="s1"), SlotView(1), SlotView(2)])
    assert [g.slot for g in panel.gauges] == [0, 1, 2]
    assert panel.gauges[0].title == "First chat"
    assert not panel.empty_label.isVisible()
    panel.set_views([SlotView(0)])
    assert len(panel.gauges) == 1
    assert panel.gauges[0].title == ""
    panel.set_views([])
    assert panel.gauges == [] and panel.empty_label.isVisible()


def test_tooltip_explains_the_warning_on_the_badge_and_sums_up_elsewhere(qtbot, monkeypatch):
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QHelpEvent

    from slotkeeper.gui import gauges

    shown: list[tuple[str, object]] = []

    class FakeToolTip:  # records what the user would see instead of opening a popup
        @staticmethod
        def showText(pos, text, widget=None, *args):  # noqa: N802 - Qt's name
            shown.append((text, widget))

    monkeypatch.setattr(gauges, "QToolTip", FakeToolTip)
    warning = "sliding-window model without --swa-full"
    gauge = SlotGauge(0)
    qtbot.addWidget(gauge)
    gauge.resize(600, 80)
    gauge.set_view(SlotView(0, n_ctx=4096, n_prompt=1000, cache_n=0, prompt_n=1000, n_tokens=1010,
                            warning=warning))
    gauge.grab()  # paints, which places the warning badge
    assert not gauge._badge.isEmpty()

    def hover(pos: QPointF) -> str:
        shown.clear()
        point = pos.toPoint()
        gauge.event(QHelpEvent(QEvent.Type.ToolTip, point, gauge.mapToGlobal(point)))
        assert len(shown) == 1 and shown[0][1] is gauge
        return shown[0][0]

    assert hover(gauge._badge.center()) == f"The last restore into this slot was not reused:\n{warning}"
    assert hover(QPointF(5, 5)).splitlines() == [
        "Slot 0: idle",
        "holds a conversation not saved yet",
        "0% of 1,000 prompt tokens from cache (0 cached, 1,000 processed)",
        "1,010 of 4,096 tokens held (25%)",
        f"warning: {warning}",
    ]
