"""The commit pipeline: one batch from its transaction to its commit, exactly once.

``_process`` runs a batch to a commit: it retries broker-side failures, and a batch the handler
keeps failing is narrowed in halves down to the failing message, which is parked. One attempt
(``_attempt``):

1. after a (re)subscription, waits until the ledger guard has read the ledger up to this batch
   (``_sync_guard``); inputs the ledger already shows committed are acknowledged again and
   produce nothing;
2. takes the pre-opened transaction and writes the STARTED record (outside it);
3. runs the handler (``_transform``, the hook the Spark runtime overrides) and produces the
   outputs in the transaction (``_produce``);
4. hands the commit to a background task (``_finish``: acknowledge the inputs, write the
   COMMITTED record, commit), at most ``max_inflight_commits`` at a time, so the loop goes on
   collecting the next batch. A failure aborts the transaction (``_abort``) and writes ABORTED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...backoff import Backoff
from ...client import AsyncClient
from ...consumer import AsyncConsumer
from ...errors import OwnershipLost, PulsarError, Timeout, TransactionError
from ...message import Message
from ...producer import AsyncProducer
from ...transaction import AsyncTransaction
from ..batch_ids import narrowed_batch_id
from ..batch_txn import BatchScope, BatchTxn
from ..batching import EntryBoundaries
from ..commit_audit import CommitAudit, output_starts
from ..fencing import PartitionFences
from ..guard_checkpoint import encode as encode_checkpoint
from ..guard_checkpoint import mark_deletes
from ..ledger import Kind, now_ms
from ..ledger_guard import LedgerGuard
from ..output import Output, normalise, output_size
from .config import ProcessorConfig, ProcessorStats
from .failures import _PERMANENT_SEND_ERRORS, BatchFailed, _discard_txn, _Dropped, _settle, _Transient
from .metrics import ProcessorMetrics
from .records import _ids

log = logging.getLogger("txn.processor")

#: Seconds past a batch transaction's timeout after which its commit stage stops waiting.
COMMIT_GRACE_S = 10.0
#: The longest a hand-back waits for the broker's dispatch to its consumers to settle.
DISPATCH_SETTLE_S = 1.0


async def _checkpoint_sent(f: Any) -> None:
    """Wait for a checkpoint's receipt. Its failure does not fail the batch: a checkpoint only saves
    reading; committed or not, every rung it holds is true of the ledger."""
    try:
        await f
    except PulsarError as exc:
        log.warning("guard checkpoint not written (%s); the next one comes with a later batch", exc)


class CommitPipeline:
    """Part of :class:`~txn.delivery.processor.AsyncProcessor`: attempts, produce, pipelined commits, aborts."""

    client: AsyncClient
    handler: Callable[[Message], Any]
    config: ProcessorConfig
    output: str
    stats: ProcessorStats
    guard: LedgerGuard | None
    audit: CommitAudit | None
    fatal: BaseException | None
    on_commit: Callable[[str, Any, int, dict[str, int], float], None] | None
    metrics: ProcessorMetrics | None
    _consumer: AsyncConsumer | None
    _producers: dict[str, AsyncProducer]
    _ledger: AsyncProducer | None
    _checkpoints: AsyncProducer | None
    _next_checkpoint: float
    ledger_topic: str
    _stopping: asyncio.Event
    _inflight: set[asyncio.Task[None]]
    commit_slots: asyncio.Semaphore
    _async_handler: bool
    _next_txn: asyncio.Task[AsyncTransaction] | None
    _guard_synced: int
    fences: PartitionFences | None
    batches: BatchScope
    _handback: set[Any]
    _entries: EntryBoundaries | None
    _held_over: tuple[Message, int] | None

    async def _take_txn(self) -> AsyncTransaction:
        """The pre-opened transaction if it is still fresh, else a new one."""
        c = self.config
        task, self._next_txn = self._next_txn, None
        if task is not None:
            try:
                t = await task
            except PulsarError as exc:
                raise _Transient(exc) from exc
            age_ms = (time.monotonic() - t.opened_at) * 1000
            if age_ms < c.txn_timeout_ms / 2:
                return t
            await _discard_txn(t)
        try:
            return await self.batches.new_transaction()
        except PulsarError as exc:
            raise _Transient(exc) from exc

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
            except _Dropped as dropped:
                # A partition changed hands: nothing of the batch committed, and its inputs go back
                # to the broker, which delivers them to their owner (this instance after a takeover).
                log.info("batch %s dropped: %s", batch_id, dropped)
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
        rec = self.batches.record(Kind.STARTED, batch_id, attempt=attempt, inputs=_ids(msgs), started_at_ms=started,
                                  with_config=True)
        try:
            # A recovered cursor may stand below the checkpoint the guard started from: then the
            # guard reads again from an earlier one (or the ledger's start).
            marks = await mark_deletes(self._consumer) if self._checkpoints is not None else None
            await guard.ensure_running(marks, checkpoints=self._checkpoints is not None)
            mid = await self._ledger.send_now(rec.to_json(), partition_key=batch_id)
            await guard.wait_past(mid, timeout_ms / 1000)
        except (PulsarError, TimeoutError) as exc:
            raise _Transient(exc) from exc
        self._guard_synced = made
        return True

    async def _take_over(self, partitions: list[str], msgs: list[Message]) -> None:
        """Acquire the fences of ``partitions`` (fencing their previous owners and waiting until
        their open transactions are resolved), then drop the batch: its inputs are handed back and
        come again, after the guard has synced (a previous owner may have committed some)."""
        assert self.fences is not None
        for part in partitions:
            try:
                await self.fences.acquire(part)
            except PulsarError as exc:
                raise _Transient(exc) from exc
            self.stats.takeovers += 1
        self.hand_back(msgs)
        raise _Dropped(f"took over {', '.join(partitions)}; its inputs come again")

    def hand_back(self, msgs: list[Message]) -> None:
        """Have the loop hand ``msgs``' consumers' unacknowledged inputs back to the broker before the
        next batch (after a failure: a consumer that stays connected is sent nothing again otherwise)."""
        self._handback.update(m.consumer for m in msgs if m.consumer is not None)

    def _lost(self, exc: OwnershipLost, msgs: list[Message]) -> None:
        assert self.fences is not None
        self.stats.partitions_lost += 1
        if exc.topic:
            self.fences.release(exc.topic)
        log.warning("%s: the batch is abandoned and its inputs left to the new owner", exc)
        self.hand_back(msgs)

    async def _attempt(self, msgs: list[Message], batch_id: str, attempt: int) -> None:
        c = self.config
        started = now_ms()
        partitions = {m.topic_name() for m in msgs}
        if self.fences is not None:
            missing = self.fences.missing(partitions)
            if missing:
                await self._take_over(missing, msgs)
        wrote_started = await self._sync_guard(msgs, batch_id, attempt, started)
        fresh, dups = self.guard.split(msgs) if self.guard is not None else (msgs, [])
        if dups:
            log.warning("batch %s: %d input(s) were already committed according to the ledger (the broker lost "
                        "their acknowledgements); acknowledging them again without output", batch_id, len(dups))
        bt = await self.batches.open(batch_id, attempt, txn=await self._take_txn(), started_at_ms=started)
        t = bt.t
        generation = self._generation()
        inputs = _ids(fresh)
        duplicates = _ids(dups) if dups else {}
        if not wrote_started:
            bt.started_later(inputs=_ids(msgs) if dups else inputs, with_config=True)
        registering = marking = None
        first_outputs: dict[str, Any] = {}
        try:
            # Nothing of the transaction can commit past its timeout: a stage still waiting then
            # (a reply lost in a broker restart) is given up, and the batch is tried again.
            async with asyncio.timeout(max(0.0, t.opened_at + c.txn_timeout_ms / 1000 + COMMIT_GRACE_S
                                           - time.monotonic())):
                # Register what the batch will surely touch in two requests, while it is transformed.
                assert self._consumer is not None and self._ledger is not None
                parts = self._ledger.partition_topics() + self._producers[self.output].partition_topics()
                parts += bt.fence_topics(partitions)
                subs = [(tp, c.subscription) for tp in partitions]
                registering = asyncio.ensure_future(t.register_many(parts, subs))
                # The proof of ownership goes in before any acknowledgement (those are sent by _finish).
                marking = asyncio.ensure_future(bt.mark(partitions))
                try:
                    outputs = await self._transform(fresh) if fresh else []
                finally:
                    await _settle(registering, marking)
                counts = await self._produce(outputs, t, first_outputs)
        except TimeoutError as exc:
            for f in (registering, marking):
                if f is not None and not f.done():
                    f.cancel()
            stuck = Timeout(f"batch {batch_id} outlived its transaction's timeout ({c.txn_timeout_ms} ms) before "
                            "its commit; trying again", txn_id=t.id)
            await bt.abort(stuck, inputs=inputs)
            raise _Transient(stuck) from exc
        except OwnershipLost as lost:
            await bt.abort(lost, inputs=inputs)
            self._lost(lost, msgs)
            raise _Dropped(str(lost)) from lost
        except BatchFailed as failure:
            await bt.abort(failure, inputs=inputs)
            raise
        except _Transient as exc:
            await bt.abort(exc.cause, inputs=inputs)
            raise
        except PulsarError as exc:
            # A broker-side failure before any ack: nothing was acknowledged, so retry the batch.
            await bt.abort(exc, inputs=inputs)
            raise _Transient(exc) from exc
        await self.commit_slots.acquire()
        task = asyncio.get_running_loop().create_task(
            self._finish(bt, msgs, inputs, counts, generation, fresh, duplicates, first_outputs)
        )
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _checkpoint(self, t: AsyncTransaction) -> Any:
        """When one is due, send the guard's checkpoint in ``t`` (returns the receipt to await)."""
        c = self.config
        if self._checkpoints is None or self.guard is None or time.monotonic() < self._next_checkpoint:
            return None
        rung = self.guard.rung(now_ms())
        if rung is None:
            return None
        self._next_checkpoint = time.monotonic() + c.guard_checkpoint_s
        ladder = self.guard.add_rung(rung)
        data = encode_checkpoint(c.job, self.ledger_topic, str(t.id), ladder, now_ms())
        return asyncio.ensure_future(self._checkpoints.send(data, txn=t))

    async def _transform(self, msgs: list[Message]) -> list[tuple[Message, list[Output]]]:
        c = self.config
        budget = [c.max_output_bytes_per_batch]  # bytes left for the rest of the batch
        encode = None if c.output_schema is None else c.output_schema.encode
        if c.input_schema is not None and self._consumer is not None:
            for m in msgs:  # the definitions the inputs were written with, so value() decodes by them
                await self._consumer.learn_writer_schema(m)

        one_allowed = c.max_outputs_per_input >= 1

        def bounded(m: Message, result: Any) -> tuple[Message, list[Output]]:
            if type(result) is bytes and one_allowed and len(result) <= budget[0]:
                # The common case, without normalise's checks: one output of bytes within the budget.
                budget[0] -= len(result)
                return m, [Output(result)]
            outs = normalise(result, max_outputs=c.max_outputs_per_input, max_bytes=max(budget[0], 0),
                             encode=encode)
            budget[0] -= sum(output_size(o) for o in outs)
            return m, outs

        if self._async_handler:
            out = []
            for m in msgs:
                try:
                    out.append(bounded(m, await self.handler(m)))
                except Exception as exc:  # the handler's failure fails the batch
                    raise BatchFailed(exc, m) from exc
            return out

        def run_all() -> list[tuple[Message, list[Output]]]:
            res = []
            for m in msgs:
                try:
                    res.append(bounded(m, self.handler(m)))
                except Exception as exc:
                    raise BatchFailed(exc, m) from exc
            return res

        return await asyncio.get_running_loop().run_in_executor(None, run_all)

    async def _produce(self, outputs: list[tuple[Message, list[Output]]], t: AsyncTransaction,
                       first: dict[str, Any] | None = None) -> dict[str, int]:
        """Send the outputs in ``t``; the count per topic. ``first`` gets each partition's first output id.

        Each topic's outputs go in input order through one :meth:`~txn.AsyncProducer.send_many`
        (a future per batch, not one per message)."""
        default = self.output
        topics = list(dict.fromkeys(o.topic or default for _, outs in outputs for o in outs))  # in order
        counts = dict.fromkeys(topics, 0)
        current: list[Message | None] = [None]  # the input whose outputs are being queued

        def of(topic: str) -> Iterator[tuple[Any, dict[str, str] | None, str | None]]:
            n = 0
            every = len(topics) == 1
            for m, outs in outputs:
                current[0] = m
                for o in outs:
                    if every or (o.topic or default) == topic:
                        n += 1
                        yield o.content, o.properties, o.partition_key
            counts[topic] = n

        sent: list[asyncio.Future[Any]] = []
        for topic in topics:
            try:
                p = await self._producer(topic)
                sent += await p.send_many(of(topic), t, encoded=True)
            except _PERMANENT_SEND_ERRORS as exc:
                raise BatchFailed(exc, current[0]) from exc
        for p in self._producers.values():
            p.flush_now()
        for f in sent:
            try:
                mid = await f
            except _PERMANENT_SEND_ERRORS as exc:  # the broker refused a batch of outputs
                raise BatchFailed(exc, None) from exc
            if first is not None and getattr(mid, "topic", ""):
                prev = first.get(mid.topic)
                if prev is None or mid < prev:
                    first[mid.topic] = mid
        return counts

    async def _finish(
        self,
        bt: BatchTxn,
        msgs: list[Message],
        inputs: dict[str, list[str]],
        counts: dict[str, int],
        generation: int,
        fresh: list[Message],
        duplicates: dict[str, list[str]],
        first_outputs: dict[str, Any] | None = None,
    ) -> None:
        c = self.config
        t, batch_id = bt.t, bt.batch_id
        t0 = time.monotonic()
        ack: asyncio.Future[Any] | None = None
        # Past its timeout the broker has aborted the transaction and nothing of it can commit:
        # a commit stage still waiting then (a reply lost in a broker restart, a reconnect that
        # never ends) is given up, and its inputs are handed back.
        limit_s = max(0.0, t.opened_at + c.txn_timeout_ms / 1000 + COMMIT_GRACE_S - time.monotonic())
        try:
            assert self._consumer is not None and self._ledger is not None
            ack = asyncio.ensure_future(self._consumer.acknowledge_many(msgs, t))
            async with asyncio.timeout(limit_s):
                receipt = await bt.write(Kind.COMMITTED, inputs=inputs, outputs=counts, duplicates=duplicates,
                                         output_starts=output_starts(first_outputs))
                self._ledger.flush_now()
                checkpoint = self._checkpoint(t)
                try:
                    record_id = await receipt
                finally:
                    if checkpoint is not None:
                        await _checkpoint_sent(checkpoint)
                await ack
                if self._generation() != generation:
                    # A producer reconnected during this transaction and may have re-sent a frame
                    # the broker had already stored; without broker dedup that could duplicate an
                    # output inside the transaction. Abort: the inputs come back and are redone.
                    raise TransactionError("a producer reconnected during the transaction; aborting to stay "
                                           "exactly-once", txn_id=t.id)
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
            if self.audit is not None:
                starts = dict(first_outputs or {})
                if getattr(record_id, "topic", ""):
                    starts[record_id.topic] = record_id  # the transaction's first message on the ledger
                self.audit.committed_here(batch_id, str(t.id), starts)
            if self.on_commit is not None:
                self.on_commit(batch_id, t.id, len(fresh), counts, commit_ms)
            if self.metrics is not None:
                self.metrics.observe_commit(commit_ms)
            if c.ordering is not None:
                await c.ordering.committed(msgs)
        except (PulsarError, TransactionError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                exc = TransactionError(f"the commit stage outlived the transaction's timeout ({c.txn_timeout_ms} ms) "
                                       "and was given up", txn_id=t.id)
                if ack is not None and not ack.done():
                    ack.cancel()  # the broker aborted the transaction: its acknowledgements are void
            self.stats.aborts += 1
            log.warning("batch %s (txn %s) did not commit: %s; its inputs are handed back for redelivery",
                        batch_id, t.id, exc)
            if ack is not None:  # settle the acknowledgements first (their failure is this one's)
                await asyncio.gather(ack, return_exceptions=True)
            await bt.abort(exc, inputs=inputs)
            self.hand_back(msgs)
            if c.ordering is not None and t.state.value == "ABORTED":
                await c.ordering.aborted(msgs, t.id)
        except BaseException as exc:  # a bug: stop the processor rather than lose track
            self.fatal = exc
            raise
        finally:
            self.commit_slots.release()

    async def _redeliver_handed_back(self) -> None:
        """Hand the inputs of failed batches back to the broker, once no commit is in flight.

        A Failover consumer's redelivery rewinds its partition to the first unacknowledged input,
        so commits in flight end first; the guard then syncs before the next batch, in case an
        input handed back had committed after all."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        consumers, self._handback = self._handback, set()
        # A request that crosses a read the broker has in progress can make it skip entries
        # (``TopicConsumer.skipped_after_redeliver``): wait, briefly, until none can be.
        settle_until = time.monotonic() + DISPATCH_SETTLE_S
        while not all(c.dispatch_settled() for c in consumers) and time.monotonic() < settle_until:
            await asyncio.sleep(0.005)
        for consumer in consumers:
            consumer.redeliver_after_abort([], True)
        if self._entries is not None:
            self._entries.drop()
        self._held_over = None
        self.stats.redeliveries += 1
        self._guard_synced = -1

    def _generation(self) -> int:
        ps = list(self._producers.values()) + ([self._ledger] if self._ledger else [])
        return sum(p.reconnect_count() for p in ps)
