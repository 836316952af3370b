"""Kill the API mid-projection (SIGKILL twice, then a clean restart): no gaps, no double counts.

A ledger topic gets a known history, written by our producer with client batching (so resume
positions fall inside batch entries): ``BATCHES`` batches, each STARTED + COMMITTED with 3
inputs and 3 outputs; every 10th batch first has an attempt that ABORTED. The API projects it
in small chunks and is SIGKILLed after some of it, twice, then stopped and started once more.
The database must then hold every record exactly once and the exact derived state.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

import txn
from coordinator_api import db
from coordinator_api.engine import make_engine
from txn.admin import create_namespace
from txn.delivery.ledger import LedgerRecord, default_ledger_topic

from api_server import ApiServer

BATCHES = 600


def write_history(broker: Any, ledger: str) -> int:
    """The ledger's records; returns how many were written."""
    c = txn.Client(broker.service_url)
    p = c.create_producer(ledger, batching_enabled=True, batching_max_messages=50, batching_max_publish_delay_ms=5,
                          block_if_queue_full=True)
    n = 0
    t0 = 1_700_000_000_000
    for i in range(BATCHES):
        bid = f"hist:{i}"
        inputs = {"persistent://public/x/in": [f"(1,{3 * i + k},-1,-1)" for k in range(3)]}
        recs = []
        attempt = 1
        if i % 10 == 0:
            recs += [LedgerRecord(kind="STARTED", job="hist", batch_id=bid, txn_id=f"(1,{i})", attempt=1, inputs=inputs,
                                  started_at_ms=t0 + i),
                     LedgerRecord(kind="ABORTED", job="hist", batch_id=bid, txn_id=f"(1,{i})", attempt=1, inputs=inputs,
                                  started_at_ms=t0 + i, ended_at_ms=t0 + i + 5, error="boom")]
            attempt = 2
        recs += [LedgerRecord(kind="STARTED", job="hist", batch_id=bid, txn_id=f"(0,{i})", attempt=attempt,
                              inputs=inputs, started_at_ms=t0 + i),
                 LedgerRecord(kind="COMMITTED", job="hist", batch_id=bid, txn_id=f"(0,{i})", attempt=attempt,
                              inputs=inputs, outputs={"persistent://public/x/out": 3}, started_at_ms=t0 + i,
                              ended_at_ms=t0 + i + 7)]
        for r in recs:
            p.send_async(r.to_json(), None, partition_key=bid)
            n += 1
    p.flush()
    c.close()
    return n


def counts(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        def one(stmt: Any) -> int:
            return int(conn.execute(stmt).scalar_one())
        r, b, t = db.ledger_records, db.batches, db.transactions
        return {
            "records": one(select(func.count()).select_from(r)),
            "positions": one(select(func.count()).select_from(
                select(r.c.msg_ledger, r.c.msg_entry, r.c.msg_batch).distinct().subquery())),
            "batches": one(select(func.count()).select_from(b)),
            "committed_batches": one(select(func.count()).select_from(b).where(b.c.status == "COMMITTED")),
            "retried_batches": one(select(func.count()).select_from(b).where(b.c.attempts == 2)),
            "inputs": one(select(func.coalesce(func.sum(b.c.inputs), 0))),
            "outputs": one(select(func.coalesce(func.sum(b.c.outputs), 0))),
            "committed_txns": one(select(func.count()).select_from(t).where(t.c.state == "COMMITTED")),
            "aborted_txns": one(select(func.count()).select_from(t).where(t.c.state == "ABORTED")),
        }


@pytest.mark.timeout(600)
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_restart_mid_projection(broker: Any, tmp_path: Path, request: pytest.FixtureRequest, database: str) -> None:
    ns = f"public/proj-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    total = write_history(broker, ledger)
    assert total == BATCHES * 2 + (BATCHES // 10) * 2
    if database == "sqlite":
        url = f"sqlite:///{tmp_path}/api.db"
    else:
        url = request.getfixturevalue("pg_url").replace("postgresql://", "postgresql+psycopg://", 1)
        with make_engine(url).begin() as conn:  # the session's database may hold other tests' tables
            for table in reversed(db.metadata.sorted_tables):
                conn.execute(table.delete())
    engine = make_engine(url)
    server = ApiServer(broker, url, tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_PROJECTION_BATCH": "10"})
    kills_at = []
    for fraction in (0.25, 0.6):
        server.start()
        deadline = time.monotonic() + 120
        while counts(engine)["records"] < fraction * total:
            assert time.monotonic() < deadline, f"projection stalled at {counts(engine)}"
            time.sleep(0.05)
        server.kill()
        kills_at.append(counts(engine)["records"])
    assert kills_at[0] < kills_at[1] < total, kills_at  # both kills really were mid-projection
    server.start()
    deadline = time.monotonic() + 180
    while counts(engine)["records"] < total:
        assert time.monotonic() < deadline, f"projection did not finish: {counts(engine)}"
        time.sleep(0.2)
    server.stop()
    server.start()  # a clean restart resumes at the end: nothing more, nothing twice
    time.sleep(3)
    got = counts(engine)
    server.stop()
    assert got == {
        "records": total, "positions": total, "batches": BATCHES, "committed_batches": BATCHES,
        "retried_batches": BATCHES // 10, "inputs": 3 * BATCHES, "outputs": 3 * BATCHES,
        "committed_txns": BATCHES, "aborted_txns": BATCHES // 10,
    }, (got, kills_at)
