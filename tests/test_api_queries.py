"""The control plane's read queries against their definitions, on SQLite and PostgreSQL (no broker).

The queries compute aggregates in SQL (grouped counts and sums, time-series buckets, the latency
histogram, percentiles from a grouped sample). Here a varied ledger is projected into a fresh
database and every answer is compared with the same figure computed in Python from the plain
table rows. A database made by the previous schema (without this version's indexes) gets them
when the API opens it.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select, text

from coordinator_api import db, metrics, projection, queries
from coordinator_api.engine import make_engine
from txn.delivery.ledger import LedgerRecord
from txn.message import MessageId

LEDGER = "persistent://public/q/pulsar-txn-ledger"
T0 = 1_700_000_000_000
#: The indexes of the schema before this version (``ix_batches_job_status`` and ``ix_txns_started``
#: are no longer declared).
OLD_INDEXES = {"ix_records_batch", "ix_records_txn", "ix_txns_state"}


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: an SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/q.db"
        return
    base = request.getfixturevalue("pg_url").replace("postgresql://", "postgresql+psycopg://", 1)
    name = f"q_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield f"{base.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def ledger(seed: int = 5) -> list[LedgerRecord]:
    """Three jobs (one with more than 1000 commits and many equal durations, one with '/' in its
    name): committed, retried, aborted, parked, replayed and still open batches; every batch
    starts at its own millisecond."""
    rng = random.Random(seed)
    recs: list[LedgerRecord] = []
    txn = 0
    t = T0
    for job, n in (("big", 1300), ("small", 40), ("a/b", 25)):
        for i in range(n):
            t += rng.randrange(30, 400)  # the records of one batch start within 20 ms
            bid = f"{job}:{i}"
            inputs = {"in": [f"(1,{i},-1,-1)"] * rng.randrange(1, 5)}
            kind = rng.choices(["commit", "retry", "abort", "park", "open"], [85, 5, 4, 3, 3])[0]
            for attempt in (1, 2) if kind in ("retry", "park") else (1,):
                txn += 1
                tid = f"({txn % 2},{txn})"
                dur = rng.choice([3, 30, 30, 250]) if rng.random() < 0.3 else rng.randrange(1, 90_000)
                recs.append(LedgerRecord(kind="STARTED", job=job, batch_id=bid, txn_id=tid, attempt=attempt,
                                         inputs=inputs, started_at_ms=t + attempt))
                if kind == "open":
                    continue
                ok = kind == "commit" or (kind == "retry" and attempt == 2)
                recs.append(LedgerRecord(kind="COMMITTED" if ok else "ABORTED", job=job, batch_id=bid, txn_id=tid,
                                         attempt=attempt, inputs=inputs,
                                         outputs={"out": len(inputs["in"])} if ok else {}, started_at_ms=t + attempt,
                                         ended_at_ms=t + attempt + dur, error=None if ok else "boom"))
            if kind == "park":
                txn += 1
                recs.append(LedgerRecord(kind="PARKED", job=job, batch_id=bid, txn_id=f"(0,{txn})", attempt=2,
                                         inputs=inputs, outputs={"in-parked": 1}, started_at_ms=t + 3,
                                         ended_at_ms=t + 9, error="bad", parked_topic="in-parked"))
                if i % 2:
                    txn += 1
                    recs.append(LedgerRecord(kind="REPLAYED", job=job, batch_id=bid, txn_id=f"(1,{txn})", attempt=3,
                                             inputs=inputs, outputs={"out": 1}, started_at_ms=t + 20,
                                             ended_at_ms=t + 26))
    return recs


def project(engine: Any, recs: list[LedgerRecord]) -> None:
    entries = [projection.Entry(MessageId(ledger_id=1, entry_id=i), r.started_at_ms, r) for i, r in enumerate(recs)]
    for i in range(0, len(entries), 500):
        projection.apply_chunk(engine, LEDGER, entries[i:i + 500])
    with engine.begin() as conn:
        parked = conn.execute(select(db.batches.c.batch_id).where(db.batches.c.status == "PARKED")).scalars().all()
        conn.execute(db.replays.insert(), [
            {"replay_id": f"r{k}", "batch_id": b, "ledger_topic": LEDGER, "status": "failed", "requested_at_ms": k,
             "runs": 1} for k, b in enumerate(sorted(parked)[:3])])


def rows(engine: Any, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(table)).all()]


def nearest_rank(values: list[int], q: float) -> float | None:
    s = sorted(values)
    return float(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]) if s else None


def expected_job(job: str, batches: list[dict[str, Any]], txns: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [b for b in batches if b["job"] == job]
    done = [b for b in mine if b["status"] in ("COMMITTED", "REPLAYED")]
    by_status: dict[str, int] = {}
    for b in mine:
        by_status[b["status"]] = by_status.get(b["status"], 0) + 1
    commits = sorted((t for t in txns if t["job"] == job and t["state"] == "COMMITTED"
                      and t["duration_ms"] is not None), key=lambda t: t["started_at_ms"], reverse=True)[:1000]
    lat = [t["duration_ms"] for t in commits]
    inputs = sum(b["inputs"] for b in done)
    last = max((b["ended_at_ms"] for b in done if b["ended_at_ms"] is not None), default=None)
    first_start = min((b["started_at_ms"] for b in done), default=None)
    span_s = (last - first_start) / 1000 if last is not None and first_start is not None else 0
    return {
        "job": job, "batches": by_status, "total_batches": len(mine), "inputs_committed": inputs,
        "outputs_committed": sum(b["outputs"] for b in done),
        "first_commit_ms": min((b["ended_at_ms"] for b in done if b["ended_at_ms"] is not None), default=None),
        "last_commit_ms": last, "throughput_per_s": round(inputs / span_s, 1) if span_s > 0 else None,
        "commit_p50_ms": nearest_rank(lat, 0.5), "commit_p99_ms": nearest_rank(lat, 0.99),
    }


def test_read_queries_agree_with_their_definitions(url: str) -> None:
    engine = make_engine(url)
    try:
        project(engine, ledger())
        batches, txns, reps = rows(engine, db.batches), rows(engine, db.transactions), rows(engine, db.replays)
        jobs = sorted({b["job"] for b in batches})
        assert jobs == ["a/b", "big", "small"]
        assert sum(t["job"] == "big" and t["state"] == "COMMITTED" for t in txns) > 1000
        assert {b["status"] for b in batches} == {"STARTED", "COMMITTED", "ABORTED", "PARKED", "REPLAYED"}

        want = [expected_job(j, batches, txns) for j in jobs]
        assert queries.all_job_stats(engine) == want
        for w in want:
            assert queries.job_stats(engine, w["job"]) == w
        assert queries.job_stats(engine, "nope") is None and queries.job_detail(engine, "nope", 5) is None

        replay_of = {r["batch_id"]: {k: v for k, v in r.items() if k != "resumes"} for r in reps}  # not served
        newest = sorted(batches, key=lambda b: (b["started_at_ms"], b["batch_id"]), reverse=True)
        for recent in (0, 1, 20):
            got = queries.job_detail(engine, "big", recent)
            assert got is not None
            assert got == {**want[1], "recent_batches": [
                {**b, "replay": replay_of.get(b["batch_id"])} for b in newest if b["job"] == "big"][:recent]}

        parked = [b for b in newest if b["status"] == "PARKED"]
        items, total = queries.list_batches(engine, None, "PARKED", 50, 1)
        assert total == len(parked) and items == [{**b, "replay": replay_of.get(b["batch_id"])} for b in parked[1:51]]
        by_start = sorted(txns, key=lambda t: (t["started_at_ms"], t["txn_id"]), reverse=True)
        since = T0 + 100_000
        page = [t for t in by_start if t["job"] == "big" and t["state"] == "COMMITTED" and t["started_at_ms"] >= since]
        assert queries.list_transactions(engine, "COMMITTED", "big", since, 30, 7) == (page[7:37], len(page))

        for since_ms, until_ms, bucket_ms in ((T0, T0 + 600_000, 10_000), (T0 - 5_000, T0 + 86_400_000, 3_600_000)):
            points = [{"t_ms": since_ms + i * bucket_ms, "OPEN": 0, "COMMITTED": 0, "ABORTED": 0}
                      for i in range(-(-(until_ms - since_ms) // bucket_ms))]
            for t in txns:
                at = t["started_at_ms"] if t["state"] == "OPEN" else t["ended_at_ms"]
                if since_ms <= at < until_ms:
                    points[(at - since_ms) // bucket_ms][t["state"]] += 1
            assert queries.timeseries(engine, since_ms, until_ms, bucket_ms) == points

        bounds = [b * 1000 for b in metrics.LATENCY_BOUNDS_S]
        durations = [t["duration_ms"] for t in txns if t["state"] == "COMMITTED" and t["duration_ms"] is not None]
        with engine.connect() as conn:
            assert queries.latency_histogram(conn, bounds) == (
                [sum(d <= b for d in durations) for b in bounds], len(durations), sum(durations))
            assert queries.count_by(conn, "transactions", "state") == {
                s: sum(t["state"] == s for t in txns) for s in {t["state"] for t in txns}}
    finally:
        engine.dispose()


def test_a_database_of_the_previous_schema_gets_the_new_indexes(url: str) -> None:
    old = create_engine(url)
    db.metadata.create_all(old)  # every table, then back to the previous version's indexes
    with old.begin() as conn:
        for table in db.metadata.sorted_tables:
            for index in table.indexes:
                if index.name not in OLD_INDEXES:
                    conn.execute(text(f"DROP INDEX {index.name}"))
        conn.execute(text("CREATE INDEX ix_batches_job_status ON batches (job, status)"))
        conn.execute(text("CREATE INDEX ix_txns_started ON transactions (started_at_ms)"))
    old.dispose()
    project_on = make_engine(url)
    try:
        project(project_on, ledger()[:200])  # the old database works, and has all indexes now
        declared = {str(ix.name) for t in db.metadata.sorted_tables for ix in t.indexes}
        assert declared - OLD_INDEXES, "this version declares new indexes"
        found = {ix["name"] for t in db.metadata.sorted_tables for ix in inspect(project_on).get_indexes(t.name)}
        assert declared | {"ix_batches_job_status", "ix_txns_started"} <= found
        db.create_indexes(project_on)  # idempotent
        assert queries.all_job_stats(project_on)
    finally:
        project_on.dispose()
