"""The chat window: a transcript drawn (roles, Markdown, code), lazily for long ones; the composer's
keys; replies streamed through the REAL front door (an Engine on the tiny generated model: it
answers gibberish, the mechanics are what count) with Stop, Regenerate, edit-and-resend, export and
the cache figure; failures said in words; every way into it."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import replace

import pytest
from gui_helpers import OTHER_SHA, make_session
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.sessions.transcripts import CHAT, TEXT, Message, Transcript
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.gui.chat.chat_window import NO_TRANSCRIPT, ChatWindow
from slotkeeper.gui.chat.composer import Composer
from slotkeeper.gui.chat.markdown import code_background
from slotkeeper.gui.chat.web_ui import serves_web_ui

READY_MS = 180_000
REPLY_MS = 180_000
FIGURES = re.compile(r"^[\d,]+ of [\d,]+ tokens from cache · first token \d+\.\d\d s")

CODE_REPLY = ("Use **slicing**:\n\n```python\nitems = [1, 2, 3]\nprint(items[::-1])\n```\n\n"
              "or `reversed(items)`.")


def chat_of(pairs: int, system: str = "You are helpful.") -> Transcript:
    msgs = [Message("system", system)] if system else []
    for i in range(pairs):
        msgs += [Message("user", f"Question {i}: how do I reverse a list?"),
                 Message("assistant", f"Answer {i}. {CODE_REPLY}")]
    return Transcript(CHAT, tuple(msgs), source="/v1/chat/completions")


@pytest.fixture
def window(qtbot, bridge):
    w = ChatWindow(bridge)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()


def headings(w: ChatWindow) -> list[str]:
    return [x.role_label.text() for x in w.view.widgets]


# -- drawing --------------------------------------------------------------------------------------
def test_a_transcript_is_drawn_with_its_roles_reasoning_and_code_blocks(qtbot, window):
    t = Transcript(CHAT, (
        Message("system", "You are helpful."),
        Message("user", "How do I reverse a list?"),
        Message("assistant", CODE_REPLY, reasoning="The user wants Python."),
        Message("tool", "42", tool_call_id="call_1", name="calculator"),
    ))
    with qtbot.waitSignal(window.transcriptShown):
        window.show_transcript(t, title="Reversing lists")
    assert window.windowTitle().startswith("Reversing lists")
    assert headings(window) == ["System prompt", "You", "Assistant", "Tool result (calculator)"]
    reply = window.view.widgets[2]
    assert reply.reasoning is not None and reply.reasoning.isVisibleTo(reply)
    assert reply.reasoning.toPlainText() == "The user wants Python."
    body = reply.body
    assert "slicing" in body.toPlainText() and "**" not in body.toPlainText()  # Markdown, not its marks
    assert body.code_lines == 2
    block = body.document().findBlock(body.toPlainText().index("items = [1, 2, 3]"))
    assert block.blockFormat().background().color() == code_background(body.palette())
    assert block.begin().fragment().charFormat().fontFixedPitch()  # in a fixed-width font
    # Edit is offered on the last thing the user said, Copy on every message
    you = window.view.widgets[1]
    assert you.edit_button is not None and you.edit_button.isVisibleTo(you)
    assert all(w.copy_button.isVisibleTo(w) for w in window.view.widgets)
    window.view.widgets[2].copy_button.click()
    assert QGuiApplication.clipboard().text() == CODE_REPLY


def test_a_long_transcript_draws_its_last_screen_first_and_earlier_messages_as_one_scrolls_up(qtbot, window):
    t = chat_of(1000)  # 2,001 messages
    with qtbot.waitSignal(window.transcriptShown):
        window.show_transcript(t)
    view = window.view
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    qtbot.wait(100)  # the margin above the screen is drawn after the first paint
    drawn = view.rendered
    assert 3 <= drawn <= 60, f"{drawn} of 2,001 drawn for the first screen"
    assert view.first == len(t.messages) - drawn
    assert view.widgets[-1].entry.message == t.messages[-1]
    assert "earlier messages above" in view._more.text()

    # Scrolling up draws earlier ones; what was on screen stays where it was.
    top = view.widgets[0]
    before = top.mapTo(view.viewport(), top.rect().topLeft()).y()
    bar.setValue(0)
    qtbot.waitUntil(lambda: view.rendered > drawn, timeout=5000)
    qtbot.wait(50)
    assert view.widgets[0].entry.message == t.messages[view.first]
    after = top.mapTo(view.viewport(), top.rect().topLeft()).y()
    assert abs(after - before) < 40 or after >= 0, "the message at the top stays in view"
    assert view.rendered < len(t.messages)


def test_a_text_completion_is_shown_and_can_be_read_not_continued(qtbot, window, tmp_path):
    t = Transcript(TEXT, prompt="Once upon a time", completion=" there was a river.", source="/completion")
    window.show_transcript(t)
    assert headings(window) == ["Prompt", "Completion"]
    assert "/completion" in window.notice.text() and "continue it from the client" in window.notice.text()
    assert not window.composer.isEnabled() and not window.send_button.isEnabled()
    assert window.export_md_action.isEnabled()
    out = tmp_path / "story.md"
    with qtbot.waitSignal(window.exported):
        window.export("markdown", str(out))
    assert "## Prompt" in out.read_text() and "there was a river" in out.read_text()


def test_a_conversation_saved_without_a_transcript_says_so_plainly(qtbot, window, bridge, sessions_dir,
                                                                   monkeypatch):
    make_session(sessions_dir, "aaaaaaaaaaaa", title="The herons by the river", preview="They nest in March.")
    monkeypatch.setattr(type(bridge.engine.sessions), "transcript", lambda self, sid: None, raising=False)
    with qtbot.waitSignal(window.transcriptShown, timeout=10_000):
        window.open_session("aaaaaaaaaaaa")
    text = window.notice.text()
    assert "saved without a transcript" in text and "nothing to send" in text
    assert "The herons by the river" in text and "They nest in March." in text
    assert NO_TRANSCRIPT.split(".")[0] in text
    assert not window.composer.isEnabled() and not window.send_button.isEnabled()
    assert not window.export_md_action.isEnabled()
    assert window.send("hello") is False


def test_a_conversation_that_cannot_be_read_says_why(qtbot, window, sessions_dir):
    with qtbot.waitSignal(window.errorShown, timeout=10_000) as said:
        window.open_session("bbbbbbbbbbbb")  # no such session
    assert said.args[0].startswith("The conversation could not be read:")
    assert "Traceback" not in said.args[0]


def test_another_models_conversation_offers_the_switch(qtbot, window, bridge, sessions_dir, monkeypatch):
    make_session(sessions_dir, "cccccccccccc", title="Made elsewhere", model_sha256=OTHER_SHA)
    monkeypatch.setattr(type(bridge.engine.sessions), "transcript", lambda self, sid: chat_of(1),
                        raising=False)
    with qtbot.waitSignal(window.transcriptShown, timeout=10_000):
        window.open_session("cccccccccccc")
    assert window.banner.isVisible()
    assert "was made with Qwen3-8B-Q4_K_M.gguf" in window.banner_label.text()
    assert window.banner_button.text() == "Switch to Qwen3-8B-Q4_K_M.gguf"
    with qtbot.waitSignal(window.switchRequested) as asked:
        window.banner_button.click()
    assert asked.args[0].endswith("Qwen3-8B-Q4_K_M.gguf")
    assert window.composer.isEnabled(), "it can be read and written while the switch is offered"


# -- the composer -----------------------------------------------------------------------------------
def test_enter_sends_shift_enter_starts_a_new_line_and_nothing_empty_is_sent(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    c.show()
    sent: list[str] = []
    c.submitted.connect(sent.append)
    qtbot.keyClick(c, Qt.Key.Key_Return)
    qtbot.keyClicks(c, "   ")
    qtbot.keyClick(c, Qt.Key.Key_Return)
    assert sent == []
    c.clear()
    qtbot.keyClicks(c, "first line")
    qtbot.keyClick(c, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(c, "second line")
    assert c.toPlainText() == "first line\nsecond line" and sent == []
    qtbot.keyClick(c, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"]
    qtbot.keyClick(c, Qt.Key.Key_Enter)  # the keypad's Enter too
    assert len(sent) == 2
    with qtbot.waitSignal(c.cancelled):
        qtbot.keyClick(c, Qt.Key.Key_Escape)


def test_a_new_chat_sends_its_system_prompt_first(qtbot, window, monkeypatch):
    sent: list[dict] = []
    monkeypatch.setattr(window, "_request", lambda: (sent.append(window.transcript.to_openai()),
                                                     window._update_controls()))
    assert window.system_edit.isVisible()
    window.system_edit.setPlainText("Answer in English, briefly.")
    qtbot.keyClicks(window.composer, "Hello")
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    assert sent[0]["messages"] == [{"role": "system", "content": "Answer in English, briefly."},
                                   {"role": "user", "content": "Hello"}]
    assert window.composer.toPlainText() == ""
    assert not window.system_edit.isVisible()


# -- failures, in words -------------------------------------------------------------------------------
class StubServer:
    """A local server that answers every request with ``raw`` bytes (a status line and headers, maybe
    part of a stream), then closes the connection: the rare edges a real front door will not produce
    on demand (a 503 while restarting, a 401, a connection that drops in the middle of a reply)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.stopping = threading.Event()
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(1.0)
            with conn:
                try:
                    self._answer(conn)
                except OSError:  # the client went away
                    pass

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        found = re.search(rb"(?i)content-length: *(\d+)", head)
        while found and len(body) < int(found.group(1)):
            got = conn.recv(65536)
            if not got:
                return
            body += got
        self.requests.append(head + b"\r\n\r\n" + body)
        conn.sendall(self.raw)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def stub_window(qtbot):
    made = []

    def make(raw: bytes | None, key: str | None = None):
        stub = StubServer(raw) if raw is not None else None
        port = stub.port if stub else _free_port()
        extra = ("--api-key", key) if key else ()
        engine = Engine(app_paths(), Settings(profile=ServerProfile(port=port, extra_args=extra)))
        from slotkeeper.gui.bridge import EngineBridge

        bridge = EngineBridge(engine, watch_sessions=False)
        w = ChatWindow(bridge)
        qtbot.addWidget(w)
        w.show()
        made.append((stub, engine, bridge, w))
        return w, stub

    yield make
    for stub, engine, bridge, w in made:
        w.close()
        bridge.close()
        engine.close(save=False)
        if stub is not None:
            stub.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send_and_wait(qtbot, w: ChatWindow, text: str, timeout: int = 20_000):
    with qtbot.waitSignal(w.replyFinished, timeout=timeout) as done:
        assert w.send(text)
    return done.args[0]


def test_a_server_not_ready_says_so_with_when_to_try_again(qtbot, stub_window):
    body = (b'{"error":{"code":503,"message":"llama-server is restarting after a crash",'
            b'"type":"unavailable_error"}}')
    w, stub = stub_window(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                          b"Retry-After: 7\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                          % (len(body), body))
    result = send_and_wait(qtbot, w, "Hello?")
    assert result.error == ("The server is not ready to answer (llama-server is restarting after a crash). "
                            "Try again in 7 s.")
    assert w.error_label.isVisible() and w.error_label.text() == result.error
    assert [m.role for m in w.transcript.messages] == ["user"]  # no empty reply kept
    assert w.regenerate_button.text() == "Send again" and w.regenerate_button.isEnabled()
    request = stub.requests[0]
    assert request.startswith(b"POST /v1/chat/completions ")
    assert json.loads(request.partition(b"\r\n\r\n")[2]) == {
        "messages": [{"role": "user", "content": "Hello?"}], "stream": True}


def test_a_refused_key_says_so_and_the_key_is_sent(qtbot, stub_window):
    body = b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}'
    w, stub = stub_window(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body),
                          key="sekrit-1")
    result = send_and_wait(qtbot, w, "Hello?")
    assert result.error.startswith("The front door refused the API key (401)")
    assert b"\r\nAuthorization: Bearer sekrit-1\r\n" in stub.requests[0]


def test_a_dropped_connection_keeps_the_text_so_far_and_says_so(qtbot, stub_window):
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"The river"}}]}\n\n'
    w, _stub = stub_window(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n"
                           + b"%x\r\n%s\r\n" % (len(chunk), chunk))  # then the connection closes mid-stream
    result = send_and_wait(qtbot, w, "Tell me about rivers")
    assert "connection dropped before the reply ended" in result.error
    assert [m.role for m in w.transcript.messages] == ["user", "assistant"]
    assert w.transcript.messages[-1].content == "The river"
    assert w.view.widgets[-1].footer.text().endswith("· cut short")
    assert w.error_label.isVisible() and "Traceback" not in w.error_label.text()


def test_nothing_listening_says_to_start_the_server(qtbot, stub_window):
    w, _ = stub_window(None)
    assert w.banner.isVisible() and w.banner_button.text() == "Start server"
    result = send_and_wait(qtbot, w, "Anyone there?")
    assert (result.error.startswith("Nothing answers at http://127.0.0.1:")
            and "start the server" in result.error)


def test_the_web_ui_is_offered_only_when_served(qtbot):
    page = b"<!doctype html><title>llama.cpp</title>"
    html = StubServer(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n"
                      b"Connection: close\r\n\r\n%s" % (len(page), page))
    not_found = StubServer(b'HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n'
                           b'Content-Length: 2\r\nConnection: close\r\n\r\n{}')
    try:
        assert serves_web_ui(f"http://127.0.0.1:{html.port}") is True
        assert serves_web_ui(f"http://127.0.0.1:{not_found.port}") is False
        assert serves_web_ui(f"http://127.0.0.1:{_free_port()}") is False
    finally:
        html.close()
        not_found.close()


# -- every way in ---------------------------------------------------------------------------------------
def test_every_way_in_opens_the_chat_window(qtbot, sessions_dir, monkeypatch):
    from slotkeeper.core.services.settings import SettingsService
    from slotkeeper.gui.application import SlotkeeperApp

    paths = app_paths().ensure()
    make_session(sessions_dir, "dddddddddddd", title="About herons")
    monkeypatch.setattr("slotkeeper.core.services.sessions.SessionsService.transcript",
                        lambda self, sid: chat_of(1), raising=False)
    app = SlotkeeperApp(paths, Settings(), SettingsService(paths.settings_file), tray_available=True,
                        first_run=False)
    switches: list[tuple] = []  # a conversation of a model not chosen yet also asks for the switch
    monkeypatch.setattr(app.switcher, "choose", lambda path, resume_id=None, ask=True: switches.append(path))
    try:
        qtbot.addWidget(app.window)
        tray, page = app.tray, app.window.sessions_page
        tray.new_chat_action.trigger()
        assert len(app.chats.windows) == 1 and app.chats.windows[0].session_id is None
        tray.open_chat_action.trigger()  # the last chat window again
        assert len(app.chats.windows) == 1
        qtbot.waitUntil(lambda: page.select_session("dddddddddddd"), timeout=10_000)
        page.resume_selected()
        chat = next(w for w in app.chats.windows if w.session_id == "dddddddddddd")
        qtbot.waitUntil(lambda: chat.transcript is not None, timeout=10_000)
        assert chat.windowTitle().startswith("About herons")
        page.table.activated.emit(page.table.currentIndex())  # double click / Enter: the same window
        page.search_results.resumeRequested.emit("dddddddddddd")  # a search result: the same window
        assert len(app.chats.windows) == 2
        qtbot.waitUntil(lambda: bool(app.bridge.listing and app.bridge.listing.sessions), timeout=10_000)
        tray.rebuild_resume_menu()
        with qtbot.waitSignal(tray.chatRequested) as via_tray:
            tray.resume_menu.actions()[0].trigger()
        assert via_tray.args == ["dddddddddddd"] and len(app.chats.windows) == 2
        assert switches and all(p.endswith(".gguf") for p in switches)
        window_server = [a.text() for a in app.window.menuBar().actions()[1].menu().actions()]
        assert "Open chat" in window_server and "&New chat" in window_server
        app.window.new_chat_action.trigger()
        assert len(app.chats.windows) == 3
        chat.close()
        assert chat not in app.chats.windows
    finally:
        app.dispose()
        app.engine.close(save=False)
        app.deleteLater()


# -- the real front door ------------------------------------------------------------------------------
@pytest.fixture
def served(qtbot, llama_model, server_bin, port):
    """A bridge over an Engine running llama-server on the tiny generated model."""
    from slotkeeper.gui.bridge import EngineBridge

    profile = ServerProfile(model_path=str(llama_model), server_bin=server_bin, port=port, ctx=4096)
    # as tests/e2e's make_engine
    engine = Engine(app_paths(), Settings(profile=profile, idle_save_seconds=0.3))
    bridge = EngineBridge(engine, watch_sessions=False)
    bridge.start_server()
    qtbot.waitUntil(lambda: bridge.facts is not None, timeout=READY_MS)
    yield bridge
    bridge.close()
    engine.close(save=False)


@pytest.fixture
def chat(qtbot, served):
    w = ChatWindow(served)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


def with_options(w: ChatWindow, **options) -> None:
    w.show_transcript(replace(w.transcript, options={**w.transcript.options, **options}))


@pytest.mark.e2e
def test_replies_stream_through_the_front_door_without_freezing_the_window(qtbot, chat, served, tmp_path,
                                                                          monkeypatch):
    from slotkeeper.gui.chat.stream import ChatStream

    w = chat
    assert not w.banner.isVisible()  # the server is ready: nothing stands in the way
    with_options(w, max_tokens=24, temperature=0, seed=1)
    w.system_edit.setPlainText("You are a helpful assistant for walkers.")
    ticks: list[float] = []
    # every 5 ms, precisely: the tiny model's reply takes about 25 ms, in which a window that keeps
    # running ticks several times and a frozen one once at most
    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(5)
    # The server's events as the stream reads them: the reply comes in pieces as it is generated.
    # (The window is given what one read brought at once: on a loaded machine that may be all of it.)
    deltas: list[bytes] = []
    read_event = ChatStream._event
    monkeypatch.setattr(ChatStream, "_event",
                        lambda self, line, c, r: (deltas.append(line) if b'"content":"' in line else None,
                                                  read_event(self, line, c, r))[1])
    qtbot.keyClicks(w.composer, "Hello there, what should I pack for a long walk in the hills?")
    with qtbot.waitSignal(w.replyFinished, timeout=REPLY_MS) as done:
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
        assert w.send_button.text() == "Stop"
    sent_at, ended = w._sent_at, time.monotonic()
    timer.stop()
    first = done.args[0]
    assert first.error is None and not first.stopped
    assert len(deltas) >= 2, "the reply came in pieces as it was generated"
    # the window kept running while the reply streamed: its timer ticked throughout (a frozen
    # window ticks once at most; a loaded machine may skip many of the ticks, not all)
    during = [t for t in ticks if sent_at <= t <= ended]
    assert len(during) >= max(3, 0.05 * (ended - sent_at) / 0.01)
    assert [m.role for m in w.transcript.messages] == ["system", "user", "assistant"]
    assert w.transcript.messages[-1].content == first.message.content != ""
    f = first.figures
    assert f.prompt_tokens > 10 and f.cache_n is not None and 0 < f.first_token_s < (ended - sent_at) + 0.01
    reply_widget = w.view.widgets[-1]
    assert FIGURES.match(reply_widget.footer.text()), reply_widget.footer.text()
    assert w.send_button.text() == "Send" and w.regenerate_button.text() == "Regenerate"

    # The next turn continues from the slot: most of its prompt comes from the cache.
    second = send_and_wait(qtbot, w, "And what about food and water?", REPLY_MS)
    assert second.error is None
    assert second.figures.cache_n >= first.figures.prompt_tokens - 2
    line = w.view.widgets[-1].footer.text()
    assert line.startswith(f"{second.figures.cache_n:,} of {second.figures.prompt_tokens:,} tokens from "
                           "cache")

    # Regenerate: the same conversation without its last reply, for a new one.
    before = w.transcript.messages
    with qtbot.waitSignal(w.replyFinished, timeout=REPLY_MS) as again:
        w.regenerate_button.click()
    assert again.args[0].error is None
    assert w.transcript.messages[:-1] == before[:-1] and w.transcript.messages[-1].role == "assistant"
    assert len(w.transcript.messages) == len(before)
    assert again.args[0].figures.cache_n >= second.figures.prompt_tokens - 2 - 2, "resent from the slot"

    # Edit the last message and send it in place of the old one.
    w.edit_last()
    assert w.composer.toPlainText() == "And what about food and water?" and w.edit_bar.isVisible()
    w.composer.setPlainText("And which boots?")
    with qtbot.waitSignal(w.replyFinished, timeout=REPLY_MS) as edited:
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert edited.args[0].error is None and not w.edit_bar.isVisible()
    roles = [m.role for m in w.transcript.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert w.transcript.messages[3].content == "And which boots?"
    assert "food and water" not in json.dumps(w.transcript.to_openai())
    assert [x.entry.message for x in w.view.widgets[-5:]] == list(w.transcript.messages)

    # Export: Markdown for people, OpenAI-style JSON for programs.
    md, js = tmp_path / "walk.md", tmp_path / "walk.json"
    with qtbot.waitSignal(w.exported):
        w.export("markdown", str(md))
    with qtbot.waitSignal(w.exported):
        w.export("json", str(js))
    text = md.read_text()
    assert (text.startswith("# ") and "## User" in text and "And which boots?" in text
            and "## Assistant" in text)
    data = json.loads(js.read_text())
    assert data["messages"] == [m.to_openai() for m in w.transcript.messages]
    assert data["max_tokens"] == 24


@pytest.mark.e2e
def test_stop_closes_the_stream_and_the_server_stops_generating(qtbot, chat, served):
    w = chat
    engine = served.engine
    with_options(w, max_tokens=3000, ignore_eos=True)
    with qtbot.waitSignal(w.replyFinished, timeout=REPLY_MS) as done:
        assert w.send("Tell me a very long story about the river.")
        qtbot.waitUntil(lambda: bool(w._reply.content), timeout=REPLY_MS)
        assert w.stop_action.isEnabled()
        qtbot.keyClick(w.composer, Qt.Key.Key_Escape)  # Esc stops, as the Stop button does
    result = done.args[0]
    assert result.stopped and result.error is None
    assert w.transcript.messages[-1].role == "assistant" and w.transcript.messages[-1].content
    assert w.view.widgets[-1].footer.text().endswith("stopped")
    # closing the connection cancelled the request upstream: llama-server stops generating at once,
    # not after 3,000 tokens
    stopped_at = time.monotonic()
    with engine.client() as client:
        qtbot.waitUntil(lambda: not any(s.is_processing for s in client.slots()), timeout=10_000)
    assert time.monotonic() - stopped_at < 10
    # and the conversation goes on from the reply as far as it came (eight tokens whatever is
    # sampled: a reply that is only an end of text keeps no message)
    with_options(w, max_tokens=8, ignore_eos=True)
    assert send_and_wait(qtbot, w, "Go on.", REPLY_MS).error is None
    assert [m.role for m in w.transcript.messages] == ["user", "assistant", "user", "assistant"]


@pytest.mark.e2e
def test_a_saved_conversation_opens_with_its_messages_and_continues(qtbot, chat, served):
    w = chat
    engine = served.engine
    with_options(w, max_tokens=16, temperature=0, seed=1)
    assert send_and_wait(qtbot, w, "Hello there, tell me about herons by the river.", REPLY_MS).error is None
    qtbot.waitUntil(lambda: len(engine.sessions.listing().sessions) == 1, timeout=60_000)  # the idle save
    (saved,) = engine.sessions.listing().sessions

    other = ChatWindow(served)
    qtbot.addWidget(other)
    other.show()
    with qtbot.waitSignal(other.transcriptShown, timeout=30_000):
        other.open_session(saved.id)
    assert other.transcript is not None and other.transcript.messages == w.transcript.messages
    assert [x.entry.message for x in other.view.widgets] == list(w.transcript.messages)
    assert other.title and other.title != "Conversation"
    result = send_and_wait(qtbot, other, "Where do they nest?", REPLY_MS)
    assert result.error is None
    assert result.figures.cache_n >= w.last_result.figures.prompt_tokens - 2, "continued from the cache"
    other.close()


def test_a_reply_on_screen_is_kept_to_what_its_transcript_keeps(qtbot, stub_window, monkeypatch):
    """A runaway reply does not grow the window's copy past the transcript's bound."""
    from slotkeeper.core.sessions import transcripts

    monkeypatch.setattr(transcripts, "MAX_REPLY_CHARS", 10)
    w, _ = stub_window(None)
    w._reply = Message("assistant", "", "")
    w._on_delta("", "think")
    w._on_delta("abcdefgh", "")
    assert (w._reply.reasoning, w._reply.content) == ("think", "abcde")
    w._on_delta("more", "more")
    assert (w._reply.reasoning, w._reply.content) == ("think", "abcde")
