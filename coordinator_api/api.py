"""REST routes: liveness, readiness, health, transactions, coordinators, jobs, batches, replays,
quarantine, metrics.

Only the probes, ``/livez`` and ``/readyz``, are open whatever the settings; with
``read_requires_token`` everything else needs the token. Texts of errors (in /health, in logs)
never hold record contents or SQL parameters.

A batch is identified by (ledger topic, batch id): ``GET /batches/{id}`` and ``POST
/batches/{id}/replay`` take ``?ledger_topic=``, needed only when that id is in several ledger
topics (409 then, listing them).

Batch ids, job names and replay ids are free-form and may contain '/': the server decodes
``%2F`` before routing, so these parameters use Starlette's ``path`` converter and take the rest
of the path. Only one route has a sub-route under such a parameter, ``POST /batches/{id}/replay``,
and it differs by method from ``GET /batches/{id}``: a GET takes the whole rest of the path as
the id (so ``GET /batches/a/replay`` is batch ``a/replay``), a POST takes everything before the
final ``/replay`` (so ``POST /batches/a/replay/replay`` replays batch ``a/replay``).

- Starlette prefers a route matching path and method over one matching the path only, so which
  handler runs does not depend on registration order. A 405 for another method does (its
  ``Allow`` comes from the first route whose path matches), so ``writes`` is registered before
  ``reads`` (see app.py): the more specific route first.
- Decoding loses the difference between ``%2F`` and ``/``, so the replay route also checks the
  path as sent: its ``/replay`` must be literal. A POST to a batch itself
  (``POST /batches/a%2Freplay``) is a 405, not a replay of batch ``a``.
- Never add a GET (or other same-method) sub-route under a ``:path`` parameter: ids ending in
  its suffix would become ambiguous.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from sqlalchemy import text

from txn.delivery.ledger import now_ms
from txn.errors import PulsarError, TransactionNotFound
from txn.message import TxnID

from . import metrics, queries
from .auth import require_read, require_write
from .core import Core
from .live import LiveError
from .models import (
    AbortResult,
    Alive,
    Batch,
    BatchDetail,
    BatchStatus,
    Component,
    Coordinators,
    Error,
    Health,
    Job,
    JobDetail,
    LiveTxn,
    Page,
    Quarantined,
    Ready,
    Replay,
    TimeSeries,
    Transaction,
    TransactionDetail,
    TxnState,
)
from .replays import NotReplayable
from .sanitize import describe

MAX_BUCKETS = 2000
router = APIRouter()
reads = APIRouter(dependencies=[Depends(require_read)])
writes = APIRouter(dependencies=[Depends(require_write)])

#: Validation errors are ``{"detail": "<what was wrong>"}`` too (see app.py's handler).
INVALID: dict[int | str, dict[str, Any]] = {422: {"model": Error}}
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": Error}, 403: {"model": Error}, **INVALID}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Error}}
BAD_ID: dict[int | str, dict[str, Any]] = {400: {"model": Error}}

Limit = Annotated[int, Query(ge=1, le=1000, description="page size")]
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="items to skip")]
TxnIdPath = Annotated[str, Path(description="transaction id in the client's string form '(most,least)'",
                                pattern=r"^(\([0-9]{1,18},[0-9]{1,18}\)|[0-9]{1,18}:[0-9]{1,18})$", examples=["(0,5)"])]
BatchIdPath = Annotated[str, Path(description="batch id (may contain '/'; percent-encode it or not)",
                                  min_length=1, max_length=512)]
JobPath = Annotated[str, Path(description="job name (may contain '/')", min_length=1, max_length=256)]
ReplayIdPath = Annotated[str, Path(description="replay id", min_length=1, max_length=64)]
NameFilter = Annotated[str | None, Query(max_length=256, description="exact job name")]
LedgerTopic = Annotated[str | None, Query(min_length=1, max_length=512,
                                          description="the batch's ledger topic (needed if the id is in several)")]
RecordsLimit = Annotated[int, Query(ge=1, le=1000, description="ledger records per answer")]
#: The paging fields of an answer with ledger records.
RECORD_PAGE = ("records", "records_total", "records_offset", "records_limit", "records_truncated")
TxnLedgerTopic = Annotated[str | None, Query(min_length=1, max_length=512, description=(
    "the transaction's ledger topic (needed if the id is in several)"))]


async def core(request: Request) -> Core:
    """The app's shared state (a coroutine: FastAPI would run a plain function in a worker thread)."""
    return request.app.state.core


def parse_txn_id(txn_id: str) -> str:
    """The canonical ``(most,least)`` form of ``txn_id``; 400 if malformed."""
    try:
        t = TxnID.parse(txn_id)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if t.most >= 2**63 or t.least >= 2**63:
        raise HTTPException(400, f"transaction id {txn_id!r} is out of range")
    return str(t)


def sent_with_suffix(request: Request, suffix: bytes) -> bool:
    """Whether the path, as the client sent it (before percent-decoding), ends in ``suffix``."""
    raw = request.scope.get("raw_path")
    return raw is None or raw.split(b"?", 1)[0].endswith(suffix)


async def _live(c: Core, fn: Any, *args: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args)
    except LiveError as exc:
        raise HTTPException(503, str(exc)) from None


@router.get("/livez", response_model=Alive)
async def livez() -> dict[str, str]:
    """Liveness: the process answers. Checks nothing else, so a broker or database outage never
    makes an orchestrator restart the API (that is what ``/readyz`` is for). Open to all."""
    return {"status": "alive"}


async def _ping_broker(c: Core) -> str:
    return str(await asyncio.to_thread(c.live.ping))


async def _ping_database(c: Core) -> None:
    def ping() -> None:
        with c.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    await asyncio.to_thread(ping)


@router.get("/readyz", response_model=Ready, responses={503: {"model": Ready}})
async def readyz(response: Response, c: Core = Depends(core)) -> dict[str, Any]:
    """Readiness: this process can serve its API, i.e. its database answers (503 if not).

    The broker is not asked: every read but the live views comes from the database, and a broker
    outage would otherwise take every replica out of its Service at once (``/health`` reports the
    broker). Open to all, like ``/livez``: the orchestrator's probe carries no token."""
    try:
        await _ping_database(c)
        database = True
    except Exception:  # noqa: BLE001 - reported, not raised
        database = False
    if not database:
        response.status_code = 503
    return {"status": "ready" if database else "not ready", "database": database}


@reads.get("/health", response_model=Health, responses={503: {"model": Health}, **AUTH_ERRORS})
async def health(response: Response, c: Core = Depends(core)) -> Health:
    """Broker and database reachability, and the projection's progress (503 if degraded)."""
    try:
        broker = Component(ok=True, detail=f"clusters: {await _ping_broker(c)}")
    except LiveError as exc:
        broker = Component(ok=False, detail=describe(exc))
    try:
        await _ping_database(c)
        database = Component(ok=True, detail=c.engine.dialect.name)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        database = Component(ok=False, detail=describe(exc))
    projection = [] if c.projector is None else [
        {"topic": s.topic, "records": s.records, "skipped": s.skipped, "quarantined": s.quarantined,
         "position": s.position, "last_applied_ms": s.last_applied_ms, "error": s.error}
        for s in list(c.projector.status.values())]
    ok = broker.ok and database.ok
    if not ok:
        response.status_code = 503
    return Health(status="ok" if ok else "degraded", broker=broker, database=database, projection=projection)


@reads.get("/transactions", response_model=Page[Transaction], responses=AUTH_ERRORS)
async def list_transactions(
    c: Core = Depends(core),
    state: Annotated[TxnState | None, Query(description="OPEN, COMMITTED or ABORTED")] = None,
    job: NameFilter = None,
    since: Annotated[int | None, Query(ge=0, le=2**62, description="started at or after (epoch ms)")] = None,
    limit: Limit = 50, offset: Offset = 0,
) -> dict[str, Any]:
    """Transactions from the ledger, newest first."""
    items, total = await asyncio.to_thread(queries.list_transactions, c.reader, state, job, since, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@reads.get("/transactions/timeseries", response_model=TimeSeries, responses=AUTH_ERRORS)
async def transactions_timeseries(
    c: Core = Depends(core),
    window_s: Annotated[int, Query(ge=10, le=7 * 86400, description="how far back")] = 600,
    bucket_s: Annotated[int, Query(ge=1, le=86400, description="bucket width")] = 10,
) -> dict[str, Any]:
    """Transactions by state over time: committed and aborted by end time, open by start time.

    At most 2000 buckets: a narrower ``bucket_s`` is widened (see ``bucket_ms`` in the answer)."""
    bucket_s = max(bucket_s, -(-window_s // MAX_BUCKETS))  # at most MAX_BUCKETS points: widen the buckets
    until = now_ms()
    until -= until % (bucket_s * 1000)
    until += bucket_s * 1000
    points = await asyncio.to_thread(queries.timeseries, c.reader, until - window_s * 1000, until, bucket_s * 1000)
    return {"bucket_ms": bucket_s * 1000, "points": points}


@reads.get("/transactions/{txn_id}", response_model=TransactionDetail,
           responses={**AUTH_ERRORS, **NOT_FOUND, **BAD_ID, 503: {"model": Error}})
async def get_transaction(txn_id: TxnIdPath, c: Core = Depends(core), ledger_topic: TxnLedgerTopic = None,
                          records_limit: RecordsLimit = 100, records_offset: Offset = 0) -> dict[str, Any]:
    """A transaction: its ledger record(s) and, while it is live, the coordinator's metadata.

    Transactions are keyed by (ledger topic, transaction id): an id found in several ledger topics
    needs ``ledger_topic`` (409 otherwise, listing them)."""
    tid = parse_txn_id(txn_id)
    rows = await asyncio.to_thread(queries.transaction_detail, c.reader, tid, ledger_topic, records_limit,
                                   records_offset)
    if len(rows) > 1:
        topics = ", ".join(r["ledger_topic"] for r in rows)
        raise HTTPException(409, f"transaction {tid} is in several ledger topics ({topics}): "
                                 "name one with ?ledger_topic=")
    row = rows[0] if rows else None
    page = {k: row.pop(k) for k in RECORD_PAGE if k in row} if row is not None else {}
    live = None
    if row is None or row["state"] == "OPEN":
        meta = await _live(c, c.live.txn_metadata, tid)
        if meta is not None:
            live = LiveTxn(**meta, age_ms=now_ms() - meta["opened_at_ms"] if meta.get("opened_at_ms") else None)
    if row is None and live is None:
        raise HTTPException(404, f"transaction {tid} is neither in the ledger nor known to its coordinator")
    buffers: dict[str, Any] = {}
    pending: dict[str, Any] = {}
    if live is not None:
        for topic in live.produced_partitions[:20]:
            buffers[topic] = await _live(c, c.live.buffer_stats, topic)
        for ts in live.acked_subscriptions[:20]:
            topic, _, sub = ts.rpartition(":")
            pending[ts] = await _live(c, c.live.pending_ack_stats, topic, sub)
    state = live.status if live is not None and live.status else row["state"]  # type: ignore[index]
    return {"txn_id": tid, "state": state, "ledger": row, "records": [], **page, "live": live, "buffers": buffers,
            "pending_acks": pending}


@writes.post("/transactions/{txn_id}/abort", response_model=AbortResult,
             responses={**AUTH_ERRORS, **NOT_FOUND, **BAD_ID, 409: {"model": Error}, 503: {"model": Error}})
async def abort_transaction(txn_id: TxnIdPath, c: Core = Depends(core)) -> AbortResult:
    """Abort a stuck open transaction (its produced messages are discarded, its acks undone)."""
    tid = parse_txn_id(txn_id)
    meta = await _live(c, c.live.txn_metadata, tid)
    if meta is None:
        rows = await asyncio.to_thread(queries.get_transactions, c.reader, tid)
        if not rows:
            raise HTTPException(404, f"transaction {tid} is not known to its coordinator nor in the ledger")
        states = f"{rows[0]['state']} in the ledger" if len(rows) == 1 else \
            ", ".join(f"{r['state']} in {r['ledger_topic']}" for r in rows)
        raise HTTPException(409, f"transaction {tid} has already ended ({states})")
    if meta["status"] not in ("OPEN", None):
        raise HTTPException(409, f"transaction {tid} is {meta['status']}, not OPEN")
    try:
        await c.client.transaction_from_id(tid).abort()
    except TransactionNotFound:
        raise HTTPException(409, f"transaction {tid} ended before it could be aborted") from None
    except PulsarError as exc:
        raise HTTPException(503, f"abort of {tid} failed: {exc}") from None
    return AbortResult(txn_id=tid, state="ABORTED", message=f"transaction {tid} aborted")


@reads.get("/coordinators", response_model=Coordinators, responses={**AUTH_ERRORS, 503: {"model": Error}})
async def coordinators(
    c: Core = Depends(core),
    slow_after_ms: Annotated[int | None, Query(ge=0, le=2**40, description="'slow' threshold")] = None,
) -> dict[str, Any]:
    """Coordinator stats, and the open transactions older than ``slow_after_ms``."""
    slow_ms = c.settings.slow_txn_ms if slow_after_ms is None else slow_after_ms
    stats = await _live(c, c.live.coordinator_stats)
    slow = await _live(c, c.live.slow_transactions, slow_ms)
    now = now_ms()
    for s in slow:
        s["age_ms"] = now - s["opened_at_ms"] if s.get("opened_at_ms") else None
    return {"coordinators": stats, "slow_after_ms": slow_ms, "slow_transactions": slow}


@reads.get("/jobs", response_model=list[Job], responses=AUTH_ERRORS)
async def jobs(c: Core = Depends(core)) -> list[dict[str, Any]]:
    """Every job: batches by status, committed volumes, throughput, last commit."""
    return await asyncio.to_thread(queries.all_job_stats, c.reader)


@reads.get("/jobs/{job:path}", response_model=JobDetail, responses={**AUTH_ERRORS, **NOT_FOUND})
async def job(job: JobPath, c: Core = Depends(core),
              recent: Annotated[int, Query(ge=0, le=1000, description="latest batches to include")] = 20,
              ) -> dict[str, Any]:
    """One job's stats and its latest batches."""
    detail = await asyncio.to_thread(queries.job_detail, c.reader, job, recent)
    if detail is None:
        raise HTTPException(404, f"no batches of job {job!r} in the ledger")
    return detail


@reads.get("/batches", response_model=Page[Batch], responses=AUTH_ERRORS)
async def list_batches(
    c: Core = Depends(core), job: NameFilter = None,
    status: Annotated[BatchStatus | None, Query(description="STARTED, COMMITTED, ABORTED, PARKED or REPLAYED")] = None,
    limit: Limit = 50, offset: Offset = 0,
) -> dict[str, Any]:
    """Batches from the ledger, newest first."""
    items, total = await asyncio.to_thread(queries.list_batches, c.reader, job, status, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


def _one_batch(rows: list[dict[str, Any]], batch_id: str, ledger_topic: str | None) -> dict[str, Any]:
    """The one row of ``rows``; 404 if none, 409 naming the ledger topics if several."""
    if not rows:
        where = f" {ledger_topic}" if ledger_topic else ""
        raise HTTPException(404, f"batch {batch_id!r} is not in the ledger{where}")
    if len(rows) > 1:
        topics = ", ".join(r["ledger_topic"] for r in rows)
        raise HTTPException(409, f"batch id {batch_id!r} is in several ledger topics ({topics}): "
                                 "name one with ?ledger_topic=")
    return rows[0]


@reads.get("/batches/{batch_id:path}", response_model=BatchDetail,
           responses={**AUTH_ERRORS, **NOT_FOUND, 409: {"model": Error}})
async def get_batch(batch_id: BatchIdPath, c: Core = Depends(core), ledger_topic: LedgerTopic = None,
                    records_limit: RecordsLimit = 100, records_offset: Offset = 0) -> dict[str, Any]:
    """A batch, a page of its ledger records (``records_limit``, ``records_offset``; at most 8 MiB
    of records per answer, see ``records_truncated``) and its replay."""
    rows = await asyncio.to_thread(queries.batch_detail, c.reader, batch_id, ledger_topic, records_limit,
                                   records_offset)
    return _one_batch(rows, batch_id, ledger_topic)


@writes.post("/batches/{batch_id:path}/replay", status_code=202, response_model=Replay,
             responses={**AUTH_ERRORS, **NOT_FOUND, 409: {"model": Error}})
async def replay_batch(batch_id: BatchIdPath, request: Request, c: Core = Depends(core),
                       ledger_topic: LedgerTopic = None) -> dict[str, Any]:
    """Replay a parked batch exactly once (202 with the replay; a repeated POST returns the same one).

    Only batches of jobs in the control plane's job registry are replayed, with the registry's code
    and topics (409 otherwise, with the reason)."""
    if not sent_with_suffix(request, b"/replay"):
        raise HTTPException(405, "POST /batches/{id} is not an operation (a '/replay' at its end was percent-encoded, "
                                 "so it belongs to the id); to replay a batch, POST /batches/{id}/replay",
                            headers={"Allow": "GET"})
    row = _one_batch(await asyncio.to_thread(queries.get_batches, c.reader, batch_id, ledger_topic), batch_id,
                     ledger_topic)
    try:
        rep, started = await asyncio.to_thread(c.replays.request, row)
    except NotReplayable as exc:
        raise HTTPException(409, str(exc)) from None
    if started:
        c.replays.launch(rep["replay_id"])
    return rep


@reads.get("/replays/{replay_id:path}", response_model=Replay, responses={**AUTH_ERRORS, **NOT_FOUND})
async def get_replay(replay_id: ReplayIdPath, c: Core = Depends(core)) -> dict[str, Any]:
    """A replay's status."""
    rep = await asyncio.to_thread(c.replays.get, replay_id)
    if rep is None:
        raise HTTPException(404, f"replay {replay_id!r} not found")
    return rep


@reads.get("/quarantine", response_model=Page[Quarantined], responses=AUTH_ERRORS)
async def quarantine(
    c: Core = Depends(core),
    topic: Annotated[str | None, Query(max_length=512, description="one ledger topic")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20, offset: Offset = 0,
) -> dict[str, Any]:
    """Ledger messages the projection quarantined (not valid records, or refused by the database),
    newest first; the projection moved past each of them."""
    items, total = await asyncio.to_thread(queries.list_quarantine, c.reader, topic, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@reads.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}, **AUTH_ERRORS})
async def prometheus(c: Core = Depends(core)) -> Response:
    """Prometheus text format: transactions, batches, volumes, commit latency, last commit and backlog per job.

    Computed within a time budget (``PULSAR_TXN_METRICS_SCRAPE_BUDGET_S``): past it, the last
    complete snapshot is answered (503 before there is one); backlogs are read in the background."""
    service = c.metrics
    body = await (service.scrape() if service is not None else
                  asyncio.to_thread(metrics.render, c.reader, c.projector, None))
    if body is None:
        raise HTTPException(503, "metrics are being computed; try again shortly")
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
