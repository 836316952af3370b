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
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..backoff import Backoff
from ..client import AsyncClient
from ..consumer import AsyncConsumer, ConsumerType, InitialPosition
from ..errors import (
    CorruptMessage,
    InvalidTopicName,
    MessageTooBig,
    NotAllowed,
    PulsarError,
    Timeout,
    TopicNotFound,
    TransactionError,
)
from ..message import Message
from ..producer import AsyncProducer
from ..topic import parse_topic
from ..transaction import AsyncTransaction
from .batch_ids import narrowed_batch_id, processor_batch_id
from .batching import EntryBoundaries
from .ledger import Kind, LedgerRecord, RecordConfig, default_ledger_topic, ensure_ledger_retained, now_ms
from .ledger_guard import LedgerGuard
from .ordering import OrderingGuard
from .output import Output, handler_spec, is_async, normalise

log = logging.getLogger("txn.processor")

#: Property names the processor adds to parked messages.
PARK_ERROR = "pulsar-txn.error"
PARK_ATTEMPTS = "pulsar-txn.attempts"
PARK_BATCH = "pulsar-txn.batch_id"
PARK_JOB = "pulsar-txn.job"
PARK_SOURCE_TOPIC = "pulsar-txn.source_topic"
PARK_SOURCE_ID = "pulsar-txn.source_message_id"
#: On a parked message that could not be read at all (bad checksum, lying sizes): the check that
#: failed. Its payload is empty; the source topic and message id say where the entry is stored.
PARK_CORRUPT = "pulsar-txn.corrupt"
PARK_PROPS = (PARK_ERROR, PARK_ATTEMPTS, PARK_BATCH, PARK_JOB, PARK_SOURCE_TOPIC, PARK_SOURCE_ID, PARK_CORRUPT)

_PERMANENT_SEND_ERRORS = (MessageTooBig, InvalidTopicName, TopicNotFound, NotAllowed, TypeError, ValueError)


class _Transient(Exception):
    """A broker-side failure before anything was acknowledged: retry the same batch later."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class BatchFailed(Exception):
    """The handler (or a permanent send failure) failed a batch; carries the failing message."""

    def __init__(self, cause: BaseException, message: Message | None) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.message = message


@dataclass(slots=True)
class ProcessorConfig:
    """Settings of a :class:`Processor`."""

    inputs: list[str]
    output: str
    subscription: str
    job: str = "job"
    batch_max_messages: int = 100
    batch_max_delay_ms: int = 100
    max_attempts: int = 3
    txn_timeout_ms: int = 60000
    max_inflight_commits: int = 2
    consumer_type: ConsumerType = ConsumerType.Shared
    initial_position: InitialPosition = InitialPosition.Earliest
    ledger_topic: str | None = None
    parking_suffix: str = "-parked"
    receiver_queue_size: int = 1000
    max_pending_messages: int | None = None  # output producers' window; default 2 × batch, 1000..50000
    progress_interval_s: float = 5.0
    handler_spec: str | None = None
    #: Check every batch's inputs against the ledger's committed records (see ``ledger_guard``).
    ledger_guard: bool = True
    #: Bound of the guard's state: committed input ids remembered (about 60 bytes each).
    guard_max_ids: int = 1_000_000
    #: How long a batch waits for the ledger to become readable up to its STARTED record after a
    #: re-subscription; default 3 x the transaction timeout, at least 2 minutes.
    guard_sync_timeout_ms: int | None = None
    #: Close batches at batch-entry boundaries: a batch never splits a producer's batch entry across
    #: two transactions (it may exceed ``batch_max_messages`` by up to one entry; see ``batching``).
    batch_entry_boundaries: bool = False
    #: Hold a message until the one it must follow committed (see ``ordering``); None: off.
    ordering: OrderingGuard | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessorStats:
    """Counters, updated as batches complete."""

    batches: int = 0
    messages: int = 0
    outputs: int = 0
    aborts: int = 0
    parked: int = 0
    #: Inputs the ledger already showed committed: acknowledged again, nothing produced.
    duplicates_skipped: int = 0
    commit_ms_total: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def line(self, job: str, inflight: int) -> str:
        el = max(time.monotonic() - self.started, 1e-9)
        avg = self.commit_ms_total / self.batches if self.batches else 0.0
        return (
            f"[{job}] batches={self.batches} messages={self.messages} outputs={self.outputs} "
            f"txn/s={self.batches / el:.1f} msg/s={self.messages / el:.0f} aborts={self.aborts} "
            f"parked={self.parked} duplicates_skipped={self.duplicates_skipped} inflight={inflight} "
            f"avg_commit_ms={avg:.1f}"
        )


class AsyncProcessor:
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
        if config.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
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
        self._producer_locks: dict[str, asyncio.Lock] = {}
        self._ledger: AsyncProducer | None = None
        self._stopping = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max(1, config.max_inflight_commits))
        self._progress = progress
        self._async_handler = is_async(handler)
        self.fatal: BaseException | None = None
        self._next_txn: asyncio.Task[AsyncTransaction] | None = None
        self._entries = EntryBoundaries() if config.batch_entry_boundaries else None
        self.guard: LedgerGuard | None = None
        self._corrupt: list[CorruptMessage] = []  # unreadable inputs, parked after the batch is collected
        self._guard_synced = -1  # the consumer's subscriptions_made when the guard last caught up
        #: Called after each commit with (batch id, txn id, inputs, outputs per topic, commit ms).
        self.on_commit: Callable[[str, Any, int, dict[str, int], float], None] | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Subscribe to the inputs and create the ledger producer."""
        c = self.config
        self._consumer = await self.client.subscribe(
            self.inputs,
            c.subscription,
            consumer_type=c.consumer_type,
            initial_position=c.initial_position,
            receiver_queue_size=c.receiver_queue_size,
        )
        await ensure_ledger_retained(self.client, self.ledger_topic)
        if c.ledger_guard:
            self.guard = LedgerGuard(self.client, self.ledger_topic, c.job, self.inputs, c.guard_max_ids)
            await self.guard.start()
        self._ledger = await self.client.create_producer(
            self.ledger_topic, block_if_queue_full=True, batching_max_publish_delay_ms=5
        )
        await self._producer(self.output)

    def stop(self) -> None:
        """Ask the run loop to finish the batch in flight and return."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _producer(self, topic: str) -> AsyncProducer:
        p = self._producers.get(topic)
        if p is not None:
            return p
        lock = self._producer_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            p = self._producers.get(topic)
            if p is None:
                c = self.config
                window = c.max_pending_messages or min(max(1000, 2 * c.batch_max_messages), 50000)
                p = await self.client.create_producer(topic, block_if_queue_full=True, batching_max_publish_delay_ms=1,
                                                      max_pending_messages=window)
                self._producers[topic] = p
        return p

    async def close(self) -> None:
        """Wait for commits in flight, then close producers and the consumer."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        task, self._next_txn = self._next_txn, None
        if task is not None:
            await _discard(task)
        for p in list(self._producers.values()) + ([self._ledger] if self._ledger else []):
            await p.close()
        if self._consumer is not None:
            await self._consumer.close()
        if self.guard is not None:
            await self.guard.close()

    # ---------------------------------------------------------------------- loop

    async def run(self, max_batches: int | None = None, idle_exit_ms: int | None = None) -> ProcessorStats:
        """Process batches until :meth:`stop` (or ``max_batches``, or ``idle_exit_ms`` without input)."""
        assert self._consumer is not None, "call start() first"
        last_progress = time.monotonic()
        idle_since = time.monotonic()
        done = 0
        try:
            while not self._stopping.is_set():
                if self.fatal is not None:
                    raise self.fatal
                batch = await self._collect()
                while self._corrupt:
                    await self._park_corrupt(self._corrupt.pop(0))
                if self.config.ordering is not None:
                    batch = await self.config.ordering.gate(self, batch)
                now = time.monotonic()
                if self._progress is not None and now - last_progress >= self.config.progress_interval_s:
                    print(self.stats.line(self.config.job, len(self._inflight)), file=self._progress, flush=True)
                    last_progress = now
                if not batch:
                    if idle_exit_ms is not None and (now - idle_since) * 1000 >= idle_exit_ms and not self._inflight:
                        if self.config.ordering is None or not self.config.ordering.holding:
                            break
                    continue
                idle_since = now
                await self._process(batch, self._new_batch_id())
                done += 1
                if max_batches is not None and done >= max_batches:
                    break
        finally:
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            if self._progress is not None:
                print(self.stats.line(self.config.job, 0), file=self._progress, flush=True)
        if self.fatal is not None:
            raise self.fatal
        return self.stats

    async def _collect(self) -> list[Message]:
        assert self._consumer is not None
        c = self.config
        consumer = self._consumer
        if self._next_txn is None and not self._stopping.is_set():
            # Open the next batch's transaction while its messages arrive.
            self._next_txn = asyncio.get_running_loop().create_task(
                self.client.new_transaction(timeout_millis=c.txn_timeout_ms)
            )
        batch: list[Message] = []
        ids: set[tuple[str, Any]] = set()
        deadline = time.monotonic() + c.batch_max_delay_ms / 1000.0
        held = self._entries.take(consumer.subscriptions_made) if self._entries is not None else None
        while len(batch) < c.batch_max_messages and not self._stopping.is_set():
            m, held = self._receive_nowait() if held is None else held, None
            if m is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                m = await self._receive_or_stop(max(1, int(left * 1000)))
                if m is None:
                    break
            key = (m.topic_name(), m.message_id())
            if key in ids:
                # Redelivered while its first copy is still here (after a reconnect or an abort).
                # A transaction that acknowledged one message twice would commit its output twice.
                continue
            ids.add(key)
            batch.append(m)
        if self._entries is not None:
            self._entries.complete(batch, ids, self._receive_nowait, consumer.subscriptions_made)
        return batch

    def _receive_nowait(self) -> Message | None:
        """A queued message or None; unreadable ones are set aside to be parked."""
        assert self._consumer is not None
        while True:
            try:
                return self._consumer.receive_nowait()
            except CorruptMessage as exc:
                self._corrupt.append(exc)

    async def _receive_or_stop(self, timeout_ms: int) -> Message | None:
        """Wait for a message, the timeout, or :meth:`stop`, whichever comes first."""
        assert self._consumer is not None
        recv = asyncio.ensure_future(self._consumer.receive(timeout_millis=timeout_ms))
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not recv.done():
            recv.cancel()
            try:
                await recv
            except (asyncio.CancelledError, Timeout):
                pass
            return None
        try:
            return recv.result()
        except Timeout:
            return None
        except CorruptMessage as exc:
            self._corrupt.append(exc)  # closes this batch early; the message is parked next
            return None

    async def _take_txn(self) -> AsyncTransaction:
        """The pre-opened transaction if it is still fresh, else a new one."""
        c = self.config
        task, self._next_txn = self._next_txn, None
        if task is not None:
            try:
                t = await task
            except PulsarError as exc:
                raise _Transient(exc) from exc
            age_ms = (time.monotonic() - t._opened) * 1000  # noqa: SLF001
            if age_ms < c.txn_timeout_ms / 2:
                return t
            await _discard_txn(t)
        try:
            return await self.client.new_transaction(timeout_millis=c.txn_timeout_ms)
        except PulsarError as exc:
            raise _Transient(exc) from exc

    def _new_batch_id(self) -> str:
        self._seq += 1
        return processor_batch_id(self.config.job, self.instance, self._seq)

    # ------------------------------------------------------------------- batches

    async def _process(self, msgs: list[Message], batch_id: str, root: str | None = None) -> None:
        """Run one batch to a commit, retrying, narrowing and parking as needed."""
        root = root or batch_id
        attempt = 0
        backoff = Backoff(0.2, 5.0)
        while True:
            attempt += 1
            try:
                await self._attempt(msgs, batch_id, attempt)
                return
            except _Transient as exc:
                # Not the batch's fault (broker restart, lost connection, coordinator busy):
                # keep the batch and try again; this does not count towards parking.
                self.stats.aborts += 1
                attempt -= 1
                if self._stopping.is_set():
                    log.warning("stopping with batch %s unfinished (%s); the broker redelivers it", batch_id,
                                exc.cause)
                    return
                delay = backoff.next()
                log.warning("batch %s hit a broker-side failure (%s); retrying in %.1fs", batch_id, exc.cause, delay)
                await asyncio.sleep(delay)
                continue
            except BatchFailed as failure:
                self.stats.aborts += 1
                if attempt < self.config.max_attempts:
                    continue
                if len(msgs) > 1:
                    half = len(msgs) // 2
                    log.warning("batch %s failed %d times (%s); narrowing %d messages", batch_id, attempt,
                                failure, len(msgs))
                    await self._process(msgs[:half], narrowed_batch_id(batch_id, 0), root)
                    await self._process(msgs[half:], narrowed_batch_id(batch_id, 1), root)
                    return
                await self._park(msgs[0], failure, attempt, root)
                return

    async def _sync_guard(self, msgs: list[Message], batch_id: str, attempt: int, started: int) -> bool:
        """After a (re)subscription, wait until the guard has read the ledger past this batch's STARTED record.

        Returns True if it wrote the batch's STARTED record (then without a transaction id).
        """
        guard = self.guard
        assert self._consumer is not None and self._ledger is not None
        made = self._consumer.subscriptions_made
        if guard is None or made == self._guard_synced:
            return False
        c = self.config
        timeout_ms = c.guard_sync_timeout_ms or max(3 * c.txn_timeout_ms, 120_000)
        rec = LedgerRecord(kind=Kind.STARTED, job=c.job, batch_id=batch_id, txn_id=None, attempt=attempt,
                           inputs=_ids(msgs), started_at_ms=started, config=self._record_config())
        try:
            await guard.ensure_running()
            mid = await self._ledger.send(rec.to_json(), partition_key=batch_id)
            await guard.wait_past(mid, timeout_ms / 1000)
        except (PulsarError, TimeoutError) as exc:
            raise _Transient(exc) from exc
        self._guard_synced = made
        return True

    async def _attempt(self, msgs: list[Message], batch_id: str, attempt: int) -> None:
        c = self.config
        started = now_ms()
        wrote_started = await self._sync_guard(msgs, batch_id, attempt, started)
        fresh, dups = self.guard.split(msgs) if self.guard is not None else (msgs, [])
        if dups:
            log.warning("batch %s: %d input(s) were already committed according to the ledger (the broker lost "
                        "their acknowledgements); acknowledging them again without output", batch_id, len(dups))
        t = await self._take_txn()
        generation = self._generation()
        inputs = _ids(fresh)
        duplicates = _ids(dups) if dups else {}
        if not wrote_started:
            self._record_nowait(
                LedgerRecord(kind=Kind.STARTED, job=c.job, batch_id=batch_id, txn_id=str(t.id), attempt=attempt,
                             inputs=_ids(msgs) if dups else inputs, started_at_ms=started, config=self._record_config())
            )
        try:
            # Register what the batch will surely touch in two requests, while it is transformed.
            assert self._consumer is not None and self._ledger is not None
            parts = self._ledger.partition_topics() + self._producers[self.output].partition_topics()
            subs = [(tp, c.subscription) for tp in {m.topic_name() for m in msgs}]
            registering = asyncio.ensure_future(t.register_many(parts, subs))
            try:
                outputs = await self._transform(fresh) if fresh else []
            finally:
                try:
                    await registering
                except PulsarError as exc:
                    raise _Transient(exc) from exc
            counts = await self._produce(outputs, t)
        except BatchFailed as failure:
            await self._abort(t, batch_id, attempt, inputs, started, failure)
            raise
        except _Transient as exc:
            await self._abort(t, batch_id, attempt, inputs, started, exc.cause)
            raise
        except PulsarError as exc:
            # A broker-side failure before any ack: nothing was acknowledged, so retry the batch.
            await self._abort(t, batch_id, attempt, inputs, started, exc)
            raise _Transient(exc) from exc
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(
            self._finish(t, msgs, batch_id, attempt, inputs, counts, started, generation, fresh, duplicates)
        )
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _transform(self, msgs: list[Message]) -> list[tuple[Message, list[Output]]]:
        if self._async_handler:
            out = []
            for m in msgs:
                try:
                    out.append((m, normalise(await self.handler(m))))
                except Exception as exc:  # the handler's failure fails the batch
                    raise BatchFailed(exc, m) from exc
            return out

        def run_all() -> list[tuple[Message, list[Output]]]:
            res = []
            for m in msgs:
                try:
                    res.append((m, normalise(self.handler(m))))
                except Exception as exc:
                    raise BatchFailed(exc, m) from exc
            return res

        return await asyncio.get_running_loop().run_in_executor(None, run_all)

    async def _produce(self, outputs: list[tuple[Message, list[Output]]], t: AsyncTransaction) -> dict[str, int]:
        counts: dict[str, int] = {}
        futs: list[tuple[Message, asyncio.Future[Any]]] = []
        for m, outs in outputs:
            for o in outs:
                topic = o.topic or self.output
                try:
                    p = await self._producer(topic)
                    f = await p.send_async(o.content, properties=o.properties, partition_key=o.partition_key, txn=t)
                except _PERMANENT_SEND_ERRORS as exc:
                    raise BatchFailed(exc, m) from exc
                futs.append((m, f))
                counts[topic] = counts.get(topic, 0) + 1
        for p in self._producers.values():
            p.flush_now()
        for m, f in futs:
            try:
                await f
            except _PERMANENT_SEND_ERRORS as exc:
                raise BatchFailed(exc, m) from exc
        return counts

    async def _finish(
        self,
        t: AsyncTransaction,
        msgs: list[Message],
        batch_id: str,
        attempt: int,
        inputs: dict[str, list[str]],
        counts: dict[str, int],
        started: int,
        generation: int,
        fresh: list[Message],
        duplicates: dict[str, list[str]],
    ) -> None:
        c = self.config
        t0 = time.monotonic()
        try:
            assert self._consumer is not None and self._ledger is not None
            ack = asyncio.ensure_future(self._consumer.acknowledge_many(msgs, t))
            rec = LedgerRecord(kind=Kind.COMMITTED, job=c.job, batch_id=batch_id, txn_id=str(t.id), attempt=attempt,
                               inputs=inputs, outputs=counts, started_at_ms=started, ended_at_ms=now_ms(),
                               duplicates=duplicates)
            receipt = await self._ledger.send_async(rec.to_json(), partition_key=batch_id, txn=t)
            self._ledger.flush_now()
            record_id = await receipt
            await ack
            if self._generation() != generation:
                # A producer reconnected during this transaction and may have re-sent a frame
                # the broker had already stored; without broker dedup that could duplicate an
                # output inside the transaction. Abort: the inputs come back and are redone.
                raise TransactionError("a producer reconnected during the transaction; aborting to stay exactly-once",
                                       txn_id=t.id)
            if c.ordering is not None:
                await c.ordering.prepare(msgs, t.id, self._ledger, record_id)
            await t.commit()
            commit_ms = (time.monotonic() - t0) * 1000
            # (The guard learns this commit from the ledger: its reader sees the COMMITTED record.)
            self.stats.batches += 1
            self.stats.messages += len(fresh)
            self.stats.duplicates_skipped += len(msgs) - len(fresh)
            self.stats.outputs += sum(counts.values())
            self.stats.commit_ms_total += commit_ms
            if self.on_commit is not None:
                self.on_commit(batch_id, t.id, len(fresh), counts, commit_ms)
            if c.ordering is not None:
                await c.ordering.committed(msgs)
        except (PulsarError, TransactionError) as exc:
            self.stats.aborts += 1
            log.warning("batch %s (txn %s) did not commit: %s; the broker redelivers its inputs",
                        batch_id, t.id, exc)
            await self._abort(t, batch_id, attempt, inputs, started, exc)
            if c.ordering is not None and t.state.value == "ABORTED":
                await c.ordering.aborted(msgs, t.id)
        except BaseException as exc:  # a bug: stop the processor rather than lose track
            self.fatal = exc
            raise
        finally:
            self._slots.release()

    async def _abort(
        self,
        t: AsyncTransaction,
        batch_id: str,
        attempt: int,
        inputs: dict[str, list[str]],
        started: int,
        error: BaseException,
    ) -> None:
        if t.state.value in ("OPEN", "TIMED_OUT"):
            try:
                await t.abort()
            except PulsarError as exc:
                log.warning("abort of %s failed (the broker's timeout aborts it): %s", t.id, exc)
        await self._record(
            LedgerRecord(kind=Kind.ABORTED, job=self.config.job, batch_id=batch_id, txn_id=str(t.id), attempt=attempt,
                         inputs=inputs, started_at_ms=started, ended_at_ms=now_ms(), error=_err(error))
        )

    async def _park(self, m: Message, failure: BatchFailed, attempts: int, batch_id: str) -> None:
        """Move a poison message to the parking topic, atomically with its ack."""
        c = self.config
        assert self._consumer is not None and self._ledger is not None
        source = parse_topic(m.topic_name()).base
        parked_topic = source + c.parking_suffix
        props = {k: v for k, v in m.properties().items() if k not in PARK_PROPS}
        props.update({
            PARK_ERROR: _err(failure.cause),
            PARK_ATTEMPTS: str(attempts),
            PARK_BATCH: batch_id,
            PARK_JOB: c.job,
            PARK_SOURCE_TOPIC: m.topic_name(),
            PARK_SOURCE_ID: str(m.message_id()),
        })
        started = now_ms()
        while True:
            t = await self.client.new_transaction(timeout_millis=c.txn_timeout_ms)
            try:
                p = await self._producer(parked_topic)
                # Keep the event time: a replay hands the transform the message as it first saw it.
                await p.send_async(m.data(), properties=props, partition_key=m.partition_key() or None,
                                   event_timestamp=m.event_timestamp() or None, txn=t)
                await self._consumer.acknowledge_many([m], t)
                rec = LedgerRecord(kind=Kind.PARKED, job=c.job, batch_id=batch_id, txn_id=str(t.id), attempt=attempts,
                                   inputs={m.topic_name(): [str(m.message_id())]}, outputs={parked_topic: 1},
                                   started_at_ms=started, ended_at_ms=now_ms(), error=_err(failure.cause),
                                   parked_topic=parked_topic, config=self._record_config())
                await self._ledger.send_async(rec.to_json(), partition_key=batch_id, txn=t)
                await t.commit()
                if self.guard is not None:
                    self.guard.committed.add_message(m)
                self.stats.parked += 1
                if c.ordering is not None:
                    await c.ordering.on_parked(m)
                log.warning("parked message %s of batch %s on %s: %s", m.message_id(), batch_id, parked_topic,
                            failure)
                return
            except (PulsarError, TransactionError) as exc:
                log.warning("parking %s failed (%s); the broker redelivers it", m.message_id(), exc)
                if t.state.value == "OPEN":
                    try:
                        await t.abort()
                    except PulsarError:
                        pass
                return

    async def _park_corrupt(self, exc: CorruptMessage) -> None:
        """Park an input that cannot be read (bad checksum, sizes that lie), never stopping on it.

        One transaction acknowledges the stored entry, produces an empty message to the parking
        topic whose properties name the check that failed, the source topic and message id, and
        writes a PARKED record. If that fails the entry stays unacknowledged and comes back.
        """
        c = self.config
        assert self._consumer is not None and self._ledger is not None
        topic, mid = exc.topic or "", exc.message_id
        parked_topic = parse_topic(topic).base + c.parking_suffix
        batch_id = self._new_batch_id()
        props = {PARK_ERROR: _err(exc), PARK_ATTEMPTS: "0", PARK_BATCH: batch_id, PARK_JOB: c.job,
                 PARK_SOURCE_TOPIC: topic, PARK_SOURCE_ID: str(mid), PARK_CORRUPT: str(exc.reason)}
        started = now_ms()
        log.error("input %s on %s cannot be read (%s); parking it on %s", mid, topic, exc, parked_topic)
        t: AsyncTransaction | None = None
        try:
            t = await self.client.new_transaction(timeout_millis=c.txn_timeout_ms)
            p = await self._producer(parked_topic)
            sent = await p.send_async(b"", properties=props, txn=t)
            await self._consumer.acknowledge(mid, t)
            rec = LedgerRecord(kind=Kind.PARKED, job=c.job, batch_id=batch_id, txn_id=str(t.id), attempt=0,
                               inputs={topic: [str(mid)]}, outputs={parked_topic: 1}, started_at_ms=started,
                               ended_at_ms=now_ms(), error=_err(exc), parked_topic=parked_topic,
                               config=self._record_config())
            receipt = await self._ledger.send_async(rec.to_json(), partition_key=batch_id, txn=t)
            p.flush_now()
            self._ledger.flush_now()
            await sent
            await receipt
            await t.commit()
        except (PulsarError, TransactionError, ValueError) as err:
            log.warning("parking unreadable input %s failed (%s); it stays unacknowledged", mid, err)
            if t is not None and t.state.value == "OPEN":
                await _discard_txn(t)
            return
        if self.guard is not None:
            self.guard.committed.add(topic, mid.ledger_id, mid.entry_id, -1)
        self.stats.parked += 1

    def _record_nowait(self, rec: LedgerRecord) -> None:
        """Queue an informative record (STARTED) without waiting for its receipt."""
        assert self._ledger is not None

        async def go() -> None:
            try:
                fut = await self._ledger.send_async(rec.to_json(), partition_key=rec.batch_id)
                await fut
            except PulsarError as exc:
                log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)

        task = asyncio.get_running_loop().create_task(go())
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _record(self, rec: LedgerRecord) -> None:
        assert self._ledger is not None
        try:
            await self._ledger.send(rec.to_json(), partition_key=rec.batch_id)
        except PulsarError as exc:  # STARTED/ABORTED are informative; the outcome does not depend on them
            log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)

    def _generation(self) -> int:
        ps = list(self._producers.values()) + ([self._ledger] if self._ledger else [])
        return sum(p.reconnect_count() for p in ps)

    def _record_config(self) -> RecordConfig:
        c = self.config
        return RecordConfig.of(handler=c.handler_spec, output=self.output, inputs=self.inputs,
                               subscription=c.subscription, parking_suffix=c.parking_suffix,
                               ledger_topic=self.ledger_topic)


async def _discard_txn(t: AsyncTransaction) -> None:
    try:
        await t.abort()
    except PulsarError:
        pass  # the broker's timeout aborts it


async def _discard(task: asyncio.Task[AsyncTransaction]) -> None:
    try:
        t = await task
    except BaseException:  # noqa: BLE001 - never opened
        return
    await _discard_txn(t)


def _ids(msgs: list[Message]) -> dict[str, list[str]]:
    """Message ids per topic/partition, as ledger records list them."""
    out: dict[str, list[str]] = {}
    for m in msgs:
        out.setdefault(m.topic_name(), []).append(str(m.message_id()))
    return out


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Processor:
    """Blocking facade: ``Processor(service_url, inputs, output, subscription, handler, ...).run()``.

    ``run()`` processes until SIGTERM/SIGINT (or :meth:`stop`), then finishes the batch in
    flight and returns the stats.
    """

    def __init__(
        self,
        service_url: str,
        inputs: list[str] | str,
        output: str,
        subscription: str,
        handler: Callable[[Message], Any],
        *,
        job: str = "job",
        batch_max_messages: int = 100,
        batch_max_delay_ms: int = 100,
        progress: TextIO | None = sys.stderr,
        client_kwargs: dict[str, Any] | None = None,
        **config: Any,
    ) -> None:
        self.service_url = service_url
        self.client_kwargs = client_kwargs or {}
        self.config = ProcessorConfig(
            inputs=[inputs] if isinstance(inputs, str) else list(inputs),
            output=output,
            subscription=subscription,
            job=job,
            batch_max_messages=batch_max_messages,
            batch_max_delay_ms=batch_max_delay_ms,
            **config,
        )
        self.handler = handler
        self.progress = progress
        self._inner: AsyncProcessor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """Ask the processor to stop after the batch in flight (thread-safe)."""
        if self._loop is not None and self._inner is not None:
            self._loop.call_soon_threadsafe(self._inner.stop)

    def run(self, max_batches: int | None = None, idle_exit_ms: int | None = None,
            install_signal_handlers: bool = True) -> ProcessorStats:
        """Run until stopped; returns the final stats."""
        return asyncio.run(self._main(max_batches, idle_exit_ms, install_signal_handlers))

    async def _main(self, max_batches: int | None, idle_exit_ms: int | None, signals: bool) -> ProcessorStats:
        self._loop = asyncio.get_running_loop()
        async with AsyncClient(self.service_url, **self.client_kwargs) as client:
            proc = AsyncProcessor(client, self.handler, self.config, self.progress)
            self._inner = proc
            if signals and os.name == "posix":
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.add_signal_handler(sig, proc.stop)
            await proc.start()
            try:
                return await proc.run(max_batches=max_batches, idle_exit_ms=idle_exit_ms)
            finally:
                await proc.close()
