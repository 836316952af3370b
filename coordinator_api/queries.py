"""Read queries over the projected state.

Each function answers from one database connection (one pool checkout). Aggregates are computed
by the database (grouped counts and sums, time-series buckets, the latency histogram), so a
request reads a few rows, not one row per transaction; ``db`` declares the indexes they use.
Statements are built once, with bound parameters for the values (building one costs more CPU
than running it on these tables).
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from typing import Any

from sqlalchemy import Engine, Float, Integer, Select, bindparam, case, cast, func, literal_column, select, union_all
from sqlalchemy.engine import Connection

from txn.delivery.ledger import Kind
from txn.message import MessageId

from . import db

#: A job's commit-latency percentiles cover its latest this many commits.
LATENCY_SAMPLE = 1000
DONE = (Kind.COMMITTED.value, Kind.REPLAYED.value)

_t, _b, _r, _rep = db.transactions, db.batches, db.ledger_records, db.replays


def _dicts(result: Any) -> list[dict[str, Any]]:
    """The rows of ``result`` as dicts (column name -> value); much cheaper than ``Row._asdict()``."""
    keys = list(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result.all()]


def _one(result: Any) -> dict[str, Any] | None:
    """The first row of ``result`` as a dict, or None."""
    rows = _dicts(result)
    return rows[0] if rows else None


@cache
def _page_statements(table_name: str, filters: tuple[str, ...]) -> tuple[Select[Any], Select[Any]]:
    """(count, page) statements over ``table_name`` with the given filters, newest first.

    Parameters: one per filter (``state``, ``status`` and ``job`` by equality, ``since`` as a
    minimal start time), ``limit`` and ``offset``."""
    t, key = (_t, _t.c.txn_id) if table_name == "transactions" else (_b, _b.c.batch_id)
    stmt = select(t)
    count = select(func.count()).select_from(t)  # not of a subquery: that reads every column of every row
    for name in filters:
        cond = t.c.started_at_ms >= bindparam(name) if name == "since" else t.c[name] == bindparam(name)
        stmt, count = stmt.where(cond), count.where(cond)
    page = (stmt.order_by(t.c.started_at_ms.desc(), key.desc())
            .limit(bindparam("limit", type_=Integer)).offset(bindparam("offset", type_=Integer)))
    return count, page


def _page(conn: Connection, table_name: str, filters: dict[str, Any], limit: int,
          offset: int) -> tuple[list[dict[str, Any]], int]:
    count, page = _page_statements(table_name, tuple(filters))
    total = conn.execute(count, filters).scalar_one()
    return _dicts(conn.execute(page, {**filters, "limit": limit, "offset": offset})), total


def list_transactions(engine: Engine, state: str | None, job: str | None, since_ms: int | None, limit: int,
                      offset: int) -> tuple[list[dict[str, Any]], int]:
    """Transactions, newest first, filtered by state, job and start time."""
    filters: dict[str, Any] = {}
    if state:
        filters["state"] = state
    if job:
        filters["job"] = job
    if since_ms is not None:
        filters["since"] = since_ms
    with engine.connect() as conn:
        return _page(conn, "transactions", filters, limit, offset)


#: A transaction id's rows (one per ledger topic holding it, ordered by topic, as for batches), and
#: the row of one (ledger topic, transaction id).
_TXNS_BY_ID = select(_t).where(_t.c.txn_id == bindparam("txn_id")).order_by(_t.c.ledger_topic).limit(20)
_TXN_BY_KEY = _TXNS_BY_ID.where(_t.c.ledger_topic == bindparam("ledger_topic"))
#: A batch id's rows (one per ledger topic holding it; ordered, so an ambiguous id lists its topics
#: the same way every time), and the row of one (ledger topic, batch id).
_BATCHES_BY_ID = select(_b).where(_b.c.batch_id == bindparam("batch_id")).order_by(_b.c.ledger_topic).limit(20)
_BATCH_BY_KEY = _BATCHES_BY_ID.where(_b.c.ledger_topic == bindparam("ledger_topic"))
_RECORD_FILTERS = {"txn_id": (_r.c.txn_id == bindparam("id")) & (_r.c.topic == bindparam("topic")),
                   "batch_id": (_r.c.batch_id == bindparam("id")) & (_r.c.topic == bindparam("topic"))}
#: One page of the records of a transaction or a batch (oldest first; ``limit`` and ``offset``),
#: each with its size, and their number.
_RECORDS = {k: select(_r.c.record, _r.c.topic, _r.c.publish_ms, func.length(_r.c.record)).where(f).order_by(_r.c.id)
            .limit(bindparam("limit", type_=Integer)).offset(bindparam("offset", type_=Integer))
            for k, f in _RECORD_FILTERS.items()}
_RECORD_COUNTS = {k: select(func.count()).select_from(_r).where(f) for k, f in _RECORD_FILTERS.items()}
#: Bytes of records one answer holds at most (the rest: ``records_truncated``, and the next page).
MAX_RECORD_BYTES_PER_ANSWER = 8 * 1024 * 1024
_REPLAYS_OF = select(_rep).where(_rep.c.batch_id.in_(bindparam("ids", expanding=True)))
_REPLAY_FIELDS = [c.name for c in _rep.columns if c.name != "resumes"]


def _txns(conn: Connection, txn_id: str, ledger_topic: str | None) -> list[dict[str, Any]]:
    if ledger_topic is None:
        return _dicts(conn.execute(_TXNS_BY_ID, {"txn_id": txn_id}))
    return _dicts(conn.execute(_TXN_BY_KEY, {"txn_id": txn_id, "ledger_topic": ledger_topic}))


def get_transactions(engine: Engine, txn_id: str, ledger_topic: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``txn_id`` (in ``ledger_topic``, or in every ledger topic, up to 20)."""
    with engine.connect() as conn:
        return _txns(conn, txn_id, ledger_topic)


def _records(conn: Connection, column: str, value: str, topic: str, limit: int = 100,
             offset: int = 0) -> dict[str, Any]:
    """One page of the ledger records whose ``column`` (``txn_id`` or ``batch_id``) is ``value`` in
    ledger ``topic``, oldest first, as JSON objects: ``records``, ``records_total``, ``records_offset``,
    ``records_limit`` and ``records_truncated`` (the page stopped early: its records reached
    :data:`MAX_RECORD_BYTES_PER_ANSWER` bytes; it holds at least one record)."""
    params = {"id": value, "topic": topic}
    total = conn.execute(_RECORD_COUNTS[column], params).scalar_one()
    out: list[dict[str, Any]] = []
    size, truncated = 0, False
    for rec, rec_topic, publish_ms, length in conn.execute(_RECORDS[column],
                                                           {**params, "limit": limit, "offset": offset}):
        size += int(length or 0)
        if out and size > MAX_RECORD_BYTES_PER_ANSWER:
            truncated = True
            break
        d = json.loads(rec)
        d["ledger_topic"] = rec_topic
        d["publish_ms"] = publish_ms
        out.append(d)
    return {"records": out, "records_total": total, "records_offset": offset, "records_limit": limit,
            "records_truncated": truncated}


def transaction_detail(engine: Engine, txn_id: str, ledger_topic: str | None = None, limit: int = 100,
                       offset: int = 0) -> list[dict[str, Any]]:
    """:func:`get_transactions`; if there is exactly one row, with a page of its ledger records
    (``records``..., see :func:`_records`; of its own ledger topic)."""
    with engine.connect() as conn:
        rows = _txns(conn, txn_id, ledger_topic)
        for row in rows[:1] if len(rows) == 1 else []:
            row.update(_records(conn, "txn_id", txn_id, row["ledger_topic"], limit, offset))
    return rows


def _with_replays(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = sorted({r["batch_id"] for r in rows})
    if not ids:
        return rows
    reps = {(r["ledger_topic"], r["batch_id"]): {k: r[k] for k in _REPLAY_FIELDS}
            for r in _dicts(conn.execute(_REPLAYS_OF, {"ids": ids}))}
    for r in rows:
        r["replay"] = reps.get((r["ledger_topic"], r["batch_id"]))
    return rows


def _list_batches(conn: Connection, job: str | None, status: str | None, limit: int,
                  offset: int) -> tuple[list[dict[str, Any]], int]:
    filters: dict[str, Any] = {}
    if job:
        filters["job"] = job
    if status:
        filters["status"] = status
    rows, total = _page(conn, "batches", filters, limit, offset)
    return _with_replays(conn, rows), total


def list_batches(engine: Engine, job: str | None, status: str | None, limit: int,
                 offset: int) -> tuple[list[dict[str, Any]], int]:
    """Batches, newest first, filtered by job and status."""
    with engine.connect() as conn:
        return _list_batches(conn, job, status, limit, offset)


def _batches(conn: Connection, batch_id: str, ledger_topic: str | None) -> list[dict[str, Any]]:
    if ledger_topic is None:
        return _dicts(conn.execute(_BATCHES_BY_ID, {"batch_id": batch_id}))
    return _dicts(conn.execute(_BATCH_BY_KEY, {"batch_id": batch_id, "ledger_topic": ledger_topic}))


def get_batches(engine: Engine, batch_id: str, ledger_topic: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``batch_id`` (in ``ledger_topic``, or in every ledger topic, up to 20), with their replays."""
    with engine.connect() as conn:
        return _with_replays(conn, _batches(conn, batch_id, ledger_topic))


def batch_detail(engine: Engine, batch_id: str, ledger_topic: str | None = None, limit: int = 100,
                 offset: int = 0) -> list[dict[str, Any]]:
    """:func:`get_batches`; if there is exactly one row, with a page of its ledger records
    (``records``..., see :func:`_records`)."""
    with engine.connect() as conn:
        rows = _with_replays(conn, _batches(conn, batch_id, ledger_topic))
        for row in rows[:1] if len(rows) == 1 else []:
            row.update(_records(conn, "batch_id", batch_id, row["ledger_topic"], limit, offset))
    return rows


def list_quarantine(engine: Engine, topic: str | None, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Quarantined ledger messages, newest first (optionally of one ledger topic)."""
    q = db.quarantine
    stmt = select(q)
    if topic:
        stmt = stmt.where(q.c.topic == topic)
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()
        rows = _dicts(conn.execute(stmt.order_by(q.c.id.desc()).limit(limit).offset(offset)))
    for r in rows:
        raw = r.pop("raw")
        r["raw"] = bytes(raw).decode("utf-8", "backslashreplace")
        r["raw_truncated"] = len(raw) < r["size"]
        r["message_id"] = str(MessageId(ledger_id=r.pop("msg_ledger"), entry_id=r.pop("msg_entry"),
                                        partition=r.pop("msg_partition"), batch_index=r.pop("msg_batch")))
    return rows, total


def _percentile(counts: list[tuple[int, int]], q: float) -> float | None:
    """The ``q`` quantile (nearest rank, as ``sorted(values)[round(q * (n - 1))]``) of the values
    given as ascending (value, how many) pairs."""
    n = sum(k for _, k in counts)
    if not n:
        return None
    i = min(n - 1, max(0, round(q * (n - 1))))
    seen = 0
    for value, k in counts:
        seen += k
        if i < seen:
            return float(value)
    raise AssertionError("unreachable: i < n")  # pragma: no cover


#: Batches by job and status, with the volumes and times the stats need: read from the covering
#: index ``ix_batches_job_status_totals`` (all jobs, or one with the ``job`` parameter).
_JOB_GROUPS = (select(_b.c.job, _b.c.status, func.count(), func.sum(_b.c.inputs), func.sum(_b.c.outputs),
                      func.min(_b.c.ended_at_ms), func.max(_b.c.ended_at_ms), func.min(_b.c.started_at_ms))
               .group_by(_b.c.job, _b.c.status).order_by(_b.c.job, _b.c.status))
_ONE_JOB_GROUPS = _JOB_GROUPS.where(_b.c.job == bindparam("job"))
#: The durations of one job's latest commits (newest first; ``txn_id`` breaks ties, so the sample
#: is well defined; from the covering index ``ix_txns_job_state_started``) as ascending
#: (duration, how many) pairs: fewer rows to read than one per commit.
_recent_commits = (select(_t.c.duration_ms)
                   .where(_t.c.job == bindparam("job"), _t.c.state == "COMMITTED", _t.c.duration_ms.is_not(None))
                   .order_by(_t.c.started_at_ms.desc(), _t.c.txn_id.desc()).limit(LATENCY_SAMPLE).subquery())
_LATENCIES = (select(_recent_commits.c.duration_ms, func.count()).group_by(_recent_commits.c.duration_ms)
              .order_by(_recent_commits.c.duration_ms))


def _job_stats(conn: Connection, job: str | None) -> list[dict[str, Any]]:
    """Stats of ``job``, or of every job (by name) if None: one grouped query, then one latency
    sample per job."""
    rows = conn.execute(_JOB_GROUPS).all() if job is None else conn.execute(_ONE_JOB_GROUPS, {"job": job}).all()
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(row[0], []).append(row[1:])
    out = []
    for j, by in groups.items():
        by_status = {status: int(n) for status, n, *_ in by}
        done = [g for g in by if g[0] in DONE]
        inputs = sum(int(g[2]) for g in done)
        outputs = sum(int(g[3]) for g in done)
        first = min((g[4] for g in done if g[4] is not None), default=None)
        last = max((g[5] for g in done if g[5] is not None), default=None)
        first_start = min((g[6] for g in done if g[6] is not None), default=None)
        lat = [(d, int(k)) for d, k in conn.execute(_LATENCIES, {"job": j}).all()]
        span_s = (last - first_start) / 1000 if last is not None and first_start is not None else 0
        out.append({
            "job": j, "batches": by_status, "total_batches": sum(by_status.values()),
            "inputs_committed": inputs, "outputs_committed": outputs,
            "first_commit_ms": first, "last_commit_ms": last,
            "throughput_per_s": round(inputs / span_s, 1) if span_s > 0 else None,
            "commit_p50_ms": _percentile(lat, 0.5), "commit_p99_ms": _percentile(lat, 0.99),
        })
    return out


def all_job_stats(engine: Engine) -> list[dict[str, Any]]:
    """:func:`job_stats` of every job with at least one batch, by job name."""
    with engine.connect() as conn:
        return _job_stats(conn, None)


def job_stats(engine: Engine, job: str) -> dict[str, Any] | None:
    """Counts by status, committed volumes, throughput, last commit and commit latency of ``job``
    (latency percentiles over its latest 1000 commits); None if it has no batches."""
    with engine.connect() as conn:
        found = _job_stats(conn, job)
    return found[0] if found else None


def job_detail(engine: Engine, job: str, recent: int) -> dict[str, Any] | None:
    """:func:`job_stats` of ``job`` with its latest ``recent`` batches (``recent_batches``), or None."""
    with engine.connect() as conn:
        found = _job_stats(conn, job)
        if not found:
            return None
        _, page = _page_statements("batches", ("job",))  # the latest batches; their count is not needed
        items = _with_replays(conn, _dicts(conn.execute(page, {"job": job, "limit": recent, "offset": 0}))) \
            if recent else []
    return {**found[0], "recent_batches": items}


def _bucket(column: Any) -> Any:
    """``column``'s bucket number: (column - since) / bucket, an integer division (both operands are integers)."""
    return ((column - bindparam("since", type_=column.type)) // bindparam("bucket", type_=column.type)).label("bucket")


def _in_window(column: Any) -> Any:
    return (column >= bindparam("since", type_=column.type)) & (column < bindparam("until", type_=column.type))


#: What the time series counts per bucket: (state, the time that places it in a bucket).
_SERIES = (("COMMITTED", _t.c.ended_at_ms), ("ABORTED", _t.c.ended_at_ms), ("OPEN", _t.c.started_at_ms))


def _series_part(i: int) -> Select[Any]:
    """Transactions in state ``_SERIES[i]`` per bucket, as (i, bucket, count); one state per part,
    so each is one range of ``ix_txns_state_ended`` or ``ix_txns_state_started``.

    Bucket numbers are computed in a subquery and grouped by its column: a grouped expression with
    bound parameters would not match its copy in the select list on PostgreSQL."""
    state, column = _SERIES[i]
    sub = select(_bucket(column)).where(_t.c.state == state, _in_window(column)).subquery()
    return select(literal_column(str(i)).label("series"), sub.c.bucket, func.count()).group_by(sub.c.bucket)


_SERIES_BY_BUCKET = union_all(*(_series_part(i) for i in range(len(_SERIES))))


def timeseries(engine: Engine, since_ms: int, until_ms: int, bucket_ms: int) -> list[dict[str, Any]]:
    """Per bucket: transactions that committed / aborted in it (by end time) and that are open and
    started in it."""
    n = max(1, (until_ms - since_ms + bucket_ms - 1) // bucket_ms)
    points = [{"t_ms": since_ms + i * bucket_ms, "OPEN": 0, "COMMITTED": 0, "ABORTED": 0} for i in range(n)]
    with engine.connect() as conn:
        rows = conn.execute(_SERIES_BY_BUCKET, {"since": since_ms, "until": until_ms, "bucket": bucket_ms}).all()
    for series, i, k in rows:
        points[i][_SERIES[series][0]] += k
    return points


@cache
def _count_statement(table_name: str, column_name: str) -> Select[Any]:
    column = db.metadata.tables[table_name].c[column_name]
    return select(column, func.count()).group_by(column)


def count_by(conn: Connection, table_name: str, column_name: str) -> dict[str, int]:
    """Value of ``column_name`` -> number of rows of ``table_name``."""
    return {k: int(v) for k, v in conn.execute(_count_statement(table_name, column_name)).all()}


@lru_cache(maxsize=8)
def _histogram_statement(bounds_ms: tuple[float, ...]) -> Select[Any]:
    """Committed transactions by latency bucket (the index of the first bound >= the duration; one
    past the last bound above them all): count and summed duration."""
    bucket = case(*((_t.c.duration_ms <= b, i) for i, b in enumerate(bounds_ms)), else_=len(bounds_ms))
    sub = (select(bucket.label("bucket"), _t.c.duration_ms)
           .where(_t.c.state == "COMMITTED", _t.c.duration_ms.is_not(None)).subquery())
    # Summed as floating point: two durations near 2^63 ms (a record may claim one) overflow an integer sum.
    return select(sub.c.bucket, func.count(), func.sum(cast(sub.c.duration_ms, Float))).group_by(sub.c.bucket)


def latency_histogram(conn: Connection, bounds_ms: list[float]) -> tuple[list[int], int, int]:
    """Cumulative counts of committed transactions with duration <= each bound (``bounds_ms``
    ascending), the count, and the sum (ms)."""
    per = [0] * (len(bounds_ms) + 1)
    total_ms = 0
    for i, k, s in conn.execute(_histogram_statement(tuple(bounds_ms))).all():
        per[i] += int(k)
        total_ms += int(s or 0)
    cum, acc = [], 0
    for k in per[:-1]:
        acc += k
        cum.append(acc)
    return cum, acc + per[-1], total_ms
