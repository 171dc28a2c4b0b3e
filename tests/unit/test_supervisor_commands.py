"""The supervisor is handed its launches (commands down) and says what happened (events up): it
never asks anyone above it. Real child processes (small Python scripts stand in for llama-server
where only how it ends matters); the launches of a real llama-server are in tests/e2e."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from slotkeeper.core.events import EventBus, LaunchFellBack, ServerStateChanged
from slotkeeper.core.server.supervisor import LaunchSpec, ServerState, Supervisor


@pytest.fixture
def supervised(tmp_path):
    events = EventBus()
    seen: list[object] = []
    events.subscribe(seen.append, ServerStateChanged, LaunchFellBack)
    sup = Supervisor(log_path=tmp_path / "llama-server.log", state_file=tmp_path / "server.json",
                     events=events, health_timeout=5.0, stop_grace=2.0)
    yield sup, seen
    sup.stop()


def _ends_with(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def _wait_for(sup: Supervisor, state: ServerState, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while sup.state is not state and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sup.state is state, sup.message


def test_a_stop_while_the_launch_is_planned_means_nothing_starts(supervised, tmp_path):
    sup, seen = supervised
    marker = tmp_path / "ran"
    assert sup.preparing() and sup.state is ServerState.STARTING and sup.message == "preparing"
    assert sup.preparing("saving first") and sup.message == "saving first"  # how the planning goes on
    sup.stop()
    assert sup.state is ServerState.STOPPED
    sup.launch(LaunchSpec(_ends_with(f"open({str(marker)!r}, 'w')"), "127.0.0.1", 9))
    time.sleep(0.5)
    assert sup.state is ServerState.STOPPED and sup.pid is None and not marker.exists()
    states = [e.state for e in seen if isinstance(e, ServerStateChanged)]
    assert states == [ServerState.STARTING, ServerState.STARTING, ServerState.STOPPING, ServerState.STOPPED]


def test_a_launch_that_cannot_be_planned_fails_with_the_planners_words(supervised):
    sup, seen = supervised
    sup.fail("no launch was being prepared")  # not preparing: nothing to fail
    assert sup.state is ServerState.STOPPED
    assert sup.preparing("downloading the starter model")
    assert sup.message == "downloading the starter model"
    why = "The model file was not found: /models/gone.gguf"
    sup.fail(why)
    assert sup.state is ServerState.FAILED and sup.message == why
    assert sup.preparing()  # a person starts it again
    assert sup.state is ServerState.STARTING


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_a_start_up_that_ends_with_the_named_code_runs_the_fallback_and_says_so(supervised, tmp_path):
    sup, seen = supervised
    ran = tmp_path / "fallback-ran"
    dies = _ends_with("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    fallback = LaunchSpec(_ends_with(f"open({str(ran)!r}, 'w'); raise SystemExit(3)"), "127.0.0.1", 9)
    sup.start(LaunchSpec(dies, "127.0.0.1", 9, fallback=(-signal.SIGILL, fallback)))
    _wait_for(sup, ServerState.FAILED)
    assert ran.exists()
    [fell] = [e for e in seen if isinstance(e, LaunchFellBack)]
    assert fell == LaunchFellBack(-signal.SIGILL, fallback.argv)
    assert "error code 3" in sup.message  # the fallback's own end is what is said: no second fallback


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_a_start_up_that_ends_otherwise_fails_without_the_fallback(supervised, tmp_path):
    sup, seen = supervised
    ran = tmp_path / "fallback-ran"
    fallback = LaunchSpec(_ends_with(f"open({str(ran)!r}, 'w')"), "127.0.0.1", 9)
    sup.start(LaunchSpec(_ends_with("raise SystemExit(1)"), "127.0.0.1", 9,
                         fallback=(-signal.SIGILL, fallback)))
    _wait_for(sup, ServerState.FAILED)
    assert not ran.exists() and not any(isinstance(e, LaunchFellBack) for e in seen)
    assert "error code 1" in sup.message
