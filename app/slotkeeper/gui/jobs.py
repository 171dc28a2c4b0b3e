"""The one way the GUI runs blocking work: a job on a thread pool, answered on the GUI thread.

Blocking work (disk reads of sessions, reading a model's header, a file dialog's search) must
never run on the GUI thread. ``JobRunner.run(fn, on_success=..., on_failure=...)`` runs ``fn`` on a private
QThreadPool and calls exactly one of the callbacks on the GUI thread with its result or its
exception. Errors are never swallowed: without ``on_failure`` the exception is logged with its
traceback and re-announced through ``jobFailed`` so a window can show it (like Anki's QueryOp
and napari's thread_worker). Engine commands run on the engine's own loop; ``watch`` delivers
their outcome the same way.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal, Slot

log = logging.getLogger(__name__)

# Engine work is mostly waiting on llama-server or the disk; a few threads are plenty, and a
# bound keeps a burst of clicks from hammering the server.
MAX_THREADS = 4
SHUTDOWN_WAIT_MS = 30_000


@dataclass
class Job:
    """A submitted job: its description (for messages) and whether it has finished."""

    id: int
    description: str
    on_success: Callable[[Any], None] | None
    on_failure: Callable[[BaseException], None] | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class _Runnable(QRunnable):
    def __init__(self, runner: JobRunner, job: Job, fn: Callable[[], Any]) -> None:
        super().__init__()
        self.setAutoDelete(True)
        self._runner = runner
        self._job = job
        self._fn = fn

    def run(self) -> None:  # on a pool thread
        try:
            result = self._fn()
        except BaseException as exc:
            log.debug("job %r failed", self._job.description, exc_info=True)
            self._runner._post(self._job.id, False, exc)
        else:
            self._runner._post(self._job.id, True, result)


class JobRunner(QObject):
    """Runs callables off the GUI thread; delivers their outcome on the GUI thread.

    Create it on the GUI thread. ``shutdown()`` waits for running jobs and drops pending
    callbacks, so nothing runs against widgets that are gone.
    """

    jobFailed = Signal(str, str)  # description, message: a failure nobody handled
    busyChanged = Signal(bool)
    _finished = Signal(int, bool, object)  # job id, ok, result or exception (any thread)

    def __init__(self, parent: QObject | None = None, max_threads: int = MAX_THREADS) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(max_threads)
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._finished.connect(self._deliver, Qt.ConnectionType.QueuedConnection)

    # -- submitting -----------------------------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_success: Callable[[Any], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        description: str = "",
        **kwargs: Any,
    ) -> Job:
        job = self._register(description or getattr(fn, "__name__", "job"), on_success, on_failure)
        self._pool.start(_Runnable(self, job, lambda: fn(*args, **kwargs)))
        return job

    def watch(
        self,
        future: concurrent.futures.Future,
        on_success: Callable[[Any], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        description: str = "",
    ) -> Job:
        """Deliver the outcome of work already running elsewhere (an engine command posted to its
        loop) on the GUI thread, like ``run`` does for its own jobs."""
        job = self._register(description or "engine command", on_success, on_failure)

        def done(f: concurrent.futures.Future) -> None:  # the engine's thread
            if f.cancelled():
                self._post(job.id, False, concurrent.futures.CancelledError(job.description))
            elif f.exception() is not None:
                self._post(job.id, False, f.exception())
            else:
                self._post(job.id, True, f.result())

        future.add_done_callback(done)
        return job

    def _register(self, description: str, on_success: Callable[[Any], None] | None,
                  on_failure: Callable[[BaseException], None] | None) -> Job:
        if self._closed:
            raise RuntimeError("the job runner has been shut down")
        job = Job(next(self._ids), description, on_success, on_failure)
        with self._lock:
            was_idle = not self._jobs
            self._jobs[job.id] = job
        if was_idle:
            self.busyChanged.emit(True)
        return job

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def shutdown(self, timeout_ms: int = SHUTDOWN_WAIT_MS) -> bool:
        """No new jobs; wait for running ones; their callbacks will not be called."""
        with self._lock:
            self._closed = True
        done = self._pool.waitForDone(timeout_ms)
        if not done:
            log.error("background jobs still running after %d ms: %s", timeout_ms,
                      ", ".join(j.description for j in self._jobs.values()))
        self._pool.clear()
        return done

    # -- delivering -----------------------------------------------------------------------
    def _post(self, job_id: int, ok: bool, payload: Any) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            if ok:
                job.result = payload
            else:
                job.error = payload
            job.done.set()
        with self._lock:
            if self._closed:
                self._jobs.pop(job_id, None)
                return
            # Emitted from the pool thread; the queued connection runs _deliver on ours.
            self._finished.emit(job_id, ok, payload)

    @Slot(int, bool, object)
    def _deliver(self, job_id: int, ok: bool, payload: Any) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            now_idle = not self._jobs
        if job is None or self._closed:
            return
        try:
            if ok:
                if job.on_success is not None:
                    job.on_success(payload)
            elif job.on_failure is not None:
                job.on_failure(payload)
            else:
                self._report(job, payload)
        except Exception as exc:  # a broken callback must be seen, not lost in the event loop
            log.exception("callback of job %r failed", job.description)
            self.jobFailed.emit(job.description, f"{type(exc).__name__}: {exc}")
        finally:
            if now_idle:
                self.busyChanged.emit(False)

    def _report(self, job: Job, exc: BaseException) -> None:
        log.error("%s failed", job.description, exc_info=(type(exc), exc, exc.__traceback__))
        self.jobFailed.emit(job.description, describe_error(exc))


def describe_error(exc: BaseException) -> str:
    """The message a person sees for an exception (core errors are written for people)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    return text
