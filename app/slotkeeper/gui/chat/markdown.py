"""A message's text as a document: Markdown (Qt's own reader), code blocks on a tinted background
in a fixed-width font, wrapped rather than cut; and a read-only view exactly as tall as its text."""

from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import (
    QColor,
    QFontDatabase,
    QPalette,
    QTextBlockFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from slotkeeper.gui.theme import is_dark

CODE_PROPERTIES = (QTextFormat.Property.BlockCodeFence, QTextFormat.Property.BlockCodeLanguage)


def code_background(palette: QPalette | None = None) -> QColor:
    """A tint that sets code apart from the text around it, on a light or a dark window."""
    return QColor("#2a2d33") if is_dark(palette) else QColor("#eef0f3")


def is_code_block(fmt: QTextBlockFormat) -> bool:
    return any(fmt.hasProperty(p) for p in CODE_PROPERTIES)


def fill_document(doc: QTextDocument, text: str, palette: QPalette | None = None) -> int:
    """``doc`` holds ``text`` read as Markdown; returns how many lines of code it has."""
    doc.setMarkdown(text, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    code_lines = 0
    background = code_background(palette)
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    cursor = QTextCursor(doc)
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if is_code_block(fmt):
            code_lines += 1
            fmt.setBackground(background)
            fmt.setNonBreakableLines(False)  # wrapped, never cut off at the edge
            fmt.setLeftMargin(6)
            fmt.setRightMargin(6)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
            cursor.setPosition(block.position() + block.length() - 1, QTextCursor.MoveMode.KeepAnchor)
            char = cursor.charFormat()
            char.setFontFamilies([fixed.family()])
            char.setFontFixedPitch(True)
            cursor.mergeCharFormat(char)
        block = block.next()
    return code_lines


class MarkdownView(QTextBrowser):
    """Read-only Markdown, as tall as its text at its width (no scroll bars of its own): selectable,
    links open in the browser."""

    def __init__(self, text: str = "", parent: QWidget | None = None, muted: bool = False) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # Tab goes on to the composer; the mouse still selects
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.viewport().setAutoFillBackground(False)
        self.document().setDocumentMargin(2)
        if muted:
            pal = self.palette()
            pal.setColor(QPalette.ColorRole.Text,
                         pal.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
            self.setPalette(pal)
            f = self.font()
            f.setItalic(True)
            self.setFont(f)
        self.markdown = ""
        self.code_lines = 0
        self._fitted_width = -1
        if text:
            self.set_markdown(text)

    def set_markdown(self, text: str) -> None:
        self.markdown = text
        self.code_lines = fill_document(self.document(), text, self.palette())
        self._fitted_width = -1
        self._fit()

    def height_for(self, width: int) -> int:
        doc = self.document()
        doc.setTextWidth(max(40, width - 2 * self.frameWidth()))
        return math.ceil(doc.size().height()) + 2 * self.frameWidth()

    def fit_width(self, width: int) -> int:
        """Lay the text out for ``width`` now (before the widget is shown at it); its height."""
        height = self.height_for(width)
        self._fitted_width = width
        self.setFixedHeight(height)
        return height

    def _fit(self) -> None:
        width = self.width()
        if width == self._fitted_width:
            return
        self._fitted_width = width
        height = self.height_for(width)
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()
