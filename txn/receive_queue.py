"""The consumer's bounded receive queue, usable from the event loop and from other threads.

The broker may only send as many messages as we granted permits, so the queue is
bounded by the sum of its consumers' ``receiver_queue_size``. Taking a message
out returns a permit; every half queue's worth, a FLOW command asks for more.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import AlreadyClosed, Timeout


class ReceiveQueue:
    """Messages waiting for ``receive``; fed by the event loop, drained by any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_taken: Callable[[Any, int], None]) -> None:
        self._loop = loop
        self._dq: deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._async_waiters: deque[asyncio.Future[None]] = deque()
        self._on_taken = on_taken  # (sub_consumer, n) -> None, called on the loop thread
        self._closed: BaseException | None = None

    def __len__(self) -> int:
        return len(self._dq)

    def put_many(self, items: list[Any]) -> None:
        """Append messages (event-loop thread)."""
        with self._cond:
            self._dq.extend(items)
            self._cond.notify(len(items))
        while self._async_waiters:
            w = self._async_waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    def _taken(self, item: Any) -> None:
        sub = item._consumer  # noqa: SLF001
        if sub is None:
            return
        n = sub.count_taken(1)
        if n:
            if _on_loop(self._loop):
                self._on_taken(sub, n)
            else:
                self._loop.call_soon_threadsafe(self._on_taken, sub, n)

    def get_nowait(self) -> Any | None:
        """Pop one message, or ``None``."""
        with self._cond:
            if self._closed is not None:
                raise self._closed
            item = self._dq.popleft() if self._dq else None
        if item is not None:
            self._taken(item)
        return item

    def get_blocking(self, timeout: float | None) -> Any:
        """Pop one message, waiting up to ``timeout`` seconds (other threads only)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._dq:
                if self._closed is not None:
                    raise self._closed
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Timeout("no message received within the timeout")
                self._cond.wait(remaining if remaining is not None else 1.0)
            if self._closed is not None:
                raise self._closed
            item = self._dq.popleft()
        self._taken(item)
        return item

    async def get(self, timeout: float | None) -> Any:
        """Pop one message, awaiting up to ``timeout`` seconds (event-loop thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            fut = self._loop.create_future()
            self._async_waiters.append(fut)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise Timeout("no message received within the timeout")
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                raise Timeout("no message received within the timeout") from None

    def remove_where(self, pred: Callable[[Any], bool]) -> int:
        """Drop queued messages matching ``pred``; returns how many (event-loop thread)."""
        with self._cond:
            keep = [m for m in self._dq if not pred(m)]
            removed = len(self._dq) - len(keep)
            self._dq.clear()
            self._dq.extend(keep)
        return removed

    def close(self, reason: BaseException | None = None) -> None:
        """Wake every waiter with ``reason`` (default :class:`AlreadyClosed`)."""
        with self._cond:
            self._closed = reason or AlreadyClosed("consumer is closed")
            self._cond.notify_all()
        for w in self._async_waiters:
            if not w.done():
                w.set_result(None)
        self._async_waiters.clear()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
