"""Synchronous facade: ``Client``, ``Producer``, ``Consumer``, ``Transaction``.

One event loop runs the asyncio core in a daemon thread (:class:`txn.bridge.LoopThread`);
every blocking call hands a coroutine to it and waits. Hot paths avoid a round trip per call:
``send_async`` queues into a thread-safe inbox drained by the loop, ``receive``
pops from the thread-safe receive queue, and plain acks are grouped.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .args import NUMBER, check_send, check_type_or_none, deliver_time
from .auth import Authentication
from .bridge import LoopThread
from .client import AsyncClient
from .client_logger import ConsoleLogger, FileLogger
from .connection import MAX_MESSAGE_SIZE_CEILING
from .consumer import AsyncConsumer, ConsumerType, InitialPosition
from .errors import AlreadyClosed, ProducerQueueIsFull, PulsarError, Result, Timeout
from .failover import AutoClusterFailover, ServiceInfo, ServiceInfoProvider
from .message import Message, MessageId
from .pool import MAX_PARTITIONS
from .producer import AsyncProducer, run_callback
from .protocol import CompressionType
from .reader_listener import check_reader_listener, reader_delivery
from .schema import BytesSchema, Schema
from .table_view import TableView
from .transaction import AsyncTransaction, TxnState

_log = logging.getLogger("txn.consumer")


class Transaction:
    """A Pulsar transaction (blocking API). ``with txn:`` commits, or aborts on an exception."""

    def __init__(self, inner: AsyncTransaction, lt: LoopThread) -> None:
        self._inner = inner
        self._lt = lt

    @property
    def async_transaction(self) -> AsyncTransaction:
        """The asyncio transaction this one wraps."""
        return self._inner

    @property
    def id(self) -> Any:
        """The :class:`~txn.TxnID`; ``str()`` gives ``(most,least)``."""
        return self._inner.id

    @property
    def state(self) -> TxnState:
        """Current :class:`~txn.TxnState`."""
        return self._inner.state

    def commit(self) -> None:
        """Commit (after the transaction's sends and acks complete)."""
        self._lt.run(self._inner.commit())

    def abort(self) -> None:
        """Abort."""
        self._lt.run(self._inner.abort())

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        self._lt.run(self._inner.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return repr(self._inner)


class Producer:
    """A producer (blocking API); see :class:`~txn.producer.AsyncProducer`."""

    def __init__(self, inner: AsyncProducer, lt: LoopThread) -> None:
        self._inner = inner
        self._lt = lt
        window = inner.conf.max_pending_messages * max(len(inner.partition_producers), 1)
        window = min(window, max(inner.conf.max_pending_messages_across_partitions, inner.conf.max_pending_messages))
        self._slots = threading.BoundedSemaphore(window)
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._drain_scheduled = False
        self._lock = threading.Lock()

    @property
    def async_producer(self) -> AsyncProducer:
        """The asyncio producer this one wraps."""
        return self._inner

    def topic(self) -> str:
        """The topic."""
        return self._inner.topic()

    def producer_name(self) -> str:
        """The broker-assigned (or given) producer name."""
        return self._inner.producer_name()

    def last_sequence_id(self) -> int:
        """Highest sequence id the broker confirmed."""
        return self._inner.last_sequence_id()

    def send(
        self,
        content: bytes | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        *,
        event_timestamp: int | None = None,
        txn: Transaction | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send and block until the broker confirms; returns the :class:`MessageId`.

        The message arguments come in the official ``send``'s order (``event_timestamp``, ``txn``,
        ``deliver_at`` and ``deliver_after`` by keyword); bad types raise ``ValueError`` as there.
        An open batch goes out at once, as the official blocking ``send`` flushes it. ``content=None``
        sends a null-value message (a tombstone: ``Message.has_null_value()`` is True)."""
        if self._inner.closed:  # also after Client.shutdown(), whose loop has stopped
            raise AlreadyClosed("producer is closed", topic=self._inner.topic())
        return self._lt.run(
            self._inner.send_now(
                content,
                properties=properties,
                partition_key=partition_key,
                ordering_key=ordering_key,
                sequence_id=sequence_id,
                event_timestamp=event_timestamp,
                txn=txn.async_transaction if txn is not None else None,
                deliver_at=deliver_at,
                deliver_after=deliver_after,
            )
        )

    def send_async(
        self,
        content: bytes | None,
        callback: Callable[[Result, MessageId | None], Any] | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        *,
        event_timestamp: int | None = None,
        txn: Transaction | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> None:
        """Queue a message; ``callback(result, message_id)`` runs on the client's thread.

        Arguments as in :meth:`send`. Blocks while the pending window is full if
        ``block_if_queue_full`` was set, otherwise raises :class:`ProducerQueueIsFull`.
        """
        if self._inner.closed:
            raise AlreadyClosed("producer is closed", topic=self._inner.topic())
        check_send(properties, partition_key, ordering_key, sequence_id, event_timestamp)
        deliver_time(deliver_at, deliver_after)
        self._inner.check_content(content)
        if txn is not None or deliver_at or deliver_after:
            t = txn.async_transaction if txn is not None else None
            if t is not None:
                t.check_open()

            async def go() -> None:
                fut = await self._inner.send_async(
                    content, callback, properties, partition_key, ordering_key, sequence_id,
                    event_timestamp=event_timestamp, txn=t, deliver_at=deliver_at, deliver_after=deliver_after,
                )
                del fut

            self._lt.run(go())
            return
        if not self._slots.acquire(blocking=self._inner.conf.block_if_queue_full):
            raise ProducerQueueIsFull("pending window is full", topic=self._inner.topic())
        self._inbox.append((content, callback, properties, partition_key, event_timestamp, sequence_id, ordering_key))
        with self._lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._lt.call_soon(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._drain_scheduled = False
        inner = self._inner
        while self._inbox:
            content, cb, props, key, ts, seq, okey = self._inbox.popleft()
            try:
                fut = inner.send_nowait(content, props, key, ts, seq, block=True, ordering_key=okey)
            except PulsarError as exc:
                self._slots.release()
                if cb is not None:
                    _call_cb(cb, exc.result, None)
                continue
            if fut is None:  # window full in the core: retry when room frees up
                self._inbox.appendleft((content, cb, props, key, ts, seq, okey))
                asyncio.ensure_future(self._wait_and_drain())
                with self._lock:
                    self._drain_scheduled = True
                return
            fut.add_done_callback(lambda f, cb=cb: self._done(f, cb))

    async def _wait_and_drain(self) -> None:
        await self._inner.wait_space()
        self._drain()

    def _done(self, fut: asyncio.Future[MessageId], cb: Callable[..., Any] | None) -> None:
        self._slots.release()
        if cb is not None:
            run_callback(cb, fut)

    def flush(self) -> None:
        """Block until every queued message is confirmed."""

        async def go() -> None:
            while self._inbox:
                self._drain()
                await asyncio.sleep(0.001)
            await self._inner.flush()

        self._lt.run(go())

    def close(self) -> None:
        """Flush and close."""
        if self._inner.closed:
            return
        self.flush()
        self._lt.run(self._inner.close())

    def is_connected(self) -> bool:
        """True when connected to the broker(s)."""
        return self._inner.is_connected()


def _call_cb(cb: Callable[..., Any], res: Result, mid: MessageId | None) -> None:
    try:
        cb(res, mid)
    except Exception:  # pragma: no cover - user callback bug
        import logging

        logging.getLogger("txn.producer").exception("send callback raised")


class Consumer:
    """A consumer (blocking API); see :class:`~txn.consumer.AsyncConsumer`."""

    def __init__(self, inner: AsyncConsumer, lt: LoopThread) -> None:
        self._inner = inner
        self._lt = lt
        self._listener_thread: threading.Thread | None = None
        self._listener_resumed = threading.Event()
        self._listener_resumed.set()

    # -------------------------------------------------------- message listener

    def _start_listener(self, listener: Callable[[Consumer, Message], Any]) -> None:
        """Call ``listener(self, message)`` for every message, one at a time, on a thread of its own."""
        self._inner.message_listener = listener
        self._listener_thread = threading.Thread(target=self._listen, args=(listener,), daemon=True,
                                                 name=f"txn-listener-{self._inner.subscription_name()}")
        self._listener_thread.start()

    def _listen(self, listener: Callable[[Consumer, Message], Any]) -> None:
        inner = self._inner
        queue = inner.receive_queue
        while not inner.closed:
            self._listener_resumed.wait()
            try:
                if inner.zero_queue:
                    inner.want_one()
                msg = queue.get_blocking(0.5)
                if inner.zero_queue:
                    inner.got_one()
                if inner.conf.schema is not None:
                    self._lt.run(inner.learn_writer_schema(msg))
            except Timeout:
                continue
            except AlreadyClosed:
                return
            except PulsarError as exc:  # a corrupt entry's error, at its place in the stream
                _log.error("message listener of %s skipped: %s", inner.topic(), exc)
                continue
            except RuntimeError:  # the client's loop has stopped
                return
            self._listener_resumed.wait()  # paused while this one was awaited: hold it until resumed
            if inner.closed:
                return
            inner.handed_out(msg)
            try:
                listener(self, msg)
            except Exception:
                _log.exception("message listener of %s raised", inner.topic())

    def pause_message_listener(self) -> None:
        """Stop calling the listener (messages stay queued) until :meth:`resume_message_listener`;
        a consumer without a listener raises :class:`~txn.InvalidConfiguration`."""
        self._inner.check_listener()
        self._listener_resumed.clear()

    def resume_message_listener(self) -> None:
        """Call the listener again, with the messages queued meanwhile first."""
        self._inner.check_listener()
        self._listener_resumed.set()

    def _join_listener(self) -> None:
        thread = self._listener_thread
        self._listener_resumed.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The asyncio consumer this one wraps."""
        return self._inner

    def topic(self) -> str:
        """The (first) topic."""
        return self._inner.topic()

    def subscription_name(self) -> str:
        """The subscription."""
        return self._inner.subscription_name()

    def consumer_name(self) -> str:
        """The consumer's name (see :meth:`AsyncConsumer.consumer_name`)."""
        return self._inner.consumer_name()

    def receive(self, timeout_millis: int | None = None) -> Message:
        """Block for the next message; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        check_type_or_none(NUMBER, timeout_millis, "timeout_millis")
        inner = self._inner
        inner.check_zero_queue_timeout(timeout_millis)
        inner.check_receive()
        if inner.zero_queue:
            inner.want_one()
        msg = inner.receive_queue.get_blocking(None if timeout_millis is None else timeout_millis / 1000.0)
        if inner.zero_queue:
            inner.got_one()
        if self._inner.conf.schema is not None:
            self._lt.run(self._inner.learn_writer_schema(msg))
        if self._inner.unacked is not None:
            self._inner.unacked.add(msg)
        return msg

    def batch_receive(self) -> list[Message]:
        """Block until ``batch_receive_policy`` says the batch is complete (its count or bytes are
        reached, or its timeout passed); returns the messages, maybe none."""
        inner = self._inner
        inner.check_open()
        p = inner.batch_policy
        msgs = inner.receive_queue.get_batch_blocking(p.max_num_message, p.max_num_bytes,
                                                      p.timeout_ms / 1000.0 if p.timeout_ms > 0 else None)
        for m in msgs:
            if inner.conf.schema is not None:
                self._lt.run(inner.learn_writer_schema(m))
            inner.handed_out(m)
        return msgs

    def acknowledge(self, message_or_id: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge; with ``txn`` it blocks until the broker accepted the transactional ack."""
        if txn is None:
            sub = getattr(message_or_id, "consumer", None)
            if sub is not None and sub.parent is self._inner and not self._inner.closed:
                sub.ack_local(message_or_id, False)  # fast path: grouped, sent by the loop's ticker
                return
            self._inner.acknowledge_nowait(message_or_id)
            return

        async def go() -> None:
            await self._inner.acknowledge(message_or_id, txn.async_transaction)

        self._lt.run(go())

    def acknowledge_cumulative(self, message_or_id: Message | MessageId, txn: Transaction | None = None) -> None:
        """Acknowledge everything up to this message."""
        if txn is None:
            self._inner.acknowledge_nowait(message_or_id, cumulative=True)
            return
        self._lt.run(self._inner.acknowledge_cumulative(message_or_id, txn.async_transaction))

    def acknowledge_many(self, messages: list[Message], txn: Transaction) -> None:
        """Acknowledge ``messages`` inside ``txn``; blocks until the broker took every ack."""
        self._lt.run(self._inner.acknowledge_many(messages, txn.async_transaction))

    def negative_acknowledge(self, message_or_id: Message | MessageId) -> None:
        """Redeliver after the negative-ack delay."""
        self._inner.check_open()

        async def go() -> None:
            self._inner.negative_acknowledge(message_or_id)

        self._lt.run(go())

    def reconsume_later(self, message: Message, delay: timedelta | int,
                        properties: dict[str, str] | None = None) -> None:
        """Consume ``message`` again after ``delay`` (``timedelta`` or ms) through the retry-letter
        topic (subscribe with ``retry_enable=True``); blocks until the copy is stored, then
        acknowledges ``message``. See :meth:`txn.consumer.AsyncConsumer.reconsume_later`."""
        self._lt.run(self._inner.reconsume_later(message, delay, properties))

    def redeliver_unacknowledged_messages(self) -> None:
        """Redeliver all unacknowledged messages now."""

        async def go() -> None:
            self._inner.redeliver_unacknowledged_messages()

        self._lt.run(go())

    def unsubscribe(self) -> None:
        """Delete the subscription and close."""
        self._lt.run(self._inner.unsubscribe())
        self._join_listener()

    def close(self) -> None:
        """Close (pending acks are flushed first); waits for a listener call in progress to return."""
        self._lt.run(self._inner.close())
        self._join_listener()

    def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the topic (non-partitioned or one partition)."""
        return self._lt.run(self._inner.get_last_message_id())

    def seek(self, messageid: MessageId | int) -> None:
        """Reset the subscription to a message id or a publish time (int, ms since the epoch)."""
        self._lt.run(self._inner.seek(messageid))

    def is_connected(self) -> bool:
        """True when subscribed on every topic/partition."""
        return self._inner.is_connected()


class Reader:
    """A reader (blocking API) of a topic, a partition or all partitions of a partitioned topic; see
    :class:`~txn.reader.AsyncReader` and :class:`~txn.partitioned_reader.AsyncPartitionedReader`."""

    def __init__(self, inner: Any, lt: LoopThread, listener: Callable[[Reader, Message], Any] | None = None) -> None:
        self._inner = inner
        self._lt = lt
        #: With a listener: the blocking consumer whose listener thread calls it (see :meth:`Client.create_reader`).
        self._listening: Consumer | None = None
        if listener is not None:
            self._listening = Consumer(inner.async_consumer, lt)
            self._listening._start_listener(reader_delivery(inner, self, listener))  # noqa: SLF001 - same module

    @property
    def async_reader(self) -> Any:
        """The asyncio reader this one wraps (an ``AsyncReader`` or an ``AsyncPartitionedReader``)."""
        return self._inner

    def topic(self) -> str:
        """The topic read."""
        return self._inner.topic()

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        return self._lt.run(self._inner.read_next(timeout_millis))

    def seek(self, messageid: MessageId | int) -> None:
        """Reset the reader to a message id or a publish time (int, ms since the epoch)."""
        self._lt.run(self._inner.seek(messageid))

    def has_message_available(self) -> bool:
        """True if a message after the last one read is stored."""
        return self._lt.run(self._inner.has_message_available())

    def is_connected(self) -> bool:
        """True while open and subscribed (on every partition); False once closed."""
        return self._inner.is_connected()

    def close(self) -> None:
        """Close; with a listener, waits for a call of it in progress to return (none follows)."""
        self._lt.run(self._inner.close())
        if self._listening is not None:
            self._listening._join_listener()  # noqa: SLF001 - same module


class Client:
    """A Pulsar client with a blocking API; parameters mirror ``pulsar.Client`` (``service_url`` may be
    an :class:`~txn.AutoClusterFailover` or a :class:`~txn.ServiceInfoProvider`)."""

    def __init__(
        self,
        service_url: str | AutoClusterFailover | ServiceInfoProvider,
        authentication: Authentication | None = None,
        operation_timeout_seconds: float = 30,
        connection_timeout_ms: int = 10000,
        keep_alive_interval_seconds: float = 30,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        max_partitions: int = MAX_PARTITIONS,
        max_message_size_ceiling: int = MAX_MESSAGE_SIZE_CEILING,
        max_uncompressed_message_size: int | None = None,
        tls_private_key_file_path: str | None = None,
        tls_certificate_file_path: str | None = None,
        logger: logging.Logger | ConsoleLogger | FileLogger | None = None,
    ) -> None:
        self._lt = LoopThread()
        self._closed = False

        async def make() -> AsyncClient:
            return AsyncClient(
                service_url,
                authentication=authentication,
                operation_timeout_seconds=operation_timeout_seconds,
                connection_timeout_ms=connection_timeout_ms,
                keep_alive_interval_seconds=keep_alive_interval_seconds,
                tls_trust_certs_file_path=tls_trust_certs_file_path,
                tls_allow_insecure_connection=tls_allow_insecure_connection,
                tls_validate_hostname=tls_validate_hostname,
                max_partitions=max_partitions,
                max_message_size_ceiling=max_message_size_ceiling,
                max_uncompressed_message_size=max_uncompressed_message_size,
                tls_private_key_file_path=tls_private_key_file_path,
                tls_certificate_file_path=tls_certificate_file_path,
                logger=logger,
            )

        try:
            self._inner = self._lt.run(make())
        except BaseException:
            self._lt.close()
            raise

    def _check(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")

    def get_service_info(self) -> ServiceInfo:
        """The cluster this client uses now (as ``pulsar.Client.get_service_info``)."""
        return self._inner.get_service_info()

    @property
    def bridge(self) -> LoopThread:
        """The thread and event loop this client's asyncio core runs on (to run more coroutines there)."""
        return self._lt

    @property
    def async_client(self) -> AsyncClient:
        """The asyncio client this one wraps (use it only on :attr:`bridge`'s loop)."""
        return self._inner

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_producer(self, topic: str, **kwargs: Any) -> Producer:
        """Create a producer; keyword arguments as in :meth:`AsyncClient.create_producer`."""
        self._check()
        return Producer(self._lt.run(self._inner.create_producer(topic, **kwargs)), self._lt)

    def subscribe(
        self,
        topic: str | list[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        initial_position: InitialPosition = InitialPosition.Latest,
        message_listener: Callable[[Consumer, Message], Any] | None = None,
        **kwargs: Any,
    ) -> Consumer:
        """Subscribe; keyword arguments as in :meth:`AsyncClient.subscribe`.

        ``message_listener(consumer, message)`` is called for each message, one at a time, on a
        thread of the consumer's own (``receive()`` then raises :class:`~txn.InvalidConfiguration`)."""
        self._check()
        if message_listener is not None and not callable(message_listener):
            raise ValueError("message_listener must be callable")
        consumer = Consumer(
            self._lt.run(
                self._inner.subscribe(
                    topic, subscription_name, consumer_type=consumer_type, initial_position=initial_position,
                    **kwargs,
                )
            ),
            self._lt,
        )
        if message_listener is not None:
            consumer._start_listener(message_listener)  # noqa: SLF001 - its own class
        return consumer

    def create_reader(self, topic: str, start_message_id: MessageId, start_message_id_inclusive: bool = False,
                      *, reader_listener: Callable[[Reader, Message], Any] | None = None, **kwargs: Any) -> Reader:
        """Read ``topic`` from ``start_message_id`` (``txn.EARLIEST``, ``txn.LATEST`` or a message id);
        the keywords of :meth:`AsyncClient.create_reader`, ``schema=`` among them.

        ``reader_listener(reader, message)`` is called for each message, in order, one at a time, on
        a thread of the reader's own; an exception it raises is logged and the next message follows.
        ``read_next()`` then raises :class:`~txn.InvalidConfiguration`, as in the official client."""
        self._check()
        check_reader_listener(reader_listener)
        inner = self._lt.run(self._inner.create_reader(topic, start_message_id, start_message_id_inclusive, **kwargs))
        return Reader(inner, self._lt, reader_listener)

    def create_table_view(self, topic: str, subscription_name: str | None = None,
                          schema: Schema = BytesSchema()) -> TableView:
        """A table view of ``topic``, once read to its end (see :meth:`AsyncClient.create_table_view`)."""
        self._check()
        return TableView(self._lt.run(self._inner.create_table_view(topic, subscription_name, schema)), self._lt)

    def new_transaction(self, timeout_millis: int = 60000) -> Transaction:
        """Open a transaction that the broker aborts if not ended within ``timeout_millis`` (see
        :meth:`AsyncClient.new_transaction`)."""
        self._check()
        return Transaction(self._lt.run(self._inner.new_transaction(timeout_millis)), self._lt)

    def transaction_from_id(self, txn_id: Any, timeout_millis: int = 60000) -> Transaction:
        """A handle on a transaction opened elsewhere (see :meth:`AsyncClient.transaction_from_id`)."""
        self._check()
        return Transaction(self._inner.transaction_from_id(txn_id, timeout_millis), self._lt)

    def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of ``topic``."""
        self._check()
        return self._lt.run(self._inner.get_topic_partitions(topic))

    def shutdown(self) -> None:
        """Close everything at once without waiting for pending operations (see :meth:`AsyncClient.shutdown`)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._inner.shutdown(), timeout=60)
        finally:
            self._lt.close()

    def close(self) -> None:
        """Close everything and stop the client's thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._inner.close(), timeout=60)
        finally:
            self._lt.close()


__all__ = ["Client", "Consumer", "Producer", "Reader", "TableView", "Transaction", "CompressionType"]
