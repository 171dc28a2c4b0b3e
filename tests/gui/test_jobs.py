"""JobRunner: work off the GUI thread, callbacks on it, failures never lost."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QThread
from PySide6.QtWidgets import QApplication

from slotkeeper.gui.jobs import JobRunner


@pytest.fixture
def runner(qtbot):
    r = JobRunner()
    yield r
    r.shutdown()
    r.deleteLater()


def test_success_runs_off_thread_and_answers_on_gui_thread(qtbot, runner):
    seen = {}

    def work(a, b=0):
        seen["worker"] = threading.get_ident()
        return a + b

    def ok(result):
        seen["result"] = result
        seen["gui"] = QThread.currentThread() is QApplication.instance().thread()

    runner.run(work, 2, b=3, on_success=ok)
    qtbot.waitUntil(lambda: "result" in seen)
    assert seen["result"] == 5
    assert seen["gui"] is True
    assert seen["worker"] != threading.get_ident()


def test_failure_goes_to_the_failure_callback(qtbot, runner):
    errors = []

    def boom():
        raise ValueError("the disk is full")

    with qtbot.assertNotEmitted(runner.jobFailed):
        runner.run(boom, on_failure=errors.append)
        qtbot.waitUntil(lambda: bool(errors))
    assert isinstance(errors[0], ValueError)
    assert str(errors[0]) == "the disk is full"


def test_unhandled_failure_is_announced(qtbot, runner):
    def boom():
        raise RuntimeError("llama-server refused")

    with qtbot.waitSignal(runner.jobFailed) as blocker:
        runner.run(boom, description="Saving slot 0")
    assert blocker.args == ["Saving slot 0", "llama-server refused"]


def test_a_failing_callback_is_announced_too(qtbot, runner):
    def bad_callback(_):
        raise KeyError("oops")

    with qtbot.waitSignal(runner.jobFailed) as blocker:
        runner.run(lambda: 1, on_success=bad_callback, description="Listing")
    assert blocker.args[0] == "Listing"
    assert "KeyError" in blocker.args[1]


def test_busy_signal_brackets_the_work(qtbot, runner):
    gate = threading.Event()
    with qtbot.waitSignal(runner.busyChanged, check_params_cb=lambda b: b is True):
        runner.run(gate.wait, 5)
    assert runner.busy
    with qtbot.waitSignal(runner.busyChanged, check_params_cb=lambda b: b is False):
        gate.set()
    assert not runner.busy


def test_shutdown_waits_and_drops_callbacks(qtbot):
    r = JobRunner()
    called = []
    started, gate = threading.Event(), threading.Event()

    def work():
        started.set()
        return gate.wait(5)

    r.run(work, on_success=called.append)
    assert started.wait(5)
    gate.set()
    assert r.shutdown(5000)
    QApplication.processEvents()  # a queued delivery would run here; there must be none
    assert called == []
    with pytest.raises(RuntimeError):
        r.run(lambda: None)
    r.deleteLater()


def test_watch_delivers_an_outside_future_on_the_gui_thread(qtbot):
    import concurrent.futures

    from PySide6.QtCore import QThread
    from PySide6.QtWidgets import QApplication

    from slotkeeper.gui.jobs import JobRunner

    runner = JobRunner()
    got, threads = [], []

    def ok(value):
        got.append(value)
        threads.append(QThread.currentThread() is QApplication.instance().thread())

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with qtbot.waitSignal(runner.busyChanged, check_params_cb=lambda busy: busy is False):
            runner.watch(pool.submit(lambda: 41 + 1), on_success=ok, description="answer")
        assert got == [42] and threads == [True]
        failed = []
        with qtbot.waitSignal(runner.busyChanged, check_params_cb=lambda busy: busy is False):
            runner.watch(pool.submit(lambda: 1 / 0), on_failure=failed.append)
        assert isinstance(failed[0], ZeroDivisionError)
    runner.shutdown()
