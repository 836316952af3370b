"""Committing again the batches the broker rolled back after their commit (see ``commit_audit``).

Beside the batch loop, :meth:`Redo._audit_watch` notices reconnects of the coordinator and of
the producers (a broker restart or a topic move) and tells the audit, which keeps the COMMITTED
records the guard read just before; it also delivers this instance's own recent commits to any
partition that still holds them open. Between batches, :meth:`Redo._audit_tick` checks the
records that are due. Once their check is due, a record no
longer readable is a batch the broker rolled back after its commit: its inputs stay acknowledged,
so they would never come again. :meth:`Redo._redo` takes the batch's input partitions over if
this instance does not own them (their owner may have died, or started after the record vanished
and so never read it; the take-over waits until the previous owner's transactions are resolved,
then the ledger is read again for a redo committed meanwhile), reads those inputs again by
message id, runs the handler, and commits the outputs with a ``COMMITTED`` record of batch
``<batch>+redo``, in a new transaction that carries the partitions' fence markers and no
acknowledgement. Inputs not yet below the subscription's mark-delete position are left alone
(they may still come again), and a batch another instance already redid (its ``+redo`` record
is on the ledger) is not redone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...errors import CorruptMessage, OwnershipLost, PulsarError, Timeout
from ...message import Message, MessageId
from ..batch_txn import BatchScope
from ..commit_audit import (
    REDO_SUFFIX,
    CommitAudit,
    OwnCommit,
    SeenCommit,
    close_quietly,
    output_starts,
    position,
)
from ..fencing import PartitionFences
from ..guard_checkpoint import mark_deletes
from ..ledger import Kind
from ..ledger_guard import ID_PATTERN
from .config import ProcessorConfig, ProcessorStats
from .failures import BatchFailed

log = logging.getLogger("txn.processor")

#: Records a check handles at the start of an instance (it cannot know whether a restart came just before).
START_CHECK_LIMIT = 10_000
#: The start's check covers what the guard read by its first sync, or by this many seconds (an idle instance).
START_EXPOSE_S = 15.0
#: Batches whose outputs a check reads again: those committed in this many seconds before the
#: reconnect, at most this many.
OUTPUT_CHECK_WINDOW_S = 20.0
OUTPUT_CHECK_LIMIT = 200


class Redo:
    """Part of :class:`~txn.delivery.processor.AsyncProcessor`: the commit audit's ticks and redos."""

    client: Any
    config: ProcessorConfig
    stats: ProcessorStats
    audit: CommitAudit | None
    fences: PartitionFences | None
    batches: BatchScope
    _consumer: Any
    _ledger: Any
    _producers: dict[str, Any]
    _links_seen: int | None
    _guard_synced: int
    _start_exposed: bool = False
    _started_at: float = 0.0

    def _links(self) -> int:
        """Reconnects seen so far: the coordinator's and every producer's."""
        ps = list(self._producers.values()) + ([self._ledger] if self._ledger is not None else [])
        return self.client.transaction_coordinator.reconnects + sum(p.reconnect_count() for p in ps)

    def _notice_reconnects(self, audit: CommitAudit) -> None:
        """Tell the audit of a start (once the guard has caught up) or of reconnects since the last call."""
        links = self._links()
        now = time.monotonic()
        if self._links_seen is None:
            self._started_at = now
        synced = isinstance(self._guard_synced, int) and self._guard_synced >= 0
        if not self._start_exposed and (synced or now - self._started_at >= START_EXPOSE_S):
            # A start may follow a broker restart this instance did not see: check what the guard
            # read, once it has read the ledger up to now (its first sync), or after a while.
            self._start_exposed = True
            n = audit.expose(limit=START_CHECK_LIMIT)
            if n:
                log.info("commit audit: %d recent COMMITTED record(s) to check in %.0fs", n, audit.settle_s)
        elif self._links_seen is not None and links != self._links_seen:
            n = audit.expose()
            if n:
                log.info("commit audit: a broker connection came back; %d COMMITTED record(s) from the %.0fs before "
                         "are checked again in %.0fs", n, audit.keep_s, audit.settle_s)
        self._links_seen = links

    async def _audit_watch(self, interval_s: float = 0.5) -> None:
        """Beside the batch loop (which can wait for minutes on a ledger held by an open
        transaction): notice reconnects, and deliver this instance's own commits to partitions
        still holding them open. Runs until cancelled."""
        audit = self.audit
        if audit is None:
            return
        while True:
            try:
                self._notice_reconnects(audit)
                own = audit.due_own()
                if own:
                    await self._unstick(own)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the watch must outlive a surprise; the check comes again
                log.exception("commit audit: watch failed; going on")
            await asyncio.sleep(interval_s)

    async def _audit_tick(self) -> None:
        """Between batches: check the records that are due, and redo what the broker rolled back."""
        audit = self.audit
        if audit is None:
            return
        if self._links_seen is None:
            self._notice_reconnects(audit)
        due = audit.due()
        if not due:
            return
        try:
            result = await audit.check(due)
        except PulsarError as exc:
            log.warning("commit audit: ledger not readable (%s); checking again in 10s", exc)
            audit.retry_later(due, 10.0)
            return
        if result.unreached:
            audit.retry_later(result.unreached, 10.0)
        gone = {r.pos for r in result.vanished} | {r.pos for r in result.unreached}
        present = [r for r in due if r.pos not in gone]
        await self._unstick(present)
        await self._check_outputs([r for r in present if r.pos not in audit.handled_outputs
                                   and r.batch_id not in result.redone and not r.batch_id.endswith(REDO_SUFFIX)])
        for rec in result.vanished:
            audit.handled.add(rec.pos)
            if rec.batch_id in result.redone:
                log.info("commit audit: batch %s was rolled back by the broker and already committed again",
                         rec.batch_id)
                continue
            self.stats.vanished += 1
            log.error("commit audit: batch %s (txn %s) committed, but the broker rolled it back since (its COMMITTED "
                      "record is gone; apache/pulsar#20150); committing its outputs again", rec.batch_id, rec.txn_id)
            if not await self._redo(rec):
                audit.handled.discard(rec.pos)
                audit.retry_later([rec], 10.0)

    async def _unstick(self, committed: list[SeenCommit] | list[OwnCommit]) -> None:
        """Batches known to be committed (records still on the ledger after the settle time, or
        this instance's own commits): deliver their commit to any partition still holding it open
        (``CommitAudit.unstick``), whoever committed them; partitions held by another transaction
        are checked again later."""
        audit = self.audit
        assert audit is not None
        try:
            held, freed = await audit.unstick(committed)
            self.stats.unstuck += freed
        except (PulsarError, TimeoutError) as exc:
            log.warning("commit audit: partitions not checked (%s); checking again in 10s", exc)
            held = list(committed)
        if not held:
            return
        log.info("commit audit: %d committed batch(es) are behind a transaction still open on a partition they "
                 "wrote to; checking again in 10s", len(held))
        records = [r for r in held if isinstance(r, SeenCommit)]
        if records:
            audit.retry_later(records, 10.0)
        own = [c for c in held if isinstance(c, OwnCommit)]
        if own:
            audit.retry_own_later(own, 10.0)

    async def _check_outputs(self, committed: list[SeenCommit]) -> None:
        """Committed batches (records still on the ledger) whose outputs the broker aborted on a
        partition (``CommitAudit.vanished_outputs``): send those outputs again."""
        audit = self.audit
        assert audit is not None
        # A commit goes undelivered while a restart unloads its partitions: only the batches
        # committed just before the reconnect (the newest, at most OUTPUT_CHECK_LIMIT) are read.
        recent = time.monotonic() - audit.settle_s - OUTPUT_CHECK_WINDOW_S
        committed = sorted((r for r in committed if r.at >= recent or r.attempts), key=lambda r: r.pos)
        committed = committed[-OUTPUT_CHECK_LIMIT:]
        if not committed:
            return
        try:
            found, unreached = await audit.vanished_outputs(committed)
        except (PulsarError, TimeoutError) as exc:
            log.warning("commit audit: outputs not checked (%s); checking again in 10s", exc)
            audit.retry_later(committed, 10.0)
            return
        if unreached:
            log.info("commit audit: the outputs of %d committed batch(es) were not reached; checking again in 10s",
                     len(unreached))
            audit.retry_later(unreached, 10.0)
        for rec, topics in found:
            audit.handled_outputs.add(rec.pos)
            self.stats.vanished += 1
            log.error("commit audit: batch %s (txn %s) committed, but its outputs on %s are gone (the broker aborted "
                      "them there after its coordinator failed to deliver the commit); sending them again",
                      rec.batch_id, rec.txn_id, ", ".join(sorted(topics)))
            if not await self._redo(rec, only=set(topics)):
                audit.handled_outputs.discard(rec.pos)
                audit.retry_later([rec], 10.0)

    async def _redo(self, rec: SeenCommit, only: set[str] | None = None) -> bool:
        """Commit again the outputs of a rolled-back batch (only those bound for the partitions in
        ``only``, if given: the batch's record stayed); False to try later."""
        parts = sorted(rec.inputs)
        if self.fences is not None and self.fences.missing(set(parts)):
            # The owner may have died, or started after the record vanished (then it never read it):
            # take the partitions over. Acquiring waits until every transaction of the previous
            # owner is resolved, so a redo another instance committed meanwhile is on the ledger now.
            for p in self.fences.missing(set(parts)):
                log.warning("commit audit: taking %s over to commit batch %s again", p, rec.batch_id)
                try:
                    await self.fences.acquire(p)
                except PulsarError as exc:
                    log.warning("commit audit: %s not taken over (%s); trying later", p, exc)
                    return False
                self.stats.takeovers += 1
            assert self.audit is not None
            try:
                again = await self.audit.check([rec])
            except PulsarError as exc:
                log.warning("commit audit: ledger not readable (%s); trying later", exc)
                return False
            if again.unreached:
                return False
            if rec.batch_id in again.redone or (only is None and not again.vanished):
                log.info("commit audit: batch %s was committed again by another instance", rec.batch_id)
                return True
        try:
            marks = await mark_deletes(self._consumer)
        except (PulsarError, TimeoutError) as exc:
            log.warning("commit audit: mark-delete positions not read (%s)", exc)
            return False
        wanted: dict[str, set[tuple[int, int, int]]] = {}
        for p in parts:
            mark = marks.get(p)
            ids = {(int(a), int(b), int(c)) for a, b, c in ID_PATTERN.findall("\n".join(rec.inputs[p]))}
            if mark is None or any((i[0], i[1]) > mark for i in ids):
                log.info("commit audit: inputs of batch %s on %s are not all acknowledged yet; checking again later",
                         rec.batch_id, p)
                return False
            wanted[p] = ids
        msgs: list[Message] = []
        for p, ids in wanted.items():
            got = await self._read_by_id(p, ids)
            gone = ids - {position(m.message_id()) for m in got}
            if gone:
                log.error("commit audit: %d input(s) of batch %s on %s are no longer stored (retention); their outputs "
                          "are lost: %s", len(gone), rec.batch_id, p, sorted(gone)[:10])
            msgs += got
        if not msgs:
            return True
        return await self._commit_again(rec, sorted(parts), msgs, only)

    async def _bound_for(self, outputs: list[tuple[Message, list[Any]]],
                         partitions: set[str]) -> tuple[list[tuple[Message, list[Any]]], int]:
        """The outputs that go to ``partitions``, and how many go to a partition not fixed in advance."""
        kept: list[tuple[Message, list[Any]]] = []
        unknown = 0
        for m, outs in outputs:
            mine = []
            for o in outs:
                producer = await self._producer(o.topic or self.config.output)  # type: ignore[attr-defined]
                dest = producer.partition_of(o.partition_key)
                if dest is None:
                    unknown += 1
                elif dest in partitions:
                    mine.append(o)
            kept.append((m, mine))
        return kept, unknown

    async def _read_by_id(self, topic: str, ids: set[tuple[int, int, int]]) -> list[Message]:
        """The messages of ``topic`` with these (ledger, entry, batch index) positions, while stored."""
        first, last = min(ids), max(ids)
        start = MessageId(ledger_id=first[0], entry_id=first[1])
        # The input schema, so that the handler's ``value()`` decodes as in the original batch.
        reader = await self.client.create_reader(topic, start, start_message_id_inclusive=True,
                                                 schema=self.config.input_schema)  # type: ignore[attr-defined]
        found: list[Message] = []
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline and len(found) < len(ids):
                try:
                    m = await reader.read_next(timeout_millis=1000)
                except CorruptMessage:
                    continue
                except Timeout:
                    if not await reader.has_message_available():
                        break
                    continue
                pos = position(m.message_id())
                if pos in ids:
                    found.append(m)
                if (pos[0], pos[1]) > (last[0], last[1]):
                    break
        finally:
            await close_quietly(reader)
        return found

    async def _commit_again(self, rec: SeenCommit, parts: list[str], msgs: list[Message],
                            only: set[str] | None = None) -> bool:
        from .records import _ids

        inputs = _ids(msgs)
        try:
            outputs = await self._transform(msgs)  # type: ignore[attr-defined]
        except BatchFailed as failure:
            log.error("commit audit: the handler fails on the inputs of batch %s (%s); not committed again",
                      rec.batch_id, failure)
            return True
        if only is not None:
            outputs, unknown = await self._bound_for(outputs, only)
            if unknown:
                log.error("commit audit: %d output(s) of batch %s have no key and go to a topic of several "
                          "partitions: which of them went to %s is not known; they are not sent again", unknown,
                          rec.batch_id, ", ".join(sorted(only)))
            inputs = {}  # the batch's record, which stayed, names them
        bt = await self.batches.open(rec.batch_id + REDO_SUFFIX)
        bt.started_later(inputs=inputs)
        generation = self._generation()  # type: ignore[attr-defined]
        try:
            await bt.mark(parts)
            first: dict[str, MessageId] = {}
            counts = await self._produce(outputs, bt.t, first)  # type: ignore[attr-defined]
            receipt = await bt.write(Kind.COMMITTED, inputs=inputs, outputs=counts, duplicates={},
                                     output_starts=output_starts(first))
            self._ledger.flush_now()
            await receipt
            if self._generation() != generation:  # type: ignore[attr-defined]
                raise PulsarError("a producer reconnected during the transaction")
            await bt.commit()
        except OwnershipLost as lost:
            await bt.abort(lost, inputs=inputs)
            log.warning("commit audit: batch %s not committed again: %s (its new owner checks it)", rec.batch_id, lost)
            return True
        except (PulsarError, BatchFailed) as exc:
            await bt.abort(exc, inputs=inputs)
            log.warning("commit audit: committing batch %s again failed (%s); trying later", rec.batch_id, exc)
            return False
        self.stats.redone += 1
        self.stats.outputs += sum(counts.values())
        log.warning("commit audit: batch %s committed again as %s%s (%d inputs, %d outputs)", rec.batch_id,
                    rec.batch_id, REDO_SUFFIX, len(msgs), sum(counts.values()))
        return True

