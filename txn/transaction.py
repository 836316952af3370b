"""``Transaction``: state machine, timeout, registration of partitions and subscriptions."""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum
from typing import Any

from .coordinator import CoordinatorClient
from .errors import (
    InvalidTxnStatus,
    PulsarError,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
)
from .message import ConsumerRef, MessageId, TxnID

log = logging.getLogger("txn.transaction")


class TxnState(Enum):
    """Lifecycle of a transaction."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    TIMED_OUT = "TIMED_OUT"
    ERROR = "ERROR"


class AsyncTransaction:
    """An open Pulsar transaction (asyncio). Create it with ``AsyncClient.new_transaction``.

    ``async with txn:`` commits on a clean exit and aborts (then re-raises) on an exception.
    """

    def __init__(self, coordinator: CoordinatorClient, txn_id: TxnID, timeout_ms: int) -> None:
        self._tc = coordinator
        self.id = txn_id
        self.timeout_ms = timeout_ms
        self.state = TxnState.OPEN
        self._opened = time.monotonic()
        self._deadline = self._opened + timeout_ms / 1000.0
        self._partitions: dict[str, asyncio.Future[None]] = {}
        self._subscriptions: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._pending_ops = 0
        self._ops_idle: asyncio.Future[None] | None = None
        self._acked: dict[ConsumerRef, list[MessageId]] = {}
        self._cumulative: set[ConsumerRef] = set()
        self._op_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"Transaction(id={self.id}, state={self.state.value})"

    @property
    def opened_at(self) -> float:
        """When this handle was made, on the :func:`time.monotonic` clock."""
        return self._opened

    def partition_registered(self, topic: str) -> bool:
        """True once ``topic`` (a partition) was added to the transaction on the coordinator."""
        reg = self._partitions.get(topic)
        return reg is not None and reg.done() and reg.exception() is None

    @property
    def expired(self) -> bool:
        """True once the transaction's timeout has passed (the broker aborts it)."""
        return time.monotonic() >= self._deadline

    def check_open(self) -> None:
        """Raise at once unless the transaction can still take operations."""
        if self.state is TxnState.OPEN and self.expired:
            self.state = TxnState.TIMED_OUT
        if self.state is TxnState.TIMED_OUT:
            raise TransactionTimedOut(
                f"transaction timed out after {self.timeout_ms} ms; the broker aborts it", txn_id=self.id
            )
        if self.state is not TxnState.OPEN:
            raise InvalidTxnStatus(
                f"transaction is {self.state.value}, not OPEN; it cannot be used again", txn_id=self.id
            )

    # ------------------------------------------------------------ registration

    async def register_partition(self, topic: str) -> None:
        """Tell the coordinator we produce to ``topic`` (once per partition)."""
        await self.register_many([topic], [])

    async def register_subscription(self, topic: str, subscription: str) -> None:
        """Tell the coordinator we ack on ``topic``/``subscription`` (once per pair)."""
        await self.register_many([], [(topic, subscription)])

    async def register_many(self, partitions: list[str], subscriptions: list[tuple[str, str]]) -> None:
        """Register partitions and subscriptions not registered yet: one request per kind.

        Keys another call is registering right now are awaited, not sent twice.
        """
        self.check_open()
        await asyncio.gather(
            self._register(self._partitions, partitions, lambda ks: self._tc.add_partitions(self.id, ks)),
            self._register(self._subscriptions, subscriptions, lambda ks: self._tc.add_subscriptions(self.id, ks)),
        )

    @staticmethod
    async def _register(table: dict[Any, asyncio.Future[None]], keys: list[Any], call: Any) -> None:
        pending = [table[k] for k in dict.fromkeys(keys) if k in table and not table[k].done()]
        new = [k for k in dict.fromkeys(keys) if k not in table]
        if new:
            loop = asyncio.get_running_loop()
            futs = {k: loop.create_future() for k in new}
            table.update(futs)
            try:
                await call(new)
            except BaseException as exc:
                for k, f in futs.items():
                    table.pop(k, None)
                    f.set_exception(exc)
                    f.exception()  # retrieved: waiters get it re-raised
                raise
            for f in futs.values():
                f.set_result(None)
        if pending:
            await asyncio.gather(*(asyncio.shield(f) for f in pending))

    def add_op(self, fut: asyncio.Future[Any]) -> None:
        """Track a send or ack; commit waits for it and aborts if it failed."""
        self._pending_ops += 1
        fut.add_done_callback(self._op_done)

    def _op_done(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self._op_error = self._op_error or asyncio.CancelledError()
        elif fut.exception() is not None:
            self._op_error = self._op_error or fut.exception()
        self._pending_ops -= 1
        if self._pending_ops == 0 and self._ops_idle is not None and not self._ops_idle.done():
            self._ops_idle.set_result(None)

    async def _wait_ops(self) -> None:
        if self._pending_ops:
            self._ops_idle = asyncio.get_running_loop().create_future()
            await self._ops_idle

    def record_ack(self, consumer: ConsumerRef, ids: list[MessageId], cumulative: bool) -> None:
        """Remember acks so an abort can hand the messages back to the consumer."""
        self._acked.setdefault(consumer, []).extend(ids)
        if cumulative:
            self._cumulative.add(consumer)

    # ------------------------------------------------------------------ ending

    async def commit(self) -> None:
        """Wait for this transaction's sends and acks, then commit it.

        If one of them failed, the transaction is aborted and
        :class:`TransactionError` is raised with that failure as its cause.
        """
        if not (self.state is TxnState.OPEN and self.expired):
            self.check_open()
        # Past the deadline we still ask the broker: it is the authority, and its
        # answer (normally "not found": it aborted the transaction) goes in the error.
        self.state = TxnState.COMMITTING
        await self._wait_ops()
        if self._op_error is not None:
            self.state = TxnState.OPEN
            try:
                await self.abort()
            except PulsarError as exc:
                log.warning("abort after a failed operation of %s failed: %s", self.id, exc)
            raise TransactionError(
                f"an operation in the transaction failed ({self._op_error!r}); it was aborted",
                txn_id=self.id,
            ) from self._op_error
        try:
            await self._tc.end_txn(self.id, commit=True)
        except (TransactionNotFound, InvalidTxnStatus) as exc:
            self.state = TxnState.TIMED_OUT if self.expired else TxnState.ERROR
            if self.expired:
                raise TransactionTimedOut(
                    f"commit failed: the transaction outlived its {self.timeout_ms} ms timeout "
                    f"and was aborted by the broker ({exc.message})",
                    txn_id=self.id,
                    server_error=exc.server_error,
                ) from exc
            raise
        except BaseException:
            self.state = TxnState.ERROR
            raise
        self.state = TxnState.COMMITTED

    async def abort_if_open(self) -> None:
        """Abort if still OPEN (cleanup after a failure); a failed abort is left to the broker's
        timeout, which aborts it anyway. Never raises a :class:`PulsarError`."""
        if self.state is not TxnState.OPEN:
            return
        try:
            await self.abort()
        except PulsarError as exc:
            log.debug("abort of %s failed (%s); the broker's timeout aborts it", self.id, exc)

    async def abort(self) -> None:
        """Abort: nothing produced in it becomes visible, and its acks are undone."""
        if self.state is TxnState.OPEN and self.expired:
            self.state = TxnState.TIMED_OUT
        if self.state is TxnState.TIMED_OUT:
            # The broker already aborted it; make sure, and hand the messages back.
            try:
                await self._tc.end_txn(self.id, commit=False)
            except PulsarError:
                pass
            self._redeliver_acked()
            return
        if self.state is not TxnState.OPEN:
            raise InvalidTxnStatus(f"cannot abort a transaction that is {self.state.value}", txn_id=self.id)
        self.state = TxnState.ABORTING
        await self._wait_ops()
        try:
            await self._tc.end_txn(self.id, commit=False)
        except BaseException:
            self.state = TxnState.ERROR
            raise
        finally:
            self._redeliver_acked()
        self.state = TxnState.ABORTED

    def _redeliver_acked(self) -> None:
        acked, self._acked = self._acked, {}
        for consumer, ids in acked.items():
            try:
                consumer.redeliver_after_abort(ids, consumer in self._cumulative)
            except PulsarError as exc:
                log.debug("redelivery after abort of %s skipped: %s", self.id, exc)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if exc_type is None:
            await self.commit()
        elif self.state in (TxnState.OPEN, TxnState.TIMED_OUT):
            try:
                await self.abort()
            except PulsarError as abort_exc:
                log.warning("abort of %s after %r failed: %s", self.id, exc, abort_exc)
