"""``AsyncProcessor``: the asyncio processor, assembled from its parts.

Its state is set up here, with the lifecycle (``start``, ``close``) and the output producers;
the behaviour lives in the parts it inherits: :class:`~.batch_loop.BatchLoop` (``run``,
``stop``, collecting), :class:`~.commit.CommitPipeline` (attempts, pipelined commits, aborts),
:class:`~.parking.Parking` and :class:`~.records.LedgerRecords`. A subclass may override
``_transform`` (how a batch becomes outputs) and ``_record_config`` (what records say of the job).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from ...client import AsyncClient
from ...consumer import AsyncConsumer, ConsumerType
from ...errors import (
    AuthenticationError,
    AuthorizationError,
    CorruptMessage,
    InvalidTopicName,
    PulsarError,
    TopicNotFound,
)
from ...message import Message
from ...producer import AsyncProducer
from ...topic import parse_topic
from ...transaction import AsyncTransaction
from ..batch_txn import BatchScope
from ..batching import EntryBoundaries
from ..commit_audit import CommitAudit
from ..fencing import PartitionFences
from ..guard_checkpoint import checkpoint_topic, mark_deletes
from ..ledger import default_ledger_topic, ensure_ledger_retained
from ..ledger_guard import LedgerGuard
from ..output import handler_spec, is_async
from .batch_loop import BatchLoop
from .commit import COMMIT_GRACE_S, CommitPipeline
from .config import ProcessorConfig, ProcessorStats
from .failures import _discard
from .metrics import ProcessorMetrics
from .parking import Parking
from .records import LedgerRecords
from .redo import Redo


class AsyncProcessor(BatchLoop, CommitPipeline, Parking, LedgerRecords, Redo):
    """The asyncio processor. Build it with :func:`create_processor` or construct and ``await start()``."""

    def __init__(
        self,
        client: AsyncClient,
        handler: Callable[[Message], Any],
        config: ProcessorConfig,
        progress: TextIO | None = None,
    ) -> None:
        if not config.inputs:
            raise ValueError("a processor needs at least one input topic")
        if config.batch_max_messages <= 0 or config.batch_max_delay_ms <= 0:
            raise ValueError("batch_max_messages and batch_max_delay_ms must be positive")
        if config.batch_max_bytes < 0:
            raise ValueError("batch_max_bytes must be 0 (no bound) or positive")
        if config.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if config.fencing and config.consumer_type not in (ConsumerType.Failover, ConsumerType.Exclusive):
            raise ValueError(
                f"consumer_type {config.consumer_type.name} hands one input partition to several instances; "
                "exactly-once needs one owner per partition: use Failover (the default) or Exclusive")
        self.client = client
        self.handler = handler
        self.config = config
        self.inputs = [str(parse_topic(t)) for t in config.inputs]
        self.output = str(parse_topic(config.output))
        self.ledger_topic = str(parse_topic(config.ledger_topic or default_ledger_topic(self.output)))
        self.config.handler_spec = config.handler_spec or handler_spec(handler)
        self.stats = ProcessorStats()
        self.instance = uuid.uuid4().hex[:8]
        self._seq = 0
        self._consumer: AsyncConsumer | None = None
        self._producers: dict[str, AsyncProducer] = {}
        #: Producers of parking topics when the outputs have a schema (parked inputs are their bytes).
        self._raw_producers: dict[str, AsyncProducer] = {}
        self._producer_locks: dict[str, asyncio.Lock] = {}
        self._ledger: AsyncProducer | None = None
        #: Writes the guard's checkpoints (``config.guard_checkpoint_s``), inside batch transactions.
        self._checkpoints: AsyncProducer | None = None
        self._next_checkpoint = 0.0
        self._stopping = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        #: Bounds the commits in flight (``max_inflight_commits``); a benchmark may swap in an instrumented one.
        self.commit_slots = asyncio.Semaphore(max(1, config.max_inflight_commits))
        self._progress = progress
        self._async_handler = is_async(handler)
        self.fatal: BaseException | None = None
        self._next_txn: asyncio.Task[AsyncTransaction] | None = None
        self._entries = EntryBoundaries() if config.batch_entry_boundaries else None
        self._held_over: tuple[Message, int] | None = None
        self.guard: LedgerGuard | None = None
        #: Checks recent commits again after a broker restart (``config.commit_audit``), with the guard.
        self.audit: CommitAudit | None = None
        self._links_seen: int | None = None
        #: Opens the batches' transactions and writes their records (set up in :meth:`start`).
        self.batches: BatchScope = None  # type: ignore[assignment]
        #: The input partitions this instance owns (``config.fencing``), set up in :meth:`start`.
        self.fences: PartitionFences | None = None
        #: Consumers whose unacknowledged inputs the loop hands back before the next batch (after a
        #: batch failed, or a partition changed hands): the broker redelivers them to their owner.
        self._handback: set[Any] = set()
        self._corrupt: list[CorruptMessage] = []  # unreadable inputs, parked after the batch is collected
        self._guard_synced = -1  # the consumer's subscriptions_made when the guard last caught up
        #: Called after each commit with (batch id, txn id, inputs, outputs per topic, commit ms).
        self.on_commit: Callable[[str, Any, int, dict[str, int], float], None] | None = None
        #: The Prometheus exporter (``config.metrics``), fed by the commit pipeline; served from ``start``.
        self.metrics: ProcessorMetrics | None = None

    @property
    def consumer(self) -> AsyncConsumer | None:
        """The consumer on the inputs (None before :meth:`start`)."""
        return self._consumer

    @property
    def inflight_commits(self) -> int:
        """Batches whose commit is still running in the background."""
        return len(self._inflight)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Subscribe to the inputs and create the ledger producer.

        Retries for up to ``config.start_timeout_ms`` while the broker cannot be reached or is
        not ready (it is restarting, or its transaction coordinator is not assigned yet), closing
        what an attempt opened before the next; errors that a retry cannot cure are raised at once.
        """
        deadline = asyncio.get_running_loop().time() + max(0, self.config.start_timeout_ms) / 1000
        delay = 0.25
        attempt = 1
        while True:
            try:
                await self._start_once()
                return
            except asyncio.CancelledError:
                await self._close_partial()
                raise
            except Exception as e:
                await self._close_partial()
                left = deadline - asyncio.get_running_loop().time()
                if not _start_retriable(e) or left <= 0 or self._stopping.is_set():
                    raise
                if self._progress is not None:
                    print(f"[processor] start attempt {attempt} failed ({type(e).__name__}: {e}); "
                          f"retrying in {delay:.2f}s", file=self._progress, flush=True)
                try:  # a stop() during the wait ends the retries
                    await asyncio.wait_for(self._stopping.wait(), min(delay, left))
                except TimeoutError:
                    pass
                else:
                    raise
                delay = min(delay * 2, 5.0)
                attempt += 1

    async def _close_partial(self) -> None:
        """Close what a failed start attempt opened (each part on its own; errors are dropped)."""
        parts: list[Any] = [*self._producers.values(), *self._raw_producers.values(), self._ledger,
                            self._checkpoints, self._consumer, self.fences, self.guard]
        self._producers.clear()
        self._raw_producers.clear()
        self._ledger = self._consumer = self._checkpoints = None
        self.fences = self.guard = None
        for part in parts:
            if part is None:
                continue
            try:
                await asyncio.wait_for(part.close(), 10)
            except Exception:  # noqa: BLE001 - best effort: the attempt already failed
                pass

    async def _start_once(self) -> None:
        c = self.config
        if c.metrics is not None and self.metrics is None:
            self.metrics = ProcessorMetrics.for_processor(self, c.metrics)
            self.metrics.serve(c.metrics.port, c.metrics.host)
        self._consumer = await self.client.subscribe(
            self.inputs,
            c.subscription,
            consumer_type=c.consumer_type,
            initial_position=c.initial_position,
            receiver_queue_size=c.receiver_queue_size,
            schema=c.input_schema,
            # Failover gives each partition to the first of the sorted consumer names; one name
            # per instance keeps an instance's share stable while others come and go.
            consumer_name=f"{c.job}-{self.instance}",
        )
        await ensure_ledger_retained(self.client, self.ledger_topic)
        if c.fencing:
            self.fences = PartitionFences(
                self.client, self.ledger_topic, c.subscription, f"{c.job}-{self.instance}", c.txn_timeout_ms,
                claim_timeout_s=c.claim_timeout_ms / 1000 if c.claim_timeout_ms else None)
        if c.ledger_guard:
            self.guard = LedgerGuard(self.client, self.ledger_topic, c.job, self.inputs, c.guard_max_ids)
            if c.commit_audit:
                self.audit = CommitAudit(self.client, self.ledger_topic, keep_s=c.commit_audit_keep_s,
                                         settle_s=c.txn_timeout_ms / 1000 + COMMIT_GRACE_S + 5)
                self.guard.audit = self.audit
            checkpoints = c.guard_checkpoint_s > 0
            if checkpoints:
                ckpt = checkpoint_topic(self.ledger_topic, c.job)
                await ensure_ledger_retained(self.client, ckpt)
                self._checkpoints = await self.client.create_producer(ckpt, batching_enabled=False)
            await self.guard.start(await mark_deletes(self._consumer) if checkpoints else None,
                                   checkpoints=checkpoints)
        self._ledger = await self.client.create_producer(
            self.ledger_topic, block_if_queue_full=True, batching_max_publish_delay_ms=5
        )
        self.batches = BatchScope(self.client, c.job, self._ledger, c.txn_timeout_ms, fences=self.fences,
                                  record_config=self._record_config)
        await self._producer(self.output)

    async def _producer(self, topic: str, raw: bool = False) -> AsyncProducer:
        """The producer of ``topic``, with the output schema, or without one if ``raw`` (parking)."""
        c = self.config
        raw = raw and c.output_schema is not None
        producers = self._raw_producers if raw else self._producers
        p = producers.get(topic)
        if p is not None:
            return p
        lock = self._producer_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            p = producers.get(topic)
            if p is None:
                window = c.max_pending_messages or min(max(1000, 2 * c.batch_max_messages), 50000)
                p = await self.client.create_producer(topic, block_if_queue_full=True, batching_max_publish_delay_ms=1,
                                                      max_pending_messages=window,
                                                      schema=None if raw else c.output_schema)
                producers[topic] = p
        return p

    async def close(self) -> None:
        """Wait for commits in flight, then close producers and the consumer."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        task, self._next_txn = self._next_txn, None
        if task is not None:
            await _discard(task)
        if self.batches is not None:
            await self.batches.drain()
        for p in [*self._producers.values(), *self._raw_producers.values(), self._ledger, self._checkpoints]:
            if p is not None:
                await p.close()
        if self._consumer is not None:
            await self._consumer.close()
        if self.fences is not None:
            await self.fences.close()
        if self.guard is not None:
            await self.guard.close()
        if self.metrics is not None:
            self.metrics.close()


#: Errors a start attempt can raise that no retry cures.
_FATAL_AT_START: tuple[type[BaseException], ...] = (
    AuthenticationError, AuthorizationError, InvalidTopicName, TopicNotFound, ValueError, TypeError)


def _start_retriable(e: BaseException) -> bool:
    """Whether a failed start may succeed later: the broker unreachable, restarting or not ready."""
    if isinstance(e, _FATAL_AT_START):
        return False
    return isinstance(e, (PulsarError, OSError, asyncio.TimeoutError))
