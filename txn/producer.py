"""Producers: batching, compression, a bounded pending window, receipts, timeouts, reconnects.

Each partition has a ``PartitionProducer`` holding an ordered deque of frames
awaiting their receipts. After a reconnect the same frames, with the same
sequence ids, are written again before anything new, so the broker's
deduplication (when enabled) drops the repeats and nothing confirmed is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from .backoff import Backoff
from .connection import Connection, check_error, command, next_request_id
from .context import ClientContext
from .errors import (
    AlreadyClosed,
    ConnectError,
    MessageTooBig,
    ProducerQueueIsFull,
    PulsarError,
    Result,
    Timeout,
    from_server_error,
)
from .message import MessageId, TxnID
from .protocol import CompressionType, compress, encode_entry, encode_payload_frame, pb

if TYPE_CHECKING:
    from .transaction import AsyncTransaction

log = logging.getLogger("txn.producer")
T = pb.BaseCommand
_NO_TXN = TxnID(-1, -1)

#: One message of an explicit batch (:meth:`AsyncProducer.send_batch_async`): content, properties, partition key.
#: ``(content, properties, partition_key)``, optionally with a 4th item: the event time (epoch ms) or None.
BatchEntry = (tuple[bytes, dict[str, str] | None, str | None]
              | tuple[bytes, dict[str, str] | None, str | None, int | None])


class ProducerAccessMode(IntEnum):
    """Who may produce to the topic (names as in ``pulsar.ProducerAccessMode``)."""

    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


@dataclass(slots=True)
class ProducerConfig:
    """Producer settings; names follow ``pulsar.Client.create_producer``."""

    producer_name: str | None = None
    initial_sequence_id: int | None = None
    send_timeout_millis: int = 30000
    compression_type: CompressionType = CompressionType.NONE
    max_pending_messages: int = 1000
    max_pending_messages_across_partitions: int = 50000
    block_if_queue_full: bool = False
    batching_enabled: bool = True
    batching_max_messages: int = 1000
    batching_max_allowed_size_in_bytes: int = 128 * 1024
    batching_max_publish_delay_ms: int = 10
    properties: dict[str, str] = field(default_factory=dict)
    access_mode: ProducerAccessMode = ProducerAccessMode.Shared


@dataclass(slots=True)
class _Op:
    """A frame awaiting its receipt: one message or one batch."""

    seq: int
    highest: int
    frame: bytes
    futures: list[asyncio.Future[MessageId]]
    batched: bool
    created: float
    txn: TxnID


class _Batch:
    __slots__ = ("entries", "futures", "size", "txn", "first_seq", "last_seq")

    def __init__(self, txn: TxnID, first_seq: int) -> None:
        self.entries: list[bytes] = []
        self.futures: list[asyncio.Future[MessageId]] = []
        self.size = 0
        self.txn = txn
        self.first_seq = first_seq
        self.last_seq = first_seq


def _kv(props: dict[str, str] | None) -> list[pb.KeyValue]:
    if not props:
        return []
    out = []
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"message properties must be str -> str, got {k!r}: {v!r}")
        out.append(pb.KeyValue(key=k, value=v))
    return out


class PartitionProducer:
    """Producer for one (non-partitioned topic or) partition; :class:`AsyncProducer` routes to it.

    Package-internal, public for the facades and tests: ``window`` (its share of the pending
    window), ``queued`` (messages in the open batch plus those awaiting receipts), ``ready``
    (created on a live connection) and ``conn`` (that connection, or None).
    """

    def __init__(self, ctx: ClientContext, topic: str, partition: int, conf: ProducerConfig, window: int) -> None:
        self._ctx = ctx
        self.topic = topic
        self.partition = partition
        self.conf = conf
        self.producer_id = ctx.next_id()
        self.producer_name = conf.producer_name or ""
        self._user_named = conf.producer_name is not None
        self.window = window
        self.queued = 0  # messages in batch + pending ops
        self._pending: deque[_Op] = deque()
        self._batch: _Batch | None = None
        self._batch_timer: asyncio.TimerHandle | None = None
        self._seq = -1
        self.conn: Connection | None = None
        self.ready = False
        self._closed = False
        self._fatal: PulsarError | None = None
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._timeout_task: asyncio.Task[None] | None = None
        self._epoch = 0
        self.reconnects = 0  # re-creations after the first: a resend may have happened
        self._topic_epoch: int | None = None
        self.max_message_size = 5 * 1024 * 1024
        self.last_sequence_id_published = -1

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Create the producer on the broker (raises the broker's error).

        ``ProducerBusy`` is retried until the operation timeout: after a crash the broker may
        still hold the previous holder of a fixed producer name until it notices.
        """
        pool = self._ctx.pool
        await pool.retrying(f"create producer on {self.topic}", self._create, topic=self.topic)
        loop = asyncio.get_running_loop()
        self._timeout_task = loop.create_task(self._timeout_loop())

    async def _create(self) -> None:
        conn = await self._ctx.pool.connection_for(self.topic)
        rid = next_request_id()
        conn.producers[self.producer_id] = self
        fields: dict[str, Any] = {
            "topic": self.topic,
            "producer_id": self.producer_id,
            "request_id": rid,
            "epoch": self._epoch,
            "metadata": _kv(self.conf.properties),
            "txn_enabled": True,
            "producer_access_mode": int(self.conf.access_mode),
        }
        if self._topic_epoch is not None:
            fields["topic_epoch"] = self._topic_epoch
        if self.producer_name:
            fields["producer_name"] = self.producer_name
            fields["user_provided_producer_name"] = self._user_named
        try:
            resp = await conn.request(command(T.PRODUCER, **fields), rid)
            while resp.type == T.PRODUCER_SUCCESS and not resp.producer_success.producer_ready:
                # Waiting for exclusive access: the broker sends a second success later.
                resp = await conn.request(command(T.PRODUCER, **fields), rid)
            check_error(resp, "create producer", topic=self.topic)
        except BaseException:
            conn.producers.pop(self.producer_id, None)
            raise
        ok = resp.producer_success
        self.producer_name = ok.producer_name
        if ok.HasField("topic_epoch"):
            self._topic_epoch = ok.topic_epoch
        self.conn = conn
        self.max_message_size = conn.max_message_size
        if self._seq < 0:
            if self.conf.initial_sequence_id is not None:
                self._seq = self.conf.initial_sequence_id + 1
            else:
                self._seq = ok.last_sequence_id + 1 if ok.last_sequence_id >= 0 else 0
        self.last_sequence_id_published = ok.last_sequence_id
        if self._epoch > 0:
            self.reconnects += 1
        # Re-send what was not confirmed, in order, with the same sequence ids.
        for op in self._pending:
            conn.write(op.frame)
        self.ready = True
        self._epoch += 1

    def on_connection_closed(self, conn: Connection, exc: BaseException) -> None:
        if self.conn is conn:
            self.ready = False
            self.conn = None
            self._schedule_reconnect(exc)

    def on_broker_close(self) -> None:
        self.ready = False
        if self.conn is not None:
            self.conn.producers.pop(self.producer_id, None)
        self.conn = None
        self._schedule_reconnect(ConnectError("broker closed the producer", topic=self.topic))

    def _schedule_reconnect(self, exc: BaseException) -> None:
        if self._closed or (self._reconnect_task and not self._reconnect_task.done()):
            return
        log.info("producer %s on %s disconnected (%s); reconnecting", self.producer_name, self.topic, exc)
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while not self._closed:
            await asyncio.sleep(backoff.next())
            try:
                await self._create()
                log.info("producer %s on %s reconnected; re-sent %d pending", self.producer_name,
                         self.topic, len(self._pending))
                return
            except PulsarError as exc:
                # A broker that is still starting (after a restart) answers some of these, e.g.
                # UnknownError "Bookie handle is not available" while its managed ledger opens.
                if exc.retriable or isinstance(exc, (Timeout,)) or exc.server_error in (
                    "ServiceNotReady", "ProducerBusy", "MetadataError", "PersistenceError", "TopicNotFound",
                    "UnknownError",
                ):
                    log.debug("producer reconnect to %s failed: %s", self.topic, exc)
                    continue
                log.error("producer on %s cannot reconnect: %s", self.topic, exc)
                self._fail_all(exc)
                self._fatal = exc
                return

    # ------------------------------------------------------------------ window

    def has_space(self) -> bool:
        return self.queued < self.window

    async def wait_space(self) -> None:
        """Wait until the pending window has room (backpressure)."""
        while self.queued >= self.window and not self._closed:
            fut = asyncio.get_running_loop().create_future()
            self._space_waiters.append(fut)
            await fut

    def _release(self, n: int) -> None:
        self.queued -= n
        while self._space_waiters and self.queued < self.window:
            w = self._space_waiters.popleft()
            if not w.done():
                w.set_result(None)

    # ------------------------------------------------------------------ sending

    def check_size(self, content: bytes) -> None:
        """Raise :class:`MessageTooBig` if ``content`` (compressed, if a codec is set) exceeds the broker's limit."""
        limit = self.max_message_size
        if len(content) > limit:
            codec = self.conf.compression_type
            if codec == CompressionType.NONE or len(compress(codec, content)) > limit:
                raise MessageTooBig(f"message of {len(content)} bytes exceeds the broker's limit of {limit}",
                                    topic=self.topic)

    def check_usable(self) -> None:
        if self._closed:
            raise AlreadyClosed("producer is closed", topic=self.topic)
        if self._fatal is not None:
            raise self._fatal

    def enqueue(
        self,
        content: bytes,
        properties: dict[str, str] | None,
        partition_key: str | None,
        event_timestamp: int | None,
        sequence_id: int | None,
        txn: TxnID,
    ) -> asyncio.Future[MessageId]:
        """Queue one message; returns a future resolved with its id on receipt.

        The caller checked the window. Raises on a closed producer or an oversize message.
        """
        self.check_usable()
        self.check_size(content)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[MessageId] = loop.create_future()
        if sequence_id is None:
            seq = self._seq
            self._seq += 1
        else:
            seq = sequence_id
            self._seq = max(self._seq, seq + 1)
        self.queued += 1
        conf = self.conf
        if not conf.batching_enabled:
            meta = pb.MessageMetadata(
                producer_name=self.producer_name,
                sequence_id=seq,
                publish_time=int(time.time() * 1000),
                properties=_kv(properties),
            )
            if partition_key is not None:
                meta.partition_key = partition_key
            if event_timestamp:
                meta.event_time = event_timestamp
            self._push(seq, seq, meta, content, [fut], False, txn)
            return fut
        smm = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=seq, properties=_kv(properties))
        if partition_key is not None:
            smm.partition_key = partition_key
        if event_timestamp:
            smm.event_time = event_timestamp
        entry = encode_entry(smm, content)
        b = self._batch
        if b is not None and (
            b.txn != txn
            or len(b.entries) >= conf.batching_max_messages
            or b.size + len(entry) > conf.batching_max_allowed_size_in_bytes
        ):
            self._flush_batch()
            b = None
        if b is None:
            b = self._batch = _Batch(txn, seq)
            self._batch_timer = loop.call_later(conf.batching_max_publish_delay_ms / 1000.0, self._flush_batch)
        b.entries.append(entry)
        b.futures.append(fut)
        b.size += len(entry)
        b.last_seq = seq
        if len(b.entries) >= conf.batching_max_messages or b.size >= conf.batching_max_allowed_size_in_bytes:
            self._flush_batch()
        return fut

    def enqueue_batch(
        self,
        entries: Sequence[BatchEntry],
        first_sequence_id: int,
        txn: TxnID,
    ) -> list[asyncio.Future[MessageId]]:
        """Queue ``entries`` as one batch message with sequence ids ``first_sequence_id``, ``+1``, ...

        The frame carries ``sequence_id`` = the first id and ``highest_sequence_id`` = the last, so
        broker deduplication stores or drops the batch as a whole. An open batch of single sends
        goes out first (order). The caller checked the window. Raises on a closed producer, an
        empty batch or an oversize one.
        """
        self.check_usable()
        if not entries:
            raise ValueError("a batch needs at least one message")
        if first_sequence_id < 0:
            raise ValueError(f"sequence ids are non-negative, got {first_sequence_id}")
        parts: list[bytes] = []
        for i, entry in enumerate(entries):
            content, properties, partition_key = entry[0], entry[1], entry[2]
            smm = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=first_sequence_id + i,
                                           properties=_kv(properties))
            if partition_key is not None:
                smm.partition_key = partition_key
            if len(entry) > 3 and entry[3]:
                smm.event_time = entry[3]  # type: ignore[misc]
            parts.append(encode_entry(smm, content))
        payload = b"".join(parts)
        self.check_size(payload)
        self._flush_batch()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[MessageId]] = [loop.create_future() for _ in entries]
        last = first_sequence_id + len(entries) - 1
        self._seq = max(self._seq, last + 1)
        self.queued += len(entries)
        meta = pb.MessageMetadata(
            producer_name=self.producer_name,
            sequence_id=first_sequence_id,
            publish_time=int(time.time() * 1000),
            num_messages_in_batch=len(entries),
            highest_sequence_id=last,
        )
        self._push(first_sequence_id, last, meta, payload, futures, True, txn)
        return futures

    def _flush_batch(self) -> None:
        b = self._batch
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if b is None:
            return
        self._batch = None
        payload = b"".join(b.entries)
        meta = pb.MessageMetadata(
            producer_name=self.producer_name,
            sequence_id=b.first_seq,
            publish_time=int(time.time() * 1000),
            num_messages_in_batch=len(b.entries),
            highest_sequence_id=b.last_seq,
        )
        self._push(b.first_seq, b.last_seq, meta, payload, b.futures, True, b.txn)

    def _push(
        self,
        seq: int,
        highest: int,
        meta: pb.MessageMetadata,
        payload: bytes,
        futures: list[asyncio.Future[MessageId]],
        batched: bool,
        txn: TxnID,
    ) -> None:
        codec = self.conf.compression_type
        if codec != CompressionType.NONE:
            meta.compression = int(codec)
            meta.uncompressed_size = len(payload)
            payload = compress(codec, payload)
        send = {"producer_id": self.producer_id, "sequence_id": seq, "num_messages": len(futures)}
        if highest != seq:
            send["highest_sequence_id"] = highest
        if txn is not _NO_TXN:
            meta.txnid_most_bits = txn.most
            meta.txnid_least_bits = txn.least
            send["txnid_most_bits"] = txn.most
            send["txnid_least_bits"] = txn.least
        frame = encode_payload_frame(command(T.SEND, **send), meta, payload)
        op = _Op(seq, highest, frame, futures, batched, time.monotonic(), txn)
        self._pending.append(op)
        if self.ready and self.conn is not None:
            try:
                self.conn.write(frame)
            except ConnectError:
                pass  # resent after reconnect

    def flush_now(self) -> None:
        """Send the open batch immediately."""
        self._flush_batch()

    async def flush(self) -> None:
        """Send the open batch and wait for every pending receipt."""
        self._flush_batch()
        futs = [f for op in list(self._pending) for f in op.futures]
        if futs:
            await asyncio.gather(*futs, return_exceptions=True)

    # ----------------------------------------------------------------- receipts

    def on_send_receipt(self, r: pb.CommandSendReceipt) -> None:
        # Receipts usually arrive in send order, but not always: the broker completes
        # transactional and plain appends on different paths. Match by sequence id.
        pending = self._pending
        if not pending:
            return
        op = pending[0]
        if op.seq == r.sequence_id:
            pending.popleft()
        else:
            for i, cand in enumerate(pending):
                if cand.seq == r.sequence_id:
                    op = cand
                    del pending[i]
                    break
            else:
                return  # a receipt for something already resolved (duplicate after a resend)
        self.last_sequence_id_published = max(self.last_sequence_id_published, op.highest)
        mid = r.message_id
        n = len(op.futures)
        for i, f in enumerate(op.futures):
            if not f.done():
                f.set_result(
                    MessageId(mid.ledgerId, mid.entryId, self.partition, i if op.batched else -1,
                              n if op.batched else 0)
                )
        self._release(n)

    def on_send_error(self, e: pb.CommandSendError) -> None:
        name = pb.ServerError.Name(e.error)
        op = next((o for o in self._pending if o.seq == e.sequence_id), None)
        if name == "ChecksumError" or op is None:
            if self.conn is not None:
                self.conn.close(ConnectError(f"send error {name}: {e.message}", topic=self.topic))
            return
        txn = None if op.txn is _NO_TXN else op.txn
        if name in ("NotAllowedError", "TransactionNotFound", "InvalidTxnStatus", "TransactionConflict",
                    "TopicTerminatedError", "ProducerBlockedQuotaExceededError",
                    "ProducerBlockedQuotaExceededException"):
            self._pending.remove(op)
            err = from_server_error(name, f"send rejected: {e.message}", topic=self.topic, txn_id=txn)
            for f in op.futures:
                if not f.done():
                    f.set_exception(err)
            self._release(len(op.futures))
            return
        # Anything else: reconnect and resend, as the broker's state is unknown.
        if self.conn is not None:
            self.conn.close(ConnectError(f"send error {name}: {e.message}", topic=self.topic))

    async def _timeout_loop(self) -> None:
        limit = self.conf.send_timeout_millis / 1000.0
        if limit <= 0:
            return
        tick = min(1.0, limit / 4)
        while not self._closed:
            await asyncio.sleep(tick)
            if self._pending and time.monotonic() - self._pending[0].created > limit:
                self._fail_all(Timeout(f"no receipt within send_timeout_millis={self.conf.send_timeout_millis}",
                                       topic=self.topic))

    def _fail_all(self, exc: PulsarError) -> None:
        self._flush_batch()
        n = 0
        while self._pending:
            op = self._pending.popleft()
            for f in op.futures:
                n += 1
                if not f.done():
                    f.set_exception(exc)
        self._release(n)

    # -------------------------------------------------------------------- close

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout=max(self.conf.send_timeout_millis / 1000.0, 1.0))
        except TimeoutError:
            pass
        self._closed = True
        for t in (self._reconnect_task, self._timeout_task):
            if t is not None:
                t.cancel()
        self._fail_all(AlreadyClosed("producer closed before the receipt arrived", topic=self.topic))
        for w in self._space_waiters:
            if not w.done():
                w.set_result(None)
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.producer_id, None)
            rid = next_request_id()
            try:
                await conn.request(command(T.CLOSE_PRODUCER, producer_id=self.producer_id, request_id=rid), rid)
            except PulsarError:
                pass


def java_string_hash(s: str) -> int:
    """The partition hash of a key, as the Java client computes it (``String.hashCode``, made
    non-negative): a keyed message goes to partition ``java_string_hash(key) % partitions``."""
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


class AsyncProducer:
    """A producer on a topic (all partitions of a partitioned topic)."""

    def __init__(self, ctx: ClientContext, topic: str, conf: ProducerConfig) -> None:
        self._ctx = ctx
        self._topic = topic
        self.conf = conf
        self._parts: list[PartitionProducer] = []
        self._closed = False
        self._rr = 0

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

    def _route(self, partition_key: str | None) -> PartitionProducer:
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        if partition_key:
            return parts[java_string_hash(partition_key) % len(parts)]
        if self.conf.batching_enabled:
            slot = int(time.monotonic() * 1000 / max(self.conf.batching_max_publish_delay_ms, 1))
            return parts[slot % len(parts)]
        self._rr += 1
        return parts[self._rr % len(parts)]

    def check_content(self, content: Any) -> bytes:
        """``content`` as bytes; raises if the producer is closed or ``content`` is not bytes-like."""
        if self._closed:
            raise AlreadyClosed("producer is closed", topic=self._topic)
        if isinstance(content, str):
            raise TypeError("content must be bytes; encode str payloads first")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        return bytes(content)

    async def send_async(
        self,
        content: bytes,
        callback: Callable[[Result, MessageId | None], Any] | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        sequence_id: int | None = None,
        txn: AsyncTransaction | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue a message; returns a future of its :class:`MessageId`.

        Awaits for room in the pending window when ``block_if_queue_full`` is set,
        otherwise raises :class:`ProducerQueueIsFull` when it is full.
        """
        data = self.check_content(content)
        part = self._route(partition_key)
        part.check_usable()
        tid = await self._admit(part, txn)
        fut = part.enqueue(data, properties, partition_key, event_timestamp, sequence_id, tid)
        if txn is not None:
            txn.add_op(fut)
        if callback is not None:
            fut.add_done_callback(lambda f: run_callback(callback, f))
        return fut

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
        data: list[BatchEntry] = [(self.check_content(e[0]), *e[1:]) for e in entries]  # type: ignore[misc]
        part = self._route(data[0][2])
        part.check_usable()
        tid = await self._admit(part, txn)
        futs = part.enqueue_batch(data, first_sequence_id, tid)
        if txn is not None:
            txn.add_op(futs[-1])  # the batch's futures resolve (or fail) together: one op tracks it
        return futs

    def send_nowait(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        sequence_id: int | None = None,
        block: bool = True,
    ) -> asyncio.Future[MessageId] | None:
        """Queue a non-transactional message without awaiting; ``None`` if the window is full."""
        data = self.check_content(content)
        part = self._route(partition_key)
        if not part.has_space():
            if block:
                return None
            raise ProducerQueueIsFull("pending window is full", topic=part.topic)
        return part.enqueue(data, properties, partition_key, event_timestamp, sequence_id, _NO_TXN)

    async def send(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        sequence_id: int | None = None,
        txn: AsyncTransaction | None = None,
    ) -> MessageId:
        """Send a message and wait for the broker's receipt."""
        fut = await self.send_async(
            content,
            properties=properties,
            partition_key=partition_key,
            event_timestamp=event_timestamp,
            sequence_id=sequence_id,
            txn=txn,
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

    async def close(self) -> None:
        """Flush, then close. Further sends raise :class:`AlreadyClosed`."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.close() for p in self._parts), return_exceptions=True)
        self._ctx.forget(self)

    def reconnect_count(self) -> int:
        """How many times partitions re-created themselves on the broker (each may have re-sent frames)."""
        return sum(p.reconnects for p in self._parts)

    def partition_topics(self) -> list[str]:
        """The topic (partition) names this producer writes to."""
        return [p.topic for p in self._parts]

    def is_connected(self) -> bool:
        """True when every partition has a live broker connection."""
        return all(p.ready for p in self._parts)


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

