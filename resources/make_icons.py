"""Write the icons in resources/icons/ from their sources in slotkeeper.gui.icons.

    QT_QPA_PLATFORM=offscreen PYTHONPATH=app python resources/make_icons.py

Writes the SVGs, PNG renders of the app icon (16-512 px) and of each tray state (16-64 px),
macOS menu-bar template images of each state (``tray-<state>Template.png`` and ``@2x``, black on
transparent), a ``slotkeeper.ico`` holding every size Windows asks for (16-256 px) and
``slotkeeper.icns`` (macOS). Both containers
hold PNG images, which Windows Vista+ and macOS 10.7+ read.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtGui import QGuiApplication, QImage

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "app"))

from slotkeeper.gui import icons  # noqa: E402

OUT = ROOT / "icons"
# Every size Windows asks an .ico for (small icons at 100-250% scale, Explorer views, the taskbar).
ICO_SIZES = (16, 20, 24, 30, 32, 36, 40, 48, 60, 64, 72, 80, 96, 128, 256)
# icns element types holding PNG data, by pixel size
ICNS_TYPES = ((b"icp4", 16), (b"icp5", 32), (b"icp6", 64), (b"ic07", 128), (b"ic08", 256),
              (b"ic09", 512))


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buf, "PNG"):
        raise RuntimeError("PNG encoding failed")
    buf.close()
    return bytes(data.data())


def write_ico(path: Path, svg: str) -> None:
    images = [png_bytes(icons.render_svg(svg, s)) for s in ICO_SIZES]
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = 6 + 16 * len(images)
    entries = b""
    for size, data in zip(ICO_SIZES, images):
        dim = 0 if size >= 256 else size  # 0 means 256 in an ICO directory entry
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(data), offset)
        offset += len(data)
    path.write_bytes(header + entries + b"".join(images))


def write_icns(path: Path, svg: str) -> None:
    body = b""
    for kind, size in ICNS_TYPES:
        data = png_bytes(icons.render_svg(svg, size))
        body += kind + struct.pack(">I", len(data) + 8) + data
    path.write_bytes(b"icns" + struct.pack(">I", len(body) + 8) + body)


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    OUT.mkdir(parents=True, exist_ok=True)
    app_svg = icons.app_svg()
    (OUT / "slotkeeper.svg").write_text(app_svg, encoding="utf-8")
    for size in icons.APP_SIZES:
        icons.render_svg(app_svg, size).save(str(OUT / f"slotkeeper-{size}.png"))
    write_ico(OUT / "slotkeeper.ico", app_svg)
    write_icns(OUT / "slotkeeper.icns", app_svg)
    for state in icons.STATES:
        svg = icons.state_svg(state)
        (OUT / f"tray-{state}.svg").write_text(svg, encoding="utf-8")
        for size in (16, 22, 32, 64):
            icons.render_svg(svg, size).save(str(OUT / f"tray-{state}-{size}.png"))
        # macOS menu-bar template images: black on transparent, 18 pt, with the @2x render.
        template = icons.template_svg(state)
        (OUT / f"tray-{state}Template.svg").write_text(template, encoding="utf-8")
        icons.render_svg(template, 18).save(str(OUT / f"tray-{state}Template.png"))
        icons.render_svg(template, 36).save(str(OUT / f"tray-{state}Template@2x.png"))
    del app
    print(f"wrote {len(list(OUT.iterdir()))} files to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
