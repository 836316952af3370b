"""Client side of Pulsar's transaction coordinators (TC): NewTxn, AddPartition/Subscription, EndTxn.

The coordinators are the partitions of the system topic
``persistent://pulsar/system/transaction_coordinator_assign``: partition *i* is
TC *i*, served by whichever broker owns that partition. A transaction id's
``most`` bits are its TC id, so every later request for it goes to that TC.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .connection import Connection, check_error, command, next_request_id
from .errors import ConnectError, CoordinatorNotFound, PulsarError, from_server_error
from .message import TxnID
from .pool import ConnectionPool
from .protocol import pb

log = logging.getLogger("txn.coordinator")
T = pb.BaseCommand
TC_ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
R = TypeVar("R")


class CoordinatorClient:
    """Finds the coordinators and sends them transaction commands, with retries."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._count: int | None = None
        self._conns: dict[int, asyncio.Task[Connection]] = {}
        self._rr = itertools.count()
        self._start_lock = asyncio.Lock()
        self._connected: set[int] = set()
        #: Connections to a coordinator made again after its first (a broker restart or a move).
        self.reconnects = 0

    async def _ensure_started(self) -> int:
        if self._count is not None:
            return self._count
        async with self._start_lock:
            if self._count is None:
                n = await self._pool.partitions(TC_ASSIGN_TOPIC)
                if n <= 0:
                    raise CoordinatorNotFound(
                        "the broker has no transaction coordinators; start it with "
                        "transactionCoordinatorEnabled=true and initialise the coordinator metadata",
                        topic=TC_ASSIGN_TOPIC,
                    )
                self._count = n
        return self._count

    async def _connect_tc(self, tc_id: int) -> Connection:
        topic = f"{TC_ASSIGN_TOPIC}-partition-{tc_id}"
        conn = await self._pool.connection_for(topic)
        rid = next_request_id()
        resp = await conn.request(command(T.TC_CLIENT_CONNECT_REQUEST, request_id=rid, tc_id=tc_id), rid)
        check_error(resp, f"connect to transaction coordinator {tc_id}")
        r = resp.tcClientConnectResponse
        if r.HasField("error"):
            raise from_server_error(
                pb.ServerError.Name(r.error), f"transaction coordinator {tc_id} unavailable: {r.message}"
            )
        if tc_id in self._connected:
            self.reconnects += 1
        self._connected.add(tc_id)
        return conn

    async def _conn(self, tc_id: int) -> Connection:
        task = self._conns.get(tc_id)
        if task is not None and task.done() and (task.exception() is not None or task.result().closed):
            task = None
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect_tc(tc_id))
            self._conns[tc_id] = task
        try:
            return await asyncio.shield(task)
        except BaseException:
            if self._conns.get(tc_id) is task:
                del self._conns[tc_id]
            raise

    async def _call(
        self, tc_id: int, what: str, txn_id: TxnID | None, fn: Callable[[Connection], Awaitable[R]]
    ) -> R:
        async def once() -> R:
            conn = await self._conn(tc_id)
            try:
                return await fn(conn)
            except PulsarError as exc:
                if isinstance(exc, (ConnectError, CoordinatorNotFound)):
                    self._conns.pop(tc_id, None)
                if exc.txn_id is None:
                    exc.txn_id = txn_id
                raise

        return await self._pool.retrying(what, once)

    # ------------------------------------------------------------------ commands

    async def new_txn(self, timeout_ms: int) -> TxnID:
        """Open a transaction on the next coordinator (round-robin), timing out after ``timeout_ms``.

        The only place that fills the wire's ``CommandNewTxn.txn_ttl_seconds``: the protocol kept
        the field's historic name, but the broker reads it in milliseconds (so does Pulsar's Java
        client fill it), so it gets ``timeout_ms`` unconverted.
        """
        n = await self._ensure_started()
        tc_id = next(self._rr) % n

        async def op(conn: Connection) -> TxnID:
            rid = next_request_id()
            # Milliseconds, despite the field's name (see the docstring).
            resp = await conn.request(
                command(T.NEW_TXN, request_id=rid, txn_ttl_seconds=timeout_ms, tc_id=tc_id), rid
            )
            check_error(resp, "new transaction")
            r = resp.newTxnResponse
            if r.HasField("error"):
                raise from_server_error(pb.ServerError.Name(r.error), f"new transaction failed: {r.message}")
            return TxnID(r.txnid_most_bits, r.txnid_least_bits)

        return await self._call(tc_id, "new transaction", None, op)

    async def _txn_command(
        self, txn: TxnID, kind: int, response_field: str, what: str, topic: str | None,
        attempts: list[int] | None = None, **fields: object,
    ) -> None:
        """Send a transaction command to ``txn``'s coordinator and raise the typed error it reports."""

        async def op(conn: Connection) -> None:
            if attempts is not None:
                attempts[0] += 1
            rid = next_request_id()
            cmd = command(kind, request_id=rid, txnid_most_bits=txn.most, txnid_least_bits=txn.least, **fields)
            resp = await conn.request(cmd, rid)
            check_error(resp, what, topic=topic, txn_id=txn)
            r = getattr(resp, response_field)
            if r.HasField("error"):
                raise from_server_error(pb.ServerError.Name(r.error), f"{what} failed: {r.message}", topic=topic,
                                        txn_id=txn)

        await self._call(txn.most, what, txn, op)

    async def add_partitions(self, txn: TxnID, topics: list[str]) -> None:
        """Register produced-to partitions with the transaction."""
        await self._txn_command(txn, T.ADD_PARTITION_TO_TXN, "addPartitionToTxnResponse",
                                "add partition to transaction", ",".join(topics), partitions=topics)

    async def add_subscriptions(self, txn: TxnID, subs: list[tuple[str, str]]) -> None:
        """Register (topic, subscription) pairs whose acks the transaction carries."""
        await self._txn_command(
            txn, T.ADD_SUBSCRIPTION_TO_TXN, "addSubscriptionToTxnResponse", "add subscription to transaction",
            subs[0][0], subscription=[pb.TxnSubscription(topic=t, subscription=s) for t, s in subs],
        )

    async def end_txn(self, txn: TxnID, commit: bool) -> None:
        """Commit or abort. Raises the broker's typed error on failure.

        If a connection drop forced a retry and the retry finds the transaction gone, the
        error says so: the first attempt may have completed.
        """
        verb = "commit" if commit else "abort"
        attempts = [0]
        try:
            await self._txn_command(txn, T.END_TXN, "endTxnResponse", verb, None, attempts,
                                    txn_action=pb.COMMIT if commit else pb.ABORT)
        except PulsarError as exc:
            done = f"but it is in {'COMMITTED' if commit else 'ABORTED'} status"
            if attempts[0] > 1 and exc.server_error == "InvalidTxnStatus" and done in exc.message:
                # The interrupted attempt reached the coordinator (e.g. its broker died after
                # ending the transaction, and the coordinator moved): it reports the state asked for.
                log.info("%s of %s: an interrupted earlier attempt completed it", verb, txn)
                return
            if attempts[0] > 1 and exc.server_error == "TransactionNotFound":
                exc.message += " (an earlier attempt was interrupted and may have completed)"
                exc.args = (exc.render(),)
            raise
