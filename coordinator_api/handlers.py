"""Running a registered job's code for a replay: off the API's event loop, bounded in time and output.

The library's replay (:func:`txn.delivery.replay.replay_batch`) calls the handler in an executor
thread, but a handler may return a generator, and iterating it is the handler's code too: it may
compute for a long time, never end, or produce gigabytes. :class:`HandlerRunner` wraps the
registered handler (and a Spark transform's replayer) so that the whole call, iterating its result
included, runs in a thread pool of its own with a time limit per input, and its result is turned
into a list of outputs with :func:`txn.delivery.output.normalise`'s limits (outputs and bytes per
input). A limit that is hit raises :class:`~txn.delivery.output.OutputLimitExceeded` naming it,
which fails the replay with that reason; nothing is written.

A thread cannot be stopped from outside: a handler blocked for ever keeps its pool thread. The
caller stops waiting for it at the time limit (the replay fails), and the pool's size bounds how
many such threads there can be; once all are held, later handler calls wait in the queue and fail
at their own time limit. The API's event loop and the executor its database calls use are never
held.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from txn.delivery.output import Output, OutputLimitExceeded, normalise
from txn.message import Message


class HandlerRunner:
    """Runs handlers in a pool of ``threads`` threads with a time limit and output limits."""

    def __init__(self, timeout_s: float, max_outputs: int, max_bytes: int, threads: int = 4,
                 transform_timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self.transform_timeout_s = transform_timeout_s
        self.max_outputs = max_outputs
        self.max_bytes = max_bytes
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="replay-handler")

    def close(self) -> None:
        """Stop taking work (threads still running a handler are left to it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _timed_out(self, timeout_s: float) -> OutputLimitExceeded:
        return OutputLimitExceeded("deadline", timeout_s, f"the handler took longer than {timeout_s:g} s for one input")

    def _wait(self, fut: concurrent.futures.Future[list[Output]], timeout_s: float) -> list[Output]:
        try:
            return fut.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise self._timed_out(timeout_s) from None
        except OutputLimitExceeded as exc:
            if exc.limit == "deadline":
                raise self._timed_out(timeout_s) from None
            raise

    def _call(self, handler: Callable[[Message], Any], message: Message, deadline: float) -> list[Output]:
        result = handler(message)
        try:
            return normalise(result, max_outputs=self.max_outputs, max_bytes=self.max_bytes, deadline=deadline)
        finally:
            close = getattr(result, "close", None)  # a generator stopped early runs its clean-up now
            if callable(close) and not isinstance(result, (bytes, bytearray, memoryview, Output)):
                close()

    def wrap(self, handler: Callable[[Message], Any]) -> Callable[[Message], list[Output]]:
        """``handler`` bounded: it runs in the pool, its result is normalised there within the limits,
        and the caller waits at most ``timeout_s`` per input."""

        def bounded(message: Message) -> list[Output]:
            deadline = time.monotonic() + self.timeout_s
            return self._wait(self._pool.submit(self._call, handler, message, deadline), self.timeout_s)

        bounded.__qualname__ = getattr(handler, "__qualname__", "handler")  # the REPLAYED record names it
        return bounded

    def wrap_replayer(self, replayer: Callable[[str, list[Message]], Any],
                      ) -> Callable[[str, list[Message]], list[Output]]:
        """A transform runtime's replayer bounded the same way, over the whole batch: at most
        ``transform_timeout_s``, and the per-input limits times the batch's inputs."""

        def call(transform: str, messages: list[Message], deadline: float) -> list[Output]:
            n = max(1, len(messages))
            return normalise(replayer(transform, messages), max_outputs=self.max_outputs * n,
                             max_bytes=self.max_bytes * n, deadline=deadline)

        def bounded(transform: str, messages: list[Message]) -> list[Output]:
            deadline = time.monotonic() + self.transform_timeout_s
            return self._wait(self._pool.submit(call, transform, messages, deadline), self.transform_timeout_s)

        return bounded
