"""Platform conventions: the macOS template tray icon, the Windows .ico sizes, dark mode from the
system, and keys for the tabs."""

from __future__ import annotations

import struct
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel

from slotkeeper.gui import icons, theme

ICONS = Path(__file__).resolve().parents[2] / "resources" / "icons"


def test_the_macos_tray_icon_is_a_monochrome_template(qtbot):
    for state in icons.STATES:
        icon = icons.tray_icon(state, platform="darwin")
        assert icon.isMask()
        image = icon.pixmap(36, 36).toImage()
        opaque = [image.pixelColor(x, y) for x in range(36) for y in range(36)
                  if image.pixelColor(x, y).alpha() > 200]
        assert opaque and all(c.red() < 40 and c.green() < 40 and c.blue() < 40 for c in opaque), state
        assert (ICONS / f"tray-{state}Template.png").exists()
        assert (ICONS / f"tray-{state}Template@2x.png").exists()
    assert not icons.tray_icon("ready", platform="linux").isMask()
    # the states differ in shape, not only in colour
    renders = {s: icons.render_svg(icons.template_svg(s), 32) for s in icons.STATES}
    assert len({bytes(img.constBits()) for img in renders.values()}) == len(icons.STATES)


def test_the_windows_ico_holds_every_size():
    data = (ICONS / "slotkeeper.ico").read_bytes()
    _reserved, kind, count = struct.unpack_from("<HHH", data)
    sizes = {(struct.unpack_from("<B", data, 6 + 16 * i)[0] or 256) for i in range(count)}
    assert kind == 1 and {16, 20, 24, 32, 40, 48, 64, 96, 256} <= sizes


def test_dark_mode_follows_the_system_and_our_colours_stay_readable(qtbot, monkeypatch):
    app = QApplication.instance()
    saved_palette, saved_style = app.palette(), app.style().name()
    try:
        monkeypatch.setenv(theme.SCHEME_ENV, "dark")
        assert theme.apply_color_scheme(app)
        assert theme.is_dark(app.palette())
        label = QLabel("warning")
        qtbot.addWidget(label)
        label.setStyleSheet(theme.warning_style())
        window = app.palette().color(QPalette.ColorRole.Window)
        for colour in (theme.warning_colour(), theme.error_colour()):
            assert colour.lightness() - window.lightness() > 100, colour.name()  # light text on a dark window
        monkeypatch.setenv(theme.SCHEME_ENV, "light")
        assert not theme.apply_color_scheme(app)
    finally:
        app.setStyle(saved_style)
        app.setPalette(saved_palette)
    assert not theme.is_dark(QGuiApplication.palette())
    assert theme.error_colour().name() == "#b91c1c"


def test_ctrl_and_a_number_chooses_a_tab(qtbot, bridge):
    from slotkeeper.gui.main_window import MainWindow

    window = MainWindow(bridge)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()
    if not window.isActiveWindow():  # offscreen, another test's window may keep the activation
        QApplication.setActiveWindow(window)
    window.tabs.tabBar().setFocus()
    qtbot.keyClick(window.tabs.tabBar(), Qt.Key.Key_4, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.sessions_page
    qtbot.keyClick(window.tabs.tabBar(), Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.slots_page
    assert window.tabs.tabToolTip(3) == "Ctrl+4"
