"""Sending: the per-partition producer on the broker - create, reconnect and resend, receipts,
send errors, send timeouts, close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from ..backoff import Backoff
from ..connection import Connection, check_error, command, next_request_id
from ..context import ClientContext
from ..errors import AlreadyClosed, ConnectError, ProducerFenced, PulsarError, Timeout, from_server_error
from ..message import ChunkMessageId, MessageId, signed64
from ..protocol import pb
from ..schema import schema_to_pb
from .accumulator import _Batch, _Op
from .config import _NO_TXN, ProducerAccessMode, ProducerConfig, _kv

log = logging.getLogger("txn.producer")
T = pb.BaseCommand


class Sender:
    """Part of :class:`~.partition.PartitionProducer`: the producer on the broker.

    Creates it (retrying ``ProducerBusy``), writes the pending frames again after a reconnect
    with the same sequence ids, matches receipts and send errors to frames, fails what passes
    ``send_timeout_millis``, and closes. It sends the accumulator's open batch (``_flush_batch``)
    before failing what is pending, and frees window room (``_release``) as receipts arrive.
    """

    _ctx: ClientContext
    _user_named: bool
    _reconnect_task: asyncio.Task[None] | None
    _timeout_task: asyncio.Task[None] | None
    _epoch: int
    _topic_epoch: int | None
    schema_version: bytes | None
    reconnects: int
    max_message_size: int
    last_sequence_id_published: int

    conf: ProducerConfig
    topic: str
    partition: int
    producer_id: int
    producer_name: str
    window: int
    queued: int
    conn: Connection | None
    ready: bool
    _pending: deque[_Op]
    _batch: _Batch | None
    _batch_timer: asyncio.TimerHandle | None
    _seq: int
    _closed: bool
    _fatal: PulsarError | None
    _creating: bool
    _space_waiters: deque[asyncio.Future[None]]

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Create the producer on the broker (raises the broker's error).

        ``ProducerBusy`` is retried until the operation timeout: after a crash the broker may
        still hold the previous holder of a fixed producer name until it notices.
        """
        pool = self._ctx.pool
        await pool.retrying(f"create producer on {self.topic}", self._create, topic=self.topic)
        log.info("created producer %s on %s", self.producer_name, self.topic)
        loop = asyncio.get_running_loop()
        self._timeout_task = loop.create_task(self._timeout_loop())

    async def _create(self) -> None:
        self._creating = True
        try:
            await self._create_once()
        finally:
            self._creating = False

    async def _create_once(self) -> None:
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
            "producer_access_mode": int(self._access_mode()),
        }
        if self._topic_epoch is not None:
            fields["topic_epoch"] = self._topic_epoch
        if self.conf.schema is not None:
            wire_schema = schema_to_pb(self.conf.schema)
            if wire_schema is not None:
                fields["schema"] = wire_schema
        if self.conf.encryptor is not None:
            fields["encrypted"] = True
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
        if conn.producers.get(self.producer_id) is not self or conn.closed:
            # The broker closed the producer (CLOSE_PRODUCER) or the connection dropped while the
            # answer was on its way: going on would send to a producer the broker no longer has,
            # whose receipts nobody would route here. Create it again.
            conn.producers.pop(self.producer_id, None)
            raise ConnectError("the producer was closed by the broker while it was being created", topic=self.topic)
        ok = resp.producer_success
        self.producer_name = ok.producer_name
        if ok.HasField("topic_epoch"):
            self._topic_epoch = ok.topic_epoch
        if ok.HasField("schema_version"):
            self.schema_version = ok.schema_version
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

    def _access_mode(self) -> ProducerAccessMode:
        """The mode to ask for: a producer that took a topic ``ExclusiveWithFencing`` asks for plain
        ``Exclusive`` (with its topic epoch) when it re-creates itself after a lost connection.

        The broker handles ``ExclusiveWithFencing`` by closing every producer on the topic *before*
        it checks the epoch, so a fenced-out producer reconnecting in that mode would knock out the
        producer that fenced it (and then be refused itself). In ``Exclusive`` mode with an epoch
        older than the topic's it is only refused, with ``ProducerFenced``.
        """
        mode = self.conf.access_mode
        if mode == ProducerAccessMode.ExclusiveWithFencing and self._topic_epoch is not None:
            return ProducerAccessMode.Exclusive
        return mode

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
        if self._creating:
            return  # the create under way sees it (no longer registered) and tries again
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
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed or (task is not None and task.cancelling()):
                    raise
                # A cancellation that reached us through something shared (not this task's own):
                # never let it end the reconnect loop, or the producer waits for nothing forever.
                log.info("producer reconnect to %s interrupted; retrying", self.topic)
                continue
            except (OSError, RuntimeError) as exc:
                log.info("producer reconnect to %s failed (%s); retrying", self.topic, exc)
                continue
            except PulsarError as exc:
                # A broker that is still starting (after a restart) answers some of these, e.g.
                # UnknownError "Bookie handle is not available" while its managed ledger opens.
                if exc.retriable or isinstance(exc, (Timeout,)) or exc.server_error in (
                    "ServiceNotReady", "ProducerBusy", "MetadataError", "PersistenceError", "TopicNotFound",
                    "UnknownError",
                ):
                    log.debug("producer reconnect to %s failed: %s", self.topic, exc)
                    continue
                if isinstance(exc, ProducerFenced):
                    log.warning("producer on %s was fenced out by a newer exclusive producer: %s", self.topic, exc)
                else:
                    log.error("producer on %s cannot reconnect: %s", self.topic, exc)
                self._fail_all(exc)
                self._fatal = exc
                return

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
        ledger, entry = signed64(mid.ledgerId), signed64(mid.entryId)  # -1: deduplicated
        n = len(op.futures)
        if op.chunks is not None:  # a chunk: the message's receipt is its last chunk's
            op.chunks.append(MessageId(self.partition, ledger, entry, topic=self.topic))
            if n and not op.futures[0].done():
                op.futures[0].set_result(ChunkMessageId(op.chunks))
            self._release(n)
            return
        for i, f in enumerate(op.futures):
            if not f.done():
                f.set_result(
                    MessageId(self.partition, ledger, entry, i if op.batched else -1,
                              batch_size=n if op.batched else 0, topic=self.topic)
                )
        self._release(n)

    def on_send_error(self, e: pb.CommandSendError) -> None:
        name = pb.ServerError.Name(e.error)
        op = next((o for o in self._pending if o.seq <= e.sequence_id <= max(o.seq, o.highest)), None)
        if op is None and name != "ChecksumError":
            # An error for a send already resolved (e.g. a second answer for a frame re-sent after a
            # reconnect): closing the connection would only re-send the rest into the same answer.
            log.debug("send error %s for sequence id %d, which is not pending on %s: %s", name, e.sequence_id,
                      self.topic, e.message)
            return
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
                self._recreate_after_timeout()

    def _recreate_after_timeout(self) -> None:
        """A connected producer that got no receipt for a whole send timeout is out of step with the
        broker (a producer the broker closed, receipts lost): create it on the broker again."""
        conn = self.conn
        if not self.ready or conn is None or self._closed:
            return
        log.warning("producer %s on %s got no receipt within its send timeout; creating it again", self.producer_name,
                    self.topic)
        self.ready = False
        conn.producers.pop(self.producer_id, None)
        self.conn = None
        with contextlib.suppress(ConnectError):
            conn.send_command(command(T.CLOSE_PRODUCER, producer_id=self.producer_id, request_id=next_request_id()))
        self._schedule_reconnect(Timeout("no receipt within the send timeout", topic=self.topic))

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

    async def close(self, flush: bool = True) -> None:
        """Close; pending sends fail with :class:`AlreadyClosed` (after a flush unless ``flush`` is False)."""
        if self._closed:
            return
        if flush:
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
