"""The official ``pulsar.asyncio`` API over :class:`txn.AsyncClient` (issue 19), imported as ``txn.asyncio``.

``from txn.asyncio import Client`` in place of ``from pulsar.asyncio import Client``: the same
classes (``Client``, ``Producer``, ``Consumer``, ``Reader``, ``PulsarException``), methods,
keyword names, positions and defaults. Each class is a thin wrapper around ours
(:class:`~txn.AsyncProducer`, :class:`~txn.AsyncConsumer`, :class:`~txn.AsyncReader`), which it
leaves as it is; where the official module differs from ``txn.AsyncClient`` the wrapper follows
the official one:

- every failure of a call is a :class:`PulsarException` whose ``error()`` is the
  :class:`~txn.Result`: ours are re-raised as a class under both ``PulsarException`` and their
  own ``txn`` class, so ``except txn.Timeout`` keeps working, and a builtin ``TimeoutError`` is
  ``Result.Timeout``; bad argument types stay ``ValueError`` or ``TypeError``, as there;
- ``Client.shutdown()`` is a plain call; ``Consumer.receive()`` takes no timeout; closing a
  producer or client twice raises ``AlreadyClosed``; ``negative_acknowledge`` and
  ``redeliver_unacknowledged_messages`` on a closed consumer do nothing;
- options ``txn`` does not implement (replication options)
  raise ``TypeError`` naming the keyword when given; the tuning knobs without an effect here
  (``broker_consumer_stats_cache_time_ms``, ``batch_index_ack_enabled``,
  ``lazy_start_partitioned_producers``) are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from .args import check_type
from .client import AsyncClient
from .consumer import AsyncConsumer, ConsumerType, InitialPosition, RegexSubscriptionMode
from .consumer.async_consumer import seek_target
from .consumer.batch_receive import ConsumerBatchReceivePolicy
from .consumer.dead_letter import ConsumerDeadLetterPolicy
from .consumer.key_shared import ConsumerKeySharedPolicy
from .crypto import ConsumerCryptoFailureAction, CryptoKeyReader
from .errors import AlreadyClosed, InvalidConfiguration, PulsarError, Result
from .message import Message, MessageId
from .producer import AsyncProducer, BatchingType, PartitionsRoutingMode, ProducerAccessMode
from .protocol import CompressionType
from .reader import AsyncReader
from .schema import Schema

__all__ = [
    "BatchingType",
    "Client",
    "CompressionType",
    "Consumer",
    "ConsumerCryptoFailureAction",
    "InitialPosition",
    "PartitionsRoutingMode",
    "Producer",
    "ProducerAccessMode",
    "PulsarException",
    "Reader",
    "RegexSubscriptionMode",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class PulsarException(PulsarError):
    """What ``pulsar.asyncio`` raises: :meth:`error` is the :class:`~txn.Result`.

    ``PulsarException(result, msg=None)`` as there (``str()``: ``"<value> <name>: <msg>"``). Our
    errors are raised as instances of a class under both this one and their own ``txn`` class."""

    def __init__(self, result: Result, msg: str | None = None) -> None:
        self.result = result if isinstance(result, Result) else Result(result)
        super().__init__(msg or "")

    def error(self) -> Result:
        """The error code."""
        return self.result

    def __str__(self) -> str:
        text = super().__str__()
        code = f"{self.result.value} {self.result.name}"
        return f"{code}: {text}" if text else code


_DUAL: dict[type[PulsarError], type[PulsarException]] = {}


def as_pulsar_exception(exc: BaseException) -> BaseException:
    """``exc`` as a :class:`PulsarException`: a ``txn`` error becomes a copy of itself whose class is
    under both its own and ``PulsarException``; a builtin ``TimeoutError`` is ``Result.Timeout``.
    Anything else is returned as it is."""
    if isinstance(exc, PulsarException):
        return exc
    if isinstance(exc, PulsarError):
        cls = type(exc)
        dual = _DUAL.get(cls)
        if dual is None and cls is PulsarError:
            dual = PulsarException
        elif dual is None:
            dual = type(cls.__name__, (cls, PulsarException), {"__module__": cls.__module__, "__doc__": cls.__doc__})
            _DUAL[cls] = dual
        copy = dual.__new__(dual)
        copy.args = exc.args
        copy.__dict__.update(exc.__dict__)
        return copy
    if isinstance(exc, TimeoutError):
        return PulsarException(Result.Timeout, str(exc) or None)
    return exc


def _official_errors(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Decorate a coroutine method: its ``txn`` errors are raised as :class:`PulsarException`."""

    @functools.wraps(fn)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await fn(*args, **kwargs)
        except (PulsarError, TimeoutError) as exc:
            raise as_pulsar_exception(exc).with_traceback(exc.__traceback__) from None

    return call


def _unsupported(**options: Any) -> None:
    """``TypeError`` naming the first option given (not None, False or empty) that ``txn`` lacks."""
    for name, value in options.items():
        if value is not None and value is not False and value != []:
            raise TypeError(f"{name} is not supported by txn (see docs/porting.md)")


class _State:
    """What a client shares with its producers, consumers and readers: whether ``shutdown()`` was
    called (it returns at once; the closing runs in ``task``)."""

    def __init__(self) -> None:
        self.shut_down = False
        self.task: asyncio.Task[None] | None = None

    def check(self) -> None:
        if self.shut_down:
            raise AlreadyClosed("client is shut down")

    async def wait_shut_down(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)


class Producer:
    """``pulsar.asyncio.Producer`` over a :class:`~txn.AsyncProducer` (made by :meth:`Client.create_producer`)."""

    def __init__(self, producer: AsyncProducer, state: _State) -> None:
        self._producer = producer
        self._state = state

    @_official_errors
    async def send(
        self,
        content: Any,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list[str] | None = None,
        disable_replication: bool | None = None,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send a message and return its id once the broker has stored it (with batching on, it
        waits for its batch, up to ``batching_max_publish_delay_ms``)."""
        _unsupported(replication_clusters=replication_clusters, disable_replication=disable_replication)
        self._state.check()
        return await self._producer.send(content, properties=properties, partition_key=partition_key,
                                         ordering_key=ordering_key, sequence_id=sequence_id,
                                         event_timestamp=event_timestamp, deliver_at=deliver_at,
                                         deliver_after=deliver_after)

    @_official_errors
    async def flush(self) -> None:
        """Send the open batches and wait for every pending message's receipt."""
        self._check_open()
        await self._producer.flush()

    @_official_errors
    async def close(self) -> None:
        """Flush and close; ``AlreadyClosed`` if already closed (also by its client)."""
        self._check_open()
        await self._producer.close()

    def _check_open(self) -> None:
        self._state.check()
        if self._producer.closed:
            raise AlreadyClosed("producer is already closed", topic=self._producer.topic())

    def topic(self) -> str:
        """The topic written to."""
        return self._producer.topic()

    def producer_name(self) -> str:
        """The producer's name (given, or assigned by the broker)."""
        return self._producer.producer_name()

    def last_sequence_id(self) -> int:
        """The last sequence id the broker confirmed (-1 if none)."""
        return self._producer.last_sequence_id()

    def is_connected(self) -> bool:
        """True while connected (False once closed or shut down)."""
        return not self._state.shut_down and self._producer.is_connected()


class Consumer:
    """``pulsar.asyncio.Consumer`` over a :class:`~txn.AsyncConsumer` (made by :meth:`Client.subscribe`)."""

    def __init__(self, consumer: AsyncConsumer, state: _State) -> None:
        self._consumer = consumer
        self._state = state

    def _gone(self) -> bool:
        return self._state.shut_down or self._consumer.closed

    @_official_errors
    async def receive(self) -> Message:
        """The next message (waits for one; wrap in ``asyncio.wait_for`` for a time limit)."""
        self._state.check()
        return await self._consumer.receive()

    @_official_errors
    async def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (a message or its id)."""
        self._state.check()
        await self._consumer.acknowledge(message)

    @_official_errors
    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message up to and including this one (not on Shared or Key_Shared)."""
        self._state.check()
        await self._consumer.acknowledge_cumulative(message)

    @_official_errors
    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message redelivered after ``negative_ack_redelivery_delay_ms``; nothing once closed."""
        if not self._gone():
            await self._consumer.negative_acknowledge(message)

    @_official_errors
    async def unsubscribe(self) -> None:
        """Delete the subscription on the broker and close."""
        self._state.check()
        await self._consumer.unsubscribe()

    @_official_errors
    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the subscription to a message id or a publish time (ms since the epoch)."""
        seek_target(messageid)  # a bad argument is a ValueError first, as there
        self._state.check()
        await self._consumer.seek(messageid)

    @_official_errors
    async def close(self) -> None:
        """Close (again: nothing)."""
        if self._state.shut_down:
            await self._state.wait_shut_down()
            return
        await self._consumer.close()

    @_official_errors
    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the topic (one topic or partition)."""
        self._state.check()
        return await self._consumer.get_last_message_id()

    def redeliver_unacknowledged_messages(self) -> None:
        """Have every unacknowledged message redelivered now; nothing once closed."""
        if not self._gone():
            self._consumer.redeliver_unacknowledged_messages()

    def topic(self) -> str:
        """The topic subscribed to (the first of a list)."""
        return self._consumer.topic()

    def subscription_name(self) -> str:
        """The subscription's name."""
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        """The consumer's name."""
        return self._consumer.consumer_name()

    def is_connected(self) -> bool:
        """True while subscribed on every topic (not in ``pulsar.asyncio``; ours has it)."""
        return not self._state.shut_down and self._consumer.is_connected()


class Reader:
    """``pulsar.asyncio.Reader`` over a :class:`~txn.AsyncReader` (made by :meth:`Client.create_reader`)."""

    def __init__(self, reader: AsyncReader, state: _State) -> None:
        self._reader = reader
        self._state = state

    def _check_open(self) -> None:
        self._state.check()
        if self._reader.closed:
            raise AlreadyClosed("reader is closed", topic=self._reader.topic())

    @_official_errors
    async def read_next(self) -> Message:
        """The next message (waits for one)."""
        self._check_open()
        return await self._reader.read_next()

    @_official_errors
    async def has_message_available(self) -> bool:
        """True if a message after the last one read is stored on the topic."""
        self._check_open()
        return await self._reader.has_message_available()

    @_official_errors
    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the reader to a message id or a publish time (ms since the epoch)."""
        seek_target(messageid)
        self._check_open()
        await self._reader.seek(messageid)

    @_official_errors
    async def close(self) -> None:
        """Close (again: nothing)."""
        if self._state.shut_down:
            await self._state.wait_shut_down()
            return
        await self._reader.close()

    def topic(self) -> str:
        """The topic read."""
        return self._reader.topic()

    def is_connected(self) -> bool:
        """True while connected (False once closed)."""
        return not self._state.shut_down and self._reader.is_connected()


class Client:
    """``pulsar.asyncio.Client`` over a :class:`~txn.AsyncClient`.

    ``Client(service_url, **kwargs)``: the keywords of :class:`~txn.AsyncClient` (those of
    ``pulsar.Client`` that ``txn`` has; others raise ``TypeError``). It may be made outside a
    running event loop; use it on one loop."""

    def __init__(self, service_url: str, **kwargs: Any) -> None:
        self._client = AsyncClient(service_url, **kwargs)
        self._state = _State()

    @property
    def async_client(self) -> AsyncClient:
        """The :class:`~txn.AsyncClient` underneath (for what ``pulsar.asyncio`` lacks, e.g. transactions)."""
        return self._client

    def _check(self) -> None:
        self._state.check()
        if self._client.closed:
            raise AlreadyClosed("client is closed")

    @_official_errors
    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Schema | None = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = True,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: BatchingType = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: CryptoKeyReader | None = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        message_router: Callable[[Message, int], int] | None = None,
    ) -> Producer:
        """Create a producer (batching on by default, as there). ``lazy_start_partitioned_producers``
        is accepted; every partition's producer starts at once."""
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        self._check()
        router = {} if message_router is None else {"message_router": message_router}
        producer = await self._client.create_producer(
            topic, producer_name=producer_name, initial_sequence_id=initial_sequence_id,
            send_timeout_millis=send_timeout_millis, compression_type=compression_type,
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            block_if_queue_full=block_if_queue_full, batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms, properties=properties,
            access_mode=access_mode, schema=schema, message_routing_mode=message_routing_mode,
            batching_type=batching_type, chunking_enabled=chunking_enabled,
            encryption_key=encryption_key, crypto_key_reader=crypto_key_reader, **router,
        )
        return Producer(producer, self._state)

    @_official_errors
    async def subscribe(
        self,
        topic: str | list[str],
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        schema: Schema | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = 60000,
        is_read_compacted: bool = False,
        properties: dict[str, str] | None = None,
        initial_position: InitialPosition = InitialPosition.Latest,
        crypto_key_reader: CryptoKeyReader | None = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
        is_pattern_topic: bool = False,
    ) -> Consumer:
        """Subscribe to a topic, a list of topics, or with ``is_pattern_topic=True`` the topics matching
        the regex ``topic`` (of the ``regex_subscription_mode`` domains, listed again every 60 s)."""
        if not isinstance(topic, str | list):
            raise ValueError("Argument 'topic' is expected to be of type 'str' or 'list'")
        if is_pattern_topic and isinstance(topic, list):
            raise ValueError("Argument 'topic' must be a string when 'is_pattern_topic' is True; "
                             "lists of topics do not support pattern subscriptions")
        _unsupported(replicate_subscription_state_enabled=replicate_subscription_state_enabled)
        self._check()
        if subscription_name == "":
            raise InvalidConfiguration("SubscriptionName cannot be empty.")
        consumer = await self._client.subscribe(
            re.compile(topic) if is_pattern_topic and isinstance(topic, str) else topic, subscription_name,
            consumer_type=consumer_type, initial_position=initial_position,
            regex_subscription_mode=regex_subscription_mode,
            consumer_name=consumer_name, receiver_queue_size=receiver_queue_size,
            max_total_receiver_queue_size_across_partitions=max_total_receiver_queue_size_across_partitions,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms, properties=properties,
            dead_letter_policy=dead_letter_policy, schema=schema, batch_receive_policy=batch_receive_policy,
            unacked_messages_timeout_ms=unacked_messages_timeout_ms, is_read_compacted=is_read_compacted,
            start_message_id_inclusive=start_message_id_inclusive, key_shared_policy=key_shared_policy,
            max_pending_chunked_message=max_pending_chunked_message,
            auto_ack_oldest_chunked_message_on_queue_full=auto_ack_oldest_chunked_message_on_queue_full,
            crypto_key_reader=crypto_key_reader, crypto_failure_action=crypto_failure_action,
        )
        return Consumer(consumer, self._state)

    @_official_errors
    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        schema: Schema | None = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: CryptoKeyReader | None = None,
        start_message_id_inclusive: bool = False,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
    ) -> Reader:
        """Read ``topic`` (one topic or partition) from ``start_message_id`` (``MessageId.earliest``,
        ``MessageId.latest`` or an id); ``schema`` decodes ``value()`` and is checked with the topic's."""
        self._check()
        reader = await self._client.create_reader(
            topic, start_message_id, start_message_id_inclusive=start_message_id_inclusive,
            receiver_queue_size=receiver_queue_size, reader_name=reader_name,
            subscription_role_prefix=subscription_role_prefix, is_read_compacted=is_read_compacted,
            crypto_key_reader=crypto_key_reader, crypto_failure_action=crypto_failure_action, schema=schema,
        )
        return Reader(reader, self._state)

    @_official_errors
    async def get_topic_partitions(self, topic: str) -> list[str]:
        """The partitions of ``topic`` (``[topic]`` if it is not partitioned)."""
        check_type(str, topic, "topic")
        self._check()
        return await self._client.get_topic_partitions(topic)

    def shutdown(self) -> None:
        """Close everything at once, without waiting for what is in flight. A plain call, as there:
        further calls on the client and its producers, consumers and readers raise ``AlreadyClosed``
        at once; the connections close in a task of the running loop (at once without one)."""
        if self._state.shut_down or self._client.closed:
            return
        self._state.shut_down = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop; if the one the client ran on has ended, its connections went with it
            with contextlib.suppress(RuntimeError):
                asyncio.run(self._client.shutdown())
            return
        self._state.task = loop.create_task(self._client.shutdown())

    @_official_errors
    async def close(self) -> None:
        """Close producers (flushed), consumers, readers and connections; ``AlreadyClosed`` if the
        client was closed already (after ``shutdown()``: nothing)."""
        if self._state.shut_down:
            await self._state.wait_shut_down()
            return
        self._check()
        await self._client.close()
