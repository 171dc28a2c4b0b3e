"""The conversation on screen, drawn lazily.

A transcript can hold thousands of messages; drawing each as Markdown would take seconds. The
view draws the last messages, as many as fill the window plus a screen's margin, and draws
earlier ones a batch at a time as the reader scrolls up (the part on screen stays where it is).
A message is a role line (with Copy, and Edit on the last thing the user said), its reasoning in
muted italics, its text as Markdown (code blocks tinted, in a fixed-width font), and under a reply
made here, how much of the prompt came from the cache and the time to its first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core.sessions.transcripts import Message
from slotkeeper.gui.chat.markdown import MarkdownView
from slotkeeper.gui.theme import is_dark

FIRST_BATCH_MIN = 6  # drawn at once even before the view knows its size
BATCH = 20  # earlier messages drawn per step when scrolling up
FILL_DELAY_MS = 15  # more is drawn after the screen as it is has been painted
MARGIN_SCREENS = 0.5  # drawn beyond the screen, above it (in screens)

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System prompt", "developer": "Developer",
              "tool": "Tool result", "function": "Function result"}


@dataclass
class Entry:
    """One message as the view shows it."""

    message: Message
    figures: str = ""  # under a reply made in this window: "4,210 of 4,230 tokens from cache · ..."
    label: str = ""  # the heading, when not the role's name ("Prompt", "Completion")
    note: str = ""  # muted words under it ("stopped", "the connection dropped")
    extra: dict = field(default_factory=dict)


def heading(entry: Entry) -> str:
    m = entry.message
    name = entry.label or ROLE_NAMES.get(m.role, m.role.capitalize())
    if m.name:
        name += f" ({m.name})"
    return name


def muted_colour(palette: QPalette) -> QColor:
    """Text that stays readable but steps back (between the text colour and the background)."""
    text, base = palette.color(QPalette.ColorRole.WindowText), palette.color(QPalette.ColorRole.Window)
    mix = 0.62
    return QColor(round(text.red() * mix + base.red() * (1 - mix)),
                  round(text.green() * mix + base.green() * (1 - mix)),
                  round(text.blue() * mix + base.blue() * (1 - mix)))


def bubble_kind(role: str) -> str:
    if role in ("user", "system", "developer", "tool", "function"):
        return {"developer": "system", "function": "tool"}.get(role, role)
    return "assistant"


def view_style(palette: QPalette) -> str:
    """One style sheet for every message (set on the view, so a message costs no style sheet of its own)."""
    dark = is_dark(palette)
    base = palette.color(QPalette.ColorRole.Base).name()
    colours = {
        "user": ("#1f3347", "#2f4f6f") if dark else ("#e8f0fb", "#c9d9ef"),
        "system": ("#2b2a22", "#4a4632") if dark else ("#fbf8ea", "#e6dfb8"),
        "tool": ("#23282b", "#3a4247") if dark else ("#f3f5f6", "#d9dee2"),
        "assistant": (base, "#3a3b40" if dark else "#dfe2e6"),
    }
    out = [f"QFrame#message-{k} {{ background: {bg}; border: 1px solid {border}; border-radius: 8px; }}"
           for k, (bg, border) in colours.items()]
    out.append("QToolButton#message-button { border: none; padding: 1px 6px; background: transparent; }")
    out.append("QTextBrowser#message-text { background: transparent; border: none; }")
    return "\n".join(out)


class MessageWidget(QFrame):
    copyClicked = Signal()
    editClicked = Signal()

    def __init__(self, entry: Entry, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"message-{bubble_kind(entry.message.role)}")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        layout.setSpacing(2)
        self._layout = layout
        top = QHBoxLayout()
        top.setSpacing(4)
        self.role_label = QLabel()
        f = self.role_label.font()
        f.setBold(True)
        self.role_label.setFont(f)
        top.addWidget(self.role_label)
        top.addStretch(1)
        self._top = top
        self.edit_button: QToolButton | None = None  # made for the message that can be edited
        self.copy_button = self._tool_button("Copy", "Copy this message's text (Markdown)")
        self.copy_button.clicked.connect(self.copyClicked)
        top.addWidget(self.copy_button)
        layout.addLayout(top)
        self.reasoning: MarkdownView | None = None  # made when a message has reasoning
        self.body = MarkdownView("")
        self.body.setObjectName("message-text")
        layout.addWidget(self.body)
        self.footer: QLabel | None = None  # made when there is something to say under it
        self.entry = entry
        self.set_entry(entry)

    def _tool_button(self, text: str, tip: str) -> QToolButton:
        b = QToolButton()
        b.setObjectName("message-button")
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        return b

    def set_editable(self, on: bool) -> None:
        if on and self.edit_button is None:
            self.edit_button = self._tool_button("Edit", "Change this message and send it again (the saved "
                                                 "conversation keeps both versions as branches)")
            self.edit_button.clicked.connect(self.editClicked)
            self._top.insertWidget(self._top.count() - 1, self.edit_button)
        if self.edit_button is not None:
            self.edit_button.setVisible(on)

    def set_entry(self, entry: Entry) -> None:
        self.entry = entry
        m = entry.message
        self.role_label.setText(heading(entry))
        if m.reasoning and self.reasoning is None:
            self.reasoning = MarkdownView("", muted=True)
            self.reasoning.setObjectName("message-text")
            self.reasoning.setAccessibleName("Reasoning")
            self._layout.insertWidget(1, self.reasoning)
        if self.reasoning is not None:
            if self.reasoning.markdown != m.reasoning:
                self.reasoning.set_markdown(m.reasoning)
            self.reasoning.setVisible(bool(m.reasoning))
        text = m.to_markdown()
        if self.body.markdown != text:
            self.body.set_markdown(text)
        self.body.setVisible(bool(text) or not m.reasoning)
        footer = " · ".join(p for p in (entry.figures, entry.note) if p)
        if footer and self.footer is None:
            self.footer = QLabel()
            self.footer.setObjectName("message-footer")
            self.footer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            pal = self.footer.palette()
            pal.setColor(QPalette.ColorRole.WindowText, muted_colour(pal))
            self.footer.setPalette(pal)
            small = self.footer.font()
            small.setPointSizeF(max(6.0, small.pointSizeF() * 0.9))
            self.footer.setFont(small)
            self._layout.addWidget(self.footer)
        if self.footer is not None:
            self.footer.setText(footer)
            self.footer.setVisible(bool(footer))
        self.setAccessibleName(f"{heading(entry)}: {m.content[:200]}")

    def estimate_height(self, width: int) -> int:
        """Its height at ``width``; its text is laid out for that width already."""
        inner = max(60, width - 22)
        h = 6 + 8 + self.role_label.sizeHint().height() + 4
        if not self.body.isHidden():
            h += self.body.fit_width(inner)
        if self.reasoning is not None and self.entry.message.reasoning:
            h += self.reasoning.fit_width(inner) + 2
        if self.footer is not None and self.footer.text():
            h += self.footer.sizeHint().height() + 2
        return h


class MessageView(QScrollArea):
    """The messages of one conversation, the last ones drawn first."""

    copyRequested = Signal(int)  # index of the message
    editRequested = Signal(int)
    moreLoaded = Signal(int)  # how many are drawn now (after drawing earlier messages)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setAccessibleName("Messages")
        self._inner = QWidget()
        self._inner.setObjectName("messages")
        self._inner.setStyleSheet(view_style(self.palette()))
        self._layout = QVBoxLayout(self._inner)
        self._layout.setContentsMargins(12, 10, 12, 10)
        self._layout.setSpacing(8)
        self._more = QLabel()
        self._more.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._more.hide()
        self._layout.addWidget(self._more)
        self._layout.addStretch(1)
        self.setWidget(self._inner)
        self.entries: list[Entry] = []
        self.widgets: list[MessageWidget] = []  # for entries[first:]
        self.first = 0
        self.editable = -1  # the message with an Edit button (-1: none)
        self._stick = True  # follow the bottom (a new message, a reply streaming in)
        self._keep_bottom_distance = False  # earlier messages were drawn above: hold what is on screen
        self._bottom_distance = 0
        self._adjusting = False
        self._fill_timer = QTimer(self)
        self._fill_timer.setSingleShot(True)
        self._fill_timer.setInterval(FILL_DELAY_MS)
        self._fill_timer.timeout.connect(self._fill)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range)
        bar.valueChanged.connect(self._on_value)

    # -- content --------------------------------------------------------------------------
    def set_entries(self, entries: list[Entry]) -> None:
        """Show these messages (the last ones drawn now, earlier ones as the reader scrolls up)."""
        for w in self.widgets:
            w.hide()
            w.deleteLater()
        self.widgets = []
        self.entries = list(entries)
        self.first = len(self.entries)
        self._stick = True
        self._keep_bottom_distance = False
        self._draw_last()
        self._update_more()

    def append(self, entry: Entry) -> None:
        self.entries.append(entry)
        self._keep_bottom_distance = False
        self._stick = True  # a message of ours, or a reply starting: show it
        w = self._make(len(self.entries) - 1)
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.widgets.append(w)

    def update_last(self, entry: Entry) -> None:
        """The last message changed (a reply streaming in)."""
        if not self.entries:
            return
        self.entries[-1] = entry
        self._keep_bottom_distance = False
        if self.widgets and len(self.widgets) + self.first == len(self.entries):
            self.widgets[-1].set_entry(entry)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` messages (Regenerate, an edit)."""
        n = max(0, n)
        while len(self.entries) > n:
            self.entries.pop()
            if self.widgets and self.first + len(self.widgets) > len(self.entries):
                w = self.widgets.pop()
                w.hide()
                w.deleteLater()
        self.first = min(self.first, len(self.entries))
        self._keep_bottom_distance = False

    def set_editable(self, index: int) -> None:
        """Offer Edit on the message at ``index`` (-1: on none)."""
        self.editable = index
        for i, w in enumerate(self.widgets, start=self.first):
            w.set_editable(i == index)

    @property
    def rendered(self) -> int:
        return len(self.widgets)

    def copy_message(self, index: int) -> None:
        QGuiApplication.clipboard().setText(self.entries[index].message.to_markdown())
        self.copyRequested.emit(index)

    # -- drawing --------------------------------------------------------------------------
    def _make(self, index: int) -> MessageWidget:
        w = MessageWidget(self.entries[index])
        w.copyClicked.connect(lambda i=index: self.copy_message(i))
        w.editClicked.connect(lambda i=index: self.editRequested.emit(i))
        if index == self.editable:
            w.set_editable(True)
        return w

    def _content_width(self) -> int:
        m = self._layout.contentsMargins()
        return max(200, self.viewport().width() - m.left() - m.right())

    def _draw_last(self) -> None:
        """The last messages: enough to fill the screen and a margin above it."""
        width = self._content_width()
        want = self.viewport().height() * (1 + MARGIN_SCREENS) if self.isVisible() else 0
        total = 0
        made: list[MessageWidget] = []
        i = len(self.entries) - 1
        while i >= 0 and (len(made) < FIRST_BATCH_MIN or total < want):
            w = self._make(i)
            total += w.estimate_height(width) + self._layout.spacing()
            made.append(w)
            i -= 1
        for w in made:  # nearest the top first
            self._layout.insertWidget(1, w)
        made.reverse()
        self.widgets = made + self.widgets
        self.first = i + 1

    def draw_earlier(self, n: int = BATCH) -> int:
        """Draw up to ``n`` earlier messages above the ones drawn; returns how many."""
        if self.first == 0:
            return 0
        if not self._stick:  # hold what is on screen while the content grows above it
            bar = self.verticalScrollBar()
            self._keep_bottom_distance = True
            self._bottom_distance = bar.maximum() - bar.value()
        start = max(0, self.first - n)
        width = self._content_width()
        made = [self._make(i) for i in range(start, self.first)]
        for w in made:
            w.estimate_height(width)
        for k, w in enumerate(made):
            self._layout.insertWidget(1 + k, w)
        self.widgets = made + self.widgets
        count = self.first - start
        self.first = start
        self._update_more()
        self.moreLoaded.emit(len(self.widgets))
        return count

    def _update_more(self) -> None:
        if self.first:
            self._more.setText(f"{self.first:,} earlier message{'s' if self.first != 1 else ''} above: "
                               "scroll up to read them")
        self._more.setVisible(bool(self.first))

    def _need_more(self) -> bool:
        if not self.first:
            return False
        bar = self.verticalScrollBar()
        margin = self.viewport().height() * MARGIN_SCREENS
        return bar.maximum() < margin or bar.value() < margin

    # -- scrolling ------------------------------------------------------------------------
    def _on_range(self, _minimum: int, maximum: int) -> None:
        bar = self.verticalScrollBar()
        self._adjusting = True
        try:
            if self._stick:
                bar.setValue(maximum)
            elif self._keep_bottom_distance:
                bar.setValue(max(0, maximum - self._bottom_distance))
        finally:
            self._adjusting = False
        if self._need_more():
            self._fill_soon()

    def _fill_soon(self) -> None:
        """Draw more once the screen as it is now has been painted."""
        if not self._fill_timer.isActive():
            self._fill_timer.start()

    def _on_value(self, value: int) -> None:
        if self._adjusting:
            return
        bar = self.verticalScrollBar()
        self._stick = value >= bar.maximum() - 4
        self._bottom_distance = bar.maximum() - value
        if self._need_more() and not self._stick:
            self.draw_earlier()

    def scroll_to_bottom(self) -> None:
        self._stick = True
        self._keep_bottom_distance = False
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._fill_soon()  # once laid out: enough drawn to fill the screen?

    def _fill(self) -> None:
        if self.isVisible() and self._need_more():
            self.draw_earlier()
