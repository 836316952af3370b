"""Read queries over the projected state."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, and_, case, func, select

from . import db


def _page(engine: Engine, stmt: Any, order: Any, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()
        rows = conn.execute(stmt.order_by(*order).limit(limit).offset(offset)).all()
    return [dict(r._mapping) for r in rows], total


def list_transactions(engine: Engine, state: str | None, job: str | None, since_ms: int | None, limit: int,
                      offset: int) -> tuple[list[dict[str, Any]], int]:
    """Transactions, newest first, filtered by state, job and start time."""
    t = db.transactions
    stmt = select(t)
    if state:
        stmt = stmt.where(t.c.state == state)
    if job:
        stmt = stmt.where(t.c.job == job)
    if since_ms is not None:
        stmt = stmt.where(t.c.started_at_ms >= since_ms)
    return _page(engine, stmt, (t.c.started_at_ms.desc(), t.c.txn_id.desc()), limit, offset)


def get_transaction(engine: Engine, txn_id: str) -> dict[str, Any] | None:
    """One transaction row."""
    with engine.connect() as conn:
        row = conn.execute(select(db.transactions).where(db.transactions.c.txn_id == txn_id)).first()
    return None if row is None else dict(row._mapping)


def records(engine: Engine, *, txn_id: str | None = None, batch_id: str | None = None) -> list[dict[str, Any]]:
    """Ledger records of a transaction or a batch, oldest first, as JSON objects."""
    t = db.ledger_records
    stmt = select(t.c.record, t.c.topic, t.c.publish_ms)
    stmt = stmt.where(t.c.txn_id == txn_id) if txn_id is not None else stmt.where(t.c.batch_id == batch_id)
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(t.c.id)).all()
    out = []
    for rec, topic, publish_ms in rows:
        d = json.loads(rec)
        d["ledger_topic"] = topic
        d["publish_ms"] = publish_ms
        out.append(d)
    return out


def _with_replays(engine: Engine, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = [r["batch_id"] for r in rows]
    if not ids:
        return rows
    with engine.connect() as conn:
        reps = {r.batch_id: dict(r._mapping)
                for r in conn.execute(select(db.replays).where(db.replays.c.batch_id.in_(ids))).all()}
    for r in rows:
        r["replay"] = reps.get(r["batch_id"])
    return rows


def list_batches(engine: Engine, job: str | None, status: str | None, limit: int,
                 offset: int) -> tuple[list[dict[str, Any]], int]:
    """Batches, newest first, filtered by job and status."""
    b = db.batches
    stmt = select(b)
    if job:
        stmt = stmt.where(b.c.job == job)
    if status:
        stmt = stmt.where(b.c.status == status)
    rows, total = _page(engine, stmt, (b.c.started_at_ms.desc(), b.c.batch_id.desc()), limit, offset)
    return _with_replays(engine, rows), total


def get_batch(engine: Engine, batch_id: str) -> dict[str, Any] | None:
    """One batch row with its replay."""
    with engine.connect() as conn:
        row = conn.execute(select(db.batches).where(db.batches.c.batch_id == batch_id)).first()
    return None if row is None else _with_replays(engine, [dict(row._mapping)])[0]


def _percentile(sorted_values: list[int], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[i])


def job_names(engine: Engine) -> list[str]:
    """Every job with at least one batch."""
    with engine.connect() as conn:
        return list(conn.execute(select(db.batches.c.job).distinct().order_by(db.batches.c.job)).scalars())


def job_stats(engine: Engine, job: str) -> dict[str, Any] | None:
    """Counts by status, committed volumes, throughput, last commit and commit latency of ``job``."""
    b, t = db.batches, db.transactions
    done = ("COMMITTED", "REPLAYED")
    with engine.connect() as conn:
        by_status = dict(conn.execute(select(b.c.status, func.count()).where(b.c.job == job)
                                      .group_by(b.c.status)).all())
        if not by_status:
            return None
        inputs, outputs, first, last = conn.execute(
            select(func.coalesce(func.sum(b.c.inputs), 0), func.coalesce(func.sum(b.c.outputs), 0),
                   func.min(b.c.ended_at_ms), func.max(b.c.ended_at_ms))
            .where(and_(b.c.job == job, b.c.status.in_(done)))).one()
        first_start = conn.execute(select(func.min(b.c.started_at_ms))
                                   .where(and_(b.c.job == job, b.c.status.in_(done)))).scalar_one()
        lat = sorted(conn.execute(select(t.c.duration_ms).where(and_(t.c.job == job, t.c.state == "COMMITTED",
                                                                       t.c.duration_ms.is_not(None)))
                                  .order_by(t.c.started_at_ms.desc()).limit(1000)).scalars())
    span_s = (last - first_start) / 1000 if last is not None and first_start is not None else 0
    return {
        "job": job, "batches": by_status, "total_batches": sum(by_status.values()),
        "inputs_committed": int(inputs), "outputs_committed": int(outputs),
        "first_commit_ms": first, "last_commit_ms": last,
        "throughput_per_s": round(int(inputs) / span_s, 1) if span_s > 0 else None,
        "commit_p50_ms": _percentile(lat, 0.5), "commit_p99_ms": _percentile(lat, 0.99),
    }


def timeseries(engine: Engine, since_ms: int, until_ms: int, bucket_ms: int) -> list[dict[str, Any]]:
    """Per bucket: transactions that committed / aborted in it (by end time) and that are open and
    started in it."""
    t = db.transactions
    n = max(1, (until_ms - since_ms + bucket_ms - 1) // bucket_ms)
    points = [{"t_ms": since_ms + i * bucket_ms, "OPEN": 0, "COMMITTED": 0, "ABORTED": 0} for i in range(n)]
    with engine.connect() as conn:
        ended = conn.execute(select(t.c.state, t.c.ended_at_ms).where(t.c.state.in_(("COMMITTED", "ABORTED")))
                             .where(t.c.ended_at_ms >= since_ms).where(t.c.ended_at_ms < until_ms)).all()
        opened = conn.execute(select(t.c.started_at_ms).where(t.c.state == "OPEN")
                              .where(t.c.started_at_ms >= since_ms).where(t.c.started_at_ms < until_ms)).all()
    for state, at in ended:
        points[(at - since_ms) // bucket_ms][state] += 1
    for (at,) in opened:
        points[(at - since_ms) // bucket_ms]["OPEN"] += 1
    return points


def counts(engine: Engine, table: Any, column: Any) -> dict[str, int]:
    """``column`` value -> row count."""
    with engine.connect() as conn:
        return {k: int(v) for k, v in conn.execute(select(column, func.count()).select_from(table)
                                                    .group_by(column)).all()}


def commit_latency_histogram(engine: Engine, bounds_ms: list[float]) -> tuple[list[int], int, int]:
    """Cumulative counts of committed transactions with duration <= each bound, the count, and the sum (ms)."""
    t = db.transactions
    cols = [func.coalesce(func.sum(case((t.c.duration_ms <= b, 1), else_=0)), 0) for b in bounds_ms]
    cols += [func.count(), func.coalesce(func.sum(t.c.duration_ms), 0)]
    with engine.connect() as conn:
        row = conn.execute(select(*cols).where(t.c.state == "COMMITTED").where(t.c.duration_ms.is_not(None))).one()
    return [int(v) for v in row[:-2]], int(row[-2]), int(row[-1])
