"""Stores for :class:`~txn.delivery.dedup.DedupReceiver`: SQLite (stdlib) and PostgreSQL (psycopg 3).

Both keep the same two tables and run the same SQL; the side effect of a message and
its dedup record are written through the store's one connection, in one transaction.

``txn_dedup_senders``: one row per (scope, sender): the low-water mark ``low1..low3``
(NULL until an id was evicted), ``n`` (ids held) and ``last_seen`` (epoch seconds).
``txn_dedup_ids``: the ids held per (scope, sender), primary key (scope, sender, k1, k2, k3).

An id is a tuple of three integers compared lexicographically: ``(sequence_id, 0, 0)`` or
``(ledger_id, entry_id, batch_index)``.

Concurrency: every check-and-record starts by upserting the sender's row, which locks it
until the transaction ends (SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock;
PostgreSQL: ``INSERT ... ON CONFLICT DO UPDATE`` takes the row lock, at READ COMMITTED, so
the next statement sees whatever the previous holder committed). Two receivers on the same
sender are serialised; the ids' primary key backs that up.

The ordering guard (:mod:`.ordering`) keeps its state in the same database:
``txn_order_scopes`` (one row per scope: the next sequence number, locked by every mark),
``txn_order_ids`` (business ids with state ``done``, ``parked`` or ``pending``; at most
``window`` done/parked ids per scope, the oldest evicted first) and ``txn_order_parked``
(messages the dedup receiver parked, with the reason, until the application takes them).
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

Key = tuple[int, int, int]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS txn_dedup_senders (
        scope TEXT NOT NULL,
        sender TEXT NOT NULL,
        low1 BIGINT, low2 BIGINT, low3 BIGINT,
        n BIGINT NOT NULL DEFAULT 0,
        last_seen DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, sender))""",
    """CREATE TABLE IF NOT EXISTS txn_dedup_ids (
        scope TEXT NOT NULL,
        sender TEXT NOT NULL,
        k1 BIGINT NOT NULL, k2 BIGINT NOT NULL, k3 BIGINT NOT NULL,
        PRIMARY KEY (scope, sender, k1, k2, k3))""",
    "CREATE INDEX IF NOT EXISTS txn_dedup_senders_idle ON txn_dedup_senders (scope, last_seen)",
    """CREATE TABLE IF NOT EXISTS txn_order_scopes (
        scope TEXT NOT NULL PRIMARY KEY,
        next_seq BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS txn_order_ids (
        scope TEXT NOT NULL,
        bid TEXT NOT NULL,
        state TEXT NOT NULL,
        seq BIGINT NOT NULL,
        txn TEXT, ref TEXT,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, bid))""",
    "CREATE INDEX IF NOT EXISTS txn_order_ids_seq ON txn_order_ids (scope, seq)",
    """CREATE TABLE IF NOT EXISTS txn_order_parked (
        scope TEXT NOT NULL,
        topic TEXT NOT NULL,
        message_id TEXT NOT NULL,
        bid TEXT,
        reason TEXT NOT NULL,
        payload TEXT NOT NULL,
        properties TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, topic, message_id))""",
)

_ORDER_LOCK = (
    "INSERT INTO txn_order_scopes (scope, next_seq) VALUES (?, 1) "
    "ON CONFLICT (scope) DO UPDATE SET next_seq = txn_order_scopes.next_seq RETURNING next_seq"
)
_ORDER_BUMP = "UPDATE txn_order_scopes SET next_seq = ? WHERE scope = ?"
# A pending mark never overwrites a final one; a final one overwrites anything.
_ORDER_PENDING = (
    "INSERT INTO txn_order_ids (scope, bid, state, seq, txn, ref, at) VALUES (?, ?, 'pending', ?, ?, ?, ?) "
    "ON CONFLICT (scope, bid) DO UPDATE SET seq = excluded.seq, txn = excluded.txn, ref = excluded.ref, "
    "at = excluded.at WHERE txn_order_ids.state = 'pending'"
)
_ORDER_FINAL = (
    "INSERT INTO txn_order_ids (scope, bid, state, seq, txn, ref, at) VALUES (?, ?, ?, ?, NULL, NULL, ?) "
    "ON CONFLICT (scope, bid) DO UPDATE SET state = excluded.state, seq = excluded.seq, txn = NULL, ref = NULL, "
    "at = excluded.at"
)
_ORDER_EVICT = "DELETE FROM txn_order_ids WHERE scope = ? AND state <> 'pending' AND seq <= ?"
_ORDER_CLEAR = "DELETE FROM txn_order_ids WHERE scope = ? AND bid = ? AND state = 'pending' AND txn = ?"
_ORDER_STATE = "SELECT bid, state, txn, ref, at FROM txn_order_ids WHERE scope = ? AND bid IN ({})"
_ORDER_STALE = (
    "SELECT bid, txn, ref, at FROM txn_order_ids WHERE scope = ? AND state = 'pending' AND at < ? "
    "ORDER BY at LIMIT ?"
)
_ORDER_SETTLE_DONE = (
    "UPDATE txn_order_ids SET state = 'done', txn = NULL, ref = NULL WHERE scope = ? AND txn = ? AND state = 'pending'"
)
_ORDER_SETTLE_ABORTED = "DELETE FROM txn_order_ids WHERE scope = ? AND txn = ? AND state = 'pending'"
_ORDER_COUNT = "SELECT state, COUNT(*) FROM txn_order_ids WHERE scope = ? GROUP BY state"
_PARK_INSERT = (
    "INSERT INTO txn_order_parked (scope, topic, message_id, bid, reason, payload, properties, at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope, topic, message_id) DO NOTHING"
)
_PARK_LIST = (
    "SELECT topic, message_id, bid, reason, payload, properties, at FROM txn_order_parked WHERE scope = ? "
    "ORDER BY at, topic, message_id"
)
_PARK_DELETE = "DELETE FROM txn_order_parked WHERE scope = ? AND topic = ? AND message_id = ?"

_UPSERT_SENDER = (
    "INSERT INTO txn_dedup_senders (scope, sender, n, last_seen) VALUES (?, ?, 0, ?) "
    "ON CONFLICT (scope, sender) DO UPDATE SET last_seen = excluded.last_seen "
    "RETURNING low1, low2, low3"
)
_HAS_ID = "SELECT 1 FROM txn_dedup_ids WHERE scope = ? AND sender = ? AND k1 = ? AND k2 = ? AND k3 = ?"
_INSERT_ID = "INSERT INTO txn_dedup_ids (scope, sender, k1, k2, k3) VALUES (?, ?, ?, ?, ?)"
_COUNT_UP = "UPDATE txn_dedup_senders SET n = n + 1 WHERE scope = ? AND sender = ? RETURNING n"
_NTH_ID = (
    "SELECT k1, k2, k3 FROM txn_dedup_ids WHERE scope = ? AND sender = ? "
    "ORDER BY k1, k2, k3 LIMIT 1 OFFSET ?"
)
_EVICT = "DELETE FROM txn_dedup_ids WHERE scope = ? AND sender = ? AND (k1, k2, k3) <= (?, ?, ?)"
_SET_LOW = "UPDATE txn_dedup_senders SET low1 = ?, low2 = ?, low3 = ?, n = n - ? WHERE scope = ? AND sender = ?"
_PURGE_SENDERS = "DELETE FROM txn_dedup_senders WHERE scope = ? AND last_seen < ? RETURNING sender"
_PURGE_IDS = "DELETE FROM txn_dedup_ids WHERE scope = ? AND sender = ?"
_SENDERS = "SELECT sender FROM txn_dedup_senders WHERE scope = ? ORDER BY sender"
_STATE = "SELECT low1, low2, low3, n, last_seen FROM txn_dedup_senders WHERE scope = ? AND sender = ?"
_IDS = "SELECT k1, k2, k3 FROM txn_dedup_ids WHERE scope = ? AND sender = ? ORDER BY k1, k2, k3"


@dataclass(frozen=True)
class OrderState:
    """What a store holds for one business id: ``done``, ``parked`` or ``pending`` (in a
    transaction ``txn`` whose outcome ``ref`` locates; ``at`` is when it was marked, epoch s)."""

    state: str
    txn: str | None = None
    ref: str | None = None
    at: float = 0.0


@dataclass(frozen=True)
class ParkedMessage:
    """A message the dedup receiver parked (out of order), as stored."""

    topic: str
    message_id: str
    business_id: str | None
    reason: str
    payload: bytes
    properties: dict[str, str]
    at: float


@dataclass(frozen=True)
class SenderState:
    """What a store holds for one sender (for inspection)."""

    low: Key | None
    ids: int
    last_seen: float


class DedupStore(ABC):
    """A database holding the dedup records; its :attr:`connection` is also the handler's.

    The receiver calls :meth:`begin`, :meth:`seen`, (the handler,) :meth:`record`, then
    :meth:`commit` or :meth:`rollback`, all on one transaction.
    """

    #: The driver's parameter placeholder, for the handler's own SQL (``?`` or ``%s``).
    placeholder: str = "?"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _exec(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.connection.execute(self._sql(sql), params)

    @abstractmethod
    def begin(self) -> None:
        """Start a transaction."""

    def commit(self) -> None:
        """Commit the transaction."""
        self.connection.commit()

    def rollback(self) -> None:
        """Roll the transaction back."""
        self.connection.rollback()

    @abstractmethod
    def is_key_conflict(self, exc: BaseException) -> bool:
        """True if ``exc`` is a primary-key violation (a concurrent record of the same id)."""

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()

    # ------------------------------------------------------------ in a transaction

    def seen(self, scope: str, sender: str, key: Key, now: float) -> bool:
        """Lock the sender's row (creating it), refresh ``last_seen``; True if ``key`` was seen.

        Seen means: at or below the sender's low-water mark, or among its held ids.
        """
        low = self._exec(_UPSERT_SENDER, (scope, sender, now)).fetchone()
        if low[0] is not None and key <= (low[0], low[1], low[2]):
            return True
        return self._exec(_HAS_ID, (scope, sender, *key)).fetchone() is not None

    def record(self, scope: str, sender: str, key: Key, window: int) -> None:
        """Hold ``key``; beyond ``window`` ids, evict the lowest and raise the low-water mark."""
        self._exec(_INSERT_ID, (scope, sender, *key))
        (n,) = self._exec(_COUNT_UP, (scope, sender)).fetchone()
        if n <= window:
            return
        low = self._exec(_NTH_ID, (scope, sender, n - window - 1)).fetchone()
        evicted = self._exec(_EVICT, (scope, sender, *low)).rowcount
        self._exec(_SET_LOW, (*low, evicted, scope, sender))

    def order_states(self, scope: str, bids: list[str]) -> dict[str, OrderState]:
        """The stored states of ``bids`` (absent: never marked, or evicted)."""
        out: dict[str, OrderState] = {}
        for i in range(0, len(bids), 500):
            chunk = bids[i:i + 500]
            sql = _ORDER_STATE.format(", ".join("?" * len(chunk)))
            for bid, state, txn, ref, at in self._exec(sql, (scope, *chunk)).fetchall():
                out[bid] = OrderState(state, txn, ref, at)
        return out

    def order_mark(self, scope: str, bids: list[str], state: str, window: int, now: float,
                   txn: str | None = None, ref: str | None = None) -> None:
        """Mark ``bids`` ``done``/``parked`` (or ``pending`` in ``txn``); keep ``window`` final ids per scope."""
        if not bids:
            return
        (seq,) = self._exec(_ORDER_LOCK, (scope,)).fetchone()
        for bid in bids:
            if state == "pending":
                self._exec(_ORDER_PENDING, (scope, bid, seq, txn, ref, now))
            else:
                self._exec(_ORDER_FINAL, (scope, bid, state, seq, now))
            seq += 1
        self._exec(_ORDER_BUMP, (seq, scope))
        if state != "pending":
            self._exec(_ORDER_EVICT, (scope, seq - 1 - window))

    def order_clear_pending(self, scope: str, bids: list[str], txn: str) -> None:
        """Drop the pending marks ``txn`` left on ``bids`` (it aborted); final marks stay."""
        for bid in bids:
            self._exec(_ORDER_CLEAR, (scope, bid, txn))

    def order_stale_pending(self, scope: str, before: float, limit: int) -> dict[str, OrderState]:
        """Pending marks made before ``before`` (epoch s), oldest first, at most ``limit``."""
        rows = self._exec(_ORDER_STALE, (scope, before, limit)).fetchall()
        return {bid: OrderState("pending", txn, ref, at) for bid, txn, ref, at in rows}

    def order_settle(self, scope: str, txn: str, committed: bool) -> None:
        """Turn every pending mark of ``txn`` into done (it committed) or drop them (it aborted)."""
        self._exec(_ORDER_SETTLE_DONE if committed else _ORDER_SETTLE_ABORTED, (scope, txn))

    def order_park(self, scope: str, topic: str, message_id: str, bid: str | None, reason: str,
                   payload: bytes, properties: dict[str, str], now: float) -> None:
        """Store a parked message (once per topic and message id)."""
        self._exec(_PARK_INSERT, (scope, topic, message_id, bid, reason, base64.b64encode(payload).decode(),
                                  json.dumps(properties, sort_keys=True), now))

    # ------------------------------------------------------- own transactions

    def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a transaction of its own: committed if it returns, rolled back if it raises."""
        self.begin()
        try:
            out = fn(*args)
            self.commit()
        except BaseException:
            self.rollback()
            raise
        return out

    def order_counts(self, scope: str) -> dict[str, int]:
        """How many business ids of ``scope`` are stored, per state."""
        return {r[0]: int(r[1]) for r in self._read(_ORDER_COUNT, (scope,))}

    def parked_messages(self, scope: str) -> list[ParkedMessage]:
        """The messages parked under ``scope``, oldest first."""
        return [ParkedMessage(t, m, b, r, base64.b64decode(p), json.loads(pr), at)
                for t, m, b, r, p, pr, at in self._read(_PARK_LIST, (scope,))]

    def drop_parked(self, scope: str, topic: str, message_id: str) -> bool:
        """Delete one parked message (after the application dealt with it); True if it was there."""
        return self.run(lambda: self._exec(_PARK_DELETE, (scope, topic, message_id)).rowcount > 0)

    def purge_idle(self, scope: str, idle_before: float) -> list[str]:
        """Forget every sender of ``scope`` last seen before ``idle_before``; returns them."""
        self.begin()
        try:
            senders = [r[0] for r in self._exec(_PURGE_SENDERS, (scope, idle_before)).fetchall()]
            for s in senders:
                self._exec(_PURGE_IDS, (scope, s))
            self.commit()
        except BaseException:
            self.rollback()
            raise
        return sorted(senders)

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        self.begin()
        try:
            return [tuple(r) for r in self._exec(sql, params).fetchall()]
        finally:
            self.rollback()

    def senders(self, scope: str) -> list[str]:
        """Senders the store holds state for."""
        return [r[0] for r in self._read(_SENDERS, (scope,))]

    def sender_state(self, scope: str, sender: str) -> SenderState | None:
        """The sender's low-water mark, id count and last-seen time, or None."""
        rows = self._read(_STATE, (scope, sender))
        if not rows:
            return None
        l1, l2, l3, n, last = rows[0]
        return SenderState(None if l1 is None else (l1, l2, l3), n, last)

    def ids(self, scope: str, sender: str) -> list[Key]:
        """The ids held for the sender, ascending."""
        return [(a, b, c) for a, b, c in self._read(_IDS, (scope, sender))]


class SqliteDedupStore(DedupStore):
    """SQLite file (WAL journal, ``synchronous=FULL``: a commit is on disk before the ack)."""

    placeholder = "?"

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 30.0) -> None:
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        super().__init__(conn)
        if str(path) != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        self.begin()
        for ddl in _SCHEMA:
            conn.execute(ddl)
        self.commit()

    def begin(self) -> None:
        self.connection.execute("BEGIN IMMEDIATE")

    def is_key_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)


class PostgresDedupStore(DedupStore):
    """PostgreSQL through psycopg 3, READ COMMITTED, one connection."""

    placeholder = "%s"

    def __init__(self, url: str, connect_timeout_s: int = 10) -> None:
        import psycopg

        self._psycopg = psycopg
        conn = psycopg.connect(url, autocommit=False, connect_timeout=connect_timeout_s)
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        super().__init__(conn)
        # Serialise concurrent CREATE ... IF NOT EXISTS (it races on the catalog).
        conn.execute("SELECT pg_advisory_xact_lock(7461236012)")
        for ddl in _SCHEMA:
            conn.execute(ddl)
        conn.commit()

    def begin(self) -> None:
        pass  # psycopg opens a transaction at the first statement

    def is_key_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, self._psycopg.errors.UniqueViolation)


def open_store(target: str | os.PathLike[str]) -> DedupStore:
    """Open a store: ``postgresql://...`` (or ``postgres://``) is PostgreSQL; anything else SQLite:
    a path, ``:memory:``, or ``sqlite:///relative.db`` / ``sqlite:////absolute.db`` (SQLAlchemy style).
    """
    t = os.fspath(target)
    if t.startswith(("postgresql://", "postgres://")):
        return PostgresDedupStore(t)
    if t.startswith("sqlite://"):
        t = t[len("sqlite:///"):] if t.startswith("sqlite:///") else ":memory:"
    return SqliteDedupStore(t)


__all__ = [
    "DedupStore", "Key", "OrderState", "ParkedMessage", "PostgresDedupStore", "SenderState", "SqliteDedupStore",
    "open_store",
]
