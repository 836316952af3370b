"""Prometheus metrics, computed from the database at scrape time (so every replica agrees and a
restart loses nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from txn.delivery.ledger import KINDS

from . import queries

#: Commit-latency histogram bounds in seconds (ascending).
LATENCY_BOUNDS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
TXN_STATES = ("OPEN", "COMMITTED", "ABORTED")
BATCH_STATUSES = KINDS  # a batch's status is the kind of its deciding record
REPLAY_STATUSES = ("accepted", "running", "succeeded", "noop", "failed")


class StateCollector(Collector):
    """Transactions by state, batches by status, replays by status, commit latency."""

    def __init__(self, engine: Engine, projector: Any = None) -> None:
        self.engine = engine
        self.projector = projector

    def collect(self) -> Iterator[Any]:
        with self.engine.connect() as conn:  # one connection; every figure read in it
            by_state = queries.count_by(conn, "transactions", "state")
            by_status = queries.count_by(conn, "batches", "status")
            reps = queries.count_by(conn, "replays", "status")
            quarantined = queries.count_by(conn, "quarantine", "topic")
            cum, count, total_ms = queries.latency_histogram(conn, [b * 1000 for b in LATENCY_BOUNDS_S])
        g = GaugeMetricFamily("pulsar_txn_transactions", "Transactions in the ledger by state", labels=["state"])
        for s in TXN_STATES:
            g.add_metric([s], by_state.get(s, 0))
        yield g
        g = GaugeMetricFamily("pulsar_txn_batches", "Batches by status", labels=["status"])
        for s in BATCH_STATUSES:
            g.add_metric([s], by_status.get(s, 0))
        yield g
        g = GaugeMetricFamily("pulsar_txn_replays", "Replays requested over REST by status", labels=["status"])
        for s in REPLAY_STATUSES:
            g.add_metric([s], reps.get(s, 0))
        yield g
        g = GaugeMetricFamily("pulsar_txn_quarantined_records",
                              "Ledger messages quarantined by the projection (invalid, or refused by the database)",
                              labels=["topic"])
        for topic, n in sorted(quarantined.items()):
            g.add_metric([topic], n)
        yield g
        h = HistogramMetricFamily("pulsar_txn_commit_latency_seconds",
                                  "Open-to-commit time of committed transactions")
        buckets = [(repr(b), c) for b, c in zip(LATENCY_BOUNDS_S, cum, strict=True)] + [("+Inf", count)]
        h.add_metric([], buckets, total_ms / 1000)
        yield h
        if self.projector is not None:
            c = CounterMetricFamily("pulsar_txn_projected_records", "Ledger records projected by this process",
                                    labels=["topic"])
            for st in list(self.projector.status.values()):
                c.add_metric([st.topic], st.records)
            yield c


def render(engine: Engine, projector: Any = None) -> bytes:
    """The Prometheus text exposition of the current state."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(engine, projector))
    return generate_latest(reg)
