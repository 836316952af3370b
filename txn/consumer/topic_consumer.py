"""The consumer of one topic or partition: subscribe, resubscribe after a lost connection, close.

Its flow control and decoding live in :mod:`.flow`, its acknowledgements in :mod:`.acks`."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from typing import Any

from ..backoff import Backoff
from ..connection import Connection, check_error, command, next_request_id
from ..errors import ConnectError, PulsarError, from_server_error
from ..message import EARLIEST, LATEST, ChunkMessageId, Message, MessageId
from ..protocol import pb
from ..protocol.frames import DEFAULT_MAX_MESSAGE_SIZE
from ..schema import schema_to_pb
from .acks import AckTracker
from .config import ConsumerType
from .flow import MessageFlow
from .parent import ConsumerParent

log = logging.getLogger("txn.consumer")
T = pb.BaseCommand


class ClosedWhileSubscribing(ConnectError):
    """The broker closed a consumer between answering its SUBSCRIBE and our handling of the answer."""


class TopicConsumer(MessageFlow, AckTracker):
    """Consumer on one topic or partition; :class:`AsyncConsumer` holds one per partition.

    Package-internal, public for the facades, the reader and the receive queue: ``ready`` (set
    while subscribed), and ``taken``/``threshold``/``session`` (permits used since the last FLOW,
    how many make a FLOW, and which subscription they count for), which only the receive queue
    touches, under its lock.

    Permits: each subscription starts a session in which the broker holds ``queue_size`` permits
    less what it dispatched; the client returns one per message it takes out of the queue or
    drops, and what the broker charged for an entry beyond its queued messages on arrival (see
    :mod:`.flow`). A lost connection ends the session (the broker forgets its consumer, and what
    was queued for it is dropped without a FLOW).
    """

    def __init__(self, parent: ConsumerParent, topic: str, partition: int, permits: int) -> None:
        self.parent = parent
        self.ctx = parent.ctx
        self.conf = parent.conf
        self.topic = topic
        self.partition = partition
        self.consumer_id = self.ctx.next_id()
        #: ``receiver_queue_size=0``: no prefetch; each receive asks the broker for one message
        self.zero_queue = permits == 0
        self.queue_size = 0 if self.zero_queue else max(permits, 1)
        # A zero-queue consumer never returns permits as messages are taken: it asks for each one.
        self.threshold = sys.maxsize if self.zero_queue else max(self.queue_size // 2, 1)
        self.zero_requested = False  # zero queue: a message was asked for and not taken yet
        self.zero_permits = 0  # zero queue: the permits the broker holds for us (negative after a batch)
        self.taken = 0  # guarded by the parent's receive-queue lock
        self.session = 0  # likewise; a new one at every (re)subscription
        self._conn: Connection | None = None
        self.ready = asyncio.Event()
        self._closed = False
        self._epoch = 0
        #: Entries dropped as sent before the last redeliver-all (stale epoch), and whether the
        #: broker then skipped one of them (see ``MessageFlow.on_message``).
        self.stale_entries: set[tuple[int, int]] = set()
        self.skipped_after_redeliver = False
        self.last_arrival = 0.0  # time.monotonic() of the last entry the broker sent
        self._reconnect_task: asyncio.Task[None] | None = None
        self._ack_inbox: deque[tuple[Message | MessageId, bool]] = deque()
        # (ledger, entry, partition, batch size) -> batch indexes not yet acknowledged
        self._batch_unacked: dict[tuple[int, int, int, int], set[int]] = {}
        self._nacks: dict[MessageId, float] = {}
        self.end_of_topic = False
        self.active = True
        self.resume_from: MessageId | None = None  # non-durable readers: where a resubscribe starts
        self.resume_inclusive = False  # ... and whether the message there is handed out (after a seek)
        self.seek_skip: MessageId | None = None  # after a seek: skip up to this id
        self.seek_inclusive = False  # ... but not the id itself
        self.seek_entry_only = False  # a reader's start: skip within the start's entry only
        self.payload_limit = DEFAULT_MAX_MESSAGE_SIZE  # bound on a decompressed entry; set at subscribe

    def __hash__(self) -> int:
        return self.consumer_id

    # ---------------------------------------------------------------- subscribe

    async def start(self) -> None:
        try:
            await self._subscribe()
            log.info("subscribed to %s (subscription %r, consumer %r)", self.topic, self.conf.subscription_name,
                     self.conf.consumer_name or "")
        except ClosedWhileSubscribing:
            # The broker closed the consumer as it subscribed (its topic was unloaded, deleted or
            # re-created under it): not an error of the caller's; subscribe again in the background.
            log.info("consumer on %s was closed by the broker while subscribing; resubscribing", self.topic)
            self._schedule_reconnect()

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
        if conf.schema is not None:
            wire_schema = schema_to_pb(conf.schema)
            if wire_schema is not None:
                fields["schema"] = wire_schema
        if self.resume_from is not None:
            start, inclusive = self.resume_from, self.resume_inclusive
        else:
            start, inclusive = conf.start_message_id, conf.start_message_id_inclusive
        if not conf.durable and start is not None:
            if inclusive and isinstance(start, ChunkMessageId):
                start = start.first_chunk_message_id()  # a chunked message starts at its first chunk
            fields["start_message_id"] = start.to_pb()
            # The broker starts at the start's entry, a batch entry whole: what precedes the start in
            # it (and the start itself, unless inclusive) is dropped as it arrives, so nothing is
            # queued that the reader would not hand out.
            special = start.entry_key[:2] in (EARLIEST.entry_key[:2], LATEST.entry_key[:2])
            if not special and (not inclusive or start.batch_index() > 0):
                self.seek_skip, self.seek_inclusive, self.seek_entry_only = start, inclusive, True
        if conf.read_compacted:
            fields["read_compacted"] = True
        if conf.consumer_type == ConsumerType.KeyShared:
            if conf.key_shared_policy is not None:
                fields["keySharedMeta"] = conf.key_shared_policy.to_pb()
            else:
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
        if conn.consumers.get(self.consumer_id) is not self:
            # The answer came, but so did a CLOSE_CONSUMER (or the connection dropped) before this
            # coroutine resumed: both are dispatched from one read, and the close already ran
            # _lost() while _conn was None (ignored, or skipped because this very reconnect was
            # running). Marking the consumer ready now would leave it "subscribed" to nothing: no
            # FLOW the broker accepts, no messages, no further resubscribe.
            raise ClosedWhileSubscribing("the broker closed the consumer while it was subscribing",
                                         topic=self.topic)
        self._conn = conn
        pool = self.ctx.pool
        self.payload_limit = pool.max_uncompressed_message_size or conn.max_message_size
        self.parent.receive_queue.reset(self)
        if self.zero_queue:
            self.zero_permits = 0
            if self.zero_requested:  # asked for in the session that ended: ask again
                self.ask_one()
        else:
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
        self._schedule_reconnect()
        notify = getattr(self.parent, "on_topic_consumer_lost", None)
        if notify is not None:
            notify(self)

    def _schedule_reconnect(self) -> None:
        if self._closed or (self._reconnect_task and not self._reconnect_task.done()):
            return
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while not self._closed:
            await asyncio.sleep(backoff.next())
            try:
                await self._subscribe()
                log.info("consumer on %s resubscribed", self.topic)
                self.flush_acks()
                notify = getattr(self.parent, "on_topic_consumer_resubscribed", None)
                if notify is not None:
                    notify(self)
                return
            except PulsarError as exc:
                log.debug("resubscribe to %s failed: %s", self.topic, exc)

    def on_active_change(self, active: bool) -> None:
        self.active = active

    def on_end_of_topic(self) -> None:
        self.end_of_topic = True

    async def get_schema(self, version: bytes) -> pb.Schema | None:
        """The topic's schema of ``version`` from the broker's registry (GET_SCHEMA); None if it has none."""
        return await get_schema(self.ctx, self.topic, version)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on this topic/partition (ledger -1 if empty)."""
        d = (await self.last_message_id_response()).last_message_id
        return MessageId.from_pb(d, partition=self.partition, topic=self.topic)

    async def last_message_id_response(self) -> pb.CommandGetLastMessageIdResponse:
        """The broker's whole answer to GetLastMessageId, in one round trip: ``last_message_id``
        and, on a durable subscription, ``consumer_mark_delete_position`` (the subscription's cursor).
        Waits up to the operation timeout for the subscription; raises :class:`~txn.ConnectError`."""
        if not self.ready.is_set():
            await asyncio.wait_for(self.ready.wait(), self.ctx.operation_timeout)
        conn = self._conn
        if conn is None:
            raise ConnectError("consumer is not connected", topic=self.topic)
        rid = next_request_id()
        resp = await conn.request(command(T.GET_LAST_MESSAGE_ID, consumer_id=self.consumer_id, request_id=rid), rid)
        check_error(resp, "get last message id", topic=self.topic)
        return resp.getLastMessageIdResponse

    async def seek(self, target: MessageId | int, exclusive: bool = False) -> None:
        """Move the subscription's cursor to a message id or a publish time (ms since the epoch).

        The broker answers, then closes this consumer, which resubscribes; whatever was queued
        before the seek is dropped so that no pre-seek message is handed out. With ``exclusive``,
        the message ``target`` itself (and what precedes it in its batch) is skipped too."""
        if not self.ready.is_set():
            await asyncio.wait_for(self.ready.wait(), self.ctx.operation_timeout)
        conn = self._conn
        if conn is None:
            raise ConnectError("consumer is not connected", topic=self.topic)
        # Acknowledgements still grouped here go out first, on the same connection: sent after the
        # seek, they would acknowledge again what the seek made deliverable.
        self.flush_acks()
        rid = next_request_id()
        fields: dict[str, Any] = {"consumer_id": self.consumer_id, "request_id": rid}
        if isinstance(target, MessageId):
            # A chunked message is sought at its first chunk, as by the official client: the broker
            # then sends every chunk again (its last chunk alone would not make the message).
            at = target.first_chunk_message_id() if isinstance(target, ChunkMessageId) else target
            fields["message_id"] = at.to_pb()
            self.resume_from, self.resume_inclusive = target, not exclusive
            special = target.entry_key[:2] in (EARLIEST.entry_key[:2], LATEST.entry_key[:2])
            # Exclusive: skip the target and what precedes it in its batch; inclusive: only what precedes it.
            self.seek_skip = target if not special and (exclusive or target.batch_index() > 0) else None
            self.seek_inclusive, self.seek_entry_only = not exclusive, False
        else:
            self.seek_skip = None
            fields["message_publish_time"] = target
            self.resume_from = None
        resp = await conn.request(command(T.SEEK, **fields), rid)
        check_error(resp, "seek", topic=self.topic)
        if self._conn is conn:
            # The broker's close is still on its way: stop taking this session's messages now.
            conn.consumers.pop(self.consumer_id, None)
            self._lost(ConnectError("seek", topic=self.topic))
        # Else the broker's close came first: ``_lost`` dropped the old session's messages then,
        # and whatever is queued now came from the session after the seek (a resubscribe can
        # finish before this answer is read), so it stays.

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


async def get_schema(ctx: Any, topic: str, version: bytes | None = None) -> pb.Schema | None:
    """``topic``'s schema of ``version`` (its latest without one) from the broker's registry
    (GET_SCHEMA), over ``ctx``'s connection pool (:attr:`txn.AsyncClient.context`); None if it has none."""
    conn = await ctx.pool.connection_for(topic)
    rid = next_request_id()
    fields: dict[str, Any] = {"request_id": rid, "topic": topic}
    if version is not None:
        fields["schema_version"] = version
    resp = await conn.request(command(T.GET_SCHEMA, **fields), rid)
    check_error(resp, "get schema", topic=topic)
    r = resp.getSchemaResponse
    if r.HasField("error_code"):
        if r.error_code == pb.ServerError.TopicNotFound:
            return None
        raise from_server_error(pb.ServerError.Name(r.error_code), r.error_message, topic=topic)
    return r.schema if r.HasField("schema") else None
