"""Producer settings: :class:`ProducerConfig`, :class:`ProducerAccessMode`, :class:`BatchingType`,
:class:`PartitionsRoutingMode`, explicit batch entries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..message import TxnID
from ..protocol import CompressionType, pb
from .routing import HashingScheme

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


class BatchingType(IntEnum):
    """How messages are grouped into batches (names and values as ``pulsar.BatchingType``).

    ``Default``: one open batch per partition. ``KeyBased``: every batch holds messages of one
    key (the ordering key, else the partition key), so a Key_Shared consumer gets whole entries
    of its own keys."""

    Default = 0
    KeyBased = 1


class PartitionsRoutingMode(IntEnum):
    """Where a message without a partition key goes on a partitioned topic (names and values as
    ``pulsar.PartitionsRoutingMode``; keyed messages always go by the key's hash).

    ``RoundRobinDistribution``: partition after partition, from a random one (with batching on,
    the partition changes once the open batch has been sent: full, flushed or delayed enough). ``UseSinglePartition``:
    one partition, chosen at random when the producer is created. ``CustomPartition``: the
    producer's ``message_router`` chooses (set by giving one)."""

    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


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
    #: split a message larger than the broker's ``max_message_size`` into chunks (batching must be off)
    chunking_enabled: bool = False
    batching_max_messages: int = 1000
    batching_max_allowed_size_in_bytes: int = 128 * 1024
    batching_max_publish_delay_ms: int = 10
    properties: dict[str, str] = field(default_factory=dict)
    access_mode: ProducerAccessMode = ProducerAccessMode.Shared
    hashing_scheme: HashingScheme = HashingScheme.BoostHash
    message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution
    batching_type: BatchingType = BatchingType.Default
    #: a :class:`txn.schema.Schema`: registered with the broker, and ``send`` encodes values with it
    schema: Any = None
    #: ``message_router(message, num_partitions) -> partition index``, for every message (keyed or not)
    message_router: Callable[[Any, int], int] | None = None
    #: end-to-end encryption: a :class:`txn.crypto.MessageEncryptor` (None: messages are sent as they are)
    encryptor: Any = None


def _kv(props: dict[str, str] | None) -> list[pb.KeyValue]:
    if not props:
        return []
    out = []
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"message properties must be str -> str, got {k!r}: {v!r}")
        out.append(pb.KeyValue(key=k, value=v))
    return out
