"""packaging/bundle_helpers.py on the file names of all three platforms, and the spec's inputs.

The spec only runs for real on the build machine; these checks cover what the macOS and
Windows builds (release workflow) would do with their own Qt file names.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
sys.path.insert(0, str(PACKAGING))

import bundle_helpers as bh  # noqa: E402

KEEP = [
    # Linux
    "PySide6/Qt/lib/libQt6Core.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Widgets.so.6",
    "PySide6/Qt/lib/libQt6Svg.so.6", "PySide6/Qt/lib/libQt6DBus.so.6", "PySide6/Qt/lib/libQt6Network.so.6",
    "PySide6/Qt/lib/libQt6XcbQpa.so.6", "PySide6/Qt/lib/libQt6WaylandClient.so.6",
    "PySide6/Qt/lib/libicudata.so.73",
    "PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/plugins/platforms/libqoffscreen.so",
    "PySide6/Qt/plugins/platforms/libqminimal.so", "PySide6/Qt/plugins/platforms/libqwayland.so",
    "PySide6/Qt/plugins/imageformats/libqsvg.so", "PySide6/Qt/plugins/imageformats/libqico.so",
    "PySide6/Qt/plugins/iconengines/libqsvgicon.so",
    "PySide6/Qt/plugins/platformthemes/libqxdgdesktopportal.so",
    "PySide6/Qt/plugins/platforminputcontexts/libcomposeplatforminputcontextplugin.so",
    "PySide6/Qt/plugins/xcbglintegrations/libqxcb-glx-integration.so",
    "PySide6/Qt/plugins/wayland-shell-integration/libxdg-shell.so",
    "PySide6/Qt/plugins/wayland-graphics-integration-client/libqt-plugin-wayland-egl.so",
    "PySide6/Qt/plugins/tls/libqopensslbackend.so",
    "PySide6/QtCore.abi3.so", "PySide6/QtWidgets.abi3.so", "PySide6/QtSvg.abi3.so",
    "PySide6/QtNetwork.abi3.so", "PySide6/QtDBus.abi3.so", "PySide6/libpyside6.abi3.so.6.12",
    "shiboken6/Shiboken.abi3.so", "libQt6Core.so.6", "numpy/_core/_multiarray_umath.so",
    # Windows
    "PySide6/Qt6Core.dll", "PySide6/Qt6Gui.dll", "PySide6/Qt6Widgets.dll", "PySide6/Qt6Svg.dll",
    "PySide6/QtWidgets.pyd", "PySide6/plugins/platforms/qwindows.dll",
    "PySide6/plugins/platforms/qoffscreen.dll", "PySide6/plugins/styles/qmodernwindowsstyle.dll",
    "PySide6/plugins/imageformats/qsvg.dll", "PySide6/plugins/imageformats/qico.dll",
    "PySide6/plugins/iconengines/qsvgicon.dll", "PySide6/plugins/tls/qschannelbackend.dll",
    # macOS
    "PySide6/Qt/lib/QtCore.framework/Versions/A/QtCore",
    "PySide6/Qt/lib/QtWidgets.framework/Versions/A/Resources/Info.plist",
    "PySide6/Qt/plugins/platforms/libqcocoa.dylib", "PySide6/Qt/plugins/styles/libqmacstyle.dylib",
    "PySide6/Qt/plugins/imageformats/libqsvg.dylib",
]

DROP = [
    # Linux
    "PySide6/Qt/lib/libQt6Quick.so.6", "PySide6/Qt/lib/libQt6Qml.so.6", "PySide6/Qt/lib/libQt6QmlModels.so.6",
    "PySide6/Qt/lib/libQt6Pdf.so.6", "PySide6/Qt/lib/libQt6WebEngineCore.so.6",
    "PySide6/Qt/lib/libQt6Multimedia.so.6", "PySide6/Qt/lib/libQt63DCore.so.6",
    "PySide6/Qt/lib/libQt6Charts.so.6", "PySide6/Qt/lib/libQt6EglFSDeviceIntegration.so.6",
    "PySide6/Qt/lib/libQt6WlShellIntegration.so.6", "PySide6/Qt/lib/libQt6VirtualKeyboard.so.6",
    "PySide6/Qt/plugins/platformthemes/libqgtk3.so", "PySide6/Qt/plugins/platforms/libqeglfs.so",
    "PySide6/Qt/plugins/platforms/libqlinuxfb.so", "PySide6/Qt/plugins/platforms/libqvnc.so",
    "PySide6/Qt/plugins/platforms/libqminimalegl.so", "PySide6/Qt/plugins/platforms/libqvkkhrdisplay.so",
    "PySide6/Qt/plugins/imageformats/libqjpeg.so", "PySide6/Qt/plugins/imageformats/libqwebp.so",
    "PySide6/Qt/plugins/imageformats/libqtiff.so", "PySide6/Qt/plugins/imageformats/libqicns.so",
    "PySide6/Qt/plugins/egldeviceintegrations/libqeglfs-x11-integration.so",
    "PySide6/Qt/plugins/generic/libqevdevmouseplugin.so", "PySide6/Qt/plugins/qmltooling/libqmldbg_tcp.so",
    "PySide6/Qt/plugins/networkinformation/libqnetworkmanager.so",
    "PySide6/Qt/plugins/wayland-shell-integration/libivi-shell.so",
    "PySide6/Qt/plugins/wayland-graphics-integration-client/libdmabuf-server.so",
    "PySide6/Qt/qml/QtQuick/Controls/libqtquickcontrols2plugin.so",
    "PySide6/Qt/translations/qt_de.qm", "PySide6/Qt/translations/qtbase_de.qm",
    "PySide6/Qt/libexec/QtWebEngineProcess", "PySide6/QtQml.abi3.so", "PySide6/QtQuick.abi3.so",
    # Windows
    "PySide6/Qt6Quick.dll", "PySide6/Qt6Pdf.dll", "PySide6/QtQml.pyd", "PySide6/opengl32sw.dll",
    "PySide6/plugins/imageformats/qjpeg.dll", "PySide6/plugins/generic/qtuiotouchplugin.dll",
    "PySide6/translations/qtbase_fr.qm",
    # macOS
    "PySide6/Qt/lib/QtQuick.framework/Versions/A/QtQuick", "PySide6/Qt/lib/QtQml.framework/Resources",
    "PySide6/Qt/plugins/imageformats/libqmacheif.dylib",
    "PySide6/Qt/plugins/permissions/libqdarwincamerapermission.dylib",
]


@pytest.mark.parametrize("dest", KEEP)
def test_keeps_what_the_app_uses(dest):
    assert not bh.drop_qt(dest)
    assert not bh.drop_qt(dest.replace("/", "\\"))  # Windows TOC names


@pytest.mark.parametrize("dest", DROP)
def test_drops_unused_qt(dest):
    assert bh.drop_qt(dest)


def test_dangling_symlinks_go():
    toc = [("a/libx.so.1", "libx.so.1.2", "SYMLINK"), ("a/liby.so.1", "liby.so.1.0", "SYMLINK"),
           ("lib/Q.framework/Q", "Versions/Current/Q", "SYMLINK"), ("a/libx.so.1.2", "/src/x", "BINARY")]
    present = {"a", "a/libx.so.1.2", "lib", "lib/Q.framework", "lib/Q.framework/Versions/Current/Q"}
    kept = bh.drop_dangling_symlinks(toc, present)
    assert [d for d, _s, _t in kept] == ["a/libx.so.1", "lib/Q.framework/Q", "a/libx.so.1.2"]


def test_version_from_the_package():
    from slotkeeper import __version__

    assert bh.read_version(ROOT / "app" / "slotkeeper" / "__init__.py") == __version__
    assert bh.version_tuple("0.1.0") == (0, 1, 0, 0)
    assert bh.version_tuple("1.2.3rc4") == (1, 2, 3, 4)


def test_windows_version_resource_renders():
    """packaging/version_info.txt is eval()'d by PyInstaller on Windows: check it would load."""
    text = bh.render_version_info((PACKAGING / "version_info.txt").read_text(encoding="utf-8"), "1.2.3")
    assert "@" not in text.replace("# UTF-8", "")

    def record(kind):
        return lambda *args, **kwargs: (kind, args, kwargs)

    names = ["VSVersionInfo", "FixedFileInfo", "StringFileInfo", "StringTable", "StringStruct",
             "VarFileInfo", "VarStruct"]
    info = eval(text, {"__builtins__": {}}, {n: record(n) for n in names})
    assert info[0] == "VSVersionInfo"
    ffi = info[2]["ffi"]
    assert ffi[2]["filevers"] == (1, 2, 3, 0) and ffi[2]["prodvers"] == (1, 2, 3, 0)
    strings = {s[1][0]: s[1][1] for s in info[2]["kids"][0][1][0][0][1][1]}
    assert strings["ProductVersion"] == "1.2.3" and strings["FileVersion"] == "1.2.3"
    assert strings["OriginalFilename"] == "slotkeeper.exe"


def test_platform_icons_exist_and_are_well_formed():
    icons = ROOT / "resources" / "icons"
    ico = (icons / "slotkeeper.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    assert (reserved, kind) == (0, 1) and count >= 4
    sizes = {ico[6 + 16 * i] or 256 for i in range(count)}
    assert {16, 32, 48, 256} <= sizes
    icns = (icons / "slotkeeper.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)


def test_spec_and_entry_point_compile():
    compile((PACKAGING / "slotkeeper.spec").read_text(encoding="utf-8"), "slotkeeper.spec", "exec")
    entry = (PACKAGING / "entry.py").read_text(encoding="utf-8")
    compile(entry, "entry.py", "exec")
    assert "from slotkeeper.__main__ import main" in entry  # the head start, then the command line
