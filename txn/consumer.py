"""Consumers: subscriptions, flow permits, batch parsing, grouped acks, transactional acks,
negative acks, redelivery and reconnects."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from .backoff import Backoff
from .connection import Connection, check_error, command, next_request_id
from .context import ClientContext
from .errors import (
    AlreadyClosed,
    ChecksumMismatch,
    ConnectError,
    CorruptMessage,
    PayloadTooLarge,
    ProtocolError,
    PulsarError,
    SizeLimitExceeded,
    from_server_error,
)
from .message import Message, MessageId, ReceivedMessage
from .protocol import Frame, decompress, pb, split_batch
from .protocol.frames import DEFAULT_MAX_MESSAGE_SIZE
from .receive_queue import ReceiveQueue

if TYPE_CHECKING:
    from .transaction import AsyncTransaction

log = logging.getLogger("txn.consumer")
T = pb.BaseCommand
#: Message ids per transactional ACK command (each may carry a batch-index bitset).
TXN_ACK_CHUNK = 4096


class ConsumerType(IntEnum):
    """Subscription types (names as in ``pulsar.ConsumerType``)."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(IntEnum):
    """Where a new subscription starts."""

    Latest = 0
    Earliest = 1


@dataclass(slots=True)
class ConsumerConfig:
    """Consumer settings; names follow ``pulsar.Client.subscribe``."""

    subscription_name: str
    consumer_type: ConsumerType = ConsumerType.Exclusive
    initial_position: InitialPosition = InitialPosition.Latest
    consumer_name: str | None = None
    receiver_queue_size: int = 1000
    max_total_receiver_queue_size_across_partitions: int = 50000
    negative_ack_redelivery_delay_ms: int = 60000
    ack_grouping_time_ms: int = 100
    ack_grouping_max_size: int = 1000
    properties: dict[str, str] = field(default_factory=dict)
    key_shared_allow_out_of_order: bool = False
    durable: bool = True
    start_message_id: MessageId | None = None


def _ack_set_words(n: int, acked: list[int], acked_upto: int | None = None) -> list[int]:
    """Java ``BitSet.toLongArray`` of the *unacked* indexes of an ``n``-message batch."""
    bits = (1 << n) - 1
    for i in acked:
        bits &= ~(1 << i)
    if acked_upto is not None:
        bits &= ~((1 << (acked_upto + 1)) - 1)
    words = []
    while bits:
        w = bits & 0xFFFFFFFFFFFFFFFF
        words.append(w - (1 << 64) if w >= 1 << 63 else w)
        bits >>= 64
    return words


def _txn_ack_ids(mids: list[MessageId], cumulative: bool) -> list[pb.MessageIdData]:
    """Wire ids for a transactional ACK.

    Individual acks of several messages of one batch entry become one id whose ack set
    clears all of them (the broker reads it as those batch indexes), so a batch of inputs
    costs the broker one position per entry rather than one per message.
    """
    ids: list[pb.MessageIdData] = []
    if cumulative:
        for mid in mids:
            d = pb.MessageIdData(ledgerId=mid.ledger_id, entryId=mid.entry_id)
            if mid.batch_index >= 0 and mid.batch_size > 0:
                d.ack_set.extend(_ack_set_words(mid.batch_size, [], acked_upto=mid.batch_index))
                d.batch_size = mid.batch_size
            ids.append(d)
        return ids
    entries: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for mid in mids:
        if mid.batch_index >= 0 and mid.batch_size > 0:
            key = (mid.ledger_id, mid.entry_id)
            e = entries.get(key)
            if e is None:
                entries[key] = (mid.batch_size, [mid.batch_index])
            else:
                e[1].append(mid.batch_index)
        else:
            ids.append(pb.MessageIdData(ledgerId=mid.ledger_id, entryId=mid.entry_id))
    for (ledger, entry), (size, indexes) in entries.items():
        d = pb.MessageIdData(ledgerId=ledger, entryId=entry, batch_size=size)
        d.ack_set.extend(_ack_set_words(size, indexes))
        ids.append(d)
    return ids


def _split_by_entry(mids: list[MessageId]) -> tuple[list[MessageId], list[list[MessageId]]]:
    """(ids of whole entries, the ids of each partly acknowledged batch entry): how
    :meth:`AsyncConsumer.acknowledge_many` lays out its transactional ACK commands.

    A whole entry (an unbatched message, or every message of a batch entry) is fully deleted once
    committed, which the broker's cursor persists itself: whole entries may share a command. A
    partly acknowledged entry goes alone, so that no fully deleted position can make the broker
    skip its command when it replays the pending-ack log.
    """
    whole: list[MessageId] = []
    entries: dict[tuple[int, int], list[MessageId]] = {}
    for mid in mids:
        if mid.batch_index >= 0 and mid.batch_size > 0:
            entries.setdefault((mid.ledger_id, mid.entry_id), []).append(mid)
        else:
            whole.append(mid)
    partial = []
    for ids in entries.values():
        if len({m.batch_index for m in ids}) == ids[0].batch_size:
            whole.extend(ids)
        else:
            partial.append(ids)
    return whole, partial


def _is_acked(ack_set: Any, i: int) -> bool:
    """In a broker-sent ack set, a cleared bit means that batch index is already acked."""
    w = i // 64
    if w >= len(ack_set):
        return True
    return not (ack_set[w] & (1 << (i % 64)))


class TopicConsumer:
    """Consumer on one topic or partition; :class:`AsyncConsumer` holds one per partition.

    Package-internal, public for the facades, the reader and the receive queue: ``ready`` (set
    while subscribed), and ``taken``/``threshold`` (permits used since the last FLOW, and how
    many make a FLOW), which only the receive queue touches, under its lock.
    """

    def __init__(self, parent: AsyncConsumer, topic: str, partition: int, permits: int) -> None:
        self.parent = parent
        self.ctx = parent.ctx
        self.conf = parent.conf
        self.topic = topic
        self.partition = partition
        self.consumer_id = self.ctx.next_id()
        self.queue_size = max(permits, 1)
        self.threshold = max(self.queue_size // 2, 1)
        self.taken = 0  # guarded by the parent's receive-queue lock
        self._conn: Connection | None = None
        self.ready = asyncio.Event()
        self._closed = False
        self._epoch = 0
        self._reconnect_task: asyncio.Task[None] | None = None
        self._ack_inbox: deque[tuple[Message | MessageId, bool]] = deque()
        # (ledger, entry, partition, batch size) -> batch indexes not yet acknowledged
        self._batch_unacked: dict[tuple[int, int, int, int], set[int]] = {}
        self._nacks: dict[MessageId, float] = {}
        self.end_of_topic = False
        self.active = True
        self.resume_from: MessageId | None = None  # non-durable readers: where a resubscribe starts
        self.payload_limit = DEFAULT_MAX_MESSAGE_SIZE  # bound on a decompressed entry; set at subscribe

    def __hash__(self) -> int:
        return self.consumer_id

    # ---------------------------------------------------------------- subscribe

    async def start(self) -> None:
        await self._subscribe()

    async def _subscribe(self) -> None:
        conf = self.conf
        conn = await self.ctx.pool.connection_for(self.topic)
        rid = next_request_id()
        fields: dict[str, Any] = {
            "topic": self.topic,
            "subscription": conf.subscription_name,
            "subType": int(conf.consumer_type),
            "consumer_id": self.consumer_id,
            "request_id": rid,
            "initialPosition": int(conf.initial_position),
            "durable": conf.durable,
            "consumer_epoch": self._epoch,
            "metadata": [pb.KeyValue(key=k, value=v) for k, v in conf.properties.items()],
        }
        if conf.consumer_name:
            fields["consumer_name"] = conf.consumer_name
        start = self.resume_from or conf.start_message_id
        if not conf.durable and start is not None:
            fields["start_message_id"] = start.to_pb()
        if conf.consumer_type == ConsumerType.KeyShared:
            fields["keySharedMeta"] = pb.KeySharedMeta(
                keySharedMode=pb.KeySharedMeta.AUTO_SPLIT,
                allowOutOfOrderDelivery=conf.key_shared_allow_out_of_order,
            )
        conn.consumers[self.consumer_id] = self
        try:
            resp = await conn.request(command(T.SUBSCRIBE, **fields), rid)
            check_error(resp, f"subscribe {conf.subscription_name!r}", topic=self.topic)
        except BaseException:
            conn.consumers.pop(self.consumer_id, None)
            raise
        self._conn = conn
        pool = self.ctx.pool
        self.payload_limit = pool.max_uncompressed_message_size or conn.max_message_size
        self.parent.receive_queue.reset(self)
        conn.send_command(command(T.FLOW, consumer_id=self.consumer_id, messagePermits=self.queue_size))
        self.parent.subscriptions_made += 1
        self.ready.set()

    def on_connection_closed(self, conn: Connection, exc: BaseException) -> None:
        if self._conn is conn:
            self._lost(exc)

    def on_broker_close(self) -> None:
        if self._conn is not None:
            self._conn.consumers.pop(self.consumer_id, None)
        self._lost(ConnectError("broker closed the consumer", topic=self.topic))

    def _lost(self, exc: BaseException) -> None:
        self._conn = None
        self.ready.clear()
        # The broker redelivers whatever we did not ack, so drop what is queued here.
        # (A corrupt entry's queued error goes too: the entry comes again, and so does its error.)
        self.parent.receive_queue.remove_where(
            lambda m: m.consumer is self or getattr(m, "owner", None) is self)
        if self._closed or (self._reconnect_task and not self._reconnect_task.done()):
            return
        log.info("consumer on %s disconnected (%s); resubscribing", self.topic, exc)
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while not self._closed:
            await asyncio.sleep(backoff.next())
            try:
                await self._subscribe()
                log.info("consumer on %s resubscribed", self.topic)
                self.flush_acks()
                return
            except PulsarError as exc:
                log.debug("resubscribe to %s failed: %s", self.topic, exc)

    def on_active_change(self, active: bool) -> None:
        self.active = active

    def on_end_of_topic(self) -> None:
        self.end_of_topic = True

    # ----------------------------------------------------------------- messages

    def send_flow(self, n: int) -> None:
        conn = self._conn
        if conn is not None and not conn.closed and n > 0:
            try:
                conn.send_command(command(T.FLOW, consumer_id=self.consumer_id, messagePermits=n))
            except ConnectError:
                pass

    def _skip(self, n: int) -> None:
        granted = self.parent.receive_queue.count(self, n)
        if granted:
            self.send_flow(granted)

    def on_message(self, cmd: pb.CommandMessage, frame: Frame) -> None:
        meta = frame.metadata
        if meta is None:
            raise ProtocolError("MESSAGE command without payload", topic=self.topic)
        batched = meta.HasField("num_messages_in_batch")
        n = meta.num_messages_in_batch if batched else 1
        if cmd.HasField("consumer_epoch") and cmd.consumer_epoch < self._epoch:
            self._skip(n)  # sent before a redeliver-all; it comes again
            return
        mid = cmd.message_id
        if not frame.checksum_ok:
            self._reject(ChecksumMismatch, "checksum mismatch", mid, n)
            return
        if meta.HasField("marker_type"):
            self._skip(n)
            return
        try:
            if n < 1:
                raise ProtocolError(f"batch entry declares {n} messages")
            payload = decompress(meta.compression, frame.payload or b"", meta.uncompressed_size, self.payload_limit)
            msgs = self._build(cmd, meta, payload, batched, n)
        except ProtocolError as exc:
            self._reject(PayloadTooLarge if isinstance(exc, SizeLimitExceeded) else CorruptMessage,
                         f"undecodable payload: {exc.message}", mid, n)
            return
        skipped = n - len(msgs)
        if skipped:
            self._skip(skipped)
        if msgs:
            self.parent.receive_queue.put_many(msgs)

    def _reject(self, kind: type[CorruptMessage], what: str, mid: pb.MessageIdData, n: int) -> None:
        """Report a corrupt entry in the receive queue, in its place; it stays unacknowledged."""
        err = kind(f"{what}; the entry is left unacknowledged", topic=self.topic,
                   message_id=MessageId(mid.ledgerId, mid.entryId, self.partition, topic=self.topic))
        log.error("%s", err)
        self._skip(max(n, 1))
        self.parent.receive_queue.put_error(err, self)

    def _build(self, cmd: pb.CommandMessage, meta: pb.MessageMetadata, payload: bytes, batched: bool,
               n: int) -> list[ReceivedMessage]:
        mid = cmd.message_id
        topic = self.topic
        redeliveries = cmd.redelivery_count
        publish_time = meta.publish_time
        event_time = meta.event_time
        producer = meta.producer_name
        props = {kv.key: kv.value for kv in meta.properties} if len(meta.properties) else None
        if not batched:
            key = meta.partition_key if meta.HasField("partition_key") else None
            entry = (mid.ledgerId, mid.entryId, self.partition, 0)
            return [
                ReceivedMessage(payload, props or {}, entry, -1, topic, key, publish_time, event_time, redeliveries,
                                producer, meta.sequence_id, self)
            ]
        entry = (mid.ledgerId, mid.entryId, self.partition, n)
        out: list[ReceivedMessage] = []
        append = out.append
        ack_set = cmd.ack_set
        base_seq = meta.sequence_id
        i = -1
        for data, seq, ev, key, own_props, compacted in split_batch(payload, n):
            i += 1
            if compacted or (ack_set and _is_acked(ack_set, i)):
                continue
            if own_props is None:
                p = dict(props) if props else {}
            elif props:
                p = dict(props)
                p.update(own_props)
            else:
                p = dict(own_props)
            append(
                ReceivedMessage(data, p, entry, i, topic, key, publish_time, ev or event_time, redeliveries, producer,
                                base_seq + i if seq is None else seq, self)
            )
        return out

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on this topic/partition (ledger -1 if empty)."""
        if not self.ready.is_set():
            await asyncio.wait_for(self.ready.wait(), self.ctx.operation_timeout)
        conn = self._conn
        if conn is None:
            raise ConnectError("consumer is not connected", topic=self.topic)
        rid = next_request_id()
        resp = await conn.request(command(T.GET_LAST_MESSAGE_ID, consumer_id=self.consumer_id, request_id=rid), rid)
        check_error(resp, "get last message id", topic=self.topic)
        d = resp.getLastMessageIdResponse.last_message_id
        return MessageId.from_pb(d, partition=self.partition, topic=self.topic)

    # --------------------------------------------------------------------- acks

    def ack_local(self, item: Message | MessageId, cumulative: bool) -> None:
        """Queue a non-transactional ack (thread-safe); sent within ``ack_grouping_time_ms``."""
        if self._closed:
            raise AlreadyClosed("consumer is closed", topic=self.topic)
        self._ack_inbox.append((item, cumulative))

    def flush_acks(self) -> None:
        """Send queued acks now (event-loop thread)."""
        inbox = self._ack_inbox
        if not inbox:
            return
        individual: list[pb.MessageIdData] = []
        cumulative: MessageId | None = None
        pending = self._batch_unacked
        nacks = self._nacks
        last_key: tuple[int, int, int, int] | None = None
        rest: set[int] = set()
        while inbox:
            item, cum = inbox.popleft()
            if type(item) is ReceivedMessage:  # the common case: no MessageId is built
                key = item.entry
                index = item.batch_index
                mid = item.message_id() if nacks or cum else None
            else:
                mid = item.message_id() if isinstance(item, Message) else item
                key = (mid.ledger_id, mid.entry_id, mid.partition, mid.batch_size)
                index = mid.batch_index
            if nacks:
                nacks.pop(mid, None)
            if cum:
                cumulative = mid if cumulative is None or mid > cumulative else cumulative
                continue
            if index >= 0 and key[3] > 1:
                if key is not last_key:  # consecutive acks usually share an entry
                    last_key = key
                    rest = pending.get(key)
                    if rest is None:
                        rest = pending[key] = set(range(key[3]))
                rest.discard(index)
                if rest:
                    continue
                del pending[key]
                last_key = None
            individual.append(pb.MessageIdData(ledgerId=key[0], entryId=key[1]))
        conn = self._conn
        if conn is None or conn.closed:
            return  # unacked messages are redelivered after the resubscribe
        try:
            if individual:
                conn.send_command(command(T.ACK, consumer_id=self.consumer_id, ack_type=0, message_id=individual))
            if cumulative is not None:
                target = self._cumulative_target(cumulative)
                if target is not None:
                    conn.send_command(command(T.ACK, consumer_id=self.consumer_id, ack_type=1,
                                              message_id=[target]))
        except ConnectError:
            pass

    def _cumulative_target(self, mid: MessageId) -> pb.MessageIdData | None:
        if mid.batch_index >= 0 and mid.batch_index < mid.batch_size - 1:
            # Not the last message of its batch: acknowledge up to the previous entry.
            if mid.entry_id == 0:
                return None
            return pb.MessageIdData(ledgerId=mid.ledger_id, entryId=mid.entry_id - 1)
        for key in [k for k in self._batch_unacked if (k[0], k[1]) <= (mid.ledger_id, mid.entry_id)]:
            del self._batch_unacked[key]
        return pb.MessageIdData(ledgerId=mid.ledger_id, entryId=mid.entry_id)

    async def ack_txn(self, mids: list[MessageId], txn: AsyncTransaction, cumulative: bool) -> None:
        """Acknowledge inside ``txn``; waits for the broker's ack response."""
        txn.check_open()
        await txn.register_subscription(self.topic, self.conf.subscription_name)
        if not self.ready.is_set():
            try:
                await asyncio.wait_for(self.ready.wait(), self.ctx.operation_timeout)
            except TimeoutError:
                raise ConnectError("consumer is not connected", topic=self.topic, txn_id=txn.id) from None
        conn = self._conn
        if conn is None:
            raise ConnectError("consumer is not connected", topic=self.topic, txn_id=txn.id)
        ids = _txn_ack_ids(mids, cumulative)
        rid = next_request_id()
        resp = await conn.request(
            command(
                T.ACK,
                consumer_id=self.consumer_id,
                ack_type=1 if cumulative else 0,
                message_id=ids,
                txnid_most_bits=txn.id.most,
                txnid_least_bits=txn.id.least,
                request_id=rid,
            ),
            rid,
        )
        check_error(resp, "transactional ack", topic=self.topic, txn_id=txn.id)
        r = resp.ackResponse
        if r.HasField("error"):
            raise from_server_error(
                pb.ServerError.Name(r.error), f"transactional ack failed: {r.message}", topic=self.topic,
                txn_id=txn.id,
            )
        for mid in mids:
            self._nacks.pop(mid, None)

    # ---------------------------------------------------------------- redelivery

    def nack(self, mid: MessageId) -> None:
        """Ask for redelivery of ``mid`` after the negative-ack delay (event-loop thread)."""
        self._nacks[mid] = time.monotonic() + self.conf.negative_ack_redelivery_delay_ms / 1000.0

    def process_nacks(self) -> None:
        if not self._nacks:
            return
        now = time.monotonic()
        due = [m for m, t in self._nacks.items() if t <= now]
        if not due:
            return
        for m in due:
            del self._nacks[m]
        self.redeliver(due)

    def redeliver(self, mids: list[MessageId] | None) -> None:
        """Ask the broker to send ``mids`` again (all unacked if ``None`` or not Shared)."""
        conn = self._conn
        if conn is None or conn.closed:
            return  # a resubscribe redelivers everything unacked anyway
        shared = self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared)
        try:
            if shared and mids:
                entries = {(m.ledger_id, m.entry_id) for m in mids}
                conn.send_command(
                    command(
                        T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                        consumer_id=self.consumer_id,
                        message_ids=[pb.MessageIdData(ledgerId=lg, entryId=e) for lg, e in sorted(entries)],
                    )
                )
                return
            self._epoch += 1
            removed = self.parent.receive_queue.remove_where(lambda m: m.consumer is self)
            if removed:
                self._skip(removed)
            conn.send_command(
                command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES, consumer_id=self.consumer_id,
                        consumer_epoch=self._epoch)
            )
        except ConnectError:
            pass

    def redeliver_after_abort(self, mids: list[MessageId], cumulative: bool) -> None:
        """Hand back messages whose transactional acks were aborted."""
        self.redeliver(None if cumulative else mids)

    # -------------------------------------------------------------------- close

    async def close(self, unsubscribe: bool = False) -> None:
        if self._closed:
            return
        self.flush_acks()
        self._closed = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        conn, self._conn = self._conn, None
        if conn is None or conn.closed:
            if unsubscribe:
                raise ConnectError("consumer is not connected; cannot unsubscribe", topic=self.topic)
            return
        rid = next_request_id()
        if unsubscribe:
            resp = await conn.request(command(T.UNSUBSCRIBE, consumer_id=self.consumer_id, request_id=rid), rid)
            check_error(resp, "unsubscribe", topic=self.topic)
            conn.consumers.pop(self.consumer_id, None)
            return
        conn.consumers.pop(self.consumer_id, None)
        try:
            await conn.request(command(T.CLOSE_CONSUMER, consumer_id=self.consumer_id, request_id=rid), rid)
        except PulsarError:
            pass


class AsyncConsumer:
    """A consumer over one or more topics (and all partitions of partitioned ones)."""

    def __init__(self, ctx: ClientContext, topics: list[str], conf: ConsumerConfig) -> None:
        #: The context of the client that made it (pool, ids, registry).
        self.ctx = ctx
        self._topics = topics
        self.conf = conf
        #: One :class:`TopicConsumer` per topic or partition.
        self.topic_consumers: list[TopicConsumer] = []
        self._by_topic: dict[str, TopicConsumer] = {}
        #: Received messages waiting for :meth:`receive` (thread-safe; the sync facade pops from it).
        self.receive_queue = ReceiveQueue(asyncio.get_running_loop(), lambda sub, n: sub.send_flow(n))
        self._closed = False
        self._ticker: asyncio.Task[None] | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.set_result(None)
        #: Successful (re)subscriptions of any topic/partition: a change means the broker may
        #: have recovered the subscription's cursor (and, on Pulsar 4.0.x, lost batch-index acks).
        self.subscriptions_made = 0

    async def start(self) -> None:
        """Subscribe on every topic and partition (the client calls it; raises the broker's error)."""
        counts = await asyncio.gather(*(self.ctx.pool.partitions(t) for t in self._topics))
        total_parts = sum(max(c, 1) for c in counts)
        per = self.conf.receiver_queue_size
        if total_parts > 1:
            per = max(1, min(per, self.conf.max_total_receiver_queue_size_across_partitions // total_parts))
        for t, n in zip(self._topics, counts, strict=True):
            names = [(t, -1)] if n == 0 else [(f"{t}-partition-{i}", i) for i in range(n)]
            for name, idx in names:
                sub = TopicConsumer(self, name, idx, per)
                self.topic_consumers.append(sub)
                self._by_topic[name] = sub
        try:
            await asyncio.gather(*(s.start() for s in self.topic_consumers))
        except BaseException:
            await asyncio.gather(*(s.close() for s in self.topic_consumers), return_exceptions=True)
            raise
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        interval = max(self.conf.ack_grouping_time_ms, 10) / 1000.0
        while not self._closed:
            await asyncio.sleep(interval)
            for s in self.topic_consumers:
                s.flush_acks()
                s.process_nacks()

    # -------------------------------------------------------------------- API

    def topic(self) -> str:
        """The subscribed topic (the first one for multi-topic consumers)."""
        return self._topics[0]

    def subscription_name(self) -> str:
        """The subscription's name."""
        return self.conf.subscription_name

    @property
    def closed(self) -> bool:
        """True once closed (or unsubscribed)."""
        return self._closed

    def partition_topics(self) -> list[str]:
        """The topics (partitions) this consumer is subscribed to."""
        return [s.topic for s in self.topic_consumers]

    def receive_nowait(self) -> Message | None:
        """A queued message, or ``None`` without waiting."""
        self.check_open()
        return self.receive_queue.get_nowait()

    def check_open(self) -> None:
        """Raise :class:`AlreadyClosed` once the consumer is closed."""
        if self._closed:
            raise AlreadyClosed("consumer is closed", topic=self._topics[0])

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """Next message; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        self.check_open()
        return await self.receive_queue.get(None if timeout_millis is None else timeout_millis / 1000.0)

    def _sub_for(self, message_or_id: Message | MessageId) -> tuple[TopicConsumer, MessageId]:
        if isinstance(message_or_id, Message):
            mid = message_or_id.message_id()
            sub = message_or_id.consumer
            if sub is not None and sub.parent is self:
                return sub, mid
        elif isinstance(message_or_id, MessageId):
            mid = message_or_id
        else:
            raise TypeError(f"expected a Message or MessageId, got {type(message_or_id).__name__}")
        subs = self.topic_consumers
        sub = self._by_topic.get(mid.topic) if mid.topic else (subs[0] if len(subs) == 1 else None)
        if sub is None:
            raise ValueError(f"message id {mid} does not belong to this consumer's topics")
        return sub, mid

    def acknowledge_nowait(self, message_or_id: Message | MessageId, cumulative: bool = False) -> None:
        """Non-transactional ack, queued and grouped; thread-safe."""
        self.check_open()
        if cumulative and self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise ValueError("cumulative acknowledgement is not allowed on Shared or Key_Shared subscriptions")
        if type(message_or_id) is ReceivedMessage:
            sub = message_or_id.consumer
            if sub is not None and sub.parent is self:
                sub.ack_local(message_or_id, cumulative)
                return
        sub, mid = self._sub_for(message_or_id)
        sub.ack_local(mid, cumulative)

    def acknowledge(self, message_or_id: Message | MessageId, txn: AsyncTransaction | None = None) -> Awaitable[None]:
        """Acknowledge one message; await the result. Inside ``txn`` it waits for the broker.

        Without a transaction the ack is queued and grouped, and the returned awaitable is
        already complete.
        """
        if txn is None:
            self.acknowledge_nowait(message_or_id)
            return self._done
        self.check_open()
        sub, mid = self._sub_for(message_or_id)
        return self._txn_ack(sub, [mid], txn, False)

    async def acknowledge_cumulative(
        self, message_or_id: Message | MessageId, txn: AsyncTransaction | None = None
    ) -> None:
        """Acknowledge everything up to and including this message (Exclusive/Failover only)."""
        self.check_open()
        if txn is None:
            self.acknowledge_nowait(message_or_id, cumulative=True)
            return
        if self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise ValueError("cumulative acknowledgement is not allowed on Shared or Key_Shared subscriptions")
        sub, mid = self._sub_for(message_or_id)
        await self._txn_ack(sub, [mid], txn, True)

    async def _txn_ack(self, sub: TopicConsumer, mids: list[MessageId], txn: AsyncTransaction,
                       cumulative: bool) -> None:
        fut = asyncio.ensure_future(sub.ack_txn(mids, txn, cumulative))
        txn.add_op(fut)
        txn.record_ack(sub, mids, cumulative)
        await fut

    async def acknowledge_many(self, messages: list[Message], txn: AsyncTransaction, *,
                               per_entry: bool = True) -> None:
        """Acknowledge ``messages`` inside ``txn``; the ACK commands are sent concurrently.

        With ``per_entry`` (the default) the messages of each partly acknowledged batch entry go in
        an ACK command of their own, and whole entries (unbatched messages, batch entries acked in
        full) of a topic/partition share one (chunked). Pulsar 4.0.8 replays its pending-ack log one
        command at a time and skips a command when one of its positions is already fully deleted,
        so a command that also carried a partial batch entry loses that entry's batch-index acks at
        a broker restart and its messages come again (tests/test_conformance_batch_ack_bug.py).
        ``per_entry=False`` sends one command per topic/partition (chunked), as before; the
        conformance test uses it to show the broker bug.
        """
        self.check_open()
        groups: dict[TopicConsumer, list[MessageId]] = {}
        seen: set[MessageId] = set()
        for m in messages:
            sub, mid = self._sub_for(m)
            if mid in seen:
                continue  # one transaction must never carry the same ack twice
            seen.add(mid)
            groups.setdefault(sub, []).append(mid)
        # Bounded commands: one ACK carrying ~100k batch-index ids would pass the broker's 5 MB
        # frame limit (the broker then resets the connection).
        n = TXN_ACK_CHUNK
        commands: list[tuple[TopicConsumer, list[MessageId]]] = []
        for sub, mids in groups.items():
            if per_entry:
                whole, entries = _split_by_entry(mids)
                commands.extend((sub, e) for e in entries)
            else:
                whole = mids
            commands.extend((sub, whole[i:i + n]) for i in range(0, len(whole), n))
        await asyncio.gather(*(self._txn_ack(sub, mids, txn, False) for sub, mids in commands))

    def negative_acknowledge(self, message_or_id: Message | MessageId) -> None:
        """Redeliver this message after ``negative_ack_redelivery_delay_ms``."""
        self.check_open()
        sub, mid = self._sub_for(message_or_id)
        sub.nack(mid)

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacknowledged message now."""
        self.check_open()
        for s in self.topic_consumers:
            s.redeliver(None)

    def is_connected(self) -> bool:
        """True when every topic/partition has a live subscription."""
        return all(s.ready.is_set() for s in self.topic_consumers)

    async def close(self) -> None:
        """Flush acks and close. Further calls raise :class:`AlreadyClosed`."""
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        self.receive_queue.close()
        await asyncio.gather(*(s.close() for s in self.topic_consumers), return_exceptions=True)
        self.ctx.forget(self)

    async def unsubscribe(self) -> None:
        """Delete the subscription on the broker and close."""
        self.check_open()
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        self.receive_queue.close()
        await asyncio.gather(*(s.close(unsubscribe=True) for s in self.topic_consumers))
        self.ctx.forget(self)
