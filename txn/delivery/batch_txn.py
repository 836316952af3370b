"""The batch transaction: the one owner of what makes a batch exactly-once.

Every writer that acknowledges inputs or commits outputs as a batch (the processor, its parking,
the Spark runtime's driver, replay) goes through a :class:`BatchScope` (one per job instance) and
the :class:`BatchTxn` it opens. Between them they hold:

- opening the transaction (or adopting a pre-opened one);
- the partition fences (:mod:`.fencing`): :meth:`BatchTxn.mark` puts the proof of ownership of
  each input partition into the transaction before any acknowledgement;
- the ledger records: ``STARTED`` and ``ABORTED`` outside the transaction (informative: a failure
  to write one is logged, never raised), ``COMMITTED``, ``PARKED`` and ``REPLAYED`` inside it
  (:meth:`BatchTxn.write`), all built in one place (:meth:`BatchScope.record`);
- abort-if-open with its ``ABORTED`` record (:meth:`BatchTxn.abort`).

What happens to the inputs of a failed batch stays with the caller, since it depends on how the
inputs are held: the processor hands them back to the broker for redelivery, the Spark runtime
plans again from its subscription's cursor, replay leaves them on the parking topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..errors import PulsarError
from ..message import MessageId
from ..producer import AsyncProducer
from ..transaction import AsyncTransaction
from .fencing import PartitionFences
from .ledger import Kind, LedgerRecord, RecordConfig, now_ms

log = logging.getLogger("txn.batch")


class BatchScope:
    """What every batch transaction of one job instance shares: client, job, ledger producer,
    fences, transaction timeout, and what its records say about the job (``record_config``)."""

    def __init__(self, client: Any, job: str, ledger: AsyncProducer, txn_timeout_ms: int, *,
                 fences: PartitionFences | None = None,
                 record_config: Callable[[], RecordConfig] | None = None) -> None:
        self.client = client
        self.job = job
        self.ledger = ledger
        self.txn_timeout_ms = txn_timeout_ms
        self.fences = fences
        self.record_config = record_config or RecordConfig
        #: Informative records queued without waiting (``write_later``), awaited by :meth:`drain`.
        self._pending: set[asyncio.Task[None]] = set()

    async def new_transaction(self) -> AsyncTransaction:
        """A transaction with the job's timeout, to open ahead of its batch and hand to :meth:`open`."""
        return await self.client.new_transaction(timeout_millis=self.txn_timeout_ms)

    async def open(self, batch_id: str, attempt: int = 1, *, txn: AsyncTransaction | None = None,
                   started_at_ms: int | None = None) -> BatchTxn:
        """Open the batch's transaction (or adopt ``txn``, opened ahead of time)."""
        t = txn if txn is not None else await self.new_transaction()
        return BatchTxn(self, t, batch_id, attempt, started_at_ms if started_at_ms is not None else now_ms())

    def record(self, kind: Kind, batch_id: str, *, txn_id: str | None = None, attempt: int = 1,
               started_at_ms: int | None = None, with_config: bool = False, **fields: Any) -> LedgerRecord:
        """A ledger record of this job. ``with_config`` adds :attr:`record_config` (what the job runs);
        a record that ends something (every kind but STARTED) gets ``ended_at_ms`` now unless given."""
        if with_config and "config" not in fields:
            fields["config"] = self.record_config()
        if kind is not Kind.STARTED:
            fields.setdefault("ended_at_ms", now_ms())
        return LedgerRecord(kind=kind, job=self.job, batch_id=batch_id, txn_id=txn_id, attempt=attempt,
                            started_at_ms=started_at_ms if started_at_ms is not None else now_ms(), **fields)

    async def write_outside(self, rec: LedgerRecord) -> MessageId | None:
        """Write an informative record (STARTED, ABORTED) outside any transaction; a failure is
        logged and returns None: the batch's outcome never depends on these."""
        try:
            return await self.ledger.send_now(rec.to_json(), partition_key=rec.batch_id)
        except PulsarError as exc:
            log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)
            return None

    def write_later(self, rec: LedgerRecord) -> None:
        """:meth:`write_outside` without waiting (the batch goes on meanwhile)."""
        task = asyncio.get_running_loop().create_task(self._write_quietly(rec))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write_quietly(self, rec: LedgerRecord) -> None:
        await self.write_outside(rec)

    async def drain(self) -> None:
        """Wait for the records queued by :meth:`write_later`."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class BatchTxn:
    """One batch's transaction (``t``) with its id, attempt and start time; see the module docs."""

    def __init__(self, scope: BatchScope, t: AsyncTransaction, batch_id: str, attempt: int,
                 started_at_ms: int) -> None:
        self.scope = scope
        self.t = t
        self.batch_id = batch_id
        self.attempt = attempt
        self.started_at_ms = started_at_ms

    @property
    def id(self) -> Any:
        return self.t.id

    def record(self, kind: Kind, *, batch_id: str | None = None, **fields: Any) -> LedgerRecord:
        """A record of this batch and transaction (``batch_id`` overrides the batch's, e.g. a
        parked message's root batch)."""
        fields.setdefault("attempt", self.attempt)
        fields.setdefault("started_at_ms", self.started_at_ms)
        return self.scope.record(kind, batch_id or self.batch_id, txn_id=str(self.t.id), **fields)

    def started_later(self, **fields: Any) -> None:
        """Queue this batch's STARTED record (outside the transaction) without waiting."""
        self.scope.write_later(self.record(Kind.STARTED, **fields))

    async def started(self, **fields: Any) -> MessageId | None:
        """Write this batch's STARTED record (outside the transaction) and wait for its receipt."""
        return await self.scope.write_outside(self.record(Kind.STARTED, **fields))

    async def mark(self, partitions: list[str] | set[str]) -> None:
        """The fence markers of ``partitions`` (no-op without fences); before any acknowledgement."""
        if self.scope.fences is not None:
            await self.scope.fences.mark(self.t, partitions)

    def fence_topics(self, partitions: list[str] | set[str]) -> list[str]:
        """The fence topics :meth:`mark` writes to (to register them in the transaction early)."""
        return self.scope.fences.fence_topics(partitions) if self.scope.fences is not None else []

    async def write(self, kind: Kind, **fields: Any) -> asyncio.Future[MessageId]:
        """Queue a committing record (COMMITTED, PARKED, REPLAYED) inside the transaction; returns its
        receipt. It becomes visible exactly when the transaction commits."""
        rec = self.record(kind, **fields)
        return await self.scope.ledger.send_async(rec.to_json(), partition_key=rec.batch_id, txn=self.t)

    async def commit(self) -> None:
        await self.t.commit()

    async def abort(self, error: BaseException | str, **fields: Any) -> None:
        """Abort if still open (a failed abort is left to the broker's timeout) and write ABORTED."""
        if self.t.state.value in ("OPEN", "TIMED_OUT"):  # timed out: make sure, and hand its acks back
            try:
                await self.t.abort()
            except PulsarError as exc:
                log.warning("abort of %s failed (the broker's timeout aborts it): %s", self.t.id, exc)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        await self.scope.write_outside(self.record(Kind.ABORTED, error=text, **fields))
