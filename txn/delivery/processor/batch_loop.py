"""The batch loop: collect a batch, let the ordering gate hold what must wait, hand it to the commit pipeline.

A batch closes at ``batch_max_messages``, ``batch_max_delay_ms`` or before its payloads would pass
``batch_max_bytes`` (the message that would pass it is held for the next batch, so a message larger
than the bound goes alone), or, with ``batch_entry_boundaries``, at the end of the producer's batch
entry it reached. While its
messages arrive, the next transaction is already being opened. Inputs that cannot be read are
set aside while collecting and parked before the batch is processed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from ...client import AsyncClient
from ...consumer import AsyncConsumer
from ...errors import CorruptMessage, Timeout
from ...message import Message, position
from ...transaction import AsyncTransaction
from ..batch_ids import processor_batch_id
from ..batch_txn import BatchScope
from ..batching import EntryBoundaries
from .config import ProcessorConfig, ProcessorStats


class BatchLoop:
    """Part of :class:`~txn.delivery.processor.AsyncProcessor`: ``run``/``stop`` and collecting batches."""

    client: AsyncClient
    config: ProcessorConfig
    stats: ProcessorStats
    instance: str
    fatal: BaseException | None
    _seq: int
    _consumer: AsyncConsumer | None
    _stopping: asyncio.Event
    _inflight: set[asyncio.Task[None]]
    _progress: TextIO | None
    _next_txn: asyncio.Task[AsyncTransaction] | None
    _entries: EntryBoundaries | None
    _corrupt: list[CorruptMessage]
    _handback: set[Any]
    #: A message that would have taken its batch past ``batch_max_bytes``: first in the next
    #: batch, unless the consumer re-subscribed or handed its inputs back since (it comes again).
    _held_over: tuple[Message, int] | None
    batches: BatchScope
    _redeliver_handed_back: Callable[[], Awaitable[None]]  # CommitPipeline's
    _audit_tick: Callable[[], Awaitable[None]]  # Redo's
    _audit_watch: Callable[[], Awaitable[None]]  # Redo's

    def _hand_back_skipped(self, idle: bool = False) -> None:
        """Inputs the broker skipped after a redelivery request are asked for again now, not after
        ``redeliver_idle_s``: those it sent past (``TopicConsumer.skipped_after_redeliver``), and,
        ``idle`` (a batch's wait without input, nothing committing), those it has not sent again
        at all (``stale_entries`` left: dropped as sent before the request, never seen since: no
        later entry shows the gap when they were the topic's last)."""
        assert self._consumer is not None
        for tc in self._consumer.topic_consumers:
            if tc.skipped_after_redeliver or (idle and tc.stale_entries):
                tc.skipped_after_redeliver = False
                tc.stale_entries.clear()
                self._handback.add(tc)

    def stop(self) -> None:
        """Ask the run loop to finish the batch in flight and return."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self, max_batches: int | None = None, idle_exit_ms: int | None = None) -> ProcessorStats:
        """Process batches until :meth:`stop` (or ``max_batches``, or ``idle_exit_ms`` without input)."""
        assert self._consumer is not None, "call start() first"
        last_progress = time.monotonic()
        idle_since = time.monotonic()
        last_wake = time.monotonic()  # the last batch, or the last idle redelivery request
        idle_wake = False  # the hand-back pending is the idle redelivery's (it keeps the idle clock)
        done = 0
        watch = asyncio.get_running_loop().create_task(self._audit_watch())
        try:
            while not self._stopping.is_set():
                if self.fatal is not None:
                    raise self.fatal
                self._hand_back_skipped()
                if self._handback:
                    woken, idle_wake = idle_wake, False
                    await self._redeliver_handed_back()
                    if not woken:  # a failed batch's inputs are on their way: not idle yet
                        idle_since = time.monotonic()
                await self._audit_tick()
                batch = await self._collect()
                while self._corrupt:
                    await self._park_corrupt(self._corrupt.pop(0))
                if self.config.ordering is not None:
                    batch = await self.config.ordering.gate(self, batch)
                now = time.monotonic()
                if self._progress is not None and now - last_progress >= self.config.progress_interval_s:
                    print(self.stats.line(self.config.job, len(self._inflight)), file=self._progress, flush=True)
                    last_progress = now
                if not batch:
                    if not self._inflight:
                        self._hand_back_skipped(idle=True)
                        if self._handback:
                            continue
                    if (idle_exit_ms is not None and (now - idle_since) * 1000 >= idle_exit_ms and not self._inflight
                            and not self._handback):
                        if self.config.ordering is None or not self.config.ordering.holding:
                            break
                    wake = self.config.redeliver_idle_s
                    if wake > 0 and now - last_wake >= wake and not self._inflight and self._consumer is not None:
                        # Idle for a while: have the broker send again what we hold unacknowledged.
                        self._handback.update(self._consumer.topic_consumers)
                        last_wake = now
                        idle_wake = True
                    continue
                idle_since = last_wake = now
                await self._process(batch, self._new_batch_id())
                done += 1
                if max_batches is not None and done >= max_batches:
                    break
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            if self._progress is not None:
                print(self.stats.line(self.config.job, 0), file=self._progress, flush=True)
        if self.fatal is not None:
            raise self.fatal
        return self.stats

    async def _collect(self) -> list[Message]:
        assert self._consumer is not None
        c = self.config
        consumer = self._consumer
        if self._next_txn is None and not self._stopping.is_set():
            # Open the next batch's transaction while its messages arrive.
            self._next_txn = asyncio.get_running_loop().create_task(self.batches.new_transaction())
        batch: list[Message] = []
        ids: set[tuple[str, int, int, int, int]] = set()
        deadline = time.monotonic() + c.batch_max_delay_ms / 1000.0
        held = self._entries.take(consumer.subscriptions_made) if self._entries is not None else None
        over, self._held_over = self._held_over, None
        if held is None and over is not None and over[1] == consumer.subscriptions_made:
            held = over[0]
        size = 0
        first_at = 0.0
        stop: asyncio.Future[Any] | None = None  # made on the first wait, for the whole batch
        try:
            while len(batch) < c.batch_max_messages and not self._stopping.is_set():
                m, held = self._receive_nowait() if held is None else held, None
                if m is None:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._corrupt:
                        break
                    if not consumer.zero_queue:
                        # Wait for the queue, not for one message: one wake-up takes in all that
                        # arrived together (an entry, a read), not a task and a wait per message.
                        if stop is None:
                            stop = asyncio.ensure_future(self._stopping.wait())
                        if not await self._await_input(left, stop):
                            break
                        continue
                    m = await self._receive_or_stop(max(1, int(left * 1000)))
                    if m is None:
                        break
                key = position(m)
                if key in ids:
                    # Redelivered while its first copy is still here (after a reconnect or an abort).
                    # A transaction that acknowledged one message twice would commit its output twice.
                    continue
                if c.batch_max_bytes > 0:
                    n = len(m.data())
                    if batch and size + n > c.batch_max_bytes:
                        self._held_over = (m, consumer.subscriptions_made)
                        break
                    size += n
                ids.add(key)
                if not batch:
                    first_at = time.monotonic()
                batch.append(m)
                if c.batch_max_bytes > 0 and size >= c.batch_max_bytes:
                    break
        finally:
            if stop is not None:
                stop.cancel()
        if self._entries is not None:
            self._entries.complete(batch, ids, self._receive_nowait, consumer.subscriptions_made)
        if batch:
            self.stats.batches_collected += 1
            self.stats.batch_wait_ms_total += (time.monotonic() - first_at) * 1000
        return batch

    def _receive_nowait(self) -> Message | None:
        """A queued message or None; unreadable ones are set aside to be parked."""
        assert self._consumer is not None
        while True:
            try:
                return self._consumer.receive_nowait()
            except CorruptMessage as exc:
                self._corrupt.append(exc)

    async def _await_input(self, timeout_s: float, stop: asyncio.Future[Any]) -> bool:
        """Wait until the consumer's queue holds something (or closes), up to ``timeout_s`` or
        :meth:`stop`; True unless the time ran out or the loop is stopping."""
        assert self._consumer is not None
        q = self._consumer.receive_queue
        ready = q.waiter()
        if ready is None:
            return True
        try:
            await asyncio.wait((ready, stop), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            q.forget(ready)
        return ready.done() and not ready.cancelled()

    async def _receive_or_stop(self, timeout_ms: int) -> Message | None:
        """Wait for a message, the timeout, or :meth:`stop`, whichever comes first."""
        assert self._consumer is not None
        recv = asyncio.ensure_future(self._consumer.receive(timeout_millis=timeout_ms))
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not recv.done():
            recv.cancel()
            try:
                await recv
            except (asyncio.CancelledError, Timeout):
                pass
            return None
        try:
            return recv.result()
        except Timeout:
            return None
        except CorruptMessage as exc:
            self._corrupt.append(exc)  # closes this batch early; the message is parked next
            return None

    def _new_batch_id(self) -> str:
        self._seq += 1
        return processor_batch_id(self.config.job, self.instance, self._seq)
