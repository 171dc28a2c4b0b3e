"""The typed event bus: subscription by type, unsubscribe, a broken handler does not break others."""

import threading

import pytest

from slotkeeper.core import events as ev
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.views import Activity


def test_handlers_receive_only_the_types_they_asked_for():
    bus = ev.EventBus()
    saved, everything = [], []
    bus.subscribe(saved.append, ev.SaveFailed, ev.WarningRaised)
    bus.subscribe(everything.append)
    bus.emit(ev.SaveFailed(0, "disk full"))
    bus.emit(ev.NoticeRaised("demo"))
    bus.emit(ev.WarningRaised("swa"))
    assert [type(e) for e in saved] == [ev.SaveFailed, ev.WarningRaised]
    assert len(everything) == 3


def test_events_are_frozen_values():
    e = ev.ServerStateChanged(ServerState.READY, "http://127.0.0.1:1")
    with pytest.raises(AttributeError):
        e.state = ServerState.FAILED  # type: ignore[misc]
    assert e == ev.ServerStateChanged(ServerState.READY, "http://127.0.0.1:1")


def test_strings_are_not_event_types_and_not_events():
    bus = ev.EventBus()
    with pytest.raises(TypeError):
        bus.subscribe(print, "session.saved")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        bus.emit("session.saved")  # type: ignore[arg-type]


def test_unsubscribe_and_a_failing_handler(caplog):
    bus = ev.EventBus()
    got = []

    def broken(_e):
        raise RuntimeError("boom")

    bus.subscribe(broken, ev.NoticeRaised)
    stop = bus.subscribe(got.append, ev.NoticeRaised)
    bus.emit(ev.NoticeRaised("one"))
    stop()
    bus.emit(ev.NoticeRaised("two"))
    assert [e.message for e in got] == ["one"]
    assert "NoticeRaised" in caplog.text


def test_emitting_from_many_threads_while_subscribing():
    bus = ev.EventBus()
    got: list = []
    lock = threading.Lock()

    def record(e):
        with lock:
            got.append(e)

    bus.subscribe(record, ev.RequestDone)

    def emit(n):
        for i in range(200):
            bus.emit(ev.RequestDone(n, i, 10, 5, 5, 1.0, 0.0))
            if i % 50 == 0:
                bus.subscribe(lambda e: None, ev.RequestDone)

    threads = [threading.Thread(target=emit, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 800


def test_a_held_bus_delivers_what_came_before_its_listeners_in_order_then_everything_as_it_comes():
    import threading

    from slotkeeper.core.events import EventBus, ServerStateChanged
    from slotkeeper.core.server.state import ServerState

    bus = EventBus(held=True)
    bus.emit(ServerStateChanged(ServerState.STARTING, "preparing"))
    bus.emit(ServerStateChanged(ServerState.STARTING, "loading the model"))
    got: list[str] = []
    late = threading.Event()

    def listener(e):
        got.append(e.message)
        if e.message == "preparing":  # an event emitted while the held ones are being delivered
            t = threading.Thread(target=lambda: (bus.emit(ServerStateChanged(ServerState.READY, "ready")),
                                                 late.set()))
            t.start()
            t.join()

    bus.subscribe(listener, ServerStateChanged)
    assert got == []
    bus.release()
    assert late.is_set() and got == ["preparing", "loading the model", "ready"]
    bus.emit(ServerStateChanged(ServerState.STOPPING, "stopping"))
    assert got[-1] == "stopping"


@pytest.mark.parametrize(("activity", "text"), [
    (Activity(), ""),
    (Activity("hashing", "identifying m.gguf", 0, 98_362_432), "Identifying m.gguf: 0% of 93.8 MiB"),
    (Activity("hashing", "identifying m.gguf", 61_000_000, 98_362_432),
     "Identifying m.gguf: 62% of 93.8 MiB"),
    (Activity("hashing", "identifying m.gguf", 98_362_432, 98_362_432),
     "Identifying m.gguf: 100% of 93.8 MiB"),
    (Activity("hashing", "identifying m.gguf"), "Identifying m.gguf"),
    (Activity("downloading", "downloading the starter model", 49_000_000, 98_362_432),
     "Downloading the starter model: 49% of 93.8 MiB"),
    (Activity("saving", "slot 0", 0, 2), "Saving (1 of 2): slot 0"),
    (Activity("restoring", "abc", 2, 2), "Restoring (2 of 2): abc"),  # never past the total
    (Activity("saving", "slot 1"), "Saving: slot 1"),
])
def test_an_activity_in_words_never_goes_past_its_total(activity, text):
    assert activity.describe() == text
