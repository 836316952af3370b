""":class:`AsyncProducer`: the public producer; routes each message to a partition's producer."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..args import check_send, deliver_time
from ..context import ClientContext
from ..errors import AlreadyClosed, ProducerQueueIsFull, PulsarError, Result
from ..message import Message, MessageId, TxnID
from ..protocol import NULL_PAYLOAD
from .config import _NO_TXN, BatchEntry, PartitionsRoutingMode, ProducerConfig
from .partition import PartitionProducer
from .routing import hash_function

if TYPE_CHECKING:
    from ..transaction import AsyncTransaction

log = logging.getLogger("txn.producer")


class AsyncProducer:
    """A producer on a topic (all partitions of a partitioned topic)."""

    def __init__(self, ctx: ClientContext, topic: str, conf: ProducerConfig) -> None:
        self._ctx = ctx
        self._topic = topic
        self.conf = conf
        self._parts: list[PartitionProducer] = []
        self._closed = False
        self._rr = 0  # the round-robin cursor: the partition of the next (or current batch's) message
        self._rr_routed = 0  # messages routed to the cursor's partition since it last moved (batching on)
        self._single = -1  # UseSinglePartition: the partition, chosen in start()
        self._hash = hash_function(conf.hashing_scheme)

    async def start(self) -> None:
        """Create the producer on every partition (the client calls it; raises the broker's error)."""
        n = await self._ctx.pool.partitions(self._topic)
        if n == 0:
            self._parts = [PartitionProducer(self._ctx, self._topic, -1, self.conf, self.conf.max_pending_messages)]
        else:
            per = max(1, min(self.conf.max_pending_messages, self.conf.max_pending_messages_across_partitions // n))
            self._parts = [
                PartitionProducer(self._ctx, f"{self._topic}-partition-{i}", i, self.conf, per)
                for i in range(n)
            ]
        # As the official client: a random start for the round-robin cursor and the single partition.
        self._rr = random.randrange(len(self._parts))
        self._single = random.randrange(len(self._parts))
        try:
            await asyncio.gather(*(p.start() for p in self._parts))
        except BaseException:
            await asyncio.gather(*(p.close() for p in self._parts), return_exceptions=True)
            raise

    def topic(self) -> str:
        """The topic this producer writes to."""
        return self._topic

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def partition_producers(self) -> list[PartitionProducer]:
        """One :class:`PartitionProducer` per partition (one for a non-partitioned topic)."""
        return self._parts

    async def wait_space(self) -> None:
        """Wait until every partition's pending window has room (backpressure)."""
        await asyncio.gather(*(p.wait_space() for p in self._parts))

    def producer_name(self) -> str:
        """Name the broker gave this producer (first partition's for partitioned topics)."""
        return self._parts[0].producer_name if self._parts else ""

    def last_sequence_id(self) -> int:
        """Highest sequence id confirmed by the broker."""
        return max((p.last_sequence_id_published for p in self._parts), default=-1)

    def _route(self, partition_key: str | None, routed: int | None = None) -> PartitionProducer:
        """The partition producer of a message, as the official client routes: a keyed message
        by ``hash(key) % partitions``; one without a key by ``message_routing_mode``:
        ``UseSinglePartition`` to the producer's one partition, ``RoundRobinDistribution`` to
        partition after partition from a random one; with batching on, to the same partition until its open
        batch has been sent (full, flushed or its publish delay passed), then to the next. ``routed``:
        the partition the producer's ``message_router`` chose (:meth:`_custom_route`)."""
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        if routed is not None:
            return parts[routed]
        if partition_key:
            return parts[self._hash(partition_key) % len(parts)]
        conf = self.conf
        if conf.message_routing_mode == PartitionsRoutingMode.UseSinglePartition:
            return parts[self._single]
        if not conf.batching_enabled:
            part = parts[self._rr % len(parts)]
            self._rr += 1
            return part
        part = parts[self._rr % len(parts)]
        if self._rr_routed and not part.has_open_batch():
            self._rr += 1
            self._rr_routed = 0
            part = parts[self._rr % len(parts)]
        self._rr_routed += 1
        return part

    def _custom_route(self, data: bytes, properties: dict[str, str] | None, partition_key: str | None,
                      event_timestamp: int | None, ordering_key: str | None) -> int | None:
        """The partition index the producer's ``message_router`` gives the message (None without a
        router or with one partition); raises ``ValueError`` before anything is queued if it is not
        an index of the topic's partitions."""
        router = self.conf.message_router
        n = len(self._parts)
        if router is None or n == 1:
            return None
        msg = Message(data, dict(properties or {}), MessageId(), self._topic, partition_key or None, 0,
                      event_timestamp or 0, 0, self.producer_name(), -1,
                      ordering_key=None if ordering_key is None else ordering_key.encode())
        index = router(msg, n)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"message_router returned {index!r}: not a partition index of {self._topic} "
                             f"(0 to {n - 1}); nothing was sent")
        return index

    def check_content(self, content: Any, encoded: bool = False) -> bytes:
        """``content`` as bytes; raises if the producer is closed or ``content`` is not bytes-like.

        ``None`` (not encoded by a schema) is a null-value message, a tombstone: ``NULL_PAYLOAD``.
        ``encoded``: the content is already encoded by the producer's schema."""
        if self._closed:
            raise AlreadyClosed("producer is closed", topic=self._topic)
        if content is None:
            return NULL_PAYLOAD
        if self.conf.schema is not None and not encoded:
            content = self.conf.schema.encode(content)
        if isinstance(content, str):
            raise TypeError("content must be bytes; encode str payloads first")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        return bytes(content)

    async def send_async(
        self,
        content: bytes | None,
        callback: Callable[[Result, MessageId | None], Any] | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        *,
        event_timestamp: int | None = None,
        txn: AsyncTransaction | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
        encoded: bool = False,
    ) -> asyncio.Future[MessageId]:
        """Queue a message; returns a future of its :class:`MessageId`.

        The message arguments come in the official ``send``'s order; bad types raise
        ``ValueError`` before anything is queued. ``deliver_at`` (ms since the epoch) or
        ``deliver_after`` delay its delivery to Shared and Key_Shared subscriptions. Awaits for
        room in the pending window when ``block_if_queue_full`` is set, otherwise raises
        :class:`ProducerQueueIsFull` when it is full. ``content=None`` is a null-value message
        (a tombstone), as in the official client. ``encoded=True``: ``content`` is bytes already
        encoded by the producer's schema (it is sent as it is, under the schema's version).
        """
        check_send(properties, partition_key, ordering_key, sequence_id, event_timestamp)
        deliver = deliver_time(deliver_at, deliver_after)
        data = self.check_content(content, encoded)
        part = self._route(partition_key, self._custom_route(data, properties, partition_key, event_timestamp,
                                                             ordering_key))
        part.check_usable()
        tid = await self._admit(part, txn)
        fut = part.enqueue(data, properties, partition_key, event_timestamp, sequence_id, tid,
                           None if ordering_key is None else ordering_key.encode(), deliver)
        if txn is not None:
            txn.add_op(fut)
        if callback is not None:
            fut.add_done_callback(lambda f: run_callback(callback, f))
        return fut

    async def send_many(
        self,
        messages: Iterable[tuple[bytes | None, dict[str, str] | None, str | None]],
        txn: AsyncTransaction | None = None,
        *,
        encoded: bool = False,
    ) -> list[asyncio.Future[MessageId]]:
        """Queue ``(content, properties, partition_key)`` messages, each as :meth:`send_async`
        would (same checks, routing, batching, pending window), without a future per message.

        Returns the distinct futures of the batches they went into, in order: each resolves with
        the id of the batch's first message of this call once the batch's receipt comes, or fails
        with the batch. Awaiting all of them awaits every message's receipt. Use it where only
        the outcome of the whole lot matters (a transaction's outputs): it saves a future and a
        :class:`MessageId` per message. A message that cannot be batched (batching off or
        key-based, encryption, over the broker's size limit) gets a future of its own in the list.
        Raises before queueing the message at fault; the ones before it are queued.
        """
        out: dict[int, asyncio.Future[MessageId]] = {}
        registered: set[PartitionProducer] = set()  # partitions known to be in the transaction
        single = self._parts[0] if len(self._parts) == 1 and self.conf.message_router is None else None
        tid = _NO_TXN
        if txn is not None:
            txn.check_open()
            tid = txn.id
        for content, properties, partition_key in messages:
            if properties is not None or partition_key is not None:
                check_send(properties, partition_key, None, None, None)
            data = self.check_content(content, encoded)
            part = single if single is not None else self._route(
                partition_key, self._custom_route(data, properties, partition_key, None, None))
            if part not in registered:
                if txn is not None and not txn.partition_registered(part.topic):
                    tid = await self._admit(part, txn)  # awaits: the transaction is checked again there
                registered.add(part)
            if not part.has_space():
                tid = await self._admit(part, txn)
            fut = part.enqueue_quiet(data, properties, partition_key, tid)
            if id(fut) not in out:
                out[id(fut)] = fut
                if txn is not None:
                    txn.add_op(fut)
        return list(out.values())

    async def _admit(self, part: PartitionProducer, txn: AsyncTransaction | None) -> TxnID:
        """Register ``part`` in ``txn`` (once) and wait for room in its pending window; the txn id to send."""
        tid = _NO_TXN
        if txn is not None:
            if not txn.partition_registered(part.topic):
                await txn.register_partition(part.topic)
            txn.check_open()
            tid = txn.id
        if not part.has_space():
            if not self.conf.block_if_queue_full:
                raise ProducerQueueIsFull(
                    f"pending window of {part.window} messages is full", topic=part.topic
                )
            await part.wait_space()
            part.check_usable()
        return tid

    async def send_batch_async(
        self,
        entries: Sequence[BatchEntry],
        first_sequence_id: int,
        txn: AsyncTransaction | None = None,
        encoded: bool = False,
    ) -> list[asyncio.Future[MessageId]]:
        """Send ``entries`` — ``(content, properties, partition_key[, event_time_ms])`` each — as one batch message.

        Entry ``i`` gets sequence id ``first_sequence_id + i``; returns one future per entry, all
        resolved together by the batch's receipt (or failed together), so awaiting the last one
        is enough. Unlike the producer's own batching, whose batch
        boundaries depend on timing, the caller decides what goes into the batch and which ids it
        has: re-sending the same entries with the same ids (e.g. from a retried task under the
        same producer name) builds the same batch, which broker deduplication then drops whole
        (the broker compares the batch's first sequence id with the highest it has seen). Works
        whatever the batching settings. On a partitioned topic the batch goes where
        :meth:`send_async` would send the first entry (by its key). Waits for room in the pending
        window like :meth:`send_async` (a batch may overshoot the window once).
        """
        if not entries:
            raise ValueError("a batch needs at least one message")
        data: list[BatchEntry] = [(self.check_content(e[0], encoded), *e[1:]) for e in entries]  # type: ignore[misc]
        first = data[0]
        part = self._route(first[2], self._custom_route(first[0], first[1], first[2],
                                                        first[3] if len(first) > 3 else None, None))  # type: ignore[misc]
        part.check_usable()
        tid = await self._admit(part, txn)
        futs = part.enqueue_batch(data, first_sequence_id, tid)
        if txn is not None:
            txn.add_op(futs[-1])  # the batch's futures resolve (or fail) together: one op tracks it
        return futs

    def send_nowait(
        self,
        content: bytes | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        sequence_id: int | None = None,
        block: bool = True,
        ordering_key: str | None = None,
    ) -> asyncio.Future[MessageId] | None:
        """Queue a non-transactional message without awaiting; ``None`` if the window is full."""
        check_send(properties, partition_key, ordering_key, sequence_id, event_timestamp)
        data = self.check_content(content)
        part = self._route(partition_key, self._custom_route(data, properties, partition_key, event_timestamp,
                                                             ordering_key))
        if not part.has_space():
            if block:
                return None
            raise ProducerQueueIsFull("pending window is full", topic=part.topic)
        return part.enqueue(data, properties, partition_key, event_timestamp, sequence_id, _NO_TXN,
                            None if ordering_key is None else ordering_key.encode())

    async def send(
        self,
        content: bytes | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        *,
        event_timestamp: int | None = None,
        txn: AsyncTransaction | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send a message and wait for the broker's receipt (arguments as in :meth:`send_async`).

        With batching on, the message waits for its batch as in ``pulsar.asyncio``: up to
        ``batching_max_publish_delay_ms``, so concurrent sends share a batch. :meth:`send_now`
        sends at once."""
        fut = await self.send_async(
            content,
            properties=properties,
            partition_key=partition_key,
            ordering_key=ordering_key,
            sequence_id=sequence_id,
            event_timestamp=event_timestamp,
            txn=txn,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )
        return await fut

    async def send_now(
        self,
        content: bytes | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        *,
        event_timestamp: int | None = None,
        txn: AsyncTransaction | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """:meth:`send`, but the open batch goes out at once rather than after the publish delay
        (what the blocking ``Producer.send`` does, as the official client's)."""
        fut = await self.send_async(
            content,
            properties=properties,
            partition_key=partition_key,
            ordering_key=ordering_key,
            sequence_id=sequence_id,
            event_timestamp=event_timestamp,
            txn=txn,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )
        if self.conf.batching_enabled:
            self.flush_now()
        return await fut

    def flush_now(self) -> None:
        """Send the open batches now, without waiting for receipts."""
        for p in self._parts:
            p.flush_now()

    def check_size(self, content: bytes) -> None:
        """Raise :class:`MessageTooBig` if ``content`` exceeds the broker's limit on any partition."""
        for p in self._parts:
            p.check_size(content)

    async def flush(self) -> None:
        """Send open batches and wait for all pending receipts."""
        await asyncio.gather(*(p.flush() for p in self._parts))

    async def close(self, flush: bool = True) -> None:
        """Flush (unless ``flush`` is False: pending sends then fail), then close. Further sends
        raise :class:`AlreadyClosed`."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.close(flush) for p in self._parts), return_exceptions=True)
        self._ctx.forget(self)

    def reconnect_count(self) -> int:
        """How many times partitions re-created themselves on the broker (each may have re-sent frames)."""
        return sum(p.reconnects for p in self._parts)

    def partition_of(self, partition_key: str | None) -> str | None:
        """The partition a message with ``partition_key`` goes to, or None when that is not fixed
        (no key, on a topic of several partitions)."""
        parts = self._parts
        if len(parts) == 1:
            return parts[0].topic
        if partition_key and self.conf.message_router is None:
            return parts[self._hash(partition_key) % len(parts)].topic
        return None

    def partition_topics(self) -> list[str]:
        """The topic (partition) names this producer writes to."""
        return [p.topic for p in self._parts]

    def is_connected(self) -> bool:
        """True when every partition has a live broker connection (False once closed)."""
        return not self._closed and all(p.ready for p in self._parts)


def run_callback(callback: Callable[[Result, MessageId | None], Any], fut: asyncio.Future[MessageId]) -> None:
    """Call a send callback ``(result, message_id)`` for a settled send future; a raising callback is logged."""
    try:
        if fut.cancelled():
            callback(Result.UnknownError, None)
        elif fut.exception() is not None:
            exc = fut.exception()
            callback(exc.result if isinstance(exc, PulsarError) else Result.UnknownError, None)
        else:
            callback(Result.Ok, fut.result())
    except Exception:
        log.exception("send callback raised")
