"""Producers: batching, compression, a bounded pending window, receipts, timeouts, reconnects.

Each partition has a :class:`PartitionProducer` holding an ordered deque of frames awaiting
their receipts. After a reconnect the same frames, with the same sequence ids, are written
again before anything new, so the broker's deduplication (when enabled) drops the repeats and
nothing confirmed is lost.

The package, split the way aiokafka splits its producer (one module per concern):

- :mod:`.config`: :class:`ProducerConfig`, :class:`ProducerAccessMode`, :class:`BatchingType`,
  :class:`PartitionsRoutingMode`, :data:`BatchEntry`;
- :mod:`.accumulator`: the pending window (backpressure), batching, compression, framing;
- :mod:`.sender`: the producer on the broker - create, reconnect and resend, receipts, send
  errors, send timeouts, close;
- :mod:`.partition`: :class:`PartitionProducer`, one partition, assembled from the two;
- :mod:`.async_producer`: :class:`AsyncProducer`, the public face that routes to the partitions;
- :mod:`.routing`: the partition hashes of keyed messages (:class:`HashingScheme`).

Every name is re-exported here, so ``from txn.producer import ...`` works as before.
"""

from .accumulator import Accumulator, _Batch, _Op
from .async_producer import AsyncProducer, log, run_callback
from .config import _NO_TXN, BatchEntry, BatchingType, PartitionsRoutingMode, ProducerAccessMode, ProducerConfig, _kv
from .partition import PartitionProducer
from .routing import HashingScheme, boost_hash, hash_function, java_string_hash, murmur3_32_hash
from .sender import Sender, T

__all__ = [
    "_NO_TXN",
    "Accumulator",
    "AsyncProducer",
    "BatchEntry",
    "BatchingType",
    "HashingScheme",
    "PartitionProducer",
    "PartitionsRoutingMode",
    "ProducerAccessMode",
    "ProducerConfig",
    "Sender",
    "T",
    "_Batch",
    "_Op",
    "_kv",
    "boost_hash",
    "hash_function",
    "java_string_hash",
    "log",
    "murmur3_32_hash",
    "run_callback",
]
