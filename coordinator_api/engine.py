"""Opening the control plane's database: the engine, the schema created and upgraded.

Here, above both the schema (:mod:`.db`) and the projection (:mod:`.projection`), because an
upgrade rebuilds derived rows with the projection's rules.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text, update

from .db import MAX_COUNT, batches, create_indexes, metadata, replays, transactions, txn_resolutions
from .projection import rebuild_batches, rebuild_transactions

__all__ = ["make_engine", "upgrade"]


def make_engine(url: str) -> Engine:
    """An engine for ``url`` with the schema created (and upgraded, see :func:`upgrade`); SQLite
    gets WAL and a busy timeout. SQL parameters never appear in errors (``hide_parameters``):
    they hold ledger records."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, hide_parameters=True)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, hide_parameters=True)
    metadata.create_all(engine)
    upgrade(engine)
    create_indexes(engine)
    return engine


def upgrade(engine: Engine) -> list[str]:
    """Bring tables made by an older version to this schema; returns the tables changed.

    - ``batches`` keyed by batch id alone: dropped, created with the (ledger topic, batch id) key
      and rebuilt from ``ledger_records`` (it is derived from them).
    - ``transactions`` keyed by transaction id alone: dropped, created with the (ledger topic,
      transaction id) key and rebuilt from ``ledger_records``; ``txn_resolutions`` (keyed by
      transaction id alone) is copied with the ledger topic of its transaction's old row.
    - ``batches`` counts above :data:`~coordinator_api.db.MAX_COUNT` (stored before counts were
      bounded) are cut to it.
    - ``replays`` unique by batch id, without ``resumes``: its rows are copied into the new shape."""
    insp = inspect(engine)
    changed = []
    if set(insp.get_pk_constraint("batches")["constrained_columns"]) != {"ledger_topic", "batch_id"}:
        with engine.begin() as conn:
            batches.drop(conn)
            batches.create(conn)
            rebuild_batches(conn)
        changed.append("batches")
    if set(insp.get_pk_constraint("transactions")["constrained_columns"]) != {"ledger_topic", "txn_id"}:
        with engine.begin() as conn:
            verdicts = [dict(r._mapping) for r in conn.execute(text(
                "SELECT t.ledger_topic, r.txn_id, r.state, r.reason, r.resolved_at_ms FROM txn_resolutions r "
                "JOIN transactions t ON t.txn_id = r.txn_id")).all()]
            transactions.drop(conn)
            txn_resolutions.drop(conn)
            transactions.create(conn)
            txn_resolutions.create(conn)
            if verdicts:
                conn.execute(txn_resolutions.insert(), verdicts)
            rebuild_transactions(conn)
        changed.append("transactions")
    with engine.begin() as conn:  # counts stored by older versions, before they were bounded
        for column in (batches.c.inputs, batches.c.outputs):
            if conn.execute(update(batches).where(column > MAX_COUNT).values({column: MAX_COUNT})).rowcount:
                changed.append(f"batches.{column.name}")
    if "resumes" not in {c["name"] for c in insp.get_columns("replays")}:
        with engine.begin() as conn:
            rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM replays")).all()]
            replays.drop(conn)
            replays.create(conn)
            if rows:
                conn.execute(replays.insert(), [{**r, "resumes": 0} for r in rows])
        changed.append("replays")
    return changed
