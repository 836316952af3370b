"""The consumer's bounded receive queue, usable from the event loop and from other threads.

The broker may only send as many messages as we granted permits, so the queue is
bounded by the sum of its consumers' ``receiver_queue_size``. Taking a message
out returns a permit; every half queue's worth, a FLOW command asks for more.
Permits are counted under the queue's lock by whichever thread takes or skips a
message, so none is ever lost (a lost permit would eventually stall the consumer).
A FLOW counted on another thread is sent by the event loop later, and only if the
consumer has not resubscribed meanwhile: its permits belonged to the old session,
and the new one was granted a full queue (a FLOW carried over would grant twice).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import AlreadyClosed, Timeout


class QueuedError:
    """Holds a corrupt entry's place in the queue; taking it raises ``error``.

    Its permits were counted when it was queued, so it counts none when taken.
    """

    __slots__ = ("error", "owner")
    consumer = None

    def __init__(self, error: BaseException, owner: Any) -> None:
        self.error = error
        self.owner = owner  # the sub-consumer whose entry it stands for


class ReceiveQueue:
    """Messages waiting for ``receive``; fed by the event loop, drained by any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_flow: Callable[[Any, int], None]) -> None:
        self._loop = loop
        self._dq: deque[Any] = deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sync_waiters = 0
        self._async_waiters: deque[asyncio.Future[None]] = deque()
        self._on_flow = on_flow  # (sub_consumer, n) -> None, called on the loop thread
        self._closed: BaseException | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that feeds the queue."""
        return self._loop

    def __len__(self) -> int:
        return len(self._dq)

    def snapshot(self) -> list[Any]:
        """A copy of what is queued, oldest first (for inspection; takes nothing out)."""
        with self._lock:
            return list(self._dq)

    def queued_for(self, sub: Any) -> int:
        """How many queued messages came from sub-consumer ``sub``."""
        with self._lock:
            return sum(1 for m in self._dq if m.consumer is sub)

    def put_many(self, items: list[Any]) -> None:
        """Append messages (event-loop thread)."""
        with self._lock:
            self._dq.extend(items)
            if self._sync_waiters:
                self._cond.notify(len(items))
        while self._async_waiters:
            w = self._async_waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    def put_error(self, error: BaseException, owner: Any) -> None:
        """Queue ``error`` after the messages already queued (event-loop thread)."""
        self.put_many([QueuedError(error, owner)])

    def count(self, sub: Any, n: int) -> int:
        """Count ``n`` permits used for ``sub``; returns permits to grant now (0 below threshold)."""
        with self._lock:
            return _count_locked(sub, n)

    def _flow(self, sub: Any, n: int, session: int) -> None:
        if _on_loop(self._loop):
            self._on_flow(sub, n)  # nothing ran on the loop since it was counted: same session
        else:
            self._loop.call_soon_threadsafe(self._flow_if_current, sub, n, session)

    def _flow_if_current(self, sub: Any, n: int, session: int) -> None:
        """Send a FLOW counted on another thread, unless ``sub`` resubscribed since (event-loop thread)."""
        if sub.session == session:
            self._on_flow(sub, n)

    def get_nowait(self) -> Any | None:
        """Pop one message, or ``None``."""
        with self._lock:
            if self._closed is not None:
                raise self._closed
            if not self._dq:
                return None
            item = self._dq.popleft()
            sub = item.consumer
            flow = session = 0
            if sub is not None:  # _count_locked(sub, 1), inlined: this runs once per message
                sub.taken += 1
                if sub.taken >= sub.threshold:
                    flow, sub.taken = sub.taken, 0
                    session = sub.session
            elif type(item) is QueuedError:
                raise item.error
        if flow:
            self._flow(sub, flow, session)
        return item

    def get_blocking(self, timeout: float | None) -> Any:
        """Pop one message, waiting up to ``timeout`` seconds (other threads only)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            item = self.get_nowait()  # raises once the queue is closed
            if item is not None:
                return item
            with self._cond:
                while not self._dq and self._closed is None:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise Timeout("no message received within the timeout")
                    self._sync_waiters += 1
                    try:
                        self._cond.wait(remaining if remaining is not None else 1.0)
                    finally:
                        self._sync_waiters -= 1

    def waiter(self) -> asyncio.Future[None] | None:
        """A future that completes once something is queued or the queue closes, or None when
        something is queued already (event-loop thread). :meth:`forget` it if it is given up."""
        if self._dq or self._closed is not None:
            return None
        return self._add_waiter()

    def _add_waiter(self) -> asyncio.Future[None]:
        fut = self._loop.create_future()
        self._async_waiters.append(fut)
        return fut

    def forget(self, fut: asyncio.Future[None]) -> None:
        """Drop a waiter given up on (a timeout): an idle consumer would pile them up otherwise."""
        if not fut.done():
            fut.cancel()
        try:
            self._async_waiters.remove(fut)
        except ValueError:
            pass

    async def get(self, timeout: float | None) -> Any:
        """Pop one message, awaiting up to ``timeout`` seconds (event-loop thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise Timeout("no message received within the timeout")
            fut = self._add_waiter()
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                raise Timeout("no message received within the timeout") from None
            finally:
                self.forget(fut)

    # ------------------------------------------------------------ batch receive

    def _batch_ready(self, max_n: int, max_bytes: int) -> bool:
        """True when the queue holds ``max_n`` messages or ``max_bytes`` bytes of payload (under the lock)."""
        dq = self._dq
        if not dq:
            return False
        if max_n > 0 and len(dq) >= max_n:
            return True
        if max_bytes > 0:
            total = 0
            for item in dq:
                total += _size(item)
                if total >= max_bytes:
                    return True
        return False

    def _take_batch_locked(self, max_n: int, max_bytes: int) -> tuple[list[Any], list[tuple[Any, int, int]]]:
        """Pop messages while the batch stays within ``max_n`` messages and ``max_bytes`` bytes (the
        first is always taken); a queued error ends the batch, or is raised if it comes first.
        Returns the batch and the FLOWs to send (sub-consumer, permits, session)."""
        out: list[Any] = []
        flows: list[tuple[Any, int, int]] = []
        size = 0
        dq = self._dq
        while dq:
            item = dq[0]
            if type(item) is QueuedError:
                if not out:
                    dq.popleft()
                    raise item.error
                break
            n = _size(item)
            if out and ((0 < max_n <= len(out)) or (max_bytes > 0 and size + n > max_bytes)):
                break
            dq.popleft()
            out.append(item)
            size += n
            sub = item.consumer
            if sub is not None:
                flow = _count_locked(sub, 1)
                if flow:
                    flows.append((sub, flow, sub.session))
        return out, flows

    def get_batch_blocking(self, max_n: int, max_bytes: int, timeout: float | None) -> list[Any]:
        """Wait until ``max_n`` messages or ``max_bytes`` bytes are queued, or ``timeout`` seconds
        passed (None: no time limit), then pop a batch within those limits (other threads only)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed is not None:
                    raise self._closed
                if self._batch_ready(max_n, max_bytes):
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._sync_waiters += 1
                try:
                    self._cond.wait(remaining if remaining is not None else 1.0)
                finally:
                    self._sync_waiters -= 1
            out, flows = self._take_batch_locked(max_n, max_bytes)
        for sub, n, session in flows:
            self._flow(sub, n, session)
        return out

    async def get_batch(self, max_n: int, max_bytes: int, timeout: float | None) -> list[Any]:
        """As :meth:`get_batch_blocking`, awaiting (event-loop thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._closed is not None:
                    raise self._closed
                remaining = None if deadline is None else deadline - time.monotonic()
                if self._batch_ready(max_n, max_bytes) or (remaining is not None and remaining <= 0):
                    out, flows = self._take_batch_locked(max_n, max_bytes)
                    break
            fut = self._add_waiter()
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                self.forget(fut)
        for sub, n, session in flows:
            self._flow(sub, n, session)
        return out

    def remove_where(self, pred: Callable[[Any], bool]) -> int:
        """Drop queued messages matching ``pred``; returns how many (event-loop thread)."""
        with self._lock:
            keep = [m for m in self._dq if not pred(m)]
            removed = len(self._dq) - len(keep)
            self._dq.clear()
            self._dq.extend(keep)
        return removed

    def reset(self, sub: Any) -> None:
        """Start a new session for ``sub`` (a resubscribe, which grants a full queue again): forget
        its uncounted permits, and drop the FLOWs of the old session still on their way from other
        threads (event-loop thread)."""
        with self._lock:
            sub.taken = 0
            sub.session += 1

    def close(self, reason: BaseException | None = None) -> None:
        """Wake every waiter with ``reason`` (default :class:`AlreadyClosed`)."""
        with self._lock:
            self._closed = reason or AlreadyClosed("consumer is closed")
            self._cond.notify_all()
        for w in self._async_waiters:
            if not w.done():
                w.set_result(None)
        self._async_waiters.clear()


def _size(item: Any) -> int:
    """Payload bytes of a queued message (0 for a queued error)."""
    return 0 if type(item) is QueuedError else len(item.data())


def _count_locked(sub: Any, n: int) -> int:
    sub.taken += n
    if sub.taken >= sub.threshold:
        out, sub.taken = sub.taken, 0
        return out
    return 0


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
