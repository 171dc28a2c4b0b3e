"""The engine's one owner: an asyncio event loop, and the executors its blocking work runs on.

Every change to the engine's state happens in a callback or coroutine on this loop. Other threads
(the supervisor's, the log tailer's, the GUI's) never touch that state: they post to the loop
(``post``, ``call``, ``call_soon``) and read the immutable snapshot the engine publishes.

Blocking work leaves the loop so that polling, log figures and events keep flowing while it runs:
- ``io``: HTTP to llama-server and session file work (a save, a restore check, a hash). Several
  may run at once; the engine serialises them per slot.
- ``bookkeeping``: one thread, first in first out, for small writes whose order matters (the
  request history, the in-slots file, a sidecar's reuse figures).

The loop runs on its own thread (the desktop app) or on the caller's thread (`slotkeeper serve`,
through ``run``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

IO_THREADS = 16  # slot actions wait while a slot generates; enough for many slots and the poller


class LoopClosed(RuntimeError):
    """The engine has shut down; nothing more runs on its loop."""


class EngineLoop:
    def __init__(self, name: str = "slotkeeper-engine") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.io = concurrent.futures.ThreadPoolExecutor(IO_THREADS, thread_name_prefix="engine-io")
        self.bookkeeping = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-books")
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._closed = False
        self._background: set[asyncio.Future[Any]] = set()

    # -- running --------------------------------------------------------------------------
    def start_thread(self) -> None:
        """Run the loop on a thread of its own until ``close``."""
        if self._thread is not None:
            return
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self._ident = threading.get_ident()
            self.loop.call_soon(started.set)
            try:
                self.loop.run_forever()
            finally:
                self._finish()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        started.wait()

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run the loop on the calling thread until ``main`` returns, then close it."""
        if self._thread is not None:
            raise RuntimeError("this loop already runs on its own thread")
        asyncio.set_event_loop(self.loop)
        self._ident = threading.get_ident()
        try:
            return self.loop.run_until_complete(main)
        finally:
            self._closed = True
            self._finish()
            asyncio.set_event_loop(None)

    def _finish(self) -> None:
        """On the loop's thread, after it stopped: cancel what is left, close everything."""
        try:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        except Exception:
            log.debug("closing the engine loop", exc_info=True)
        finally:
            self.io.shutdown(wait=True, cancel_futures=True)
            self.bookkeeping.shutdown(wait=True)
            self.loop.close()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop (from any other thread) and wait for its thread to end."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            self.loop.close()
            return
        if self.in_loop():
            raise RuntimeError("close() from the loop's own thread would wait for itself")
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:
            pass  # already closed
        self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop(self) -> bool:
        return threading.get_ident() == self._ident

    # -- from other threads ---------------------------------------------------------------
    def post(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; returns at once with a future for its result."""
        if self._closed:
            coro.close()
            raise LoopClosed("the engine has shut down")
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError as exc:  # the loop closed in between
            coro.close()
            raise LoopClosed("the engine has shut down") from exc

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (never from the loop itself)."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("a blocking call into the engine from its own loop would wait for itself")
        return self.post(coro).result(timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Schedule ``fn(*args)`` on the loop; False when the loop has gone."""
        if self._closed:
            return False
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    # -- from the loop --------------------------------------------------------------------
    async def run_io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking ``fn`` on the I/O threads and await its result."""
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        try:
            future = self.loop.run_in_executor(self.io, call)
        except RuntimeError as exc:  # the executor has shut down (the interpreter is exiting)
            raise LoopClosed("the engine has shut down") from exc
        return await future

    def in_background(self, fn: Callable[..., Any], *args: Any, what: str = "") -> None:
        """Run a small write on the bookkeeping thread, in order, without waiting for it."""
        if self._closed:
            return
        try:
            fut = self.loop.run_in_executor(self.bookkeeping, functools.partial(fn, *args))
        except RuntimeError:  # the interpreter is exiting
            return
        self._background.add(fut)

        def done(f: asyncio.Future[Any]) -> None:
            self._background.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.warning("%s failed: %s", what or getattr(fn, "__name__", "background write"),
                            f.exception())

        fut.add_done_callback(done)

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        """A task whose failure is logged, never lost."""
        task = self.loop.create_task(coro, name=what)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if t.cancelled() or t.exception() is None:
                return
            if isinstance(t.exception(), LoopClosed):
                log.debug("%s ended: the engine has shut down", what)
            else:
                log.error("%s failed", what, exc_info=t.exception())

        task.add_done_callback(done)
        return task
