"""Consumer settings: subscription types, initial positions, :class:`ConsumerConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..message import MessageId


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


class RegexSubscriptionMode(IntEnum):
    """Which topics a regex subscription covers (names and values as ``pulsar.RegexSubscriptionMode``):
    ``subscribe(re.compile(...), ..., regex_subscription_mode=...)``, see :mod:`txn.consumer.pattern`."""

    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


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
    #: a :class:`~.dead_letter.ConsumerDeadLetterPolicy`, or None (no dead-letter topic)
    dead_letter_policy: object | None = None
    #: subscribed to the retry-letter topic too, for ``reconsume_later`` (the Java client's ``enableRetry``)
    retry_enable: bool = False
    #: How often a consumer of partitioned topics re-reads their partition counts and subscribes
    #: to partitions added since (as the official client's ``partitionsUpdateInterval``, 60 s).
    #: A partition consumer closed by the broker or resubscribed after that also triggers a check.
    partitions_update_interval_ms: int = 60000
    #: a :class:`txn.schema.Schema`: checked with the broker at subscribe; ``Message.value()`` decodes by it
    schema: Any = None
    #: a :class:`~.batch_receive.ConsumerBatchReceivePolicy` for ``batch_receive()`` (None: the official defaults)
    batch_receive_policy: Any = None
    #: Ack timeout: messages handed out and not acknowledged within it are redelivered (None or 0: off;
    #: at least 10000 otherwise, as in the official client)
    unacked_messages_timeout_ms: int | None = None
    #: read the topic's compacted view (SUBSCRIBE ``read_compacted``); Exclusive or Failover, persistent topics only
    read_compacted: bool = False
    #: after ``seek(message_id)``, hand out the message sought too (the official ``start_message_id_inclusive``)
    start_message_id_inclusive: bool = False
    #: a :class:`~.key_shared.ConsumerKeySharedPolicy` (Key_Shared subscriptions; None: auto-split, in order)
    key_shared_policy: Any = None
    #: subscribed to a list of topics (``receiver_queue_size=0`` then prefetches one per topic, as there)
    multi_topic: bool = False
    #: chunked messages: how many incomplete ones are kept (0: no limit), whether the oldest one's chunks are
    #: acknowledged when a new one finds no room, and how long one may stay incomplete (0: no limit)
    max_pending_chunked_message: int = 10
    auto_ack_oldest_chunked_message_on_queue_full: bool = False
    expire_time_of_incomplete_chunked_message_ms: int = 60000
    #: end-to-end encryption: a :class:`txn.crypto.MessageDecryptor` (None: no key reader), and what to do
    #: with a message that cannot be decrypted (a :class:`txn.crypto.ConsumerCryptoFailureAction` value)
    decryptor: Any = None
    crypto_failure_action: int = 0
