"""Help ▸ About (the window) and "About Slotkeeper…" (the tray): the version, what Slotkeeper is,
its licence, where its files are, and the README to read in the app."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QTextBrowser, QVBoxLayout, QWidget

from slotkeeper import __version__
from slotkeeper.gui import icons

LICENCE = "MIT"
LICENCE_URL = "https://opensource.org/license/mit"
README_LINK = "readme"  # the About text's link that opens the README in the app
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")  # screenshots: not shipped with the app


@functools.cache  # read once per process, whichever About dialog asks
def readme_text() -> str | None:
    """The README: the source tree's when running from it, else the one the package was installed
    with (its metadata); None when neither is there (a bundle without the package's metadata)."""
    source = Path(__file__).resolve().parents[3] / "README.md"
    try:
        if (source.parent / "pyproject.toml").is_file():
            return source.read_text(encoding="utf-8")
    except OSError:
        pass
    try:
        from email.message import Message
        from importlib.metadata import PackageNotFoundError, metadata

        meta = metadata("slotkeeper")
        # The long description (README.md) is the body of the metadata, an email message at run
        # time; the PackageMetadata protocol it is typed as does not show it.
        text = meta.get_payload() if isinstance(meta, Message) else None
    except (PackageNotFoundError, OSError):
        return None
    return text if isinstance(text, str) and text.strip() else None


def about_html(data_dir: Path | None = None, readme: bool = True) -> str:
    parts = [
        f"<h3>Slotkeeper {__version__}</h3>",
        "<p>Keeps a local LLM's memory warm: runs llama.cpp's llama-server, saves each conversation's "
        "KV cache when a reply ends and brings it back after a restart, so a long conversation goes on "
        "without reading its prompt again.</p>",
    ]
    if readme:
        parts.append(f'<p><a href="{README_LINK}">Read me</a>: how it works, the settings, the command '
                     "line, what was measured.</p>")
    parts.append(f'<p>Licence: {LICENCE} (<a href="{LICENCE_URL}">the licence text</a>).</p>')
    if data_dir is not None:
        parts.append(f"<p>Data folder: {data_dir}</p>")
    return "".join(parts)


class ReadmeDialog(QDialog):
    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Slotkeeper: read me")
        self.setWindowIcon(icons.app_icon())
        self.browser = QTextBrowser(self)
        self.browser.setOpenExternalLinks(True)
        self.browser.setMarkdown(_IMAGE.sub("", text))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser, 1)
        layout.addWidget(buttons)
        self.resize(820, 640)


class AboutDialog(QDialog):
    """Slotkeeper's version and licence; "Read me" opens the README in the app."""

    def __init__(self, parent: QWidget | None = None, data_dir: Path | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Slotkeeper")
        self.setWindowIcon(icons.app_icon())
        self.readme: ReadmeDialog | None = None
        self._readme_text = readme_text()
        self.label = QLabel(about_html(data_dir, readme=self._readme_text is not None), self)
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.label.linkActivated.connect(self._link)
        icon = QLabel(self)
        icon.setPixmap(icons.app_icon().pixmap(64, 64))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(icon, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addWidget(self.label)
        layout.addWidget(buttons)
        self.setMinimumWidth(440)

    def _link(self, href: str) -> None:
        if href == README_LINK:
            self.open_readme()
        else:
            from slotkeeper.gui.desktop import open_url

            open_url(href)

    def open_readme(self) -> None:
        if self._readme_text is None:
            return
        if self.readme is None:
            self.readme = ReadmeDialog(self._readme_text, self)
        self.readme.show()
        self.readme.raise_()
