"""The app icon and the tray's state icons.

The SVG sources live here, so an installed wheel (which carries no ``resources/`` folder) draws
the same icons as a frozen app; ``resources/make_icons.py`` writes them to ``resources/icons/``
with PNG, ICO and ICNS renders for packaging and the docs.

Tray icons are read at 16-24 px, so each state is first of all a colour (grey stopped, amber
starting, green ready, blue saving/restoring, red error) on one simple shape: a rounded square
holding three "slot" bars. Starting fills the bars partly; error replaces them with "!". In macOS's
menu bar the icon is a monochrome template image instead (``template_svg``), which macOS tints
for a light or dark menu bar, as menu-bar apps there do.
"""

from __future__ import annotations

import sys
from functools import cache, lru_cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QIcon, QImage, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

STATES = ("stopped", "starting", "ready", "busy", "error")
TRAY_SIZES = (16, 20, 22, 24, 32, 40, 48, 64)
APP_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)

# name: (fill, outline)
_COLOURS = {
    "stopped": ("#6b7280", "#374151"),
    "starting": ("#d97706", "#78350f"),
    "ready": ("#16a34a", "#14532d"),
    "busy": ("#2563eb", "#1e3a8a"),
    "error": ("#dc2626", "#7f1d1d"),
}

_BAR_ROWS = (13, 27, 41)  # y of each slot bar in the 64-unit box
_BAR_X, _BAR_W, _BAR_H = 13, 38, 10


def _bars(levels: tuple[float, float, float], faded_opacity: float = 0.35) -> str:
    """Three bars; each level 0..1 is how much of it is filled solid white."""
    out = []
    for y, level in zip(_BAR_ROWS, levels):
        out.append(
            f'<rect x="{_BAR_X}" y="{y}" width="{_BAR_W}" height="{_BAR_H}" rx="3" '
            f'fill="#ffffff" fill-opacity="{faded_opacity}"/>'
        )
        if level > 0:
            w = max(_BAR_H, round(_BAR_W * level))
            out.append(
                f'<rect x="{_BAR_X}" y="{y}" width="{w}" height="{_BAR_H}" rx="3" fill="#ffffff"/>'
            )
    return "\n  ".join(out)


def state_svg(state: str) -> str:
    """The SVG text of one tray state icon (``STATES``)."""
    fill, outline = _COLOURS[state]
    if state == "error":
        inner = (
            '<rect x="27" y="11" width="10" height="29" rx="5" fill="#ffffff"/>\n'
            '  <circle cx="32" cy="50" r="5.5" fill="#ffffff"/>'
        )
    elif state == "stopped":
        inner = _bars((0.0, 0.0, 0.0), faded_opacity=0.75)
    elif state == "starting":
        inner = _bars((1.0, 0.55, 0.0))
    else:  # ready, busy: all slots live; the colour tells them apart
        inner = _bars((1.0, 1.0, 1.0))
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64">\n'
        f'  <rect x="3" y="3" width="58" height="58" rx="13" fill="{fill}" '
        f'stroke="{outline}" stroke-width="2.5"/>\n'
        f"  {inner}\n"
        "</svg>\n"
    )


def app_svg() -> str:
    """The application icon: a dark tile with three slots, kept at different fill levels."""
    bars = []
    for y, level, colour in ((13, 1.0, "#2dd4bf"), (27, 0.72, "#38bdf8"), (41, 0.45, "#a78bfa")):
        bars.append(
            f'<rect x="{_BAR_X}" y="{y}" width="{_BAR_W}" height="{_BAR_H}" rx="3" '
            'fill="#ffffff" fill-opacity="0.14"/>'
        )
        w = round(_BAR_W * level)
        bars.append(f'<rect x="{_BAR_X}" y="{y}" width="{w}" height="{_BAR_H}" rx="3" fill="{colour}"/>')
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="256" height="256" viewBox="0 0 64 64">\n'
        "  <defs>\n"
        '    <linearGradient id="bg" x1="0" y1="0" x2="0" y2="1">\n'
        '      <stop offset="0" stop-color="#1e3a5f"/>\n'
        '      <stop offset="1" stop-color="#0f172a"/>\n'
        "    </linearGradient>\n"
        "  </defs>\n"
        '  <rect x="2" y="2" width="60" height="60" rx="14" fill="url(#bg)" '
        'stroke="#0b1220" stroke-width="1.5"/>\n'
        "  " + "\n  ".join(bars) + "\n"
        "</svg>\n"
    )


def template_svg(state: str) -> str:
    """A state as a macOS menu-bar template image: black on transparent (macOS paints it in the menu
    bar's own colour, light or dark), so the state is told by shape alone: hollow bars stopped, part
    filled starting, full ready, dots on the last bar saving/restoring, "!" an error."""
    box = ('<rect x="4" y="4" width="56" height="56" rx="13" fill="none" stroke="#000000" '
           'stroke-width="5"/>')
    if state == "error":
        inner = ('<rect x="27" y="13" width="10" height="27" rx="5" fill="#000000"/>\n'
                 '  <circle cx="32" cy="49" r="5.5" fill="#000000"/>')
    else:
        levels = {"stopped": (0.0, 0.0, 0.0), "starting": (1.0, 0.55, 0.0),
                  "busy": (1.0, 1.0, 0.0)}.get(state, (1.0, 1.0, 1.0))
        bars = []
        for y, level in zip(_BAR_ROWS, levels):
            bars.append(f'<rect x="{_BAR_X + 1}" y="{y + 1}" width="{_BAR_W - 2}" height="{_BAR_H - 2}" '
                        'rx="3" fill="none" stroke="#000000" stroke-width="2.5"/>')
            if level > 0:
                w = max(_BAR_H, round(_BAR_W * level))
                bars.append(f'<rect x="{_BAR_X}" y="{y}" width="{w}" height="{_BAR_H}" rx="3" '
                            'fill="#000000"/>')
        if state == "busy":  # a file being written: dots along the last bar
            bars = bars[:-1] + [f'<circle cx="{x}" cy="{_BAR_ROWS[2] + _BAR_H / 2}" r="4" fill="#000000"/>'
                                for x in (20, 32, 44)]
        inner = "\n  ".join(bars)
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64">\n'
        f"  {box}\n  {inner}\n</svg>\n"
    )


@cache
def template_icon(state: str) -> QIcon:
    """The monochrome tray icon for macOS's menu bar (a mask: macOS colours it light or dark)."""
    icon = _icon(template_svg(state), (16, 18, 22, 32, 36, 44))
    icon.setIsMask(True)
    return icon


def tray_icon(state: str, platform: str = sys.platform) -> QIcon:
    """The icon the tray shows: a template image in macOS's menu bar, the coloured one elsewhere."""
    return template_icon(state) if platform == "darwin" else state_icon(state)


def render_svg(svg: str, size: int) -> QImage:
    """Render SVG text to a transparent square image of ``size`` px."""
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    if not renderer.isValid():
        raise ValueError("invalid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return image


def _icon(svg: str, sizes: tuple[int, ...]) -> QIcon:
    icon = QIcon()
    for size in sizes:
        icon.addPixmap(QPixmap.fromImage(render_svg(svg, size)))
    return icon


@cache
def state_icon(state: str) -> QIcon:
    """The tray icon for a state name in ``STATES`` (needs a QGuiApplication)."""
    return _icon(state_svg(state), TRAY_SIZES)


@lru_cache(maxsize=1)
def app_icon() -> QIcon:
    return _icon(app_svg(), APP_SIZES)


def icon_state_for(
    server_state: str,
    engine_ready: bool = True,
    activity: str | None = None,
    slot_states: list[str] | None = None,
) -> str:
    """Which of ``STATES`` shows for the server's state and what the engine is doing.

    A server that answers but whose launch work (hashing the model, restores) is still running
    shows as starting: clients would not hit the cache yet.
    """
    if server_state in ("failed", "crashed"):
        return "error"
    if server_state in ("starting", "restarting", "stopping"):
        return "starting"
    if server_state != "ready":
        return "stopped"
    if activity in ("saving", "restoring"):
        return "busy"
    if slot_states and any(s in ("saving", "restoring") for s in slot_states):
        return "busy"
    if not engine_ready or activity == "hashing":
        return "starting"
    return "ready"
