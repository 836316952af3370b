"""The I/O behind the ``pulsar-txn`` Spark sink (see :mod:`spark_jobs.sink` for the design).

Everything here is plain asyncio on :class:`txn.AsyncClient`, run with ``asyncio.run`` from a
Spark task (executor side) or from the writer's driver-side hooks; none of it imports pyspark.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from txn.admin import admin_request
from txn.bridge import run_blocking
from txn.client import AsyncClient
from txn.delivery.ledger import Kind, LedgerRecord, ensure_ledger_retained, now_ms
from txn.delivery.ledger_reader import LedgerEndUnknown, read_tail
from txn.errors import (
    InvalidTxnStatus,
    ProducerBusy,
    PulsarError,
    Timeout,
    TransactionNotFound,
    TransactionTimedOut,
)
from txn.message import MessageId, TxnID
from txn.producer import AsyncProducer, HashingScheme, hash_function
from txn.settings import BrokerSettings
from txn.topic import parse_topic

from .value_schema import TopicValueSchema

log = logging.getLogger("spark_jobs.sink")

#: Ledger of the receipt id the broker returns for a message it dropped as a duplicate (-1 on the
#: wire's unsigned field, which the client reads as signed like the official one).
_DUP_LEDGER = -1
#: Rows handed from Spark's input iterator to the event loop at a time (deterministic_order=false).
CHUNK_ROWS = 200
#: Default cut of the sink's deterministic batches (the official client's batching defaults).
BATCH_MAX_ROWS = 1000
BATCH_MAX_BYTES = 128 * 1024
#: How far from the end of a stream's marker topic the replay check looks before a full scan.
MARKER_TAIL_ENTRIES = 64
STREAM_MARKER_PREFIX = "pulsar-txn-stream-"


class SinkError(RuntimeError):
    """The sink refuses to write (bad options, deduplication off, ...).

    ``status`` is the admin API's HTTP status when an admin answer caused it."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DeduplicationDisabled(SinkError):
    """Broker deduplication is off where the sink would write: retries could duplicate rows."""


#: Where to connect: :class:`txn.settings.BrokerSettings` (URL, token, TLS), or a bare service URL.
Conn = BrokerSettings | str


def connect(conn: Conn) -> AsyncClient:
    """A client for ``conn`` with its credentials and TLS settings."""
    if isinstance(conn, BrokerSettings):
        return AsyncClient(conn.require_service_url(), **conn.client_kwargs())
    return AsyncClient(conn)


def _admin_kwargs(settings: BrokerSettings | None) -> dict[str, Any]:
    return settings.admin_kwargs() if settings is not None else {}


# ----------------------------------------------------------------------------- rows


@dataclass(slots=True, frozen=True)
class OutRow:
    """One row to produce, normalised."""

    topic: str
    key: str | None
    value: bytes
    properties: tuple[tuple[str, str], ...]
    event_time: int | None = None  # epoch milliseconds

    def sort_key(self) -> tuple[Any, ...]:
        return (self.topic, self.key is not None, self.key or "", self.value, self.properties,
                self.event_time is not None, self.event_time or 0)

    def batch_bytes(self) -> int:
        """What the row counts for towards ``batch_max_bytes``: a function of its content only
        (so every attempt cuts batches alike), a little above its encoded size in a batch."""
        n = len(self.value) + 32
        if self.key is not None:
            n += len(self.key) * 4
        for k, v in self.properties:
            n += (len(k) + len(v)) * 4 + 8
        if self.event_time is not None:
            n += 8
        return n


_topic_cache: dict[str, str] = {}


def canonical_topic(name: str) -> str:
    """Fully qualified topic name (cached: rows repeat the same few topics)."""
    t = _topic_cache.get(name)
    if t is None:
        t = str(parse_topic(name))
        if len(_topic_cache) < 10000:
            _topic_cache[name] = t
    return t


def normalise(row: Any, default_topic: str | None, has_key: bool, has_topic: bool, has_props: bool,
              has_event_time: bool = False) -> OutRow:
    """A Spark ``Row`` -> :class:`OutRow` (raises ``ValueError`` with the reason for bad rows)."""
    return make_row(row["value"], row["key"] if has_key else None, row["topic"] if has_topic else None,
                    row["properties"] if has_props else None,
                    _event_ms(row["event_time"]) if has_event_time else None, default_topic)


def _event_ms(value: Any) -> int | None:
    """An ``event_time`` cell (a datetime, naive ones in local time as PySpark gives them, or
    epoch milliseconds) -> epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    return round(value.timestamp() * 1_000_000) // 1000  # floor to the millisecond, like the Arrow path


def make_row(value: Any, key: Any, topic: str | None, props: Any, event_time: int | None,
             default_topic: str | None) -> OutRow:
    """One row's cells -> :class:`OutRow`: the one normalisation of the row and the Arrow path
    (raises ``ValueError`` with the reason for bad rows)."""
    if value is None:
        raise ValueError("the sink's 'value' column is null; Pulsar messages need a payload")
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    elif not isinstance(value, bytes):
        raise ValueError(f"'value' must be binary or string, got {type(value).__name__}")
    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            key = bytes(key).decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"binary 'key' is not UTF-8 (Pulsar keys are strings): {exc}") from None
    elif key is not None and not isinstance(key, str):
        key = str(key)
    if topic is None:
        topic = default_topic
        if topic is None:
            raise ValueError("row has no 'topic' and the sink has no 'topic' option")
    else:
        topic = canonical_topic(topic)
    pairs: tuple[tuple[str, str], ...] = ()
    if props:
        pairs = tuple(sorted((str(k), str(v)) for k, v in dict(props).items() if v is not None))
    if event_time is not None and event_time <= 0:
        raise ValueError(f"'event_time' must be after 1970-01-01 (Pulsar stores it as positive epoch "
                         f"milliseconds), got {event_time} ms")
    return OutRow(topic, key, value, pairs, event_time)


# ------------------------------------------------------------------------ dedup check


#: How long :func:`deduplication_enabled` keeps asking while the topic's owner is unreachable (a
#: broker that died: the admin API redirects topic requests to it until ownership moves, ~10-20 s).
DEDUP_CHECK_RETRY_S = 45.0


def deduplication_enabled(admin_url: str, topic: str, timeout: float = 10.0,
                          settings: BrokerSettings | None = None, retry_s: float = DEDUP_CHECK_RETRY_S) -> bool:
    """Whether broker deduplication applies to ``topic``: topic policy, else namespace, else broker.

    Connection failures and 5xx answers are retried with backoff for up to ``retry_s`` seconds
    (the topic's owner may be a broker that just died); then, or on any other unexpected answer,
    raises :class:`SinkError`.
    """
    deadline = time.monotonic() + retry_s
    delay = 0.5
    while True:
        try:
            return _deduplication_enabled(admin_url, topic, timeout, settings)
        except SinkError as exc:
            transient = isinstance(exc.__cause__, OSError) or (exc.status or 0) >= 500
            if not transient or time.monotonic() + delay > deadline:
                raise
            log.warning("deduplication check of %s failed (%s); retrying in %.1fs", topic, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _deduplication_enabled(admin_url: str, topic: str, timeout: float, settings: BrokerSettings | None) -> bool:
    t = parse_topic(topic)
    local = urllib.parse.quote(t.base.rpartition("/")[2], safe="")
    path = f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{local}/deduplicationEnabled?applied=true"
    try:
        status, body = admin_request("GET", admin_url, path, timeout=timeout, **_admin_kwargs(settings))
        if status == 200 and isinstance(body, bool):
            return body
        if status not in (404, 200):
            raise SinkError(f"cannot read the deduplication policy of {topic}: HTTP {status} {body}", status)
        path = f"/admin/v2/namespaces/{t.tenant}/{t.namespace}/deduplication"
        status, body = admin_request("GET", admin_url, path, timeout=timeout, **_admin_kwargs(settings))
        if status != 200:
            raise SinkError(f"cannot read the deduplication policy of namespace {t.tenant}/{t.namespace}: "
                                f"HTTP {status} {body}", status)
        if isinstance(body, bool):
            return body
        status, body = admin_request("GET", admin_url, "/admin/v2/brokers/configuration/runtime", timeout=timeout,
                                     **_admin_kwargs(settings))
        if status != 200 or not isinstance(body, dict):
            raise SinkError(f"namespace {t.tenant}/{t.namespace} has no deduplication policy and the broker "
                            f"default is unreadable: HTTP {status} {body}")
        return str(body.get("brokerDeduplicationEnabled", "false")).lower() == "true"
    except OSError as exc:
        raise SinkError(f"cannot reach the admin API at {admin_url} (or the broker it redirected to) to check "
                        f"deduplication: {exc}") from exc



_dedup_ok: dict[tuple[str, str], float] = {}
_dedup_lock = threading.Lock()


def require_deduplication(admin_url: str | None, topic: str, where: str = "driver",
                          settings: BrokerSettings | None = None) -> None:
    """Refuse (:class:`DeduplicationDisabled`) when deduplication is off for ``topic``.

    Without ``admin_url`` it cannot check: it logs a warning instead. Positive answers are
    cached per namespace for a minute.
    """
    t = parse_topic(topic)
    if not admin_url:
        log.warning("pulsar-txn sink: no admin_url, cannot check that broker deduplication is enabled for %s; "
                    "without it a retried Spark task can duplicate rows", topic)
        return
    key = (admin_url, f"{t.tenant}/{t.namespace}/{t.base}")
    with _dedup_lock:
        if time.monotonic() - _dedup_ok.get(key, -1e9) < 60:
            return
    if not deduplication_enabled(admin_url, topic, settings=settings):
        raise DeduplicationDisabled(
            f"broker deduplication is disabled for {t.base} (namespace {t.tenant}/{t.namespace}); the pulsar-txn "
            f"sink needs it so that retried and speculative Spark tasks cannot duplicate rows. Enable it with "
            f"`pulsar-admin namespaces set-deduplication {t.tenant}/{t.namespace} --enable` (checked on the {where})"
        )
    with _dedup_lock:
        _dedup_ok[key] = time.monotonic()


# --------------------------------------------------------------------- transactions


def run(coro: Awaitable[Any]) -> Any:
    """Run a coroutine to completion from synchronous Spark code (:func:`txn.bridge.run_blocking`)."""
    return run_blocking(coro, "the pulsar-txn sink's driver call")  # type: ignore[arg-type]


async def open_transaction(conn: Conn, timeout_ms: int) -> str:
    """Open a transaction and return its id as ``(most,least)``."""
    async with connect(conn) as client:
        t = await client.new_transaction(timeout_millis=timeout_ms)
        return str(t.id)


async def write_ledger(conn: Conn, ledger_topic: str, rec: LedgerRecord) -> None:
    """Write a ledger record outside any transaction (best effort: logged on failure)."""
    try:
        async with connect(conn) as client:
            await ensure_ledger_retained(client, ledger_topic)
            p = await client.create_producer(ledger_topic, batching_enabled=False)
            await p.send(rec.to_json(), partition_key=rec.batch_id)
            await p.close()
    except PulsarError as exc:
        log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)


@dataclass(slots=True)
class CommitResult:
    """What a driver-side commit did."""

    committed: bool
    txn_id: str | None
    outputs: dict[str, int] = field(default_factory=dict)
    reason: str = ""


async def commit_transaction(
    conn: Conn,
    txn_id: str | None,
    timeout_ms: int,
    ledger_topic: str,
    record: LedgerRecord,
    stream_key: str | None = None,
    spark_batch_id: int | None = None,
) -> CommitResult:
    """Commit ``txn_id`` with ``record`` (COMMITTED) written inside it.

    With ``stream_key``/``spark_batch_id`` (a micro-batch), the batch's marker is written too,
    and if that batch already has a COMMITTED marker (Spark replays it after a failure) the
    transaction is aborted instead: its rows are a second copy. ``txn_id=None`` (a micro-batch
    without tasks) opens a transaction just for the records.
    """
    async with connect(conn) as client:
        marker_topic = None
        if stream_key is not None:
            assert spark_batch_id is not None
            marker_topic = stream_marker_topic(ledger_topic, stream_key)
            await ensure_ledger_retained(client, marker_topic)
            done = await stream_batch_committed(client, marker_topic, stream_key, spark_batch_id)
            if done is not None:
                if txn_id is not None:
                    await _abort_quietly(client, txn_id, timeout_ms)
                return CommitResult(False, txn_id, reason=f"batch {spark_batch_id} of {stream_key} was already "
                                    f"committed in transaction {done.txn_id}; this replay's rows were aborted")
        if txn_id is None:
            t = await client.new_transaction(timeout_millis=timeout_ms)
            txn_id = str(t.id)
        else:
            t = client.transaction_from_id(txn_id, timeout_ms)
        record.txn_id = txn_id
        record.ended_at_ms = now_ms()
        try:
            await ensure_ledger_retained(client, ledger_topic)
            ledger = await client.create_producer(ledger_topic, batching_enabled=False)
            await ledger.send_async(record.to_json(), partition_key=record.batch_id, txn=t)
            if marker_topic is not None:
                marker = await client.create_producer(marker_topic, batching_enabled=False)
                await marker.send_async(record.to_json(), partition_key=record.batch_id, txn=t)
            await t.commit()
        except BaseException:
            if t.state.value == "OPEN":
                await _abort_quietly(client, txn_id, timeout_ms)
            raise
        return CommitResult(True, txn_id, dict(record.outputs))


async def _abort_quietly(client: AsyncClient, txn_id: str, timeout_ms: int) -> None:
    try:
        await client.transaction_from_id(txn_id, timeout_ms).abort()
    except (TransactionNotFound, TransactionTimedOut, InvalidTxnStatus) as exc:
        log.info("abort of %s: already ended (%s)", txn_id, exc)


async def abort_transaction(conn: Conn, txn_id: str, timeout_ms: int) -> None:
    """Abort ``txn_id`` (a transaction that already ended or timed out is fine)."""
    async with connect(conn) as client:
        await _abort_quietly(client, txn_id, timeout_ms)


# ------------------------------------------------------------------- stream markers


def stream_marker_topic(ledger_topic: str, stream_key: str) -> str:
    """Per-query topic holding one COMMITTED record per micro-batch (next to the ledger)."""
    t = parse_topic(ledger_topic)
    h = hashlib.sha256(stream_key.encode()).hexdigest()[:24]
    return f"{t.domain}://{t.tenant}/{t.namespace}/{STREAM_MARKER_PREFIX}{h}"


async def _read_tail(client: AsyncClient, topic: str, idle_ms: int, full: bool = False) -> list[LedgerRecord]:
    """The records of the last :data:`MARKER_TAIL_ENTRIES` entries of ``topic`` (all with ``full``), up
    to a probe written first (see :func:`txn.delivery.ledger_reader.read_tail`).

    Read-committed dispatch stops at the first message of a transaction still open, so an
    unresolved transaction (a driver that died between writing a marker and committing) keeps
    the probe back: then :class:`SinkError`, rather than a guess from a partial read.
    """
    try:
        return await read_tail(client, topic, MARKER_TAIL_ENTRIES, idle_ms, full, verify_txn=True)
    except LedgerEndUnknown:
        raise SinkError(f"cannot tell which micro-batches were committed: an unresolved transaction on "
                        f"{topic} holds back its end; retry after that transaction's timeout") from None


async def stream_batch_committed(client: AsyncClient, marker_topic: str, stream_key: str,
                                 spark_batch_id: int, idle_ms: int = 10000) -> LedgerRecord | None:
    """The COMMITTED marker of micro-batch ``spark_batch_id`` of ``stream_key``, or None.

    Markers of one query are written in batch order by its driver, so the newest is the
    highest committed batch: read the tail of the topic first, the whole topic only if the tail
    holds no marker. The end is a probe message written (outside any transaction) just before
    reading. Raises :class:`SinkError` if it cannot decide, or if a newer batch than this one
    is already committed (the checkpoint is older than the output).
    """

    def mine(records: list[LedgerRecord]) -> list[LedgerRecord]:
        return [r for r in records if r.kind == Kind.COMMITTED and r.config.stream_key == stream_key]

    found = mine(await _read_tail(client, marker_topic, idle_ms))
    if not found:
        found = mine(await _read_tail(client, marker_topic, idle_ms, full=True))
    for r in found:
        if r.config.spark_batch_id == spark_batch_id:
            return r
    newest = max((r.config.spark_batch_id for r in found if r.config.spark_batch_id is not None), default=-1)
    if newest > spark_batch_id:
        raise SinkError(f"micro-batch {spark_batch_id} of {stream_key}: the sink already committed batch {newest}; "
                        "the checkpoint is older than the sink's output (restored or reused?). Refusing to guess")
    return None


async def record_stream_open(conn: Conn, ledger_topic: str, stream_key: str, record: LedgerRecord) -> None:
    """Note on the query's marker topic (outside any transaction) the transaction opened for its
    next micro-batch, so that an abort can find it even if no task reported (best effort)."""
    try:
        async with connect(conn) as client:
            topic = stream_marker_topic(ledger_topic, stream_key)
            await ensure_ledger_retained(client, topic)
            p = await client.create_producer(topic, batching_enabled=False)
            await p.send(record.to_json(), partition_key=record.batch_id)
            await p.close()
    except PulsarError as exc:
        log.warning("STARTED record of %s not written: %s", stream_key, exc)


async def abort_stream_batch(conn: Conn, ledger_topic: str, stream_key: str, timeout_ms: int,
                             idle_ms: int = 5000) -> str | None:
    """Abort the transaction of the micro-batch in flight (the newest STARTED record of the query,
    if no COMMITTED marker names it); returns its id, or None if there is none to abort."""
    async with connect(conn) as client:
        topic = stream_marker_topic(ledger_topic, stream_key)
        try:
            records = [r for r in await _read_tail(client, topic, idle_ms) if r.config.stream_key == stream_key]
        except SinkError as exc:
            log.warning("cannot find the transaction of %s's failed micro-batch: %s", stream_key, exc)
            return None
        started = [r for r in records if r.kind == Kind.STARTED and r.txn_id]
        if not started:
            return None
        txn_id = started[-1].txn_id
        if any(r.kind == Kind.COMMITTED and r.txn_id == txn_id for r in records):
            return None
        await _abort_quietly(client, txn_id, timeout_ms)
        return txn_id


async def is_stream_batch_committed(conn: Conn, ledger_topic: str, stream_key: str,
                                    spark_batch_id: int) -> LedgerRecord | None:
    """Blocking-friendly wrapper of :func:`stream_batch_committed`."""
    async with connect(conn) as client:
        topic = stream_marker_topic(ledger_topic, stream_key)
        return await stream_batch_committed(client, topic, stream_key, spark_batch_id)


def checkpoint_query_id(checkpoint_location: str) -> str | None:
    """The streaming query id stored in ``<checkpoint>/metadata`` (local file systems only)."""
    path = checkpoint_location
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:"):
        path = path[len("file:"):]
    elif "://" in path:
        return None
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            first = f.readline()
        qid = json.loads(first).get("id")
        return str(qid) if qid else None
    except (OSError, ValueError, AttributeError):
        return None


# ----------------------------------------------------------------------- task write


@dataclass(slots=True)
class TaskPlan:
    """What one Spark task needs to produce its partition into the batch's transaction."""

    service_url: str
    admin_url: str | None
    txn_id: str
    txn_timeout_ms: int
    default_topic: str | None
    lease_topic: str
    partition_id: int
    attempt: int
    deterministic_order: bool
    has_key: bool
    has_topic: bool
    has_props: bool
    batch_max_rows: int = BATCH_MAX_ROWS
    batch_max_bytes: int = BATCH_MAX_BYTES
    has_event_time: bool = False
    #: Credentials and TLS (None: connect to ``service_url`` without them).
    settings: BrokerSettings | None = None
    #: ``encodeValue``: the topic's schema; values are encoded by it and produced under its version.
    value_schema: TopicValueSchema | None = None
    #: The partition hash of keyed rows (a :class:`txn.producer.HashingScheme` value).
    hashing_scheme: int = int(HashingScheme.BoostHash)

    @property
    def producer_name(self) -> str:
        tid = TxnID.parse(self.txn_id)
        return f"ptxn-{tid.most}-{tid.least}-p{self.partition_id}"


@dataclass(slots=True)
class TaskResult:
    """Per-task outcome, for the commit message."""

    counts: dict[str, int]
    rows: int
    duplicates: int
    seconds: float


SendHook = Callable[[int, "asyncio.Future[MessageId]"], Awaitable[None]]


def _encoder(plan: TaskPlan) -> Callable[[Any], Any]:
    """The ``value`` cell -> payload: by the topic's schema with ``encodeValue``, else unchanged."""
    vs = plan.value_schema
    if vs is None:
        return lambda v: v
    encode = vs.encoder()

    def encode_cell(value: Any) -> Any:
        return None if value is None else encode(value)
    return encode_cell


def _row_stream(rows: Iterable[Any], plan: TaskPlan, default: str | None) -> Iterator[OutRow]:
    """Spark ``Row`` objects -> :class:`OutRow` (the row writer)."""
    encode = _encoder(plan)
    for r in rows:
        yield make_row(encode(r["value"]), r["key"] if plan.has_key else None, r["topic"] if plan.has_topic else None,
                       r["properties"] if plan.has_props else None,
                       _event_ms(r["event_time"]) if plan.has_event_time else None, default)


_TS_DIV = {"s": -1000, "ms": 1, "us": 1000, "ns": 1_000_000}  # unit -> divisor to ms (negative: multiply)


def _event_ms_column(arr: Any) -> list[int | None]:
    """An Arrow ``event_time`` column (timestamp of any unit, or int64 epoch ms) -> epoch ms."""
    import pyarrow as pa

    if not pa.types.is_timestamp(arr.type):
        return arr.to_pylist()  # type: ignore[no-any-return]
    div = _TS_DIV[arr.type.unit]
    raw = arr.cast(pa.int64()).to_pylist()
    if div < 0:
        return [None if v is None else v * -div for v in raw]
    return [None if v is None else v // div for v in raw]


def _arrow_stream(batches: Iterable[Any], plan: TaskPlan, default: str | None) -> Iterator[OutRow]:
    """Arrow ``RecordBatch`` objects -> :class:`OutRow` (the Arrow writer): columns are read whole,
    then each row goes through the same :func:`make_row` as the row writer's."""
    encode = _encoder(plan)
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        nones: list[Any] = [None] * n
        values = [encode(v) for v in batch.column("value").to_pylist()]
        keys = batch.column("key").to_pylist() if plan.has_key else nones
        topics = batch.column("topic").to_pylist() if plan.has_topic else nones
        props = batch.column("properties").to_pylist() if plan.has_props else nones
        events = _event_ms_column(batch.column("event_time")) if plan.has_event_time else nones
        for i in range(n):
            yield make_row(values[i], keys[i], topics[i], props[i], events[i], default)


def _chunks(rows: Iterable[Any], plan: TaskPlan, size: int, arrow: bool = False) -> Iterator[list[OutRow]]:
    """The task's input as :class:`OutRow` chunks: all of it sorted by content with
    ``deterministic_order``, else in arrival order. ``arrow``: ``rows`` are Arrow record batches."""
    default = canonical_topic(plan.default_topic) if plan.default_topic else None
    it = _arrow_stream(rows, plan, default) if arrow else _row_stream(rows, plan, default)
    if plan.deterministic_order:
        allrows = list(it)
        allrows.sort(key=OutRow.sort_key)
        for i in range(0, len(allrows), size):
            yield allrows[i:i + size]
        return
    chunk: list[OutRow] = []
    for r in it:
        chunk.append(r)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def _pull(rows: Iterable[Any], plan: TaskPlan, arrow: bool = False) -> AsyncIterator[list[OutRow]]:
    """Spark's input iterator, read and normalised off the event loop, in chunks."""
    loop = asyncio.get_running_loop()
    gen = _chunks(rows, plan, CHUNK_ROWS, arrow)
    done = object()
    while True:
        chunk = await loop.run_in_executor(None, next, gen, done)
        if chunk is done:
            return
        yield chunk  # type: ignore[misc]


async def _acquire(client: AsyncClient, topic: str, name: str, deadline: float,
                   send_timeout_ms: int = 30000, window: int = 1000, schema: Any = None) -> AsyncProducer:
    """Create the named producer, waiting while another attempt of this task still holds the name.

    It does not batch by itself: the sink sends its own deterministic batches.
    """
    while True:
        try:
            return await client.create_producer(
                topic, producer_name=name, batching_enabled=False, block_if_queue_full=True,
                max_pending_messages=window, send_timeout_millis=send_timeout_ms, schema=schema,
            )
        except (ProducerBusy, Timeout) as exc:
            if time.monotonic() >= deadline:
                raise SinkError(f"producer {name} on {topic} stayed busy (another attempt of this task?) until the "
                                f"transaction's timeout: {exc}") from exc
            log.info("producer %s on %s busy (another attempt holds it); waiting", name, topic)
            await asyncio.sleep(0.5)


class _OpenBatch:
    """Rows for one topic partition waiting to be sent as one batch."""

    __slots__ = ("rows", "indexes", "size")

    def __init__(self) -> None:
        self.rows: list[OutRow] = []
        self.indexes: list[int] = []
        self.size = 0


async def write_partition(plan: TaskPlan, rows: Iterable[Any], hook: SendHook | None = None,
                          arrow: bool = False) -> TaskResult:
    """Produce one Spark partition into the transaction (see :mod:`spark_jobs.sink`).

    Rows bound for one topic partition are numbered 0, 1, ... (their sequence ids) and sent in
    batches cut by row count and content size only (``batch_max_rows``, ``batch_max_bytes``),
    never by time: every attempt that sees the same rows sends the same batches with the same
    ids. A batch is sent once it is complete, or at the end of the input; a failing attempt
    sends no partial one. ``batch_max_rows=1`` sends each row as a message of its own.
    ``hook(index, future)`` runs for each row once its batch is sent (``index``: the row's
    position in the task's input, after sorting). ``arrow``: ``rows`` is an iterator of Arrow
    record batches (the Arrow writer); the rows they hold are numbered, cut and sent exactly as
    the same rows given one by one would be.
    """
    started = time.monotonic()
    deadline = started + plan.txn_timeout_ms / 1000.0
    name = plan.producer_name
    max_rows = max(1, plan.batch_max_rows)
    max_bytes = max(1, plan.batch_max_bytes)
    client = connect(plan.settings if plan.settings is not None else plan.service_url)
    try:
        t = client.transaction_from_id(plan.txn_id, plan.txn_timeout_ms)
        lease: AsyncProducer | None = None
        parts: dict[str, list[str]] = {}
        producers: dict[str, AsyncProducer] = {}
        seqs: dict[str, int] = {}
        rr: dict[str, int] = {}
        counts: dict[str, int] = {}
        open_: dict[str, _OpenBatch] = {}
        registered = None if plan.value_schema is None else plan.value_schema.txn_schema()
        key_hash = hash_function(HashingScheme(plan.hashing_scheme))
        sent_batches: list[list[asyncio.Future[MessageId]]] = []

        async def send(dest: str, b: _OpenBatch) -> None:
            p = producers[dest]
            first = seqs.get(dest, 0)
            seqs[dest] = first + len(b.rows)
            if max_rows == 1:
                r = b.rows[0]
                sent = [await p.send_async(r.value, properties=dict(r.properties) or None, partition_key=r.key,
                                           event_timestamp=r.event_time, sequence_id=first, txn=t, encoded=True)]
            else:
                sent = await p.send_batch_async(
                    [(r.value, dict(r.properties) if r.properties else None, r.key, r.event_time) for r in b.rows],
                    first, txn=t, encoded=True)
            sent_batches.append(sent)
            if hook is not None:
                for i, fut in zip(b.indexes, sent, strict=True):
                    await hook(i, fut)

        index = 0
        async for chunk in _pull(rows, plan, arrow):
            for row in chunk:
                dests = parts.get(row.topic)
                if dests is None:
                    if plan.admin_url:
                        await asyncio.get_running_loop().run_in_executor(
                            None, require_deduplication, plan.admin_url, row.topic, "executor", plan.settings)
                    dests = parts[row.topic] = await client.get_topic_partitions(row.topic)
                if len(dests) == 1:
                    dest = dests[0]
                elif row.key:
                    dest = dests[key_hash(row.key) % len(dests)]
                else:
                    n = rr.get(row.topic, 0)
                    rr[row.topic] = n + 1
                    dest = dests[n % len(dests)]
                b = open_.get(dest)
                if b is None:
                    if lease is None:
                        # The lease: one attempt of this task at a time produces; others wait for
                        # the name. Taken at the first row, so an attempt that is slow upstream
                        # does not hold back a speculative copy.
                        lease = await _acquire(client, plan.lease_topic, f"{name}-lease", deadline)
                    producers[dest] = await _acquire(client, dest, name, deadline, plan.txn_timeout_ms,
                                                     max(1000, 4 * max_rows), registered)
                    b = open_[dest] = _OpenBatch()
                size = row.batch_bytes()
                if b.rows and b.size + size > max_bytes:
                    await send(dest, b)
                    b = open_[dest] = _OpenBatch()
                b.rows.append(row)
                b.indexes.append(index)
                b.size += size
                counts[row.topic] = counts.get(row.topic, 0) + 1
                index += 1
                if len(b.rows) >= max_rows:
                    await send(dest, b)
                    open_[dest] = _OpenBatch()
        for dest, b in open_.items():
            if b.rows:
                await send(dest, b)
        await asyncio.gather(*(p.flush() for p in producers.values()))
        dups = 0
        try:
            for sent in sent_batches:  # the futures of a batch resolve (or fail) together: check the last
                if (await sent[-1]).ledger_id() == _DUP_LEDGER:
                    dups += len(sent)
        except BaseException:
            for f in (f for sent in sent_batches for f in sent):
                if f.done() and not f.cancelled():
                    f.exception()  # retrieved: the first failure is raised below
            raise
        for p in producers.values():
            await p.close()
        if lease is not None:
            await lease.close()
        return TaskResult(counts, index, dups, time.monotonic() - started)
    finally:
        await client.close()
