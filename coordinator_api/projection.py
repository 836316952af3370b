"""Project ledger topics into SQL: idempotent, resumable, no gaps, no double counts.

Each ledger topic is tailed by a Reader that starts just after the position stored in
``projection_positions``. A chunk is bounded by records and by their decompressed bytes; a
message larger than a record may be (``max_record_bytes``) is quarantined with its size, and the
projection's client refuses it by its declared size before decompressing it, so it is never held
whole; the reader's prefetch is bounded the same way. Records are parsed in the worker thread,
never on the event loop. A chunk of records is applied in one database transaction: the raw
records (unique by topic + message id, so a record read twice is ignored), the recomputed
``batches`` and ``transactions`` rows they touch, and the new position. A crash between
chunks re-reads at most the last chunk, and re-reading changes nothing.

A message that is not a valid record (:meth:`LedgerRecord.from_json` checks types and bounds,
and size and nesting before parsing), a record with counts the columns do not hold
(:func:`column_fault`), or a record the database refuses, is quarantined: kept
raw (bounded) with the reason in ``quarantine``, and the projection moves past it. Batches and
transactions are keyed by (ledger topic, id): a row is computed from the records of its own ledger
topic only, and no record of another ledger topic can change it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError, StatementError

from txn.client import AsyncClient
from txn.delivery.batch_ids import is_stream_next
from txn.delivery.ledger import COMMITTING_KINDS, Kind, LedgerRecord, LedgerSchemaError, now_ms
from txn.delivery.ledger_reader import LedgerEntry
from txn.delivery.ledger_reader import entry_of as entry_of  # re-exported (it lived here)
from txn.errors import CorruptMessage, Timeout
from txn.message import EARLIEST, Message, MessageId

from . import db
from .live import Live
from .sanitize import describe

log = logging.getLogger("coordinator_api.projection")

#: One ledger message as read (the shared reader's entry).
Entry = LedgerEntry


@dataclass(slots=True)
class TopicStatus:
    """How far the projection of one ledger topic got."""

    topic: str
    records: int = 0
    skipped: int = 0  # quarantined by this process (the name of older versions)
    quarantined: int = 0
    position: str | None = None
    last_applied_ms: int | None = None
    error: str | None = None


def _pos(mid: MessageId) -> dict[str, int]:
    return {"msg_ledger": mid.ledger_id(), "msg_entry": mid.entry_id(), "msg_partition": mid.partition(),
            "msg_batch": mid.batch_index()}


def load_position(engine: Engine, topic: str) -> MessageId | None:
    """The id of the last applied message of ``topic``, or None."""
    with engine.connect() as conn:
        row = conn.execute(select(db.projection_positions).where(db.projection_positions.c.topic == topic)).first()
    if row is None:
        return None
    return MessageId(row.msg_partition, row.msg_ledger, row.msg_entry, row.msg_batch)


def _record_row(topic: str, e: Entry) -> dict[str, Any]:
    r = e.record
    assert r is not None
    return {
        "topic": topic, **_pos(e.msg_id), "kind": r.kind, "job": r.job, "batch_id": r.batch_id,
        "txn_id": r.txn_id, "attempt": r.attempt, "started_at_ms": r.started_at_ms or e.publish_ms,
        "ended_at_ms": r.ended_at_ms, "publish_ms": e.publish_ms, "error": r.error,
        "record": r.to_json().decode(),
    }


_DECLARED = re.compile(r"declared uncompressed size (\d+)")


def _size_of(e: Entry) -> int:
    """Bytes of the message: its payload, or for one refused before decoding, the size it declared."""
    if e.raw:
        return len(e.raw)
    m = _DECLARED.search(e.reason or "")
    return min(int(m.group(1)), db.MAX_COUNT) if m else 0


def _quarantine_row(topic: str, e: Entry, reason: str) -> dict[str, Any]:
    return {"topic": topic, **_pos(e.msg_id), "publish_ms": e.publish_ms, "reason": reason[:1024],
            "size": _size_of(e), "raw": e.raw[:db.QUARANTINE_RAW_BYTES], "quarantined_at_ms": now_ms()}


def too_big(msg_id: MessageId, publish_ms: int, size: int, limit: int, head: bytes = b"") -> Entry:
    """The entry of a message larger than the projection's record limit: only its first bytes are
    kept (``head``), and the reason states the size (as the decoder words it, see :func:`_size_of`)."""
    return Entry(msg_id, publish_ms, None, head,
                 f"record too large: declared uncompressed size {size} exceeds the limit of {limit} bytes")


def column_fault(rec: LedgerRecord) -> str | None:
    """Why the control plane cannot store ``rec`` (a count its columns do not hold), or None.

    The record model allows counts up to 2^63-1 per topic; the control plane counts at most
    :data:`db.MAX_COUNT` inputs and outputs per record."""
    outputs = sum(rec.outputs.values())
    if outputs > db.MAX_COUNT:
        return f"field 'outputs' sums to {outputs}; the control plane counts at most {db.MAX_COUNT} per record"
    inputs = rec.input_count
    if inputs > db.MAX_COUNT:
        return f"the record covers {inputs} inputs; the control plane counts at most {db.MAX_COUNT} per record"
    return None


def is_record_fault(exc: BaseException) -> bool:
    """Whether the database refused a record for what it holds (too long, out of range, bad
    text...), as opposed to being unreachable or busy."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError)):
        return False
    if isinstance(exc, DBAPIError):
        return not exc.connection_invalidated
    return isinstance(exc, (StatementError, ValueError, TypeError, OverflowError, UnicodeError, LedgerSchemaError))


def _apply(engine: Engine, topic: str, entries: list[Entry], refused: dict[int, str]) -> tuple[int, int]:
    """One database transaction: the valid records, the quarantined ones (invalid, or in
    ``refused``: index -> reason), the rows they touch and the new position."""
    rows, bad = [], []
    for i, e in enumerate(entries):
        fault = refused.get(i) or (e.reason if e.record is None else column_fault(e.record))
        if fault is not None or e.record is None:
            bad.append(_quarantine_row(topic, e, fault or "unreadable record"))
        else:
            rows.append(_record_row(topic, e))
    last = entries[-1].msg_id
    with engine.begin() as conn:
        new = db.insert_ignore(conn, db.ledger_records, rows)
        quarantined = db.insert_ignore(conn, db.quarantine, bad)
        recompute(conn, topic, {r["batch_id"] for r in rows}, {r["txn_id"] for r in rows if r["txn_id"]})
        cur = conn.execute(select(db.projection_positions).where(db.projection_positions.c.topic == topic)).first()
        cur_id = None if cur is None else MessageId(cur.msg_partition, cur.msg_ledger, cur.msg_entry, cur.msg_batch)
        if cur_id is None or cur_id < last:
            db.upsert(conn, db.projection_positions, [{
                "topic": topic, **_pos(last), "records": (cur.records if cur else 0) + new,
                "updated_at_ms": now_ms(),
            }], ["topic"])
    return new, quarantined


def apply_chunk(engine: Engine, topic: str, entries: list[Entry]) -> tuple[int, int]:
    """Apply ``entries`` (in topic order); returns (new records, newly quarantined).

    One database transaction for the chunk; if the database refuses it for a record's content, the
    entries are applied one by one and each refused record is quarantined with the reason. Errors
    that are not a record's (the database is down) are raised: the caller retries the chunk."""
    if not entries:
        return 0, 0
    try:
        return _apply(engine, topic, entries, {})
    except Exception as exc:  # noqa: BLE001 - sorted below
        if not is_record_fault(exc):
            raise
    new = quarantined = 0
    for e in entries:
        try:
            n, q = _apply(engine, topic, [e], {})
        except Exception as exc:  # noqa: BLE001
            if not is_record_fault(exc):
                raise
            log.warning("ledger record at %s of %s quarantined: %s", e.msg_id, topic, describe(exc))
            n, q = _apply(engine, topic, [e], {0: f"the database refused the record: {describe(exc)}"})
        new += n
        quarantined += q
    return new, quarantined


def _records_by(conn: Connection, column: Any, values: set[str],
                topic: str) -> dict[str, list[tuple[LedgerRecord, Any]]]:
    """Stored records of ``topic`` whose ``column`` is one of ``values``, grouped by it, oldest first."""
    t = db.ledger_records
    out: dict[str, list[tuple[LedgerRecord, Any]]] = {}
    ordered = sorted(values)
    for i in range(0, len(ordered), 500):  # bounded IN lists
        rows = conn.execute(select(t).where(t.c.topic == topic).where(column.in_(ordered[i:i + 500]))
                            .order_by(t.c.id)).all()
        for row in rows:
            try:
                rec = LedgerRecord.from_json(row.record)
            except LedgerSchemaError:  # stored by an older, laxer version: left out of the view
                continue
            out.setdefault(getattr(row, column.name), []).append((rec, row))
    return out


def is_stream_placeholder(rec: LedgerRecord) -> bool:
    """The Spark sink's STARTED record of a streaming transaction opened before its batch is known."""
    return rec.kind == Kind.STARTED and rec.config.stream_key is not None and is_stream_next(rec.batch_id)


def recompute(conn: Connection, topic: str, batch_ids: Iterable[str], txn_ids: Iterable[str]) -> None:
    """Rebuild the ``batches`` and ``transactions`` rows of the given ids from the records of ``topic``.

    Both are keyed by (ledger topic, id): records in another ledger topic with the same batch or
    transaction id have rows of their own and never change these."""
    by_batch = _records_by(conn, db.ledger_records.c.batch_id, set(batch_ids), topic)
    batch_rows = []
    for batch_id in sorted(by_batch):
        recs = [(r, row) for r, row in by_batch[batch_id] if not is_stream_placeholder(r)]
        if recs:
            batch_rows.append(_batch_row(topic, recs))
    db.upsert(conn, db.batches, batch_rows, ["ledger_topic", "batch_id"])
    tids = sorted(set(txn_ids))
    if not tids:
        return
    by_txn = _records_by(conn, db.ledger_records.c.txn_id, set(tids), topic)
    res = db.txn_resolutions
    resolutions = {}
    for i in range(0, len(tids), 500):  # bounded IN lists
        resolutions.update({r.txn_id: r for r in conn.execute(
            select(res).where(res.c.ledger_topic == topic).where(res.c.txn_id.in_(tids[i:i + 500]))).all()})
    db.upsert(conn, db.transactions, [_txn_row(topic, by_txn[t], resolutions.get(t)) for t in sorted(by_txn)],
              ["ledger_topic", "txn_id"])


def rebuild_batches(conn: Connection) -> int:
    """Recompute every ``batches`` row from the stored records (schema upgrade); returns how many topics."""
    t = db.ledger_records
    topics = conn.execute(select(t.c.topic).distinct()).scalars().all()
    for topic in topics:
        ids = set(conn.execute(select(t.c.batch_id).where(t.c.topic == topic).distinct()).scalars().all())
        recompute(conn, topic, ids, [])
    return len(topics)


def rebuild_transactions(conn: Connection) -> int:
    """Recompute every ``transactions`` row from the stored records (schema upgrade); returns how many topics."""
    t = db.ledger_records
    topics = conn.execute(select(t.c.topic).distinct()).scalars().all()
    for topic in topics:
        ids = set(conn.execute(select(t.c.txn_id).where(t.c.topic == topic).where(t.c.txn_id.is_not(None))
                               .distinct()).scalars().all())
        recompute(conn, topic, [], ids)
    return len(topics)


def batch_status(recs: list[LedgerRecord]) -> LedgerRecord:
    """The record that decides a batch's status (the same whatever order the records came in)."""
    for kind in (Kind.REPLAYED, Kind.PARKED, Kind.COMMITTED):
        found = [r for r in recs if r.kind == kind]
        if found:
            return found[-1]
    top = max(r.attempt for r in recs)
    last = [r for r in recs if r.attempt == top]
    aborted = [r for r in last if r.kind == Kind.ABORTED]
    return aborted[-1] if aborted else last[-1]


def _batch_row(topic: str, recs: list[tuple[LedgerRecord, Any]]) -> dict[str, Any]:
    records = [r for r, _ in recs]
    decider = batch_status(records)
    errors = [r.error for r in records if r.error]
    committed = [r for r in records if r.kind in (Kind.COMMITTED, Kind.REPLAYED)]
    outputs = sum(sum(r.outputs.values()) for r in committed) if committed else sum(decider.outputs.values())
    started = min((row.started_at_ms for _, row in recs), default=0)
    ended = decider.ended_at_ms if decider.kind != Kind.STARTED else None
    parked = next((r.parked_topic for r in records if r.parked_topic), None)
    return {
        "batch_id": decider.batch_id, "job": decider.job, "status": decider.kind,
        "attempts": max(r.attempt for r in records), "txn_id": decider.txn_id,
        "inputs": min(decider.input_count, db.MAX_COUNT), "outputs": min(outputs, db.MAX_COUNT),
        "started_at_ms": started, "ended_at_ms": ended,
        "duration_ms": None if ended is None else max(0, ended - started),
        "error": errors[-1] if errors else None, "ledger_topic": topic, "parked_topic": parked,
        "updated_at_ms": now_ms(),
    }


def txn_state(recs: list[LedgerRecord], resolution: Any = None) -> tuple[str, LedgerRecord]:
    """``OPEN``, ``COMMITTED`` or ``ABORTED`` from a transaction's records, and the deciding record."""
    done = [r for r in recs if r.kind in COMMITTING_KINDS]
    if done:
        return "COMMITTED", done[-1]
    aborted = [r for r in recs if r.kind == Kind.ABORTED]
    if aborted:
        return "ABORTED", aborted[-1]
    if resolution is not None:
        return resolution.state, recs[-1]
    return "OPEN", recs[-1]


def _txn_row(topic: str, recs: list[tuple[LedgerRecord, Any]], resolution: Any) -> dict[str, Any]:
    records = [r for r, _ in recs]
    state, decider = txn_state(records, resolution)
    real = [r for r in records if not is_stream_placeholder(r)]
    named = decider if not is_stream_placeholder(decider) else (real[-1] if real else decider)
    started = min(row.started_at_ms for _, row in recs)
    if state == "OPEN":
        ended = None
    elif decider.kind == Kind.STARTED:  # resolved by the reconciler
        ended = resolution.resolved_at_ms
    else:
        ended = decider.ended_at_ms or next(row.publish_ms for r, row in recs if r is decider)
    error = decider.error if state == "ABORTED" and decider.kind == Kind.ABORTED else (
        resolution.reason if state != "COMMITTED" and resolution is not None else None)
    return {
        "txn_id": decider.txn_id, "job": named.job, "batch_id": named.batch_id, "attempt": named.attempt,
        "state": state, "started_at_ms": started, "ended_at_ms": ended,
        "duration_ms": None if ended is None else max(0, ended - started), "error": error,
        "ledger_topic": topic,
    }


@dataclass
class Projector:
    """Tails every ledger topic into the database; finds new ledger topics; resolves vanished
    open transactions against the coordinator."""

    engine: Engine
    client: AsyncClient
    live: Live
    topics: list[str] = field(default_factory=list)  # fixed list
    namespaces: list[str] = field(default_factory=list)  # discover ledger topics in these; empty: no discovery
    chunk: int = 500
    #: Bytes of records (decompressed) in one chunk, at least one record.
    chunk_bytes: int = 8 * 1024 * 1024
    #: The largest record projected; a larger message is quarantined with its size, never held whole.
    max_record_bytes: int = 1024 * 1024
    discover_interval_s: float = 10.0
    resolve_after_ms: int = 15_000
    status: dict[str, TopicStatus] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _loops: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        """Start the background tasks (in the running event loop)."""
        self._loops.append(asyncio.create_task(self._discover_loop(), name="projection-discover"))
        self._loops.append(asyncio.create_task(self._resolve_loop(), name="projection-resolve"))

    async def stop(self) -> None:
        """Cancel every task and wait for them."""
        tasks = [*self._loops, *self._tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def follow(self, topic: str) -> None:
        """Start tailing ``topic`` (no-op if already tailed)."""
        if topic not in self._tasks:
            self.status.setdefault(topic, TopicStatus(topic))
            self._tasks[topic] = asyncio.create_task(self._tail(topic), name=f"projection {topic}")

    async def _discover_loop(self) -> None:
        for topic in self.topics:
            self.follow(topic)
        while self.namespaces:
            try:
                for topic in await asyncio.to_thread(self.live.ledger_topics, self.namespaces):
                    self.follow(topic)
            except Exception as exc:  # noqa: BLE001 - keep looking; the error shows in /health
                log.warning("ledger topic discovery failed: %s", describe(exc))
            await asyncio.sleep(self.discover_interval_s)

    @property
    def queue_size(self) -> int:
        """The reader's prefetch, in messages: at most twice ``chunk_bytes`` of records of the
        largest size allowed (each message is decompressed when it arrives), at least 4."""
        return max(4, min(self.chunk, 2 * self.chunk_bytes // max(1, self.max_record_bytes)))

    async def _tail(self, topic: str) -> None:
        st = self.status[topic]
        backoff = 0.5
        while True:
            try:
                start = await asyncio.to_thread(load_position, self.engine, topic)
                reader = await self.client.create_reader(topic, start or EARLIEST, receiver_queue_size=self.queue_size)
                st.error = None
                try:
                    await self._read(topic, reader, st)
                finally:
                    await reader.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect and resume from the stored position
                st.error = describe(exc)
                log.warning("projection of %s: %s; resuming in %.1fs", topic, st.error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _chunk(self, reader: Any, wait_ms: int = 1000, more_ms: int = 20) -> list[Message | Entry]:
        """The next messages, as :meth:`txn.delivery.ledger_reader.LedgerReader.chunk` takes them,
        but bounded by bytes as well (``chunk_bytes`` of payload, at least one message) and not
        parsed here (on the event loop): parsing is the worker thread's. A message that failed its
        checksum or size checks (one decompressing past ``max_record_bytes`` is refused by the
        client before it is decompressed) is an entry to quarantine, never retried."""
        out: list[Message | Entry] = []
        size = 0
        try:
            m = await reader.read_next(timeout_millis=wait_ms)
            out.append(m)
            size += len(m.data())
            while len(out) < self.chunk and size < self.chunk_bytes:
                m = await reader.read_next(timeout_millis=more_ms)
                out.append(m)
                size += len(m.data())
        except Timeout:
            pass
        except CorruptMessage as exc:
            out.append(Entry(exc.message_id, 0, None, b"", f"corrupt message ({exc.reason}): {exc.message}"))
        return out

    def _entries(self, got: list[Message | Entry]) -> list[Entry]:
        """Parse (in the worker thread): a message larger than ``max_record_bytes`` is not parsed."""
        out = []
        for m in got:
            if isinstance(m, Entry):
                out.append(m)
            elif len(m.data()) > self.max_record_bytes:
                out.append(too_big(m.message_id(), m.publish_timestamp(), len(m.data()), self.max_record_bytes,
                                   m.data()[:db.QUARANTINE_RAW_BYTES]))
            else:
                out.append(entry_of(m))
        return out

    def _apply(self, topic: str, got: list[Message | Entry]) -> tuple[int, int, MessageId]:
        entries = self._entries(got)
        new, quarantined = apply_chunk(self.engine, topic, entries)
        return new, quarantined, entries[-1].msg_id

    async def _read(self, topic: str, reader: Any, st: TopicStatus) -> None:
        while True:
            got = await self._chunk(reader)
            if got:
                new, quarantined, last = await asyncio.to_thread(self._apply, topic, got)
                del got
                if quarantined:
                    log.warning("projection of %s: %d message(s) quarantined (see GET /quarantine)", topic,
                                quarantined)
                st.records += new
                st.skipped += quarantined
                st.quarantined += quarantined
                st.error = None
                st.position = str(last)
                st.last_applied_ms = now_ms()

    async def _resolve_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(5.0, self.resolve_after_ms / 3000)))
            try:
                await asyncio.to_thread(self.resolve_vanished)
            except Exception as exc:  # noqa: BLE001
                log.warning("resolving open transactions failed: %s", describe(exc))

    def resolve_vanished(self, limit: int = 200) -> int:
        """Mark ledger-OPEN transactions that the coordinator no longer knows as ABORTED.

        A COMMITTED record that arrives later still wins (it is written inside the transaction,
        so it exists exactly when the transaction committed)."""
        t = db.transactions
        cutoff = now_ms() - self.resolve_after_ms
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.c.txn_id, t.c.ledger_topic).where(t.c.state == "OPEN")
                                .where(t.c.started_at_ms < cutoff).limit(limit)).all()
        n = 0
        for txn_id, topic in rows:
            meta = self.live.txn_metadata(txn_id)
            if meta is not None:
                continue
            with self.engine.begin() as conn:
                db.upsert(conn, db.txn_resolutions, [{
                    "ledger_topic": topic, "txn_id": txn_id, "state": "ABORTED", "resolved_at_ms": now_ms(),
                    "reason": "the coordinator no longer knows this transaction and no COMMITTED record exists: "
                              "it timed out or its owner aborted it without writing an ABORTED record",
                }], ["ledger_topic", "txn_id"])
                recompute(conn, topic, [], [txn_id])
            n += 1
        return n


def positions(engine: Engine) -> list[dict[str, Any]]:
    """Stored projection positions."""
    with engine.connect() as conn:
        rows = conn.execute(select(db.projection_positions)).all()
    return [{"topic": r.topic, "position": str(MessageId(r.msg_partition, r.msg_ledger, r.msg_entry, r.msg_batch)),
             "records": r.records, "updated_at_ms": r.updated_at_ms} for r in rows]
