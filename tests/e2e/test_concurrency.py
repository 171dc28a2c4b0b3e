"""More conversations than slots, against a real llama-server: a conversation that leaves its slot
while its next turn waits comes back from disk, streamed answers back to back never get a 503, and
requests waiting for a slot get it in the order they came."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from e2e_helpers import LONG_FIRST_TURN, USER_TURNS, EventLog, converse, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.engine.slots import saves as slot_saves
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e


def chat(url: str, messages: list[dict], max_tokens: int = 8, **extra) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra})
    r.raise_for_status()
    return r.json()


def test_a_next_turn_arriving_while_its_conversation_is_saved_out_is_restored_not_re_read(
        llama_model, server_bin, port, monkeypatch):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        a, last = converse(url, [LONG_FIRST_TURN, USER_TURNS[1]], max_tokens=8)  # A in the slot, unsaved
        real = slot_saves.check_written
        writing = threading.Event()

        def slow_check(*args, **kwargs):  # llama-server's write of A takes a while
            writing.set()
            time.sleep(1.5)
            return real(*args, **kwargs)

        monkeypatch.setattr(slot_saves, "check_written", slow_check)
        other = threading.Thread(target=chat,
                                 args=(url, [{"role": "user", "content": "Sailing boats in a harbour, "
                                              "and the tides that move them at night."}]))
        other.start()  # B takes the slot: A is saved out first
        assert writing.wait(30)
        a.append({"role": "user", "content": USER_TURNS[2]})
        r = chat(url, a)  # A's next turn, arriving while A is being moved out of its slot
        other.join(60)
        t, before = r["timings"], last["timings"]
        assert t["cache_n"] >= before["cache_n"] + before["prompt_n"], t  # restored, not re-read
        done = wait_until(lambda: len(events.of(ev.RequestDone)) == 4 and events.of(ev.RequestDone),
                          what="the requests' figures")
        assert done[-1].source == "restored" or done[-2].source == "restored", [d.source for d in done]
    finally:
        engine.stop(save=False)


def test_streamed_answers_back_to_back_never_get_a_503(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        messages = [{"role": "user", "content": USER_TURNS[0]}]
        statuses = []
        with httpx.Client(timeout=60) as client:
            for i in range(40):
                with client.stream("POST", f"{url}/v1/chat/completions",
                                   json={"messages": messages, "max_tokens": 4, "stream": True}) as r:
                    statuses.append(r.status_code)
                    reply = "".join(r.iter_text())
                if i % 3 == 2:
                    httpx.post(f"{url}/tokenize", json={"content": reply[:50]}, timeout=30)
        assert statuses == [200] * 40
    finally:
        engine.stop(save=False)


def test_requests_waiting_for_a_slot_get_it_in_the_order_they_came(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        started: list[str] = []
        lock = threading.Lock()
        all_in_line = threading.Event()

        def client(name: str, text: str, n: int) -> None:
            with httpx.stream("POST", f"{url}/completion", timeout=120,
                              json={"prompt": text, "n_predict": n, "ignore_eos": True, "stream": True}) as r:
                for _chunk in r.iter_bytes():
                    with lock:
                        if name not in started:
                            started.append(name)
                    if name == "first" and all_in_line.is_set():
                        return  # the first goes away: its slot is freed

        first = threading.Thread(target=client,
                                 args=("first", "The first conversation holds the slot.", 4000))
        first.start()
        wait_until(lambda: "first" in started, what="the slot taken")
        others = []
        for k, name in enumerate(("one", "two", "three", "four"), start=1):
            t = threading.Thread(target=client, args=(name, f"Conversation {name} waits for the slot.", 4))
            t.start()
            others.append(t)
            # They come one after the other: the next leaves once this one is in line at the door.
            def in_line(k=k) -> bool:
                assert first.is_alive(), "the first answer ended before the others were in line"
                return engine.snapshot.waiting == k

            wait_until(in_line, what=f"request {name} in line")
        all_in_line.set()
        for t in [first, *others]:
            t.join(120)
        assert started == ["first", "one", "two", "three", "four"], started
        wait_until(lambda: len(events.of(ev.RequestDone)) >= 4, what="the four that waited done")
    finally:
        engine.stop(save=False)
