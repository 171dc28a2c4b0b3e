"""The engine driven from several threads at once against the real llama-server.

Two chat clients keep both slots busy (the poller sees turns end and saves them, the log tailer
feeds per-request figures), a "GUI" thread saves slots, lists, pins and resumes sessions through
the engine's commands and services, and a reader takes snapshots all the while. Every snapshot
must be consistent (the sessions it says are in slots are exactly the ones its slot views hold),
every request must be counted once, and every saved session must verify.
"""

from __future__ import annotations

import threading
import time

import pytest
from e2e_helpers import EventLog, chat, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.engine import EngineError
from slotkeeper.core.server.state import ServerState

pytestmark = pytest.mark.e2e

TOPICS = ["rivers and the fish that live in them", "baking bread at home with a slow oven",
          "the history of small railway stations", "learning to sail on a windy lake"]


def test_state_stays_consistent_under_concurrent_use(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=0, parallel=2, ctx=4096)
    events = EventLog(engine)
    engine.start()
    stop = threading.Event()
    errors: list[str] = []
    requests = [0]
    snapshots = [0]

    def client(n: int) -> None:
        try:
            while not stop.is_set():
                messages = [{"role": "system", "content": "You are a helpful assistant."}]
                for turn in range(3):
                    messages.append({"role": "user",
                                     "content": f"Tell me about {TOPICS[(n + turn) % 4]}, part {turn}."})
                    reply = chat(engine.base_url, messages, max_tokens=6, id_slot=n)
                    messages.append({"role": "assistant",
                                     "content": reply["choices"][0]["message"]["content"]})
                    requests[0] += 1
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(f"client {n}: {exc!r}")

    def gui() -> None:
        try:
            while not stop.is_set():
                for slot in (0, 1):
                    engine.save_slot(slot)
                listing = engine.sessions.listing()
                if listing.sessions:
                    first = listing.sessions[-1]
                    engine.sessions.set_pinned(first.id, not first.sidecar.pinned)
                    try:
                        engine.restore(first.id)
                    except EngineError as exc:  # every slot busy: said plainly, never a crash
                        assert "busy" in str(exc)
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"gui: {exc!r}")

    def reader() -> None:
        while not stop.is_set():
            snap = engine.snapshot
            # A slot that went on with another conversation (detached) no longer holds its session.
            held = {v.session_id for v in snap.slots if v.session_id and not v.detached}
            if snap.launched_profile is not None and snap.slots and held != snap.in_slots:
                errors.append(f"torn snapshot: views hold {held}, in_slots says {set(snap.in_slots)}")
            snapshots[0] += 1
            time.sleep(0.001)

    try:
        assert engine.wait_ready(60) is ServerState.READY
        threads = [threading.Thread(target=client, args=(n,)) for n in (0, 1)]
        threads += [threading.Thread(target=gui), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        time.sleep(20)
        stop.set()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert requests[0] >= 6 and snapshots[0] > 1000
        # every request was counted once, from the server log, on the engine's loop
        wait_until(lambda: len(events.of(ev.RequestDone)) >= requests[0], timeout=30, what="request figures")
        assert not events.of(ev.SaveFailed), events.of(ev.SaveFailed)
        # an idle save comes once a slot rests (after the load at the latest)
        wait_until(lambda: {s.reason for s in events.of(ev.SessionSaved)} >= {"manual", "idle"},
                   timeout=30, what="a manual and an idle save")
        for e in engine.sessions.listing().sessions:
            assert engine.sessions.verify(e.id).status == "ok", e.id
        for event in events.of(ev.SlotsChanged):
            assert [v.id for v in event.slots] == sorted(v.id for v in event.slots)
    finally:
        stop.set()
        engine.close(save=True)
    assert not events.of(ev.SaveFailed)
