"""Reliable-delivery building blocks on top of the ``txn`` client.

- :mod:`.processor`: consume → transform → produce, one transaction per batch
- :mod:`.ledger`: the batch ledger (versioned JSON records in a topic)
- :mod:`.replay`: exactly-once replay of parked batches
- :mod:`.reliable_producer`, :mod:`.outbox`: publisher confirms and a durable outbox
- :mod:`.dedup`: a deduplicating receiver for side effects outside Pulsar
- :mod:`.ordering`: the ordering guard (a message held until the one it must follow committed)
"""

from .dedup import DedupReceiver, DedupStats, Outcome
from .dedup_store import DedupStore, PostgresDedupStore, SqliteDedupStore, open_store
from .ledger import LedgerRecord
from .ordering import OrderingGuard, OutOfOrder
from .outbox import Outbox, OutboxRow
from .output import Output
from .processor import AsyncProcessor, Processor, ProcessorConfig, ProcessorStats
from .reliable_producer import AsyncReliableProducer, MessageNacked, ReliableProducer
from .replay import ReplayError, ReplayResult, replay, replay_batch

__all__ = [
    "AsyncProcessor",
    "AsyncReliableProducer",
    "DedupReceiver",
    "DedupStats",
    "DedupStore",
    "LedgerRecord",
    "MessageNacked",
    "OrderingGuard",
    "OutOfOrder",
    "Outbox",
    "OutboxRow",
    "Outcome",
    "Output",
    "PostgresDedupStore",
    "Processor",
    "ProcessorConfig",
    "ProcessorStats",
    "ReliableProducer",
    "ReplayError",
    "ReplayResult",
    "SqliteDedupStore",
    "open_store",
    "replay",
    "replay_batch",
]
