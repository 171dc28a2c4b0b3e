"""Light and dark: the system's colour scheme, and the few colours of our own that must read on both.

Qt follows the system's light/dark setting on macOS and Windows 11 and with most Linux platform
themes. Where the platform gives no dark palette of its own (Windows 10's classic style, a bare
X11 session asked for dark), ``apply_color_scheme`` switches to Fusion with a dark palette.
Colours of our own (warnings, errors) are chosen from the palette in use, never fixed: a dark red
on a dark window is unreadable.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

# (on a light window, on a dark window)
_WARNING = ("#b45309", "#fbbf24")
_ERROR = ("#b91c1c", "#f87171")
SCHEME_ENV = "SLOTKEEPER_COLOR_SCHEME"  # "dark" or "light": what the system would say (tests, screenshots)


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether the window background is darker than its text."""
    pal = palette if palette is not None else QGuiApplication.palette()
    return (pal.color(QPalette.ColorRole.Window).lightness()
            < pal.color(QPalette.ColorRole.WindowText).lightness())


def warning_colour(palette: QPalette | None = None) -> QColor:
    return QColor(_WARNING[is_dark(palette)])


def error_colour(palette: QPalette | None = None) -> QColor:
    return QColor(_ERROR[is_dark(palette)])


def warning_style(palette: QPalette | None = None) -> str:
    return f"color: {warning_colour(palette).name()};"


def error_style(palette: QPalette | None = None) -> str:
    return f"color: {error_colour(palette).name()};"


def dark_palette() -> QPalette:
    """A dark Fusion palette for platforms that have none of their own."""
    pal = QPalette()
    window, base, text, disabled = QColor("#202124"), QColor("#16171a"), QColor("#e8eaed"), QColor("#80868b")
    for role, colour in (
        (QPalette.ColorRole.Window, window), (QPalette.ColorRole.WindowText, text),
        (QPalette.ColorRole.Base, base), (QPalette.ColorRole.AlternateBase, QColor("#26272b")),
        (QPalette.ColorRole.Text, text), (QPalette.ColorRole.Button, QColor("#2b2c30")),
        (QPalette.ColorRole.ButtonText, text), (QPalette.ColorRole.ToolTipBase, QColor("#2b2c30")),
        (QPalette.ColorRole.ToolTipText, text), (QPalette.ColorRole.Highlight, QColor("#3b82f6")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")), (QPalette.ColorRole.Link, QColor("#8ab4f8")),
        (QPalette.ColorRole.PlaceholderText, disabled), (QPalette.ColorRole.Mid, QColor("#5f6368")),
        (QPalette.ColorRole.Light, QColor("#3c4043")), (QPalette.ColorRole.Dark, QColor("#0b0c0e")),
        (QPalette.ColorRole.Midlight, QColor("#34353a")), (QPalette.ColorRole.Shadow, QColor("#000000")),
        (QPalette.ColorRole.BrightText, QColor("#ffffff")),
    ):  # fmt: skip
        pal.setColor(role, colour)
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return pal


def wanted_scheme(app) -> Qt.ColorScheme:
    """The system's colour scheme, or the one $SLOTKEEPER_COLOR_SCHEME names."""
    forced = os.environ.get(SCHEME_ENV, "").strip().lower()
    if forced == "dark":
        return Qt.ColorScheme.Dark
    if forced == "light":
        return Qt.ColorScheme.Light
    return app.styleHints().colorScheme()


def apply_color_scheme(app) -> bool:
    """Follow the system (or $SLOTKEEPER_COLOR_SCHEME) into dark mode where Qt's style does not.

    Returns whether a dark palette of ours was installed."""
    if wanted_scheme(app) != Qt.ColorScheme.Dark or is_dark(app.palette()):
        return False
    app.setStyle("Fusion")
    app.setPalette(dark_palette())
    return True


def follow_color_scheme(app) -> None:
    """Apply the scheme now and whenever the system changes it."""
    apply_color_scheme(app)

    def changed(_scheme) -> None:
        if wanted_scheme(app) == Qt.ColorScheme.Dark:
            apply_color_scheme(app)
        elif is_dark(app.palette()):
            app.setPalette(app.style().standardPalette())

    app.styleHints().colorSchemeChanged.connect(changed)
