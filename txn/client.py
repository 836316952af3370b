"""``AsyncClient``: the asyncio core that producers, consumers and transactions hang off.

The client is a factory. It owns the connection pool, the coordinator client and the id counter,
and gives the producers, consumers and readers it builds a :class:`~txn.context.ClientContext`
(pool, id allocator, register/forget) rather than itself: no module below imports this one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

from . import client_logger
from .args import NUMBER, check_type, check_type_or_none
from .auth import Authentication
from .client_logger import ConsoleLogger, FileLogger, check_logger
from .connection import MAX_MESSAGE_SIZE_CEILING
from .consumer import AsyncConsumer, ConsumerConfig, ConsumerType, InitialPosition, RegexSubscriptionMode
from .consumer.ack_timeout import check_unacked_messages_timeout
from .consumer.batch_receive import ConsumerBatchReceivePolicy
from .consumer.dead_letter import ConsumerDeadLetterPolicy
from .consumer.key_shared import ConsumerKeySharedPolicy
from .consumer.pattern import AsyncPatternConsumer, split_pattern
from .consumer.retry_letter import retry_policy
from .context import ClientContext
from .coordinator import CoordinatorClient
from .crypto import ConsumerCryptoFailureAction, CryptoKeyReader, consumer_decryptor, producer_encryptor
from .errors import AlreadyClosed, InvalidConfiguration
from .failover import (
    AutoClusterFailover,
    ClusterFailover,
    ServiceInfo,
    ServiceInfoProvider,
    SwitchableCoordinator,
    SwitchableTransaction,
    check_client_arguments,
)
from .message import Message, MessageId, TxnID
from .partitioned_reader import AsyncPartitionedReader
from .pool import MAX_PARTITIONS, ConnectionPool
from .producer import (
    AsyncProducer,
    BatchingType,
    HashingScheme,
    PartitionsRoutingMode,
    ProducerAccessMode,
    ProducerConfig,
)
from .protocol import CompressionType
from .reader import AsyncReader, create_reader
from .reader_listener import check_reader_listener
from .schema import BytesSchema, Schema
from .table_view import AsyncTableView, create_table_view
from .topic import parse_topic
from .transaction import AsyncTransaction


def _no_bytes(schema: Schema | None) -> Schema | None:
    """``schema`` checked; ``BytesSchema`` is the same as none (nothing registered, nothing decoded)."""
    if schema is None or isinstance(schema, BytesSchema):
        return None
    if not isinstance(schema, Schema):
        raise ValueError(f"schema must be a txn.schema.Schema, not {type(schema).__name__}")
    return schema


class AsyncClient:
    """A Pulsar client for asyncio code.

    Parameters mirror ``pulsar.Client``; use ``async with AsyncClient(url) as c``
    or call :meth:`close`. Bounds on what a broker may tell the client:

    - ``max_partitions``: a larger partition count raises :class:`~txn.errors.TooManyPartitions`.
    - ``max_message_size_ceiling``: the broker's ``max_message_size`` (the frame limit) is
      clamped to it.
    - ``max_uncompressed_message_size``: the most a compressed entry may decompress to
      (default: the broker's ``max_message_size``); a larger one is reported by ``receive()``
      as :class:`~txn.errors.PayloadTooLarge`.

    ``logger``: a ``logging.Logger`` that gets the client's log records (those of the ``txn.*``
    loggers) at its level, as the official client's ``logger=`` (see :mod:`txn.client_logger`);
    or a :class:`~txn.ConsoleLogger` (standard output) or :class:`~txn.FileLogger` (a file).

    ``tls_certificate_file_path`` / ``tls_private_key_file_path``: a client certificate presented
    in TLS handshakes (mutual TLS), whatever ``authentication`` is; with
    :class:`~txn.auth.AuthenticationTLS` its own files are used when these are not given.

    ``service_url`` may be an :class:`~txn.AutoClusterFailover` or a :class:`~txn.ServiceInfoProvider`
    (cluster failover, see :mod:`txn.failover`; build the client on a running event loop then);
    each :class:`~txn.ServiceInfo` then carries its cluster's authentication and TLS trust file.
    """

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
        check_client_arguments(service_url, authentication, tls_trust_certs_file_path)
        self._failover = None if isinstance(service_url, str) else ClusterFailover(service_url)
        if self._failover is not None:
            info = self._failover.current
            service_url, authentication, tls_trust_certs_file_path = (
                info.service_url, info.authentication, info.tls_trust_certs_file_path)
        check_type(str, service_url, "service_url")
        check_logger(logger)
        check_type_or_none(Authentication, authentication, "authentication")
        check_type(NUMBER, operation_timeout_seconds, "operation_timeout_seconds")
        check_type(NUMBER, connection_timeout_ms, "connection_timeout_ms")
        check_type_or_none(str, tls_trust_certs_file_path, "tls_trust_certs_file_path")
        check_type(bool, tls_allow_insecure_connection, "tls_allow_insecure_connection")
        check_type(bool, tls_validate_hostname, "tls_validate_hostname")
        for name, value in (("max_partitions", max_partitions), ("max_message_size_ceiling", max_message_size_ceiling),
                            ("max_uncompressed_message_size", max_uncompressed_message_size)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive")
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "name", "value", "info")}
        self._pool = ConnectionPool(
            service_url,
            auth=authentication,
            operation_timeout=float(operation_timeout_seconds),
            connection_timeout=connection_timeout_ms / 1000.0,
            keepalive_interval=float(keep_alive_interval_seconds),
            tls_trust_certs_file_path=tls_trust_certs_file_path,
            tls_allow_insecure_connection=tls_allow_insecure_connection,
            tls_validate_hostname=tls_validate_hostname,
            tls_certificate_file_path=tls_certificate_file_path,
            tls_private_key_file_path=tls_private_key_file_path,
            max_partitions=max_partitions,
            max_message_size_ceiling=max_message_size_ceiling,
            max_uncompressed_message_size=max_uncompressed_message_size,
        )
        self._service_info = ServiceInfo(service_url, authentication, tls_trust_certs_file_path)
        self._ids = itertools.count(1)
        self._tc = CoordinatorClient(self._pool) if self._failover is None else SwitchableCoordinator(
            self._pool, service_url)
        self._txn_class = AsyncTransaction if self._failover is None else SwitchableTransaction
        self._producers: set[AsyncProducer] = set()
        self._consumers: set[AsyncConsumer] = set()
        self._closed = False
        self._ctx = ClientContext(self._pool, self._ids.__next__, self._register, self._forget)
        if logger is not None:
            client_logger.attach(id(self), client_logger.as_logger(logger))
        if self._failover is not None:
            self._failover.start(self._switch_cluster)

    def _switch_cluster(self, info: ServiceInfo) -> None:
        """Cluster failover: move the pool to ``info``'s cluster; open transactions stay behind."""
        if self._closed:
            return
        old, self._service_info = self._tc, info
        # A sibling made from now on is a plain client of the new cluster.
        self._init_args.update(service_url=info.service_url, authentication=info.authentication,
                               tls_trust_certs_file_path=info.tls_trust_certs_file_path)
        self._tc = SwitchableCoordinator(self._pool, info.service_url)
        self._pool.switch_service(info.service_url, info.authentication, info.tls_trust_certs_file_path)
        if isinstance(old, SwitchableCoordinator):
            old.retire(info.service_url)

    def get_service_info(self) -> ServiceInfo:
        """The cluster this client uses now (as ``pulsar.Client.get_service_info``)."""
        return self._service_info

    def _next_id(self) -> int:
        return next(self._ids)

    def _check(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")

    def _register(self, obj: Any) -> None:
        # Consumers (and readers) close after everything else that sends (producers, reliable producers).
        (self._consumers if isinstance(obj, AsyncConsumer) else self._producers).add(obj)

    @property
    def context(self) -> ClientContext:
        """What this client's producers and consumers use of it (pool, id allocator, registry).

        Also the hook for objects built on the client: ``context.register(obj)`` makes
        :meth:`close` close ``obj`` (its ``close()`` coroutine), ``context.forget(obj)`` undoes it."""
        return self._ctx

    def sibling(self) -> AsyncClient:
        """A new client with this one's settings and connections of its own (close it yourself).

        For producers whose failures must not touch this client's connections: the broker closes
        a whole connection when a message arrives for a producer it has just fenced out. A failover
        client's sibling is a plain client of the cluster in use when it is made."""
        self._check()
        return AsyncClient(**self._init_args)

    @property
    def transaction_coordinator(self) -> CoordinatorClient:
        """The transaction-coordinator client (low level: raw ``new_txn``/``end_txn`` commands)."""
        return self._tc

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def _forget(self, obj: Any) -> None:
        self._producers.discard(obj)
        self._consumers.discard(obj)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool | None = None,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        properties: dict[str, str] | None = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        hashing_scheme: HashingScheme = HashingScheme.BoostHash,
        *,
        schema: Schema | None = None,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        batching_type: BatchingType = BatchingType.Default,
        message_router: Callable[[Message, int], int] | None = None,
        chunking_enabled: bool = False,
        encryption_key: str | None = None,
        crypto_key_reader: CryptoKeyReader | None = None,
    ) -> AsyncProducer:
        """Create a producer; raises the broker's typed error if it refuses.

        Arguments of the wrong type raise ``ValueError``, as in the official client. Keyed
        messages go to partition ``hash(key) % partitions`` by ``hashing_scheme`` (our own
        option; the default is the official Python client's hash, ``JavaStringHash`` is the Java
        client's: see :mod:`txn.producer.routing`); messages without a key by
        ``message_routing_mode`` (:class:`~txn.PartitionsRoutingMode`). ``message_router(message,
        num_partitions)``, as in the official client, chooses the partition of every message, keyed
        or not (``message_routing_mode=CustomPartition`` needs it).
        ``batching_type=BatchingType.KeyBased`` puts one key in each batch. ``chunking_enabled``
        splits a message larger than the broker's ``max_message_size`` into chunks; it needs
        batching off (``batching_enabled`` defaults to on without it, off with it).
        ``encryption_key`` (a key name) with ``crypto_key_reader`` encrypts every message end to end,
        as the official client (:mod:`txn.crypto`; the ``crypto`` extra); one without the other
        encrypts nothing, as there."""
        self._check()
        check_type(str, topic, "topic")
        check_type(int, message_routing_mode, "message_routing_mode")
        check_type(int, batching_type, "batching_type")
        routing_mode = PartitionsRoutingMode(message_routing_mode)
        if message_router is not None and not callable(message_router):
            raise ValueError("message_router must be callable: message_router(message, num_partitions) -> int")
        if message_router is not None:
            routing_mode = PartitionsRoutingMode.CustomPartition
        elif routing_mode == PartitionsRoutingMode.CustomPartition:
            raise ValueError("message_routing_mode=CustomPartition needs a message_router(message, num_partitions)")
        check_type_or_none(str, producer_name, "producer_name")
        check_type_or_none(int, initial_sequence_id, "initial_sequence_id")
        for arg, value in (("send_timeout_millis", send_timeout_millis), ("max_pending_messages", max_pending_messages),
                           ("max_pending_messages_across_partitions", max_pending_messages_across_partitions),
                           ("batching_max_messages", batching_max_messages),
                           ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
                           ("batching_max_publish_delay_ms", batching_max_publish_delay_ms)):
            check_type(int, value, arg)
        check_type(bool, chunking_enabled, "chunking_enabled")
        if batching_enabled is None:
            batching_enabled = not chunking_enabled
        for arg, value in (("block_if_queue_full", block_if_queue_full), ("batching_enabled", batching_enabled)):
            check_type(bool, value, arg)
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        check_type_or_none(dict, properties, "properties")
        name = str(parse_topic(topic))
        if max_pending_messages <= 0:
            raise ValueError("max_pending_messages must be positive (the window is always bounded)")
        encryptor = producer_encryptor(encryption_key, crypto_key_reader)
        conf = ProducerConfig(
            producer_name=producer_name,
            initial_sequence_id=initial_sequence_id,
            send_timeout_millis=send_timeout_millis,
            compression_type=CompressionType(compression_type),
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            block_if_queue_full=block_if_queue_full,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            properties=dict(properties or {}),
            access_mode=ProducerAccessMode(access_mode),
            hashing_scheme=HashingScheme(hashing_scheme),
            schema=_no_bytes(schema),
            message_routing_mode=routing_mode,
            batching_type=BatchingType(batching_type),
            message_router=message_router,
            chunking_enabled=chunking_enabled,
            encryptor=encryptor,
        )
        p = AsyncProducer(self._ctx, name, conf)
        await p.start()
        self._producers.add(p)
        return p

    async def subscribe(
        self,
        topic: str | list[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        initial_position: InitialPosition = InitialPosition.Latest,
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        negative_ack_redelivery_delay_ms: int = 60000,
        properties: dict[str, str] | None = None,
        ack_grouping_time_ms: int = 100,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        *,
        schema: Schema | None = None,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        message_listener: Callable[[AsyncConsumer, Message], Any] | None = None,
        unacked_messages_timeout_ms: int | None = None,
        is_read_compacted: bool = False,
        start_message_id_inclusive: bool = False,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        pattern_auto_discovery_period: int = 60,
        regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
        crypto_key_reader: CryptoKeyReader | None = None,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
        retry_enable: bool = False,
    ) -> AsyncConsumer:
        """Subscribe to one topic, a list of topics or the topics matching a compiled regex (bad
        argument types raise ``ValueError``).

        A regex (``re.compile("persistent://tenant/ns/orders-.*")``) covers the topics of its
        namespace whose ``tenant/ns/name`` it matches in full, of the domains
        ``regex_subscription_mode`` says (the pattern's own domain is ignored, as there); the
        namespace is listed again every ``pattern_auto_discovery_period`` seconds (0: never) to
        subscribe to new matching topics and close the consumers of deleted ones (see
        :mod:`txn.consumer.pattern`).

        ``batch_receive_policy`` sets the limits of ``batch_receive()`` (default: no count limit,
        10 MiB, 100 ms). ``message_listener(consumer, message)`` is called for each message, one at
        a time, on the event loop (a coroutine it returns is awaited first); ``receive()`` then
        raises :class:`~txn.InvalidConfiguration`. ``unacked_messages_timeout_ms`` (at least 10000,
        or None/0 for none) redelivers what was handed out and not acknowledged within it.

        ``receiver_queue_size=0`` (one non-partitioned topic): nothing is prefetched, each
        ``receive()`` asks the broker for one message and cannot take a timeout. ``is_read_compacted``
        reads the compacted view (Exclusive or Failover, persistent topics). With
        ``start_message_id_inclusive``, ``seek(message_id)`` hands out that message too.
        ``key_shared_policy`` sets a Key_Shared subscription's mode, sticky ranges and ordering.
        Chunked messages are reassembled, at most ``max_pending_chunked_message`` incomplete ones at a
        time (:mod:`txn.consumer.chunks`). Encrypted messages are decrypted with ``crypto_key_reader``
        (:mod:`txn.crypto`); one that cannot be is raised, acknowledged or handed over still encrypted
        as ``crypto_failure_action`` says (:class:`~txn.ConsumerCryptoFailureAction`).

        ``retry_enable`` (the Java client's ``enableRetry``) also subscribes to the retry-letter topic
        (``dead_letter_policy.retry_letter_topic``, default ``<topic>-<subscription>-RETRY``), for
        ``consumer.reconsume_later(message, delay)``; see :mod:`txn.consumer.retry_letter`."""
        self._check()
        if not isinstance(topic, str | list | re.Pattern):
            raise ValueError("Argument 'topic' is expected to be of a type between (str, list, re.pattern)")
        check_type(int, pattern_auto_discovery_period, "pattern_auto_discovery_period")
        check_type(RegexSubscriptionMode, regex_subscription_mode, "regex_subscription_mode")
        mode = RegexSubscriptionMode(regex_subscription_mode)
        check_type(str, subscription_name, "subscription_name")
        check_type_or_none(str, consumer_name, "consumer_name")
        for arg, value in (("receiver_queue_size", receiver_queue_size),
                           ("max_total_receiver_queue_size_across_partitions",
                            max_total_receiver_queue_size_across_partitions),
                           ("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms)):
            check_type(int, value, arg)
        check_type_or_none(dict, properties, "properties")
        pattern = topic.pattern if isinstance(topic, re.Pattern) else None
        if pattern is not None:
            names = [split_pattern(pattern)[0]]
        else:
            topics = [topic] if isinstance(topic, str) else list(topic)
            if not topics:
                raise ValueError("subscribe needs at least one topic")
            names = [str(parse_topic(t)) for t in topics]
        if not subscription_name or not isinstance(subscription_name, str):
            raise ValueError("subscription_name must be a non-empty string")
        if receiver_queue_size < 0:
            raise ValueError("receiver_queue_size must not be negative")
        check_type(bool, is_read_compacted, "is_read_compacted")
        check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        check_type_or_none(ConsumerKeySharedPolicy, key_shared_policy, "key_shared_policy")
        check_type(int, max_pending_chunked_message, "max_pending_chunked_message")
        check_type(bool, auto_ack_oldest_chunked_message_on_queue_full, "auto_ack_oldest_chunked_message_on_queue_full")
        if is_read_compacted and (
            (mode != RegexSubscriptionMode.PersistentOnly if pattern is not None
             else any(parse_topic(t).domain != "persistent" for t in names))
            or ConsumerType(consumer_type) not in (ConsumerType.Exclusive, ConsumerType.Failover)
        ):
            raise InvalidConfiguration("is_read_compacted needs persistent topics and an Exclusive or Failover "
                                       "subscription", topic=names[0])
        decryptor = consumer_decryptor(crypto_key_reader, crypto_failure_action)
        if not consumer_name and isinstance(topic, str):
            # As the official client: a consumer of one topic gets a random 10-hex-digit name;
            # one of a list of topics has none ("").
            consumer_name = secrets.token_hex(5)
        conf = ConsumerConfig(
            subscription_name=subscription_name,
            consumer_type=ConsumerType(consumer_type),
            initial_position=InitialPosition(initial_position),
            consumer_name=consumer_name or None,
            receiver_queue_size=receiver_queue_size,
            max_total_receiver_queue_size_across_partitions=max_total_receiver_queue_size_across_partitions,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            ack_grouping_time_ms=ack_grouping_time_ms,
            properties=dict(properties or {}),
            schema=_no_bytes(schema),
            read_compacted=is_read_compacted,
            start_message_id_inclusive=start_message_id_inclusive,
            key_shared_policy=key_shared_policy,
            multi_topic=not isinstance(topic, str),
            max_pending_chunked_message=max_pending_chunked_message,
            auto_ack_oldest_chunked_message_on_queue_full=auto_ack_oldest_chunked_message_on_queue_full,
            decryptor=decryptor,
            crypto_failure_action=int(crypto_failure_action),
        )
        check_type_or_none(int, unacked_messages_timeout_ms, "unacked_messages_timeout_ms")
        check_unacked_messages_timeout(unacked_messages_timeout_ms)
        conf.unacked_messages_timeout_ms = unacked_messages_timeout_ms or None
        check_type_or_none(ConsumerBatchReceivePolicy, batch_receive_policy, "batch_receive_policy")
        conf.batch_receive_policy = batch_receive_policy
        if dead_letter_policy is not None:
            check_type(ConsumerDeadLetterPolicy, dead_letter_policy, "dead_letter_policy")
            conf.dead_letter_policy = dead_letter_policy
        check_type(bool, retry_enable, "retry_enable")
        if retry_enable:
            if pattern is not None:
                raise InvalidConfiguration("retry_enable is not supported on a regex subscription", topic=pattern)
            policy = await retry_policy(self._ctx, names[0], subscription_name, dead_letter_policy)
            conf.dead_letter_policy = policy
            conf.retry_enable = True
            conf.multi_topic = True
            retry_topic = str(parse_topic(policy.retry_letter_topic))
            if retry_topic not in names:
                names.append(retry_topic)
        if message_listener is not None and not callable(message_listener):
            raise ValueError("message_listener must be callable")
        if pattern is not None:
            c: AsyncConsumer = AsyncPatternConsumer(self._ctx, pattern, mode, pattern_auto_discovery_period, conf)
        else:
            c = AsyncConsumer(self._ctx, names, conf)
        await c.start()
        self._consumers.add(c)
        if message_listener is not None:
            c.start_listener(message_listener)
        return c

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        start_message_id_inclusive: bool = False,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        *,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: CryptoKeyReader | None = None,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
        schema: Schema | None = None,
        reader_listener: Callable[[Any, Message], Any] | None = None,
    ) -> AsyncReader | AsyncPartitionedReader:
        """Read ``topic`` from ``start_message_id`` (``txn.EARLIEST``, ``txn.LATEST`` or an id); on a
        partitioned topic, every partition (an :class:`~txn.partitioned_reader.AsyncPartitionedReader`).

        ``reader_name`` is the consumer's name; the subscription is ``reader-<random>``, after
        ``<subscription_role_prefix>-`` if given. ``is_read_compacted`` reads the compacted view.
        ``crypto_key_reader`` and ``crypto_failure_action`` as in :meth:`subscribe`. ``schema`` as
        there: checked with the topic's when the reader subscribes (:class:`~txn.IncompatibleSchema`),
        ``Message.value()`` decodes by it (not a :class:`~txn.schema.Schema`: ``ValueError``).
        ``reader_listener(reader, message)`` is called for each message, one at a time, on the
        event loop (a coroutine it returns is awaited first); ``read_next()`` then raises
        :class:`~txn.InvalidConfiguration`."""
        self._check()
        check_reader_listener(reader_listener)
        check_type(str, topic, "topic")
        check_type(MessageId, start_message_id, "start_message_id")
        check_type(int, receiver_queue_size, "receiver_queue_size")
        check_type_or_none(str, reader_name, "reader_name")
        check_type_or_none(str, subscription_role_prefix, "subscription_role_prefix")
        check_type(bool, is_read_compacted, "is_read_compacted")
        check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        checked_schema = _no_bytes(schema)
        decryptor = consumer_decryptor(crypto_key_reader, crypto_failure_action)
        reader = await create_reader(self._ctx, topic, start_message_id, start_message_id_inclusive,
                                     receiver_queue_size, reader_name, subscription_role_prefix, is_read_compacted,
                                     decryptor, int(crypto_failure_action), checked_schema)
        if reader_listener is not None:
            reader.start_listener(reader_listener)
        return reader

    async def create_table_view(self, topic: str, subscription_name: str | None = None,
                                schema: Schema = BytesSchema()) -> AsyncTableView:
        """A table view of ``topic``: its latest value per key, once read to its end (as
        ``pulsar.Client.create_table_view``; see :mod:`txn.table_view`). ``subscription_name``
        defaults to ``reader-<random>``; ``schema`` decodes the values and is checked against the
        topic's (:class:`~txn.IncompatibleSchema`)."""
        self._check()
        check_type(str, topic, "topic")
        check_type_or_none(str, subscription_name, "subscription_name")
        check_type(Schema, schema, "schema")
        return await create_table_view(self._ctx, topic, subscription_name, schema)

    async def new_transaction(self, timeout_millis: int = 60000) -> AsyncTransaction:
        """Open a transaction that the broker aborts if not ended within ``timeout_millis``.

        The client API names times like the official client (``*_millis``); configurations and
        CLI flags call the same value ``txn_timeout_ms``, the core ``timeout_ms`` (docs/porting.md).
        """
        self._check()
        if timeout_millis <= 0:
            raise ValueError("timeout_millis must be positive")
        tc = self._tc  # a transaction stays with the coordinator (cluster) that opened it
        txn_id = await tc.new_txn(int(timeout_millis))
        return self._txn_class(tc, txn_id, int(timeout_millis))

    def transaction_from_id(self, txn_id: TxnID | str, timeout_millis: int = 60000) -> AsyncTransaction:
        """A handle on a transaction another process opened (e.g. a Spark driver's), to produce and
        acknowledge in it. Only the process that owns the transaction should commit or abort it;
        this handle's ``timeout_millis`` should be the one the transaction was opened with.
        """
        self._check()
        tid = TxnID.parse(txn_id) if isinstance(txn_id, str) else txn_id
        return self._txn_class(self._tc, tid, int(timeout_millis))

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of ``topic`` (``[topic]`` if it is not partitioned)."""
        self._check()
        name = str(parse_topic(topic))
        n = await self._pool.partitions(name)
        return [name] if n == 0 else [f"{name}-partition-{i}" for i in range(n)]

    async def shutdown(self) -> None:
        """Close everything at once, without waiting for what is in flight (as ``pulsar.Client.shutdown``):
        connections first, then producers (pending sends fail with :class:`AlreadyClosed`) and consumers."""
        if self._closed:
            return
        self._closed = True
        if self._failover is not None:
            self._failover.close()
        self._pool.close()
        await asyncio.gather(*(p.close(flush=False) if isinstance(p, AsyncProducer) else p.close()
                               for p in list(self._producers)),
                             *(c.close() for c in list(self._consumers)), return_exceptions=True)
        client_logger.detach(id(self))

    async def close(self) -> None:
        """Close producers (flushing them), consumers and connections."""
        if self._closed:
            return
        self._closed = True
        if self._failover is not None:
            self._failover.close()
        await asyncio.gather(*(p.close() for p in list(self._producers)), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in list(self._consumers)), return_exceptions=True)
        self._pool.close()
        client_logger.detach(id(self))
