"""The control plane's SQL schema (SQLAlchemy Core): SQLite by default, PostgreSQL by URL.

``ledger_records`` holds every ledger record once, keyed by (topic, message id): the
projection inserts with "on conflict do nothing", so reading a record twice changes nothing.
``batches`` and ``transactions`` are recomputed from the stored records of the batches and
transactions a chunk touched, so they never count anything twice either.
``projection_positions`` is updated in the same database transaction as the records.
``batches`` and ``replays`` are keyed by (ledger topic, batch id), ``transactions`` and
``txn_resolutions`` by (ledger topic, transaction id): a record in one ledger topic never changes
a batch or a transaction of another (transaction ids are predictable: anyone who can write a
ledger topic can write records naming the ids another job will get). ``quarantine`` keeps the
messages of a ledger topic that are not valid records (or could not be stored), raw and bounded,
with the reason.

Databases made by older versions are upgraded at start-up (:func:`coordinator_api.engine.upgrade`): missing indexes are
created, ``batches`` and ``transactions`` (derived from ``ledger_records``) are rebuilt with their new keys,
``txn_resolutions`` is copied with the ledger topic of its transaction, and
``replays`` is copied into its new shape. Start one replica first after an upgrade.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateIndex

metadata = MetaData()

#: The largest count (a batch's inputs or outputs) the control plane stores: what an ``Integer``
#: column holds on every database. A record claiming more is quarantined, so a column never
#: refuses a count and a sum over fewer than 2^32 rows never leaves 64 bits.
MAX_COUNT = 2**31 - 1

ledger_records = Table(
    "ledger_records", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("topic", String(512), nullable=False),
    Column("msg_ledger", BigInteger, nullable=False),
    Column("msg_entry", BigInteger, nullable=False),
    Column("msg_partition", Integer, nullable=False),
    Column("msg_batch", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("job", String(256), nullable=False),
    Column("batch_id", String(512), nullable=False),
    Column("txn_id", String(64)),
    Column("attempt", Integer, nullable=False),
    Column("started_at_ms", BigInteger, nullable=False),
    Column("ended_at_ms", BigInteger),
    Column("publish_ms", BigInteger, nullable=False),
    Column("error", Text),
    Column("record", Text, nullable=False),
    UniqueConstraint("topic", "msg_ledger", "msg_entry", "msg_partition", "msg_batch", name="uq_ledger_position"),
)
Index("ix_records_batch", ledger_records.c.batch_id)
Index("ix_records_txn", ledger_records.c.txn_id)

batches = Table(
    "batches", metadata,
    Column("ledger_topic", String(512), primary_key=True),
    Column("batch_id", String(512), primary_key=True),
    Column("job", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("txn_id", String(64)),
    Column("inputs", Integer, nullable=False),
    Column("outputs", Integer, nullable=False),
    Column("started_at_ms", BigInteger, nullable=False),
    Column("ended_at_ms", BigInteger),
    Column("duration_ms", BigInteger),
    Column("error", Text),
    Column("parked_topic", String(512)),
    Column("updated_at_ms", BigInteger, nullable=False),
)
# A job's batches by status and its committed volumes, from the index alone (it replaces the
# former ``ix_batches_job_status (job, status)``, which databases made before keep).
Index("ix_batches_job_status_totals", batches.c.job, batches.c.status, batches.c.started_at_ms,
      batches.c.ended_at_ms, batches.c.inputs, batches.c.outputs)
# Pages are ordered by (started_at_ms, batch_id) descending: these serve a job's or a status's
# page without a sort (and the metrics' count by status from the index alone).
Index("ix_batches_job_started", batches.c.job, batches.c.started_at_ms, batches.c.batch_id)
Index("ix_batches_status_started", batches.c.status, batches.c.started_at_ms, batches.c.batch_id)
Index("ix_batches_started", batches.c.started_at_ms, batches.c.batch_id)  # the unfiltered page
Index("ix_batches_id", batches.c.batch_id)  # GET /batches/{id} without its ledger topic

transactions = Table(
    "transactions", metadata,
    Column("ledger_topic", String(512), primary_key=True),
    Column("txn_id", String(64), primary_key=True),
    Column("job", String(256), nullable=False),
    Column("batch_id", String(512), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("started_at_ms", BigInteger, nullable=False),
    Column("ended_at_ms", BigInteger),
    Column("duration_ms", BigInteger),
    Column("error", Text),
)
Index("ix_txns_id", transactions.c.txn_id)
Index("ix_txns_state", transactions.c.state)
# The unfiltered page and the start-time filter (it replaces the former ``ix_txns_started
# (started_at_ms)``, which databases made before keep).
Index("ix_txns_started_id", transactions.c.started_at_ms, transactions.c.txn_id)
# Pages filtered by job and/or state, newest first; a job's latest commit latencies (covering);
# the time series (by end time, and open ones by start time) and the latency histogram (covering).
Index("ix_txns_job_state_started", transactions.c.job, transactions.c.state, transactions.c.started_at_ms,
      transactions.c.txn_id, transactions.c.duration_ms)
Index("ix_txns_job_started", transactions.c.job, transactions.c.started_at_ms, transactions.c.txn_id)
Index("ix_txns_state_started", transactions.c.state, transactions.c.started_at_ms, transactions.c.txn_id)
Index("ix_txns_state_ended", transactions.c.state, transactions.c.ended_at_ms, transactions.c.duration_ms)

#: Transactions the ledger shows open but the coordinator no longer knows (timed out, or the
#: owner died): the reconciler's verdict, which a later COMMITTED record overrides. Keyed like
#: ``transactions``: a verdict on one ledger topic's row never touches another's.
txn_resolutions = Table(
    "txn_resolutions", metadata,
    Column("ledger_topic", String(512), primary_key=True),
    Column("txn_id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("resolved_at_ms", BigInteger, nullable=False),
)

projection_positions = Table(
    "projection_positions", metadata,
    Column("topic", String(512), primary_key=True),
    Column("msg_ledger", BigInteger, nullable=False),
    Column("msg_entry", BigInteger, nullable=False),
    Column("msg_partition", Integer, nullable=False),
    Column("msg_batch", Integer, nullable=False),
    Column("records", BigInteger, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),
)

replays = Table(
    "replays", metadata,
    Column("replay_id", String(64), primary_key=True),
    Column("batch_id", String(512), nullable=False),
    Column("ledger_topic", String(512), nullable=False),
    Column("status", String(16), nullable=False),
    Column("requested_at_ms", BigInteger, nullable=False),
    Column("started_at_ms", BigInteger),
    Column("finished_at_ms", BigInteger),
    Column("txn_id", String(64)),
    Column("messages", Integer),
    Column("message", Text),
    Column("runs", Integer, nullable=False, default=0),
    #: How often a start-up found it ``running`` (a process died during it) and resumed it.
    Column("resumes", Integer, nullable=False, default=0),
    UniqueConstraint("ledger_topic", "batch_id", name="uq_replays_batch"),
)
Index("ix_replays_batch", replays.c.batch_id)  # the replays of a page of batches, by batch id

#: Bytes of a quarantined message that are kept (its full size is in ``size``).
QUARANTINE_RAW_BYTES = 64 * 1024

quarantine = Table(
    "quarantine", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("topic", String(512), nullable=False),
    Column("msg_ledger", BigInteger, nullable=False),
    Column("msg_entry", BigInteger, nullable=False),
    Column("msg_partition", Integer, nullable=False),
    Column("msg_batch", Integer, nullable=False),
    Column("publish_ms", BigInteger, nullable=False),
    Column("reason", String(1024), nullable=False),
    Column("size", Integer, nullable=False),
    Column("raw", LargeBinary, nullable=False),
    Column("quarantined_at_ms", BigInteger, nullable=False),
    UniqueConstraint("topic", "msg_ledger", "msg_entry", "msg_partition", "msg_batch", name="uq_quarantine_position"),
)
Index("ix_quarantine_topic", quarantine.c.topic, quarantine.c.id)


def create_indexes(engine: Engine) -> None:
    """Create every index of the schema that is missing, each in its own transaction.

    ``create_all`` skips the indexes of tables that exist already. Another process creating the
    same index at the same moment can make one statement fail even with ``IF NOT EXISTS``
    (PostgreSQL): that is not an error once the index exists."""
    for table in metadata.sorted_tables:
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            try:
                with engine.begin() as conn:
                    conn.execute(CreateIndex(index, if_not_exists=True))
            except DBAPIError:
                if index.name not in {ix["name"] for ix in inspect(engine).get_indexes(table.name)}:
                    raise


def _dml(dialect: str) -> Any:
    if dialect == "postgresql":
        return postgresql
    if dialect == "sqlite":
        return sqlite
    raise ValueError(f"unsupported database dialect {dialect!r}")  # pragma: no cover


def insert_ignore(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> int:
    """Insert ``rows``, skipping those that collide with a unique key; returns how many were new."""
    if not rows:
        return 0
    stmt = _dml(conn.dialect.name).insert(table).on_conflict_do_nothing()
    # One multi-row statement; RETURNING gives exactly the rows that were new (rowcount is not
    # reliable for every driver with ON CONFLICT DO NOTHING).
    stmt = stmt.returning(*table.primary_key.columns)
    return len(conn.execute(stmt, rows).all())


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], key: list[str]) -> None:
    """Insert ``rows`` or overwrite the rows with the same ``key`` columns (all rows have the same columns)."""
    if not rows:
        return
    ins = _dml(conn.dialect.name).insert(table)
    stmt = ins.on_conflict_do_update(index_elements=key,
                                     set_={c: ins.excluded[c] for c in rows[0] if c not in key})
    conn.execute(stmt, rows)
