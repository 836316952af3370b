"""Prometheus metrics, computed from the database at scrape time (so every replica agrees and a
restart loses nothing), plus each job's subscription backlog from the broker's admin API.

Every series is named ``pulsartxn_*``, never ``pulsar_txn_*`` (the broker's own transaction
series); running totals are counters ending ``_total``; per-job series carry a ``pipeline`` label,
the pulsar-txn job's name. (It was called ``job`` before; Prometheus sets ``job`` to the scrape
job's name, so keeping ours needed ``honor_labels``.)

=============================================  =========  =====================================================
series                                         type       what
=============================================  =========  =====================================================
``pulsartxn_transactions_total``               counter    ended transactions by ``pipeline``, ``state``
                                                          (COMMITTED, ABORTED); parking and replays included
``pulsartxn_open_transactions``                gauge      transactions the ledger shows open, by ``pipeline``
``pulsartxn_batches``                          gauge      batches by ``pipeline`` and current ``status``
``pulsartxn_committed_messages_total``         counter    inputs of committed (or replayed) batches
``pulsartxn_committed_outputs_total``          counter    outputs of committed (or replayed) batches
``pulsartxn_commit_latency_seconds``           histogram  open-to-commit time of committed transactions
``pulsartxn_last_commit_timestamp_seconds``    gauge      end time of the job's last committed batch
``pulsartxn_seconds_since_last_commit``        gauge      now minus that
``pulsartxn_subscription_backlog_messages``    gauge      backlog of the job's subscription per input topic
                                                          (``pipeline``, ``topic``, ``subscription``)
``pulsartxn_replays``                          gauge      replays requested over REST by ``status``
``pulsartxn_quarantined_records_total``        counter    ledger messages quarantined by the projection
``pulsartxn_projected_records_total``          counter    ledger records projected by this process
=============================================  =========  =====================================================

The backlog: a job's inputs and subscription come from its latest STARTED record (the processor
and the Spark runtime write them in the record's ``config``); the topic stats are read by
:class:`Backlogs` in the background, every :data:`BACKLOG_TTL_S` seconds, with at most a fixed
number of admin calls per refresh whatever the records say (so records cannot make a scrape, or
the broker, slow), for at most :data:`MAX_BACKLOG_JOBS` jobs of :data:`MAX_BACKLOG_TOPICS` inputs.
A scrape is computed within a time budget (:class:`MetricsService`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, Float, case, cast, func, select

from txn.delivery.ledger import KINDS, Kind

from . import db, queries
from .live import Live, LiveError

PREFIX = "pulsartxn"
#: Commit-latency histogram bounds in seconds (ascending).
LATENCY_BOUNDS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
TXN_STATES = ("OPEN", "COMMITTED", "ABORTED")
BATCH_STATUSES = KINDS  # a batch's status is the kind of its deciding record
REPLAY_STATUSES = ("accepted", "running", "succeeded", "noop", "failed")
DONE = (Kind.COMMITTED.value, Kind.REPLAYED.value)
BACKLOG_TTL_S = 15.0
MAX_BACKLOG_JOBS = 100
MAX_BACKLOG_TOPICS = 64
#: A scrape starts a backlog refresh if the last is older than this, and waits for it at most so long.
SCRAPE_REFRESH_S = 1.0
SCRAPE_WAIT_S = 0.5
#: Every series this module exports (the dashboard test checks its queries against these).
METRIC_NAMES = tuple(f"{PREFIX}_{n}" for n in (
    "transactions_total", "open_transactions", "batches", "committed_messages_total", "committed_outputs_total",
    "commit_latency_seconds", "last_commit_timestamp_seconds", "seconds_since_last_commit",
    "subscription_backlog_messages", "replays", "quarantined_records_total", "projected_records_total"))

_b, _t, _r = db.batches, db.transactions, db.ledger_records
_TXNS_BY_JOB = select(_t.c.job, _t.c.state, func.count()).group_by(_t.c.job, _t.c.state)
_BATCHES_BY_JOB = (select(_b.c.job, _b.c.status, func.count(), func.sum(_b.c.inputs), func.sum(_b.c.outputs),
                          func.max(_b.c.ended_at_ms))
                   .group_by(_b.c.job, _b.c.status))
_bucket = case(*((_t.c.duration_ms <= b * 1000, i) for i, b in enumerate(LATENCY_BOUNDS_S)),
               else_=len(LATENCY_BOUNDS_S)).label("bucket")
_lat = select(_t.c.job, _bucket, _t.c.duration_ms).where(_t.c.state == "COMMITTED",
                                                         _t.c.duration_ms.is_not(None)).subquery()
#: Durations are summed as floating point: a record may claim a duration near 2^63 ms, and an
#: integer sum of two of them would overflow (the histogram's sum is in seconds, a float anyway).
_LATENCY_BY_JOB = select(_lat.c.job, _lat.c.bucket, func.count(), func.sum(cast(_lat.c.duration_ms, Float))).group_by(
    _lat.c.job, _lat.c.bucket)
_LATEST_STARTED = (select(_r.c.job, func.max(_r.c.id)).where(_r.c.kind == Kind.STARTED.value).group_by(_r.c.job)
                   .limit(MAX_BACKLOG_JOBS))


class Backlogs:
    """Each job's subscription backlog per input, read from the admin API in the background.

    The jobs, their subscription and inputs come from the ledger (each job's latest STARTED
    record), so anyone who can write the ledger decides how many (job, topic) pairs there are. The
    admin calls therefore do not depend on them: a :meth:`refresh` makes at most
    ``calls_per_refresh`` admin calls within ``budget_s``, taking the pairs in turn from where the
    previous refresh stopped (so every pair is read again eventually), and keeps each pair's last
    value; at most :data:`MAX_BACKLOG_JOBS` jobs and :data:`MAX_BACKLOG_TOPICS` inputs per job are
    tracked. A scrape only reads the values (:meth:`values`)."""

    def __init__(self, calls_per_refresh: int = 32, budget_s: float = 2.0) -> None:
        self.calls_per_refresh = calls_per_refresh
        self.budget_s = budget_s
        self.last_calls = 0  # admin calls of the latest refresh
        self.errors = 0
        self.refreshed_at = float("-inf")
        self._values: dict[tuple[str, str, str], int] = {}  # (job, subscription, topic) -> backlog
        self._cursor = 0
        self._lock = threading.Lock()

    @staticmethod
    def pairs(engine: Engine) -> list[tuple[str, str, str]]:
        """(job, subscription, topic) from each job's latest STARTED record, bounded, sorted."""
        with engine.connect() as conn:
            ids = [i for _, i in conn.execute(_LATEST_STARTED).all()]
            rows = conn.execute(select(_r.c.job, _r.c.record).where(_r.c.id.in_(ids))).all() if ids else []
        found = set()
        for job, raw in rows:
            try:
                config = json.loads(raw).get("config") or {}
            except (ValueError, AttributeError):
                continue
            sub, inputs = config.get("subscription"), config.get("inputs")
            if isinstance(sub, str) and isinstance(inputs, list):
                found.update((job, sub, t) for t in inputs[:MAX_BACKLOG_TOPICS] if isinstance(t, str))
        return sorted(found)

    def refresh(self, engine: Engine, live: Live) -> int:
        """Read backlogs within the call and time budgets; returns the admin calls made."""
        with self._lock:
            pairs = self.pairs(engine)
            keep = set(pairs)
            self._values = {k: v for k, v in self._values.items() if k in keep}
            calls, done, start = 0, 0, time.monotonic()
            n = len(pairs)
            while done < n and calls < self.calls_per_refresh and time.monotonic() - start < self.budget_s:
                key = pairs[(self._cursor + done) % n]
                done += 1
                try:
                    value, used = live.subscription_backlog(key[2], key[1])
                except ValueError:  # a topic name this version cannot parse
                    continue
                except LiveError:
                    self.errors += 1
                    calls += 1
                    continue
                calls += used
                if value is None:
                    self._values.pop(key, None)
                else:
                    self._values[key] = value
            self._cursor = (self._cursor + done) % n if n else 0
            self.last_calls, self.refreshed_at = calls, time.monotonic()
            return calls

    def values(self) -> dict[str, tuple[str, dict[str, int]]]:
        """Job -> (subscription, topic -> backlog), as last read."""
        out: dict[str, tuple[str, dict[str, int]]] = {}
        for (job, sub, topic), n in sorted(self._values.items()):
            out.setdefault(job, (sub, {}))[1][topic] = n
        return out


class StateCollector(Collector):
    """Transactions, batches, volumes, commit latency and last commit per job; replays; quarantine;
    the projection's progress; each job's backlog (with ``live``)."""

    def __init__(self, engine: Engine, projector: Any = None, backlogs: Backlogs | None = None) -> None:
        self.engine = engine
        self.projector = projector
        self.backlogs = backlogs

    def collect(self) -> Iterator[Any]:
        with self.engine.connect() as conn:  # one connection; every figure read in it
            txns = conn.execute(_TXNS_BY_JOB).all()
            batches = conn.execute(_BATCHES_BY_JOB).all()
            latency = conn.execute(_LATENCY_BY_JOB).all()
            reps = queries.count_by(conn, "replays", "status")
            quarantined = queries.count_by(conn, "quarantine", "topic")
        now = time.time()
        jobs = sorted({r[0] for r in txns} | {r[0] for r in batches})
        ended = CounterMetricFamily(f"{PREFIX}_transactions", "Ended transactions in the ledger by job and state",
                                    labels=["pipeline", "state"])
        open_ = GaugeMetricFamily(f"{PREFIX}_open_transactions", "Transactions the ledger shows open, by job",
                                  labels=["pipeline"])
        by_job_state = {(j, s): int(n) for j, s, n in txns}
        for j in jobs:
            for s in ("COMMITTED", "ABORTED"):
                ended.add_metric([j, s], by_job_state.get((j, s), 0))
            open_.add_metric([j], by_job_state.get((j, "OPEN"), 0))
        yield ended
        yield open_
        g = GaugeMetricFamily(f"{PREFIX}_batches", "Batches by job and current status", labels=["pipeline", "status"])
        msgs = CounterMetricFamily(f"{PREFIX}_committed_messages", "Inputs of committed or replayed batches",
                                   labels=["pipeline"])
        outs = CounterMetricFamily(f"{PREFIX}_committed_outputs", "Outputs of committed or replayed batches",
                                   labels=["pipeline"])
        last_ts = GaugeMetricFamily(f"{PREFIX}_last_commit_timestamp_seconds",
                                    "End time of the job's last committed batch", labels=["pipeline"])
        since = GaugeMetricFamily(f"{PREFIX}_seconds_since_last_commit",
                                  "Seconds since the job's last committed batch", labels=["pipeline"])
        per: dict[str, dict[str, Any]] = {}
        for j, status, n, ins, outputs, last in batches:
            p = per.setdefault(j, {"status": {}, "in": 0, "out": 0, "last": None})
            p["status"][status] = int(n)
            if status in DONE:
                p["in"] += int(ins or 0)
                p["out"] += int(outputs or 0)
                if last is not None and status == Kind.COMMITTED.value:
                    p["last"] = max(p["last"] or 0, int(last))
        for j in jobs:
            p = per.get(j, {"status": {}, "in": 0, "out": 0, "last": None})
            for s in BATCH_STATUSES:
                g.add_metric([j, s], p["status"].get(s, 0))
            msgs.add_metric([j], p["in"])
            outs.add_metric([j], p["out"])
            if p["last"] is not None:
                last_ts.add_metric([j], p["last"] / 1000)
                since.add_metric([j], max(0.0, now - p["last"] / 1000))
        yield from (g, msgs, outs, last_ts, since)
        h = HistogramMetricFamily(f"{PREFIX}_commit_latency_seconds",
                                  "Open-to-commit time of committed transactions", labels=["pipeline"])
        lat: dict[str, tuple[list[int], list[float]]] = {}
        for j, bucket, n, total_ms in latency:
            per_bucket, total = lat.setdefault(j, ([0] * (len(LATENCY_BOUNDS_S) + 1), [0.0]))
            per_bucket[int(bucket)] += int(n)
            total[0] += float(total_ms or 0)
        for j in jobs:
            per_bucket, total = lat.get(j, ([0] * (len(LATENCY_BOUNDS_S) + 1), [0.0]))
            cum, acc = [], 0
            for b, k in zip(LATENCY_BOUNDS_S, per_bucket, strict=False):
                acc += k
                cum.append((repr(b), acc))
            h.add_metric([j], [*cum, ("+Inf", sum(per_bucket))], total[0] / 1000)
        yield h
        if self.backlogs is not None:
            bl = GaugeMetricFamily(f"{PREFIX}_subscription_backlog_messages",
                                   "Backlog of the job's subscription per input topic (admin API, read in the "
                                   "background)", labels=["pipeline", "topic", "subscription"])
            for j, (sub, values) in self.backlogs.values().items():
                for topic, n in sorted(values.items()):
                    bl.add_metric([j, topic, sub], n)
            yield bl
        g = GaugeMetricFamily(f"{PREFIX}_replays", "Replays requested over REST by status", labels=["status"])
        for s in REPLAY_STATUSES:
            g.add_metric([s], reps.get(s, 0))
        yield g
        c = CounterMetricFamily(f"{PREFIX}_quarantined_records",
                                "Ledger messages quarantined by the projection (invalid, or refused by the database)",
                                labels=["topic"])
        for topic, n in sorted(quarantined.items()):
            c.add_metric([topic], n)
        yield c
        if self.projector is not None:
            c = CounterMetricFamily(f"{PREFIX}_projected_records", "Ledger records projected by this process",
                                    labels=["topic"])
            for st in list(self.projector.status.values()):
                c.add_metric([st.topic], st.records)
            yield c


def render(engine: Engine, projector: Any = None, backlogs: Backlogs | None = None) -> bytes:
    """The Prometheus text exposition of the current state (with ``backlogs``: also their last values)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StateCollector(engine, projector, backlogs))
    return generate_latest(reg)


class MetricsService:
    """``GET /metrics`` within a time budget: one computation at a time, shared by concurrent
    scrapes; a scrape waits for it at most ``scrape_budget_s``, then answers the last complete
    snapshot (None before the first: the API answers 503). The backlogs are refreshed in the
    background every ``backlog_interval_s``; a scrape also starts a refresh if the last one is
    older than :data:`SCRAPE_REFRESH_S` and waits for it at most :data:`SCRAPE_WAIT_S` (then it
    shows the values read before). Each refresh is bounded in calls and time (:class:`Backlogs`),
    and there is never more than one at a time."""

    def __init__(self, engine: Engine, projector: Any, live: Live | None, *, scrape_budget_s: float = 5.0,
                 backlog_interval_s: float = BACKLOG_TTL_S, backlog_calls: int = 32,
                 backlog_budget_s: float = 2.0) -> None:
        self.engine = engine
        self.projector = projector
        self.live = live
        self.scrape_budget_s = scrape_budget_s
        self.backlog_interval_s = backlog_interval_s
        self.backlogs = Backlogs(backlog_calls, backlog_budget_s) if live is not None else None
        self.last: bytes | None = None
        self._render: asyncio.Future[bytes] | None = None
        self._refresh: asyncio.Future[int] | None = None

    def _refresh_backlogs(self, older_than_s: float) -> asyncio.Future[int] | None:
        if self.backlogs is None or self.live is None:
            return None
        stale = time.monotonic() - self.backlogs.refreshed_at >= older_than_s
        if (self._refresh is None or self._refresh.done()) and stale:
            self._refresh = asyncio.ensure_future(asyncio.to_thread(self.backlogs.refresh, self.engine, self.live))
            self._refresh.add_done_callback(lambda f: f.cancelled() or f.exception())  # errors: counted, not raised
        return self._refresh

    async def scrape(self) -> bytes | None:
        """The exposition, fresh if it can be computed within the budget, else the last one."""
        deadline = time.monotonic() + self.scrape_budget_s
        refresh = self._refresh_backlogs(SCRAPE_REFRESH_S)
        if refresh is not None and not refresh.done():
            await asyncio.wait([refresh], timeout=min(SCRAPE_WAIT_S, self.scrape_budget_s / 2))
        if self._render is None or self._render.done():
            self._render = asyncio.ensure_future(asyncio.to_thread(render, self.engine, self.projector,
                                                                   self.backlogs))
            self._render.add_done_callback(self._keep)
        try:
            return await asyncio.wait_for(asyncio.shield(self._render), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return self.last

    def _keep(self, fut: asyncio.Future[bytes]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.last = fut.result()

    async def run(self) -> None:
        """Refresh the backlogs every ``backlog_interval_s`` (a background task)."""
        while True:  # the first refresh is a scrape's, or one interval after the start
            await asyncio.sleep(self.backlog_interval_s)
            refresh = self._refresh_backlogs(self.backlog_interval_s)
            if refresh is not None:
                await asyncio.wait([refresh])
