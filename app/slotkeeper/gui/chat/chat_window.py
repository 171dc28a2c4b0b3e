"""The chat window: a saved conversation opened, read and continued, or a new one.

What it shows comes from the conversation's transcript (``Transcript``), read by a job through
the bridge (``load_conversation``). Sending goes through the front door like any client's
request (``ChatStream``: the transcript's messages and options, the new message, streamed), so the
engine routes it to the slot holding the conversation or restores it from disk first; nothing
here touches a slot or a file. Regenerate sends again without the last reply; an edited last
message is sent in place of the old one (the front door saves that as a branch by itself).

A conversation another client made through /completion is plain text (a prompt and what
followed): it is shown and can be exported, not continued here. One saved by an older Slotkeeper
has no transcript: the window says so plainly, with the title and preview it was saved with.
"""

from __future__ import annotations

import html
import logging
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtNetwork import QNetworkAccessManager
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from slotkeeper.core import events as ev
from slotkeeper.core.sessions import transcripts
from slotkeeper.core.sessions.compat import model_file_name
from slotkeeper.core.sessions.entries import SessionEntry
from slotkeeper.core.sessions.transcripts import CHAT, TEXT, Message, Transcript
from slotkeeper.core.views import STOPPED_STATES, ServerState
from slotkeeper.gui import icons
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.chat.composer import Composer
from slotkeeper.gui.chat.message_view import Entry, MessageView
from slotkeeper.gui.chat.stream import ChatStream, ReplyFigures, StreamResult, chat_body
from slotkeeper.gui.jobs import describe_error
from slotkeeper.gui.theme import error_style, warning_style
from slotkeeper.gui.widgets import WrappedLabel

log = logging.getLogger(__name__)

REDRAW_MS = 50  # a streaming reply is redrawn at most this often
WAITING = "waiting for the first token…"
NO_TRANSCRIPT = ("This conversation was saved without a transcript (by an older Slotkeeper, or by a client "
                 "whose requests are not read as a conversation). Its title and preview are below; without "
                 "its messages there is nothing to send, so it cannot be continued here. Continue it from "
                 "the client that made it, or start a new chat.")
TEXT_ONLY = ("A plain-text completion ({source}): shown as its prompt and what followed. It can be read and "
             "exported here; continue it from the client that made it.")


def safe_file_name(title: str, suffix: str) -> str:
    keep = "".join(c if c.isalnum() or c in " -_" else " " for c in title).split()
    return ("-".join(keep)[:60] or "conversation") + suffix


class ChatWindow(QMainWindow):
    """One conversation. ``open_session(id)`` reads a saved one; ``show_transcript`` shows one
    given; a window made without either is a new chat."""

    switchRequested = Signal(str)  # the model the conversation was made with: switch to it
    newChatRequested = Signal()
    closed = Signal()
    transcriptShown = Signal()  # the conversation (or why there is none) is on screen
    replyFinished = Signal(object)  # StreamResult
    errorShown = Signal(str)
    exported = Signal(str)  # the file written

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setWindowIcon(icons.app_icon())
        self.resize(820, 760)
        self.session_id: str | None = None
        self.entry: SessionEntry | None = None
        self.transcript: Transcript | None = Transcript(CHAT)
        self.title = ""
        self.stream: ChatStream | None = None
        self.last_result: StreamResult | None = None
        self._waiting_key = False
        self._cancelled = False
        self._editing: int | None = None
        self._reply = Message("assistant")
        self._sent_at = 0.0
        self._nam = QNetworkAccessManager(self)
        self._redraw = QTimer(self)
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(REDRAW_MS)
        self._redraw.timeout.connect(self._draw_reply)
        self._build()
        self._build_menus()

        for event_type in (ev.ServerStateChanged, ev.EngineReady):
            bridge.on(event_type, self._on_server)
        bridge.modelFileResolved.connect(self._update_banner)
        bridge.settingsChanged.connect(self._update_banner)
        bridge.sessionsListed.connect(self._on_listing)
        self._set_title("New chat")
        self._update_controls()
        self._update_banner()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 8)
        layout.setSpacing(6)

        self.banner = QFrame()
        self.banner.setFrameShape(QFrame.Shape.StyledPanel)
        banner_layout = QHBoxLayout(self.banner)
        banner_layout.setContentsMargins(10, 6, 10, 6)
        self.banner_label = WrappedLabel()
        banner_layout.addWidget(self.banner_label, 1)
        self.banner_button = QPushButton()
        self.banner_button.clicked.connect(self._banner_clicked)
        banner_layout.addWidget(self.banner_button)
        self.banner.hide()
        layout.addWidget(self.banner)

        self.view = MessageView()
        self.view.copyRequested.connect(lambda _i: self.statusBar().showMessage("Copied the message", 4000))
        self.view.editRequested.connect(self.edit_message)
        layout.addWidget(self.view, 1)

        self.notice = WrappedLabel()
        self.notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notice.setContentsMargins(12, 0, 12, 0)
        self.notice.hide()
        layout.addWidget(self.notice)

        self.error_label = WrappedLabel()
        self.error_label.setAccessibleName("Error")
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.setContentsMargins(12, 0, 12, 0)
        self.error_label.hide()
        layout.addWidget(self.error_label)

        bottom = QVBoxLayout()
        bottom.setContentsMargins(12, 0, 12, 0)
        bottom.setSpacing(4)
        self.system_label = QLabel("System prompt (optional): how the assistant should behave in this chat")
        self.system_edit = QPlainTextEdit()
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText("For example: You are a concise assistant. Answer in English.")
        self.system_edit.setTabChangesFocus(True)
        self.system_edit.setFixedHeight(self.system_edit.fontMetrics().lineSpacing() * 2 + 14)
        bottom.addWidget(self.system_label)
        bottom.addWidget(self.system_edit)

        self.edit_bar = QWidget()
        edit_layout = QHBoxLayout(self.edit_bar)
        edit_layout.setContentsMargins(0, 0, 0, 0)
        self.edit_label = QLabel("Editing your last message: Enter sends it in place of the old one (the "
                                 "saved conversation keeps both as branches)")
        self.edit_label.setStyleSheet(warning_style())
        edit_layout.addWidget(self.edit_label, 1)
        cancel = QPushButton("Cancel edit")
        cancel.clicked.connect(self.cancel_edit)
        edit_layout.addWidget(cancel)
        self.edit_bar.hide()
        bottom.addWidget(self.edit_bar)

        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        self.composer.cancelled.connect(self._escape)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(False)
        self.send_button.clicked.connect(self._send_or_stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Send the conversation again without the last reply, for a new one")
        self.regenerate_button.clicked.connect(self.regenerate)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        bottom.addLayout(row)
        layout.addLayout(bottom)
        self.setCentralWidget(central)
        self.server_label = QLabel()  # the model and the server's state (a passing message covers it a while)
        self.statusBar().addWidget(self.server_label, 1)
        self.composer.setFocus()

    def _build_menus(self) -> None:
        menu = self.menuBar().addMenu("&Chat")
        self.new_action = QAction("&New chat", self)
        self.new_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_action.triggered.connect(self.newChatRequested)
        menu.addAction(self.new_action)
        menu.addSeparator()
        self.export_md_action = QAction("Export as &Markdown…", self)
        self.export_md_action.triggered.connect(lambda: self.export_dialog("markdown"))
        self.export_json_action = QAction("Export as &JSON (OpenAI messages)…", self)
        self.export_json_action.triggered.connect(lambda: self.export_dialog("json"))
        menu.addAction(self.export_md_action)
        menu.addAction(self.export_json_action)
        menu.addSeparator()
        close = QAction("&Close", self)
        close.setShortcut(QKeySequence.StandardKey.Close)
        close.triggered.connect(self.close)
        menu.addAction(close)
        reply = self.menuBar().addMenu("&Reply")
        self.stop_action = QAction("&Stop", self)
        self.stop_action.triggered.connect(self.stop)
        self.regenerate_action = QAction("&Regenerate", self)
        self.regenerate_action.setShortcut(QKeySequence("Ctrl+R"))
        self.regenerate_action.triggered.connect(self.regenerate)
        self.edit_action = QAction("&Edit my last message", self)
        self.edit_action.setShortcut(QKeySequence("Ctrl+E"))
        self.edit_action.triggered.connect(self.edit_last)
        for a in (self.stop_action, self.regenerate_action, self.edit_action):
            reply.addAction(a)

    # -- what is shown --------------------------------------------------------------------
    def _set_title(self, title: str) -> None:
        self.title = title
        self.setWindowTitle(f"{title} — Chat")  # Qt adds the application's name

    def open_session(self, session_id: str) -> None:
        """Read a saved conversation (a job) and show it."""
        self.session_id = session_id
        self.transcript = None
        self.view.set_entries([])
        self._set_title("Reading the conversation…")
        self._show_notice("Reading the conversation…")
        self._update_controls()

        def failed(exc: BaseException) -> None:
            self._set_title("Conversation")
            self._show_notice("")
            self.show_error(f"The conversation could not be read: {describe_error(exc)}")
            self._update_controls()

        self.bridge.load_conversation(session_id, lambda got: self.show_transcript(got[1], got[0]),
                                      on_failure=failed)

    def show_transcript(self, transcript: Transcript | None, entry: SessionEntry | None = None,
                        title: str = "") -> None:
        """Show ``transcript`` (None: saved without one; ``entry`` says what is known of it)."""
        self.entry = entry
        if entry is not None:
            self.session_id = entry.id
        self.transcript = transcript
        self._editing = None
        self.edit_bar.hide()
        self.error_label.hide()
        sidecar = entry.sidecar if entry is not None else None
        title = title or (sidecar.title if sidecar is not None and sidecar.title else "") or (
            transcript.title() if transcript is not None else "") or "Conversation"
        self._set_title(title)
        if transcript is None:
            preview = html.escape(sidecar.preview) if sidecar is not None and sidecar.preview else "(none)"
            self.view.set_entries([])
            self._show_notice(f"<p>{html.escape(NO_TRANSCRIPT)}</p><p><b>{html.escape(title)}</b><br>"
                              f"Last said: {preview}</p>")
        elif transcript.kind == TEXT:
            self.view.set_entries([Entry(Message("user", transcript.prompt), label="Prompt"),
                                   Entry(Message("assistant", transcript.completion), label="Completion")])
            self._show_notice(html.escape(TEXT_ONLY.format(source=transcript.source or "/completion")))
        else:
            self.view.set_entries([Entry(m) for m in transcript.messages])
            self._show_notice("")
        self._update_controls()
        self._update_banner()
        self.transcriptShown.emit()

    def _show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def show_error(self, message: str) -> None:
        """A failure in one clear line (never a traceback)."""
        self.error_label.setStyleSheet(error_style())
        self.error_label.setText(message)
        self.error_label.setVisible(bool(message))
        if message:
            self.errorShown.emit(message)

    def _chat(self) -> Transcript | None:
        """The transcript when it is a chat that can be continued here; None otherwise."""
        transcript = self.transcript
        return transcript if transcript is not None and transcript.kind == CHAT else None

    @property
    def can_continue(self) -> bool:
        return self._chat() is not None

    @property
    def busy(self) -> bool:
        return self.stream is not None or self._waiting_key

    def _last_user_index(self) -> int:
        transcript = self._chat()
        if transcript is None:
            return -1
        msgs = transcript.messages
        return next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "user"), -1)

    def _update_controls(self) -> None:
        transcript = self._chat()
        chat = transcript is not None
        busy = self.busy
        msgs = transcript.messages if transcript is not None else ()
        self.composer.setEnabled(chat)
        self.composer.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)" if chat
                                         else "This conversation cannot be continued here")
        self.send_button.setText("Stop" if busy else "Send")
        self.send_button.setToolTip("Stop the reply (Esc)" if busy else "Send (Enter)")
        self.send_button.setEnabled(busy or chat)
        self.stop_action.setEnabled(busy)
        can_regenerate = chat and not busy and bool(msgs) and (
            msgs[-1].role == "user" or (msgs[-1].role == "assistant" and len(msgs) > 1))
        retry = chat and bool(msgs) and msgs[-1].role == "user"
        self.regenerate_button.setText("Send again" if retry else "Regenerate")
        self.regenerate_button.setToolTip(
            "Send the conversation again (the last request got no reply)" if retry
            else "Send the conversation again without the last reply, for a new one")
        self.regenerate_button.setEnabled(can_regenerate)
        self.regenerate_action.setEnabled(can_regenerate)
        last_user = self._last_user_index()
        self.edit_action.setEnabled(not busy and last_user >= 0)
        self.view.set_editable(last_user if not busy else -1)
        self.system_label.setVisible(chat and not msgs)
        self.system_edit.setVisible(chat and not msgs)
        exportable = self.transcript is not None and (self.transcript.kind == TEXT or bool(msgs))
        self.export_md_action.setEnabled(exportable)
        self.export_json_action.setEnabled(exportable)
        self._update_status()

    def _update_status(self) -> None:
        b = self.bridge
        state = "ready" if b.facts is not None else b.state.value
        self.server_label.setText(f"{b.model_name()}: {state} · {b.base_url}")

    # -- the server, the model ------------------------------------------------------------
    def _on_server(self, _event) -> None:
        self._update_banner()
        self._update_status()

    def _on_listing(self, listing, _facts) -> None:
        """A newer listing: the conversation's entry as it is now (its model, compatibility)."""
        if self.entry is None:
            return
        for e in listing.sessions:
            if e.id == self.entry.id:
                self.entry = e
                break
        self._update_banner()

    def _update_banner(self, *_args) -> None:
        """What stands between this conversation and a reply: another model, a stopped server."""
        b = self.bridge
        text, button, self._banner_action = "", "", None
        verdict = b.resume_verdict(self.entry) if self.entry is not None and self.entry.sidecar else None
        if verdict is not None and verdict.switch_to and b.state is not ServerState.STOPPING:
            name = model_file_name(verdict.switch_to)
            now = f"the server runs {b.model_name()}" if b.running else "no server runs"
            text = (f"This conversation was made with {name}; {now}. Switch to {name} to continue it "
                    "from its saved cache (changed conversations are saved first).")
            button = f"Switch to {name}"
            self._banner_action = ("switch", verdict.switch_to)
        elif b.state in STOPPED_STATES and self.can_continue:
            text = "llama-server is not running: start it to send."
            button = "Start server"
            self._banner_action = ("start", "")
        elif verdict is not None and not verdict.enabled and b.facts is not None and self.can_continue:
            text = (f"{verdict.why}. Sending still works: the server reads the conversation again "
                    "from the start.")
        elif b.state not in STOPPED_STATES and b.facts is None and self.can_continue:
            text = "The server is starting: a message sent now waits until it is ready."
        self.banner_label.setText(text)
        self.banner_label.setStyleSheet(warning_style() if self._banner_action is None and text else "")
        self.banner_button.setText(button)
        self.banner_button.setVisible(bool(button))
        self.banner.setVisible(bool(text))

    def _banner_clicked(self) -> None:
        action = getattr(self, "_banner_action", None)
        if action is None:
            return
        kind, value = action
        if kind == "switch":
            self.switchRequested.emit(value)
            self.banner_button.setEnabled(False)
            self.banner_label.setText(f"Switching to {model_file_name(value)}…")
            QTimer.singleShot(3000, self, lambda: self.banner_button.setEnabled(True))
        elif kind == "start":
            self.bridge.start_server()

    # -- sending --------------------------------------------------------------------------
    def _send_or_stop(self) -> None:
        if self.busy:
            self.stop()
        else:
            self.composer.submit()

    def _escape(self) -> None:
        if self.busy:
            self.stop()
        elif self._editing is not None:
            self.cancel_edit()

    def send(self, text: str) -> bool:
        """Send ``text`` as the user's next message (or in place of the one being edited)."""
        transcript = self._chat()
        if transcript is None or not text.strip():
            return False
        if self.busy:
            self.statusBar().showMessage("A reply is still coming: wait for it, or Stop it (Esc)", 5000)
            return False
        if self._editing is not None:  # a branch: the conversation up to the edited message, then the new one
            transcript = replace(transcript, messages=transcript.messages[:self._editing])
            self.view.truncate(self._editing)
            self._editing = None
            self.edit_bar.hide()
        if not transcript.messages:
            system = self.system_edit.toPlainText().strip()
            if system:
                transcript = transcript.with_reply(Message("system", system))
                self.view.append(Entry(transcript.messages[-1]))
        user = Message("user", text)
        self.transcript = transcript.with_reply(user)
        # A new chat is named by its first message.
        if self.session_id is None and self._last_user_index() <= 1:
            self._set_title(self.transcript.title() or "New chat")
        self.view.append(Entry(user))
        self.composer.clear()
        self._request()
        return True

    def regenerate(self) -> None:
        """Send the conversation again without its last reply (or again after a failed request)."""
        transcript = self._chat()
        if transcript is None or self.busy:
            return
        msgs = transcript.messages
        if msgs and msgs[-1].role == "assistant" and len(msgs) > 1:
            self.transcript = replace(transcript, messages=msgs[:-1])
            self.view.truncate(len(msgs) - 1)
        elif not msgs or msgs[-1].role != "user":
            return
        self._request()

    def edit_last(self) -> None:
        self.edit_message(self._last_user_index())

    def edit_message(self, index: int) -> None:
        """Put the last user message in the composer; sending it replaces it (and what followed)."""
        transcript = self._chat()
        if transcript is None or self.busy or index < 0 or index != self._last_user_index():
            return
        self._editing = index
        self.composer.setPlainText(transcript.messages[index].content)
        self.composer.moveCursor(self.composer.textCursor().MoveOperation.End)
        self.composer.setFocus()
        self.edit_bar.show()

    def cancel_edit(self) -> None:
        self._editing = None
        self.edit_bar.hide()
        self.composer.clear()

    def stop(self) -> None:
        """Stop the reply: the connection closes, the front door cancels the request upstream."""
        if self.stream is not None:
            self.stream.cancel()
        elif self._waiting_key:
            self._cancelled = True

    def _request(self) -> None:
        transcript = self.transcript
        assert transcript is not None  # sent only from a chat (send, regenerate)
        body = chat_body(transcript)
        self.error_label.hide()
        self._reply = Message("assistant")
        self._cancelled = False
        self._waiting_key = True
        self._sent_at = time.monotonic()
        self.view.append(Entry(self._reply, note=WAITING))
        self._update_controls()

        def failed(exc: BaseException) -> None:
            self._waiting_key = False
            self._finish(StreamResult(self._reply, ReplyFigures(), False,
                                      f"The API key could not be read: {describe_error(exc)}"))

        self.bridge.api_key(lambda key: self._start_stream(body, key), on_failure=failed)

    def _start_stream(self, body: dict, key: str | None) -> None:
        self._waiting_key = False
        if self._cancelled:
            self._finish(StreamResult(self._reply, ReplyFigures(), True))
            return
        stream = ChatStream(self._nam, self.bridge.base_url, body, key, self)
        stream.delta.connect(self._on_delta)
        stream.finished.connect(self._on_stream_finished)
        self.stream = stream
        stream.start()
        self._update_controls()

    def _on_delta(self, content: str, reasoning: str) -> None:
        r = self._reply
        room = transcripts.MAX_REPLY_CHARS - len(r.content) - len(r.reasoning)  # as the transcript keeps it
        if room <= 0:
            return
        content = content[:room]
        reasoning = reasoning[:room - len(content)]
        self._reply = replace(r, content=r.content + content, reasoning=r.reasoning + reasoning)
        if not self._redraw.isActive():
            self._redraw.start()

    def _draw_reply(self) -> None:
        if self.busy:
            self.view.update_last(Entry(self._reply, note="" if self._reply.content or self._reply.reasoning
                                        else WAITING))

    def _on_stream_finished(self, result: StreamResult) -> None:
        if self.sender() is not self.stream:
            return
        self.stream.deleteLater()
        self.stream = None
        self._finish(result)

    def _finish(self, result: StreamResult) -> None:
        self._redraw.stop()
        m = result.message
        transcript = self.transcript
        assert transcript is not None  # a reply follows a request from a chat
        n = len(transcript.messages)
        if m.content or m.reasoning or m.tool_calls:
            self.transcript = transcript.with_reply(m)
            note = "stopped" if result.stopped else ("cut short" if result.error else (
                "ended at the length limit" if result.finish_reason == "length" else ""))
            self.view.update_last(Entry(m, figures=result.figures.line(), note=note))
        else:
            self.view.truncate(n)  # nothing came: no empty reply is kept
        self.last_result = result
        if result.error:
            self.show_error(result.error)
        elif result.stopped:
            self.statusBar().showMessage("Stopped", 4000)
        self._update_controls()
        self.replyFinished.emit(result)

    # -- exporting ------------------------------------------------------------------------
    def export_text(self, kind: str) -> str:
        """The conversation as Markdown (``kind`` "markdown") or OpenAI-style JSON ("json")."""
        import json

        if self.transcript is None:
            raise ValueError("there is no transcript to export")
        if kind == "markdown":
            return self.transcript.to_markdown(self.title)
        return json.dumps(self.transcript.to_openai(), ensure_ascii=False, indent=2) + "\n"

    def export_dialog(self, kind: str) -> None:
        if self.transcript is None:
            return
        suffix, what = (".md", "Markdown (*.md)") if kind == "markdown" else (".json", "JSON (*.json)")
        start = str(Path.home() / safe_file_name(self.title, suffix))
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", start, what)
        if path:
            self.export(kind, path)

    def export(self, kind: str, path: str) -> None:
        """Write the conversation to ``path`` (a job); ``exported`` when written."""
        text = self.export_text(kind)

        def write() -> str:
            Path(path).write_text(text, encoding="utf-8")
            return path

        def done(written: str) -> None:
            self.statusBar().showMessage(f"Exported to {written}", 8000)
            self.exported.emit(written)

        self.bridge.jobs.run(write, on_success=done,
                             on_failure=lambda exc: self.show_error(
                                 f"Could not export: {describe_error(exc)}"),
                             description="Exporting the conversation")

    # -- closing --------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        if self.stream is not None:
            self.stream.cancel()
        self._redraw.stop()
        super().closeEvent(event)
        self.closed.emit()
