"""The distributed runtime's driver: plan, run, acknowledge, commit; narrow and park what keeps failing.

Each micro-batch (see :mod:`spark_jobs.runtime_plan` and :mod:`spark_jobs.runtime_batch`):

1. the driver plans one message-id range per input partition with something new, from the job's
   durable subscription (held with an Exclusive consumer per partition) and the partition's
   last message id;
2. it opens the batch's transaction (and writes a ``STARTED`` record, outside it);
3. one Spark job reads the ranges on the executors, runs the transform and writes the result
   into the transaction (each write task: deterministic producer names and batches);
4. the driver acknowledges every range cumulatively up to the entry its read ended at, inside
   the transaction, writes the ``COMMITTED`` record with the ranges (``input_ranges``: the record
   does not grow with the batch), and commits.

No row reaches the driver: it handles positions, the transaction and one summary row per write
task.

Failures. A Spark job that fails (the transform raised, a task failed for good) aborts the
transaction (``ABORTED`` record) and the batch runs again, up to ``max_attempts``; then it is
narrowed: the driver lists the batch's entries (positions and message counts, read by the
executors), splits them in halves (by partition, then by entries) and runs each half the same way,
in order, down to single entries. A single entry that still fails is parked: one transaction
produces its messages to ``<topic><parking_suffix>`` with the processor's ``PARK_*`` properties,
acknowledges the entry and writes a ``PARKED`` record (ids and range) under the batch's root id,
so replay (control plane, CLI, library) works as for the processor. A batch entry of a batching
producer is parked whole: the messages that share the poison message's entry are parked with it
(a replay brings them back). A failure on the broker's side (opening, acknowledging,
committing) aborts and re-plans from the subscription, without counting as an attempt.

One driver per job. The driver holds the subscription with an Exclusive consumer per partition
and, with ``fencing`` (the default), each partition's fence (:mod:`txn.delivery.fencing`): at
start it fences any earlier driver out and waits until that driver's open transactions are
resolved (aborting them); every batch's transaction carries the fence markers before its
acknowledgements. A stalled driver that resumes next to its replacement cannot commit: its marker
is refused, the batch aborts and the driver stops with :class:`~txn.OwnershipLost`.

Crash safety. The outputs, the acknowledgements and the ``COMMITTED`` record commit together or
not at all; a driver killed at any point leaves an open transaction (aborted at its timeout) or a
committed batch, and the next driver plans from the subscription's cursor. A second driver
waits for the subscription (Exclusive) until the first one's connection is gone; a zombie that
comes back finds its acknowledgements refused (the broker's conflict check: a cumulative
acknowledgement at or before the cursor, or while another transaction holds one), so its
transaction cannot commit. With ``ledger_guard`` the driver also starts from the furthest range
the ledger shows committed, should the broker have lost a committed cursor position.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO

import txn
from txn.backoff import Backoff
from txn.delivery.batch_ids import narrowed_batch_id, processor_batch_id
from txn.delivery.batch_txn import BatchScope, BatchTxn
from txn.delivery.fencing import PartitionFences
from txn.delivery.guard_checkpoint import Rung, checkpoint_topic, load_ladder, thin
from txn.delivery.guard_checkpoint import encode as encode_checkpoint
from txn.delivery.ledger import Kind, RecordConfig, ensure_ledger_retained, now_ms
from txn.delivery.ledger_reader import LedgerReader
from txn.delivery.processor import (
    PARK_ATTEMPTS,
    PARK_BATCH,
    PARK_ERROR,
    PARK_JOB,
    PARK_PROPS,
    PARK_SOURCE_ID,
    PARK_SOURCE_TOPIC,
    ProcessorConfig,
    ProcessorStats,
)
from txn.errors import OwnershipLost, PulsarError, TransactionError
from txn.settings import BrokerSettings
from txn.topic import parse_topic

from .options import settings_options
from .runtime_batch import (
    BatchResult,
    BrokerSideError,
    TransformError,
    WriteConfig,
    list_entries,
    read_messages,
    run_batch,
)
from .runtime_plan import Entry, Range, ReadEnd, cursor_and_last, entry_text, parse_entry, plan, record_ranges
from .runtime_rows import message_row, messages_schema, to_outputs
from .sink_runtime import deduplication_enabled
from .source import SourceOptions, TopicPartition, _Pulsar

log = logging.getLogger("spark_jobs.runtime")

#: Test hook: ``kill_before_runtime_commit:<n>`` / ``kill_after_runtime_commit:<n>`` SIGKILLs the
#: driver's process group right before / after the commit of its ``n``-th batch (from 1).
FAULT_ENV = "PULSAR_TXN_FAULT"
_EARLIEST: Entry = (-1, -1)


class _Transient(Exception):
    """A broker-side failure: the batch is planned again from the subscription."""


class _Failed(Exception):
    """The batch's own failure (its Spark job): counts towards ``max_attempts``."""


class DistributedRuntime:
    """The distributed micro-batch loop (see the module docs)."""

    def __init__(self, spark: Any, service_url: str, transform: Callable[[Any], Any], config: ProcessorConfig, *,
                 admin_url: str | None = None, progress: TextIO | None = None,
                 source_options: dict[str, str] | None = None, poll_timeout_ms: int = 60000,
                 deterministic_order: bool = True, write_batch_max_rows: int = 1000,
                 write_fail_dir: str | None = None, settings: BrokerSettings | None = None) -> None:
        self.spark, self.transform, self.config = spark, transform, config
        #: Credentials and TLS of every client and admin call, the driver's and the executors'.
        self.settings = (settings or BrokerSettings()).with_urls(service_url, admin_url)
        self.service_url = self.settings.require_service_url()
        self.admin_url, self.progress = self.settings.admin_url, progress
        src = settings_options(self.settings)
        src.pop("admin_url", None)  # the runtime names its inputs; the source needs no topic listing
        self.opts = SourceOptions.parse({**src, **(source_options or {}), "service_url": self.service_url,
                                         "topics": ",".join(config.inputs)})
        self.output = str(parse_topic(config.output))
        self.ledger_topic = config.ledger_topic or default_ledger(self.output)
        self.poll_ms = poll_timeout_ms
        self.deterministic_order = deterministic_order
        self.write_batch_max_rows = write_batch_max_rows
        self.write_fail_dir = write_fail_dir
        self.stats = ProcessorStats()
        self.instance = uuid.uuid4().hex[:8]
        self.seq = 0
        self.on_commit: Callable[[str, Any, int, dict[str, int], float], None] | None = None
        #: Test hook: called (in a thread) after a batch's acks and COMMITTED record, before its commit.
        self.before_commit: Callable[[], None] | None = None
        #: Prometheus metrics (:class:`txn.delivery.processor.metrics.ProcessorMetrics`) fed per commit, if set.
        self.metrics: Any = None
        #: Batches committing now (0 or 1: the driver commits one batch at a time).
        self.inflight_commits = 0
        self._conn: _Pulsar | None = None
        self._ledger: Any = None
        self._parking: dict[str, Any] = {}
        self._tps: dict[str, TopicPartition] = {}
        self._after: dict[str, Entry] = {}
        self._stopping = False
        self.exact_retries = False
        #: Start-up's ledger scan: the checkpoint it started after (None: the ledger's start) and
        #: the records it read; what the next checkpoint says (the furthest committed range end per
        #: partition) and when it is due (``config.guard_checkpoint_s``, with fencing on).
        self.scan_from: Rung | None = None
        self.scan_records = 0
        self._ends: dict[str, Entry] = {}
        self._ladder: list[Rung] = []
        self._checkpoints: Any = None
        self._next_checkpoint = 0.0
        #: The input partitions' fences (``config.fencing``), taken in :meth:`start`.
        self.fences: PartitionFences | None = None
        #: Opens the batches' transactions and writes their records (set up in :meth:`start`).
        self.batches: BatchScope | Any = None

    # -------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Hold the subscription on every input partition and find where the job stands."""
        c = self.config
        self._conn = conn = _Pulsar(self.opts)
        self._tps = {tp.name: tp for tp in conn.resolve()}
        conn.hold(c.subscription, sorted(self._tps))
        self._ledger = conn.run(self._open_ledger())
        if c.fencing and c.ledger_guard and c.guard_checkpoint_s > 0:
            self._checkpoints = conn.run(self._open_checkpoints())
        if c.fencing:
            # Fence any earlier driver out of every partition, and wait until the transactions it
            # left open are resolved, before reading where the subscription stands.
            self.fences = PartitionFences(conn.client, self.ledger_topic, c.subscription,
                                          f"{c.job}-{self.instance}", c.txn_timeout_ms)
            for name in sorted(self._tps):
                conn.run(self.fences.acquire(name))
        self.batches = BatchScope(conn.client, c.job, self._ledger, c.txn_timeout_ms, fences=self.fences,
                                  record_config=self._record_config)
        if self.admin_url:
            self.exact_retries = deduplication_enabled(self.admin_url, self.output, settings=self.settings)
        for name, (mark, _) in self._positions().items():
            self._after[name] = mark if mark is not None else _EARLIEST
        if c.ledger_guard:
            ends, unresolved = conn.run(self._ledger_scan())
            self._ends = dict(ends)
            for name, to in ends.items():
                if name in self._after and to > self._after[name]:
                    log.warning("%s: the ledger shows %s committed but the subscription is at %s; starting after %s",
                                name, entry_text(to), entry_text(self._after[name]), entry_text(to))
                    self._after[name] = to
            for txn_id in unresolved:  # a dead (or paused) driver's batch: its pending acks would block ours
                conn.run(self._abort_quietly(txn_id))

    async def _open_ledger(self) -> Any:
        assert self._conn is not None
        await ensure_ledger_retained(self._conn.client, self.ledger_topic)
        return await self._conn.client.create_producer(self.ledger_topic, batching_enabled=False)

    async def _open_checkpoints(self) -> Any:
        assert self._conn is not None
        topic = checkpoint_topic(self.ledger_topic, self.config.job)
        await ensure_ledger_retained(self._conn.client, topic)
        return await self._conn.client.create_producer(topic, batching_enabled=False)

    async def _ledger_scan(self) -> tuple[dict[str, Entry], list[str]]:
        """The furthest range end per partition in this job's committing records, and the
        transactions of this job's runtime that have a STARTED record and no outcome.

        With checkpoints (fencing on), the scan starts after the newest checkpoint, whose rung
        holds the furthest ends of every record before it: a driver writes one in a batch's
        transaction, at its COMMITTED record, and no other driver of the job commits while it holds
        the fences. (A STARTED record before the checkpoint with no outcome is then not listed: the
        fences taken at start already aborted what such a driver left open.)"""
        assert self._conn is not None
        ends: dict[str, Entry] = {}
        start = txn.EARLIEST
        self.scan_from = None
        if self._checkpoints is not None:
            self._ladder, _ = await load_ladder(self._conn.client, self.ledger_topic, self.config.job)
            if self._ladder:
                self.scan_from = self._ladder[-1]
                ends = dict(self.scan_from.hi)
                start = self.scan_from.start_id()
        started: dict[str, None] = {}
        ended: set[str] = set()
        async with await LedgerReader.open(self._conn.client, self.ledger_topic, start, verify_txn=True) as rd:
            entries = await rd.to_end()
        self.scan_records = len(entries)
        for r in (e.record for e in entries if e.record is not None):
            if r.job != self.config.job or r.config.runtime != "spark" or not r.txn_id:
                continue
            if r.kind == Kind.STARTED:
                started[r.txn_id] = None
                continue
            ended.add(r.txn_id)
            if r.kind not in (Kind.COMMITTED, Kind.PARKED):
                continue
            for name, rng in r.input_ranges.items():
                to = parse_entry(rng["to"])
                if to > ends.get(name, _EARLIEST):
                    ends[name] = to
        return ends, [t for t in started if t not in ended]

    async def _abort_quietly(self, txn_id: str) -> None:
        assert self._conn is not None
        try:
            await self._conn.client.transaction_from_id(txn_id, self.config.txn_timeout_ms).abort()
            log.warning("aborted transaction %s, left open by an earlier driver of job %s", txn_id, self.config.job)
        except (PulsarError, TransactionError) as exc:
            log.debug("transaction %s already ended: %s", txn_id, exc)

    def release(self) -> None:
        """Close the subscription's consumers (what the broker does to a driver it considers gone)."""
        if self._conn is not None:
            for consumer in self._conn.held.values():
                self._conn.run(consumer.close())

    def stop(self) -> None:
        """Stop after the batch in flight."""
        self._stopping = True

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            if self.fences is not None:
                conn.run(self.fences.close())
            conn.close()


    # ---------------------------------------------------------------------------- the loop

    def run(self, max_batches: int | None = None, idle_exit_ms: int | None = None) -> ProcessorStats:
        """Run batches until stopped, ``max_batches`` batches, or ``idle_exit_ms`` without input."""
        c = self.config
        idle_since = time.monotonic()
        last_progress = time.monotonic()
        done = 0
        backoff = Backoff(0.5, 30.0)
        while not self._stopping and (max_batches is None or done < max_batches):
            try:
                ranges = self._plan()
            except (PulsarError, OSError, TimeoutError) as exc:
                log.warning("planning failed (%s); retrying", exc)
                time.sleep(1.0)
                continue
            if not ranges:
                if idle_exit_ms is not None and (time.monotonic() - idle_since) * 1000 >= idle_exit_ms:
                    break
                time.sleep(min(c.batch_max_delay_ms, 200) / 1000)
                continue
            self.seq += 1
            bid = processor_batch_id(c.job, self.instance, self.seq)
            try:
                self._process(ranges, bid, bid)
            except _Transient as exc:
                self.stats.aborts += 1
                delay = backoff.next()
                log.warning("batch %s hit a broker-side failure (%s); planning again from the subscription in "
                            "%.1f s", bid, exc, delay)
                time.sleep(delay)
                continue
            backoff = Backoff(0.5, 30.0)
            done += 1
            idle_since = time.monotonic()
            if self.progress is not None and time.monotonic() - last_progress >= c.progress_interval_s:
                last_progress = time.monotonic()
                print(self.stats.line(c.job, 0), file=self.progress, flush=True)
        return self.stats

    def _positions(self) -> dict[str, tuple[Entry | None, Entry | None]]:
        assert self._conn is not None
        conn = self._conn
        names = sorted(self._tps)

        async def all_() -> list[tuple[Entry | None, Entry | None]]:
            return await asyncio.gather(*(cursor_and_last(conn.held[n]) for n in names))

        return dict(zip(names, conn.run(all_()), strict=True))

    def _plan(self) -> list[Range]:
        positions = {}
        for name, (mark, last) in self._positions().items():
            if mark is not None and mark > self._after.get(name, _EARLIEST):
                self._after[name] = mark  # another driver (a zombie) committed: the cursor decides
            tp = self._tps[name]
            positions[name] = (tp.topic, tp.partition, self._after[name], last)
        return plan(positions, self.config.batch_max_messages, self.config.batch_max_bytes)

    # ----------------------------------------------------------------------- one batch

    def _process(self, ranges: list[Range], batch_id: str, root: str) -> None:
        """Run ``ranges`` to a commit: retry, then narrow, then park (raises :class:`_Transient`)."""
        c = self.config
        failure: _Failed | None = None
        for attempt in range(1, c.max_attempts + 1):
            try:
                self._attempt(ranges, batch_id, attempt)
                return
            except _Failed as exc:
                self.stats.aborts += 1
                failure = exc
                log.warning("batch %s attempt %d failed: %s", batch_id, attempt, exc)
        assert failure is not None
        entries = list_entries(self.spark, self.opts, ranges, self.poll_ms)
        parts = [(r, entries[r.name]) for r in ranges if entries.get(r.name)]
        total = sum(len(es) for _, es in parts)
        if total == 0:
            return
        if total == 1:
            (r, [(entry, count)]), = parts
            one = Range(r.name, r.topic, r.partition, r.after, entry)
            if count > 1:
                self._narrow_entry(one, failure, batch_id, root)
            else:
                self._park(one, failure, c.max_attempts, root)
            return
        log.warning("batch %s failed %d times (%s); narrowing %d entries", batch_id, c.max_attempts, failure, total)
        if len(parts) > 1:
            k = len(parts) // 2
            halves = [parts[:k], parts[k:]]
        else:
            r, es = parts[0]
            k = len(es) // 2
            rest = Range(r.name, r.topic, r.partition, es[k - 1][0], r.to, r.cap, r.cap_bytes)
            halves = [[(r, es[:k])], [(rest, es[k:])]]
        for i, half in enumerate(halves):
            sub = [Range(r.name, r.topic, r.partition, r.after, es[-1][0]) for r, es in half]
            self._process(sub, narrowed_batch_id(batch_id, i), root)

    def _attempt(self, ranges: list[Range], batch_id: str, attempt: int) -> None:
        c = self.config
        conn = self._conn
        assert conn is not None
        t0 = time.monotonic()
        try:
            bt = conn.run(self.batches.open(batch_id, attempt))
        except PulsarError as exc:
            raise _Transient(exc) from exc
        t = bt.t
        conn.run(bt.started(input_ranges=record_ranges(ranges, {r.name: ReadEnd(r.to, 0) for r in ranges}),
                            with_config=True))
        cfg = WriteConfig(self.service_url, str(t.id), c.txn_timeout_ms, self.output, self.ledger_topic,
                          self.exact_retries, self.deterministic_order, self.write_batch_max_rows,
                          settings=self.settings)
        try:
            res = run_batch(self.spark, self.transform, self.opts, ranges, cfg, self.poll_ms, self.write_fail_dir)
        except BrokerSideError as exc:
            self._abort(bt, str(exc))
            raise _Transient(str(exc)) from exc
        except TransformError as exc:
            self._abort(bt, str(exc))
            raise _Failed(str(exc)) from exc
        t1 = time.monotonic()
        self.inflight_commits = 1
        try:
            conn.run(self._commit(bt, ranges, res))
        except OwnershipLost as exc:
            # Another driver of this job took the inputs over: this one is a zombie; stop.
            self._abort(bt, f"{type(exc).__name__}: {exc}")
            self._stopping = True
            raise
        except (PulsarError, TransactionError, OSError, TimeoutError) as exc:
            self._abort(bt, f"{type(exc).__name__}: {exc}")
            raise _Transient(exc) from exc
        finally:
            self.inflight_commits = 0
        commit_ms = (time.monotonic() - t1) * 1000
        for r in ranges:
            self._after[r.name] = res.ends[r.name].to
        _fault("kill_after_runtime_commit", self.seq)
        self.stats.batches += 1
        self.stats.messages += res.messages
        self.stats.outputs += sum(res.outputs.values())
        self.stats.commit_ms_total += commit_ms
        if self.metrics is not None:
            self.metrics.observe_commit((time.monotonic() - t0) * 1000)  # transaction open to commit
        log.info("batch %s committed in %s: %d in, %s out, %.0f ms (Spark %.0f ms)", batch_id, t.id, res.messages,
                 res.outputs, (time.monotonic() - t0) * 1000, (t1 - t0) * 1000)
        if self.on_commit is not None:
            self.on_commit(batch_id, t.id, res.messages, dict(res.outputs), commit_ms)

    async def _commit(self, bt: BatchTxn, ranges: list[Range], res: BatchResult) -> None:
        """Acknowledge the ranges, write COMMITTED, commit: all in the batch's transaction."""
        assert self._conn is not None
        held, t = self._conn.held, bt.t
        await bt.mark([r.name for r in ranges])
        await asyncio.gather(*(held[r.name].acknowledge_cumulative(
            _entry_id(res.ends[r.name].to), t) for r in ranges))
        input_ranges = record_ranges(ranges, res.ends)
        receipt = await bt.write(Kind.COMMITTED, input_ranges=input_ranges,
                                 outputs=dict(res.outputs),
                                 config=self._record_config().updated(tasks=res.tasks, rows=res.rows,
                                                                      duplicates_dropped=res.duplicates,
                                                                      task_attempts=res.attempts))
        record_id = await receipt
        ladder = await self._checkpoint(t, record_id, input_ranges)
        _fault("kill_before_runtime_commit", self.seq)
        if self.before_commit is not None:  # test hook (a zombie's pause)
            await asyncio.get_running_loop().run_in_executor(None, self.before_commit)
        await t.commit()
        for name, rng in input_ranges.items():  # committed: the next checkpoints' rungs hold them
            self._fold(name, parse_entry(rng["to"]))
        if ladder is not None:
            self._ladder = ladder

    def _fold(self, name: str, to: Entry) -> None:
        if to > self._ends.get(name, _EARLIEST):
            self._ends[name] = to

    async def _checkpoint(self, t: Any, record_id: Any, input_ranges: dict[str, dict[str, Any]]) -> list[Rung] | None:
        """When one is due, write a rung at this batch's COMMITTED record, in its transaction (so it
        is visible exactly if the batch commits): the furthest ends with this batch's ranges. Returns
        the ladder to keep once the batch committed (None: nothing written)."""
        if self._checkpoints is None or time.monotonic() < self._next_checkpoint:
            return None
        self._next_checkpoint = time.monotonic() + self.config.guard_checkpoint_s
        ends = dict(self._ends)
        for name, rng in input_ranges.items():
            to = parse_entry(rng["to"])
            if to > ends.get(name, _EARLIEST):
                ends[name] = to
        rung = Rung((record_id.ledger_id(), record_id.entry_id(), record_id.batch_index()), ends, now_ms())
        ladder = thin([*self._ladder, rung])
        data = encode_checkpoint(self.config.job, self.ledger_topic, str(t.id), ladder, now_ms())
        try:
            await self._checkpoints.send(data, txn=t)
        except PulsarError as exc:  # only saves reading at the next start; the batch goes on
            log.warning("checkpoint not written (%s); the next one comes with a later batch", exc)
            return None
        return ladder

    def _abort(self, bt: BatchTxn, error: str) -> None:
        assert self._conn is not None
        self._conn.run(bt.abort(error, with_config=True))

    def _record_config(self) -> RecordConfig:
        c = self.config
        return RecordConfig.of(handler=None, output=self.output, inputs=c.inputs, subscription=c.subscription,
                               parking_suffix=c.parking_suffix, ledger_topic=self.ledger_topic, runtime="spark",
                               transform=c.handler_spec)

    # ------------------------------------------------------------------------ parking

    def _narrow_entry(self, r: Range, failure: Exception, batch_id: str, root: str) -> None:
        """A batch entry (several messages of a batching producer) that keeps failing: find its
        failing message(s) by bisecting it on the driver (the entry is small: one producer batch),
        then one transaction commits the others' outputs, parks the failing ones and acknowledges
        the entry (COMMITTED under ``<batch_id>.0``, PARKED under ``root``)."""
        msgs = read_messages(self.opts, r, self.poll_ms)

        def outputs_of(subset: list[txn.Message]) -> list[Any]:
            df = self.spark.createDataFrame([message_row(m) for m in subset], messages_schema())
            return to_outputs(self.transform(df).collect())

        bad: list[tuple[txn.Message, str]] = []

        def search(subset: list[txn.Message]) -> None:
            try:
                outputs_of(subset)
                return
            except Exception as exc:  # noqa: BLE001 - the transform's failure, whatever it is
                err = f"{type(exc).__name__}: {exc}"
            if len(subset) == 1:
                bad.append((subset[0], err))
                return
            half = len(subset) // 2
            search(subset[:half])
            search(subset[half:])

        search(msgs)
        if not bad:  # the messages pass one by one on the driver: park the entry as it failed
            self._park(r, failure, self.config.max_attempts, root)
            return
        bad_ids = {str(m.message_id()) for m, _ in bad}
        good = [m for m in msgs if str(m.message_id()) not in bad_ids]
        outputs = outputs_of(good) if good else []
        assert self._conn is not None
        self._conn.run(self._commit_entry(r, good, outputs, bad, batch_id, root, len(msgs)))
        self._after[r.name] = r.to
        self._fold(r.name, r.to)  # committed by a parking transaction: the next checkpoint's rung holds it
        self.stats.batches += 1
        self.stats.messages += len(good)
        self.stats.outputs += len(outputs)
        self.stats.parked += len(bad)
        log.warning("entry %s of %s (batch %s): %d message(s) committed, %d parked: %s", entry_text(r.to), r.name,
                    root, len(good), len(bad), bad[0][1])

    async def _commit_entry(self, r: Range, good: list[txn.Message], outputs: list[Any],
                            bad: list[tuple[txn.Message, str]], batch_id: str, root: str, total: int) -> None:
        assert self._conn is not None
        c = self.config
        bt = await self.batches.open(root, c.max_attempts)
        t = bt.t
        try:
            sends = []
            counts: dict[str, int] = {}
            for o in outputs:
                topic = str(parse_topic(o.topic)) if o.topic else self.output
                sends.append(await (await self._producer(topic)).send_async(
                    o.content, properties=o.properties, partition_key=o.partition_key, txn=t))
                counts[topic] = counts.get(topic, 0) + 1
            parked_topic, parked_sends = await self._send_parked(r, bad, c.max_attempts, root, t)
            await bt.mark([r.name])
            await self._conn.held[r.name].acknowledge_cumulative(_entry_id(r.to), t)
            sends.append(await bt.write(Kind.PARKED, inputs={r.name: [str(m.message_id()) for m, _ in bad]},
                                        input_ranges={r.name: {"after": entry_text(r.after), "to": entry_text(r.to),
                                                               "count": total}},
                                        outputs={parked_topic: len(bad)}, error=bad[0][1], parked_topic=parked_topic,
                                        with_config=True))
            if good:
                # Under a half of its own: the entry's batch keeps its failed attempts (ABORTED).
                sends.append(await bt.write(Kind.COMMITTED, batch_id=narrowed_batch_id(batch_id, 0), attempt=1,
                                            inputs={r.name: [str(m.message_id()) for m in good]}, outputs=counts,
                                            with_config=True))
            await asyncio.gather(*sends, *parked_sends)
            await t.commit()
        except BaseException:
            await t.abort_if_open()
            raise

    async def _producer(self, topic: str) -> Any:
        assert self._conn is not None
        p = self._parking.get(topic)
        if p is None:
            p = self._parking[topic] = await self._conn.client.create_producer(topic, batching_enabled=False)
        return p

    async def _send_parked(self, r: Range, bad: list[tuple[txn.Message, str]], attempts: int, root: str,
                           t: Any) -> tuple[str, list[Any]]:
        """Produce ``bad`` (message, error) to the parking topic in ``t``: (the topic, the receipts)."""
        c = self.config
        parked_topic = parse_topic(r.name).base + c.parking_suffix
        p = await self._producer(parked_topic)
        sends = []
        for m, error in bad:
            props = {k: v for k, v in m.properties().items() if k not in PARK_PROPS}
            props.update({PARK_ERROR: error, PARK_ATTEMPTS: str(attempts), PARK_BATCH: root, PARK_JOB: c.job,
                          PARK_SOURCE_TOPIC: r.name, PARK_SOURCE_ID: str(m.message_id())})
            sends.append(await p.send_async(m.data(), properties=props, partition_key=m.partition_key() or None,
                                            event_timestamp=m.event_timestamp() or None, txn=t))
        return parked_topic, sends

    def _park(self, r: Range, failure: Exception, attempts: int, root: str) -> None:
        """Park the messages of one entry that keeps failing (see the module docs)."""
        conn = self._conn
        assert conn is not None
        msgs = read_messages(self.opts, r, self.poll_ms)
        conn.run(self._park_async(r, msgs, str(failure), attempts, root))
        self._after[r.name] = r.to
        self._fold(r.name, r.to)  # committed by a parking transaction: the next checkpoint's rung holds it
        self.stats.parked += len(msgs)
        log.warning("parked %d message(s) of entry %s of %s (batch %s): %s", len(msgs), entry_text(r.to), r.name,
                    root, failure)

    async def _park_async(self, r: Range, msgs: list[txn.Message], error: str, attempts: int, root: str) -> None:
        assert self._conn is not None
        bt = await self.batches.open(root, attempts)
        t = bt.t
        try:
            parked_topic, sends = await self._send_parked(r, [(m, error) for m in msgs], attempts, root, t)
            await bt.mark([r.name])
            await self._conn.held[r.name].acknowledge_cumulative(_entry_id(r.to), t)
            receipt = await bt.write(Kind.PARKED, inputs={r.name: [str(m.message_id()) for m in msgs]},
                                     input_ranges={r.name: {"after": entry_text(r.after), "to": entry_text(r.to),
                                                            "count": len(msgs)}},
                                     outputs={parked_topic: len(msgs)}, error=error, parked_topic=parked_topic,
                                     with_config=True)
            await asyncio.gather(*sends, receipt)
            await t.commit()
        except BaseException:
            await t.abort_if_open()
            raise


def _entry_id(entry: Entry) -> txn.MessageId:
    """The message id of a whole entry ``(ledger, entry)``, for a cumulative acknowledgement."""
    return txn.MessageId(ledger_id=entry[0], entry_id=entry[1])


def default_ledger(output: str) -> str:
    from txn.delivery.ledger import default_ledger_topic

    return default_ledger_topic(output)


def _fault(point: str, seq: int) -> None:
    if os.environ.get(FAULT_ENV) == f"{point}:{seq}":
        log.warning("%s=%s: SIGKILL of the driver's process group", FAULT_ENV, os.environ[FAULT_ENV])
        os.killpg(os.getpgid(0), signal.SIGKILL)


__all__ = ["FAULT_ENV", "DistributedRuntime"]
