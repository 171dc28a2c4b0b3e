"""A save before a switch commits beside the request that took the slot (the real llama-server):
the request does not wait for the hash, fsync, lineage and title of the conversation leaving the
slot; a request that could use that conversation waits for its commit and then restores it; a
commit that fails is said; a stop waits for the commit."""

from __future__ import annotations

import threading

import pytest
from e2e_helpers import EventLog, make_engine, wait_until
from test_front_door import long_message, reused, turn

from slotkeeper.core import events as ev
from slotkeeper.core.engine.slots import saves as engine_module
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions import pieces

pytestmark = pytest.mark.e2e


class HeldCommits:
    """The save protocol's commit, held until ``release()`` (with ``fail``, its fsync then fails
    as a dying disk's would)."""

    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        real = engine_module.commit_written
        if fail:
            def broken_fsync(fd, *args, **kwargs):
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(pieces, "sync_fd", broken_fsync)  # the new pieces cannot be made durable

        def held(*args, **kwargs):  # on an engine I/O thread
            self.entered.set()
            assert self.gate.wait(120)
            return real(*args, **kwargs)

        monkeypatch.setattr(engine_module, "commit_written", held)

    def release(self) -> None:
        self.gate.set()


def in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def two_conversations(url):
    a, _ = turn(url, [{"role": "system", "content": "You are assistant A."}], long_message(1))
    return a


@pytest.fixture
def one_slot(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)  # no idle saves
    events = EventLog(engine)
    engine.start()
    assert engine.wait_ready(60) is ServerState.READY
    yield engine, events
    engine.close(save=True)


def test_the_switching_request_does_not_wait_for_the_commit_and_a_request_for_it_does(one_slot, monkeypatch):
    engine, events = one_slot
    url = engine.base_url
    a = two_conversations(url)
    held = HeldCommits(monkeypatch)

    # B takes the only slot: A is written by llama-server, and B is answered while A's commit waits.
    b, _ = turn(url, [{"role": "system", "content": "You are assistant B."}], long_message(2))
    assert held.entered.is_set() and not held.gate.is_set()
    assert engine.library.store.listing().sessions == [] and events.of(ev.SessionSaved) == []

    # A's next turn could use A's session: it waits for the commit, then restores it.
    t, out = in_thread(lambda: turn(url, a, "And one more short question?"))
    t.join(1.5)
    assert t.is_alive(), "a request for the conversation being committed did not wait for it"
    held.release()
    t.join(120)
    _, resp = out["value"]
    assert reused(resp) > 0.8  # the committed session, restored
    saved = events.of(ev.SessionSaved)
    assert saved and saved[0].reason == "before switching conversations"
    restored = events.of(ev.SessionRestored)
    assert restored and restored[-1].id == saved[0].id


def test_a_failed_commit_is_said_and_the_engine_goes_on(one_slot, monkeypatch):
    engine, events = one_slot
    url = engine.base_url
    two_conversations(url)
    held = HeldCommits(monkeypatch, fail=True)
    turn(url, [{"role": "system", "content": "You are assistant B."}], long_message(2))
    held.release()
    failed = wait_until(lambda: events.of(ev.SaveFailed), 30, what="the failed commit reported")
    assert "keeps its previous save" in failed[0].message and "Input/output error" in failed[0].message
    assert engine.library.store.listing().sessions == []  # nothing half-made
    assert not list(engine.library.store.dir.glob("incoming-*"))  # and nothing left behind
    _, resp = turn(url, [{"role": "system", "content": "You are assistant C."}], long_message(4))
    assert resp["choices"]


def test_a_stop_waits_for_the_commit(llama_model, server_bin, port, monkeypatch):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    engine.start()
    assert engine.wait_ready(60) is ServerState.READY
    url = engine.base_url
    two_conversations(url)
    held = HeldCommits(monkeypatch)
    turn(url, [{"role": "system", "content": "You are assistant B."}], long_message(2))
    t, out = in_thread(lambda: engine.close(save=True))
    t.join(1.0)
    assert t.is_alive(), "the stop did not wait for the commit"
    held.release()
    t.join(120)
    assert "error" not in out and out["value"].ok
    titles = sorted(s.sidecar.title for s in engine.library.store.listing().sessions)
    assert len(titles) == 2  # A (committed after the switch) and B (saved at the stop)
