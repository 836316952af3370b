"""The one bridge from blocking code to the asyncio core.

Two ways in, and nothing else in the project starts or drives an event loop from blocking code:

- :class:`LoopThread`: a daemon thread that owns one event loop for a long-lived object (the
  synchronous :class:`~txn.sync.Client`, the Spark source's client). Blocking callers hand it
  coroutines with :meth:`LoopThread.run` and wait; callbacks run on its thread.
- :func:`run_blocking`: a one-shot entry point (``Processor.run``, ``replay``, the Spark sink's
  driver calls) runs a coroutine to completion on a fresh loop in the calling thread, which keeps
  signal handlers working in the main thread. Called from inside a running event loop it raises
  :class:`BlockingCallInEventLoop` at once instead of failing deep inside asyncio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import Timeout

R = TypeVar("R")


class BlockingCallInEventLoop(RuntimeError):
    """A blocking call was made where it would block the event loop that must complete it."""


class LoopThread:
    """A daemon thread running one event loop; blocking code runs coroutines on it.

    ``LoopThread(name)`` starts the thread at once; :meth:`close` stops the loop and joins it.
    """

    def __init__(self, name: str = "txn-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop (for ``call_soon_threadsafe`` and loop-bound objects)."""
        return self._loop

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (a callback, a coroutine on it)."""
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        """Run ``coro`` on the loop and block until it returns (or raises).

        ``timeout`` (seconds) cancels it and raises :class:`~txn.Timeout`. Calling this from the
        loop's own thread would deadlock, so it raises :class:`BlockingCallInEventLoop` instead.
        """
        if self.in_loop_thread():
            coro.close()
            raise BlockingCallInEventLoop("blocking txn call made from a txn callback; use the async API there")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise Timeout(f"operation did not finish within {timeout}s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop (thread-safe, returns at once)."""
        self._loop.call_soon_threadsafe(fn, *args)

    def close(self, timeout: float = 10) -> None:
        """Stop the loop and join the thread; the loop is closed once the thread has ended."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()


def run_blocking(coro: Coroutine[Any, Any, R], what: str = "this call") -> R:
    """Run ``coro`` to completion on a new event loop in this thread (as :func:`asyncio.run`).

    Raises :class:`BlockingCallInEventLoop` (and closes ``coro``) when this thread already runs an
    event loop: a blocking entry point cannot complete there; await its async form instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise BlockingCallInEventLoop(f"{what} blocks, so it cannot run inside a running event loop; "
                                  "await the async API instead")


__all__ = ["BlockingCallInEventLoop", "LoopThread", "run_blocking"]
