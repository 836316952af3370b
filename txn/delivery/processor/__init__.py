"""``Processor``: consume → transform → produce, exactly once, one transaction per batch.

For each batch (closed at ``batch_max_messages`` or ``batch_max_delay_ms``):

1. open a transaction and write a ``STARTED`` ledger record (outside it);
2. run the handler on every message (sync handlers off the event loop);
3. produce the outputs in the transaction and wait for their receipts;
4. acknowledge the inputs and write the ``COMMITTED`` record, both in the transaction;
5. commit. Steps 4–5 run in the background so the next batch is already being read and
   transformed ("pipelined"), with at most ``max_inflight_commits`` commits outstanding.

The handler raising (or an output the broker refuses for good, such as an oversize message)
aborts the batch's transaction before anything is acknowledged, writes an ``ABORTED`` record,
and the batch is retried from the copy in memory. After ``max_attempts`` consecutive aborts the
batch is split in halves and each half retried, down to the failing message(s), which are then
*parked*: one transaction acknowledges them from the input, produces them to the parking topic
(``<input>-parked``) with the error, attempt count and batch id, and writes a ``PARKED`` record.

Broker-side failures (a conflict with a zombie instance's pending acks, a timed-out transaction,
a lost connection) abort the transaction; its acknowledgements are undone and the broker
redelivers the inputs, which are then processed again in a later batch. Whatever happens, an
input's acknowledgement and its outputs commit together or not at all.

The package, split the way aiokafka splits its producer (one module per concern):

- :mod:`.config`: :class:`ProcessorConfig`, :class:`ProcessorStats`;
- :mod:`.batch_loop`: ``run``/``stop``, collecting a batch (entry boundaries, the ordering gate);
- :mod:`.commit`: the commit pipeline (attempts, the ledger guard's sync, produce, pipelined
  commits, aborts, retries and narrowing);
- :mod:`.parking`: parking a failing message or an unreadable input (``PARK_*`` properties);
- :mod:`.records`: the informative ledger records (STARTED, ABORTED);
- :mod:`.failures`: :class:`BatchFailed` and the transient failure;
- :mod:`.async_processor`: :class:`AsyncProcessor`, which assembles them; :mod:`.blocking`: :class:`Processor`.
"""

from .async_processor import AsyncProcessor
from .blocking import Processor
from .config import ProcessorConfig, ProcessorStats
from .failures import BatchFailed, _Transient
from .parking import (
    PARK_ATTEMPTS,
    PARK_BATCH,
    PARK_CORRUPT,
    PARK_ERROR,
    PARK_JOB,
    PARK_PROPS,
    PARK_SCHEMA_VERSION,
    PARK_SOURCE_ID,
    PARK_SOURCE_TOPIC,
)

__all__ = [
    "PARK_ATTEMPTS",
    "PARK_BATCH",
    "PARK_CORRUPT",
    "PARK_ERROR",
    "PARK_JOB",
    "PARK_PROPS",
    "PARK_SCHEMA_VERSION",
    "PARK_SOURCE_ID",
    "PARK_SOURCE_TOPIC",
    "AsyncProcessor",
    "BatchFailed",
    "Processor",
    "ProcessorConfig",
    "ProcessorStats",
    "_Transient",
]
