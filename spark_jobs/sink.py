"""``pulsar-txn``: an exactly-once Spark sink for Pulsar (Python Data Source API).

.. code-block:: python

    from spark_jobs.sink import PulsarTxnDataSource
    spark.dataSource.register(PulsarTxnDataSource)
    (df.select("key", "value", "properties")
       .write.format("pulsar-txn").mode("append")
       .option("service_url", "pulsar://broker:6650").option("admin_url", "http://broker:8080")
       .option("topic", "persistent://tenant/ns/out")
       .save())

Columns: ``value`` (binary or string, required), ``key`` (string or binary (UTF-8), optional),
``topic`` (string, optional: a per-row override of the ``topic`` option), ``properties``
(map<string,string>, optional). Other columns are refused.

Options: ``service_url`` (required); ``admin_url`` (used to check deduplication; without it a
warning is logged, and a retried or speculative task attempt fails the write with
:class:`UncheckedRetry`, since nothing shows that the broker would drop its duplicates); ``topic``;
``txn_timeout_ms`` (default 60000: the whole write, or micro-batch,
must finish within it); ``ledger_topic`` (default ``pulsar-txn-ledger`` in ``topic``'s namespace;
required without ``topic``); ``job`` (the name in the ledger, default ``spark-pulsar-txn``);
``deterministic_order`` (default true, see below); ``batch_max_rows`` (default 1000) and
``batch_max_bytes`` (default 131072): where the sink cuts its batches (below; ``batch_max_rows=1``:
one message per row); streaming: ``query_id`` (see below); ``batch_id`` (with ``query_id``: makes
a batch write one idempotent micro-batch, as ``write_batch_exactly_once`` does).

One transaction per write
-------------------------
A batch write (``df.write``) is one Pulsar transaction. The driver opens it in the writer's
constructor (a short-lived client; only the transaction id and timeout are kept, because the
writer object is pickled to the executors). Each task produces its partition into that
transaction (``transaction_from_id``) and returns a commit message only after every receipt
(flush), with its per-topic counts. ``commit(messages)`` on the driver writes a ``COMMITTED``
ledger record *inside* the transaction (job, batch id ``<job>:<write id>``, outputs per topic
summed from the commit messages) and commits; ``abort(messages)`` aborts and writes ``ABORTED``.
Read-committed consumers see nothing of a write before its commit and nothing ever of an
aborted one; the ledger has a ``COMMITTED`` record exactly when the rows are visible.

Retried and speculative tasks: broker deduplication
---------------------------------------------------
Spark re-runs a task after a failure (up to ``spark.task.maxFailures``) and may run a
speculative copy next to a slow one, and all of them produce into the same transaction, so the
sink must make every attempt of a task write the *same* messages, which the broker then stores
once. It does so with broker deduplication (it must be enabled on the output namespaces; with
``admin_url`` the driver checks it for ``topic``, and each task for every topic it writes to,
through the admin REST API, and refuses to write when it is off):

- a task produces with producers named from (transaction id, Spark partition id):
  ``ptxn-<most>-<least>-p<partition>``, the same for every attempt of that partition and
  different for every other task and every other write;
- each row gets a sequence id: its index among the task's rows bound for the same topic
  partition (the task routes keyed rows by the key's hash like the client does, unkeyed rows
  round-robin by index, and produces to each partition directly);
- rows go out in deterministic batches (see below), so a second attempt re-sends the same
  batches with the same ``(producer name, sequence ids)``: the broker drops those it already
  stored (receipt ``-1:-1``; the commit message counts their rows as ``duplicates``) and stores
  the rest. Every attempt sends all its rows rather than
  skipping the ``last_sequence_id`` the broker reports on producer creation, because that
  number is the highest id *pushed*, which may include in-flight writes of a killed attempt that
  can still fail; re-sending lets the broker decide (a message between its persisted and pushed
  ids is answered with an error, and the producer re-sends it after a reconnect until it is
  resolved either way);
- attempts of one task never produce concurrently: before its first send each takes a *lease*,
  a producer named ``<name>-lease`` on the ledger topic that sends nothing. The broker refuses a
  second producer with a connected name (``ProducerBusy``), so an attempt waits until the one
  producing finishes, fails or dies (its connection closes), up to the transaction's timeout,
  then re-sends everything (all duplicates if the other finished). This also keeps two attempts
  from each holding one of the other's producers. An attempt slow *before* its first send (slow
  input, the usual reason for speculation) holds nothing, so a speculative copy can overtake it;
- sequence ids only work if every attempt sees the same rows in the same order, which a
  shuffle does not guarantee. With ``deterministic_order=true`` (the default) a task first reads
  its whole partition and sorts it by content (topic, key, value, sorted properties) before
  numbering, so identical inputs get identical ids whatever order they arrive in (the partition
  is held in memory). ``deterministic_order=false`` streams rows as they come, for inputs whose
  partition order is stable across attempts (no shuffle, or a sort within partitions). Either
  way the *contents* of a partition must be the same in every attempt: a non-deterministic
  transformation (``rand()``, ``now()``, a non-deterministic UDF) upstream breaks the guarantee.

Deterministic batches
---------------------
The broker deduplicates a batch message as a whole: the frame carries the batch's first and
last sequence id, and the broker drops the batch when the first is not above the highest id it
has seen from that producer name, else stores all of it. A batch that straddled stored and new
rows would be dropped with its new rows, so batch boundaries must not depend on timing — which
the client's own batching (cut by a delay timer, or by a flush on close after an error) does. The
sink therefore builds the batches itself, with the producer's batching off: the rows bound for
one topic partition, numbered as above, are cut into batches by row count (``batch_max_rows``)
and by a size computed from the rows' content (``batch_max_bytes``) only, and each batch goes out
(``AsyncProducer.send_batch_async``, with its rows' sequence ids) once it is complete or the
task's input has ended; an attempt that fails midway never sends its open batch. Every attempt
that sees the same rows therefore sends the same batches with the same ids, and each batch is
either already stored (dropped whole) or new (stored whole): nothing is lost or doubled. With
batches the sink writes about as fast as a plain ``foreachPartition`` with the official
client (``bench/bench_spark.py``); ``batch_max_rows=1`` sends one message per row (several
times slower).

Deduplication keeps per producer name state on the broker, purged after
``brokerDeduplicationProducerInactivityTimeoutMinutes`` (default 360) of inactivity; each task
of each write uses its own names.

Streaming: one transaction per micro-batch
------------------------------------------
``df.writeStream.format("pulsar-txn")`` writes each micro-batch in one transaction. PySpark's
``DataSourceStreamWriter`` has no driver hook before a micro-batch's tasks, and ``write()`` is not
told the batch id, but PySpark 4.1 (``PythonStreamingWrite.createStreamingWriterFactory``, which
runs ``pyspark/sql/worker/write_into_data_source.py``) creates a *fresh* stream writer on the
driver for every micro-batch and pickles it into that batch's tasks. The writer opens the
transaction when it is pickled (``__getstate__``), i.e. once per micro-batch on the driver, and
every task of the batch produces into it. ``commit(messages, batchId)`` runs on another writer
instance (``python_streaming_sink_runner.py`` calls ``streamWriter()`` again, without pickling),
so it takes the transaction id from the commit messages (a batch without tasks gets a
transaction of its own for its records). Opening lazily keeps that instance from opening one.

A micro-batch that Spark replays after a failure (the driver died after the sink committed but
before Spark logged the batch as done) must not be written twice. The ``COMMITTED`` record of a
micro-batch carries the query's identity and the batch id (``config.stream_key``,
``config.spark_batch_id``; batch id ``<job>:<query>:<batch>``) and is also written, inside the
transaction, to a per-query marker topic (``pulsar-txn-stream-<hash>`` next to the ledger).
Before committing, ``commit`` looks there: if the batch already has a marker, it aborts this
transaction instead (and writes an ``ABORTED`` record, ``DuplicateMicroBatch``), so the replay's
rows are never visible. The check happens at commit rather
than before the tasks run because nothing before the tasks knows the batch id; the result is the
same. The query's identity is the ``query_id`` option, or else the Spark query id read from
``<checkpointLocation>/metadata`` (a local checkpoint); a new checkpoint means a new query.
Markers are written in batch order, so the check reads the tail of the marker topic up to a
probe message it writes first (a transaction left open by a crashed driver holds the probe back:
then the batch fails rather than guess).

``write_batch_exactly_once(batch_df, batch_id, query_id, options)`` is the same for
``foreachBatch``: it skips a batch already committed before running any task, then writes it as
one transaction with the same marker.

When the writer opens a micro-batch's transaction it also leaves a ``STARTED`` record with the
transaction id on the marker topic (outside the transaction): ``abort(messages, batchId)`` gets
no writer state and, when every task failed, no transaction id in the messages, so it aborts the
newest STARTED transaction of the query instead of leaving it open until its timeout (an open
transaction holds back read-committed consumers of its topics).

Test hook: ``PULSAR_TXN_FAULT=kill_before_sink_commit:<batch id>`` or
``kill_after_sink_commit:<batch id>`` in the driver's environment SIGKILLs the driver (the
process group of its JVM) in the stream writer's ``commit`` of that micro-batch: before its
transaction is committed (its tasks have produced), or right after it committed, before Spark
logs the batch as done (the restart replays it). For crash tests only (see :func:`_fault_hook`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, LongType, MapType, StringType, StructType, TimestampType

from txn.delivery.batch_ids import micro_batch_id, stream_next_id, write_batch_id
from txn.delivery.ledger import Kind, LedgerRecord, RecordConfig, default_ledger_topic, now_ms
from txn.producer import HashingScheme
from txn.settings import BrokerSettings

from .options import (
    CONNECTION_ALIASES,
    SECURITY_OPTIONS,
    broker_settings,
    camel_aliases,
    camel_case,
    lower_options,
    refuse_unknown,
    resolve_aliases,
)
from .sink_runtime import (
    BATCH_MAX_BYTES,
    BATCH_MAX_ROWS,
    DeduplicationDisabled,
    SinkError,
    TaskPlan,
    abort_stream_batch,
    abort_transaction,
    canonical_topic,
    checkpoint_query_id,
    commit_transaction,
    is_stream_batch_committed,
    open_transaction,
    record_stream_open,
    require_deduplication,
    run,
    write_ledger,
    write_partition,
)
from .value_schema import TopicValueSchema, ValueSchemaError, registry_get

__all__ = [
    "FORMAT",
    "DeduplicationDisabled",
    "ExtraColumnsError",
    "PulsarTxnArrowWriter",
    "PulsarTxnDataSource",
    "PulsarTxnStreamArrowWriter",
    "PulsarTxnStreamWriter",
    "PulsarTxnWriter",
    "SinkCommitMessage",
    "SinkError",
    "SinkOptions",
    "UncheckedRetry",
    "write_batch_exactly_once",
]

log = logging.getLogger("spark_jobs.sink")

FORMAT = "pulsar-txn"
DEFAULT_JOB = "spark-pulsar-txn"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


# ------------------------------------------------------------------------------ options


#: Every option the sink reads, as users write them (``checkpointLocation`` is Spark's own).
SINK_OPTIONS = ("serviceUrl", "adminUrl", "topic", "ledgerTopic", "job", "txnTimeoutMs", "deterministicOrder",
                "batchMaxRows", "batchMaxBytes", "queryId", "batchId", "extraColumns", "writer", "encodeValue",
                "hashingScheme",
                "checkpointLocation", *SECURITY_OPTIONS)
#: Internal key -> other names: the camelCase names above for the snake-case keys (the older names).
SINK_ALIASES = {**CONNECTION_ALIASES, **camel_aliases(("ledger_topic", "txn_timeout_ms", "deterministic_order",
                                                       "batch_max_rows", "batch_max_bytes", "query_id", "batch_id"))}


@dataclass(slots=True)
class SinkOptions:
    """The sink's options, validated."""

    service_url: str
    admin_url: str | None = None
    topic: str | None = None
    txn_timeout_ms: int = 60000
    ledger_topic: str = ""
    job: str = DEFAULT_JOB
    deterministic_order: bool = True
    query_id: str | None = None
    batch_id: int | None = None
    checkpoint_location: str | None = None
    batch_max_rows: int = BATCH_MAX_ROWS
    batch_max_bytes: int = BATCH_MAX_BYTES
    #: Connection: URLs, credentials, TLS (``authToken``, ``tlsTrustCertsFilePath``, ...).
    settings: BrokerSettings | None = None
    #: Columns other than the sink's: ``error`` (refuse the write, naming them) or ``ignore``.
    extra_columns: str = "error"
    #: The task-side write path: ``arrow`` (Arrow record batches) or ``rows`` (PySpark rows).
    writer: str = "arrow"
    #: ``encodeValue=true``: the topic's registered schema, which encodes the ``value`` column
    #: (:mod:`spark_jobs.value_schema`); None: ``value`` is the payload's bytes or text.
    value_schema: TopicValueSchema | None = None
    #: ``hashingScheme``: the partition hash of keyed rows (the client's default, the official
    #: Python client's; ``JavaStringHash`` for topics shared with Java producers).
    hashing_scheme: HashingScheme = HashingScheme.BoostHash

    @property
    def conn(self) -> BrokerSettings | str:
        """What :mod:`spark_jobs.sink_runtime` connects with."""
        return self.settings if self.settings is not None else self.service_url

    @classmethod
    def parse(cls, options: Any) -> SinkOptions:
        """From Spark's (case-insensitive) options; raises :class:`SinkError` on bad ones
        (:class:`spark_jobs.options.OptionError` for connection options, alias conflicts and unknown options)."""
        o = resolve_aliases(lower_options(options), SINK_ALIASES)
        refuse_unknown(o, SINK_OPTIONS, "pulsar-txn sink", SINK_ALIASES)
        if not o.get("service_url"):
            raise SinkError("the pulsar-txn sink needs option serviceUrl (aliases service_url, service.url), "
                            "e.g. pulsar://localhost:6650")
        settings = broker_settings(o, "pulsar-txn sink")
        url = settings.service_url
        extra_columns = str(o.get("extracolumns", "error")).strip().lower()
        if extra_columns not in ("error", "ignore"):
            raise SinkError(f"option extraColumns must be error or ignore, got {o.get('extracolumns')!r}")
        scheme_name = str(o.get("hashingscheme", "BoostHash")).strip()
        schemes = {m.name.lower(): m for m in HashingScheme}
        if scheme_name.lower() not in schemes:
            raise SinkError(f"option hashingScheme must be one of {', '.join(m.name for m in HashingScheme)}, "
                            f"got {scheme_name!r}")
        writer = str(o.get("writer", "arrow")).strip().lower()
        if writer not in ("arrow", "rows"):
            raise SinkError(f"option writer must be arrow or rows, got {o.get('writer')!r}")
        topic = o.get("topic") or None
        try:
            topic = canonical_topic(topic) if topic else None
        except ValueError as exc:
            raise SinkError(f"option topic: {exc}") from None
        ledger = o.get("ledger_topic") or None
        if ledger is None:
            if topic is None:
                raise SinkError("without option topic the pulsar-txn sink needs option ledgerTopic")
            ledger = default_ledger_topic(topic)
        try:
            ledger = canonical_topic(ledger)
        except ValueError as exc:
            raise SinkError(f"option ledgerTopic: {exc}") from None
        try:
            timeout = int(o.get("txn_timeout_ms", 60000))
        except ValueError:
            raise SinkError(f"option txnTimeoutMs must be an integer, got {o.get('txn_timeout_ms')!r}") from None
        if timeout <= 0:
            raise SinkError("option txnTimeoutMs must be positive")
        det = str(o.get("deterministic_order", "true")).strip().lower()
        if det not in _TRUE + _FALSE:
            raise SinkError(f"option deterministicOrder must be true or false, got {det!r}")
        batch_id = o.get("batch_id")
        try:
            batch_id = None if batch_id in (None, "") else int(batch_id)
        except ValueError:
            raise SinkError(f"option batchId must be an integer, got {batch_id!r}") from None
        query_id = o.get("query_id") or None
        if batch_id is not None and not query_id:
            raise SinkError("option batchId needs option queryId")
        value_schema = None
        if str(o.get("encodevalue", "false")).strip().lower() in _TRUE:
            value_schema = _registered_schema(topic, settings)
        limits = {}
        for name, default in (("batch_max_rows", BATCH_MAX_ROWS), ("batch_max_bytes", BATCH_MAX_BYTES)):
            try:
                limits[name] = int(o.get(name, default))
            except ValueError:
                raise SinkError(f"option {camel_case(name)} must be an integer, got {o.get(name)!r}") from None
            if limits[name] <= 0:
                raise SinkError(f"option {camel_case(name)} must be positive")
        return cls(
            service_url=str(url),
            admin_url=settings.admin_url,
            topic=topic,
            txn_timeout_ms=timeout,
            ledger_topic=ledger,
            job=str(o.get("job") or DEFAULT_JOB),
            deterministic_order=det in _TRUE,
            query_id=query_id,
            batch_id=batch_id,
            checkpoint_location=o.get("checkpointlocation") or None,
            settings=settings,
            extra_columns=extra_columns,
            writer=writer,
            value_schema=value_schema,
            hashing_scheme=schemes[scheme_name.lower()],
            **limits,
        )

    def stream_key(self) -> str:
        """The identity of a streaming query for the replay check (see the module docs)."""
        if self.query_id:
            return self.query_id
        if self.checkpoint_location:
            qid = checkpoint_query_id(self.checkpoint_location)
            if qid:
                return qid
        raise SinkError(
            "a pulsar-txn streaming write needs the query's identity to recognise a replayed micro-batch: give "
            "option checkpointLocation on a local file system (its metadata file holds the query id) or option "
            f"queryId (a stable name; change it when the checkpoint is reset). checkpointLocation="
            f"{self.checkpoint_location!r}"
        )


def _registered_schema(topic: str | None, settings: BrokerSettings) -> TopicValueSchema:
    """The schema ``encodeValue`` writes with: ``topic``'s, from the broker's registry."""
    if topic is None or not settings.admin_url:
        raise SinkError("option encodeValue needs options topic and adminUrl (the topic's schema is read from the "
                        "broker's schema registry)")
    try:
        got = registry_get(settings.admin_url, topic, settings.admin_kwargs())
        if got is None:
            raise SinkError(f"encodeValue: {topic} has no schema in the broker's registry (register one, e.g. by "
                            "producing to it with a schema, or write bytes with encodeValue=false)")
        return TopicValueSchema.from_registry(topic, got)
    except (ValueSchemaError, RuntimeError) as exc:
        raise SinkError(f"encodeValue: {exc}") from None


@dataclass(slots=True, frozen=True)
class _Columns:
    has_key: bool
    has_topic: bool
    has_props: bool
    has_event_time: bool = False


#: The columns the sink writes; any other is refused, or ignored with ``extraColumns=ignore``.
SINK_COLUMNS = ("value", "key", "topic", "properties", "event_time")


class ExtraColumnsError(SinkError):
    """The DataFrame has columns the sink does not write (``extraColumns=error``, the default)."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        super().__init__(
            f"the pulsar-txn sink writes columns {', '.join(SINK_COLUMNS)}; the DataFrame also has {columns}. "
            "Select only the sink's columns, or set option extraColumns=ignore to drop the others")


def _check_schema(schema: StructType, opts: SinkOptions) -> _Columns:
    fields = {f.name.lower(): f for f in schema.fields}
    extra = [f.name for f in schema.fields if f.name.lower() not in SINK_COLUMNS]
    if extra:
        if opts.extra_columns == "error":
            raise ExtraColumnsError(extra)
        log.warning("pulsar-txn sink: extraColumns=ignore, columns not written: %s", extra)
    v = fields.get("value")
    vs = opts.value_schema
    if vs is not None:
        want = vs.spark_type()
        if v is None or (vs.kind == "STRING" and not isinstance(v.dataType, StringType)) or (
                vs.kind != "STRING" and not isinstance(v.dataType, StructType)):
            raise SinkError(f"encodeValue: {opts.topic} has a {vs.kind} schema; the 'value' column must be "
                            f"{want.simpleString()}")
        if "topic" in fields:
            raise SinkError("encodeValue writes to option topic only; drop the 'topic' column")
    elif v is None or not isinstance(v.dataType, (BinaryType, StringType)):
        raise SinkError("the pulsar-txn sink needs a 'value' column of type binary or string")
    k = fields.get("key")
    if k is not None and not isinstance(k.dataType, (BinaryType, StringType)):
        raise SinkError("column 'key' must be string or binary")
    t = fields.get("topic")
    if t is not None and not isinstance(t.dataType, StringType):
        raise SinkError("column 'topic' must be a string")
    if t is None and opts.topic is None:
        raise SinkError("the pulsar-txn sink needs option topic or a 'topic' column")
    p = fields.get("properties")
    if p is not None and not (isinstance(p.dataType, MapType) and isinstance(p.dataType.keyType, StringType)
                              and isinstance(p.dataType.valueType, StringType)):
        raise SinkError("column 'properties' must be map<string,string>")
    e = fields.get("event_time")
    if e is not None and not isinstance(e.dataType, (TimestampType, LongType)):
        raise SinkError("column 'event_time' must be a timestamp (or a long: epoch milliseconds)")
    if any(f.name != f.name.lower() for f in schema.fields if f.name.lower() in SINK_COLUMNS):
        raise SinkError(f"name the sink's columns in lower case: {', '.join(SINK_COLUMNS)}")
    return _Columns(k is not None, t is not None, p is not None, e is not None)


class UncheckedRetry(SinkError):
    """A retried (or speculative) task attempt of a sink without ``admin_url``: nothing shows that
    broker deduplication would drop what an earlier attempt stored, so the attempt fails (and with
    it the write, whose transaction is aborted) rather than risk duplicate rows."""

    def __init__(self, partition_id: int, attempt: int) -> None:
        self.partition_id, self.attempt = partition_id, attempt
        super().__init__(
            f"pulsar-txn sink: attempt {attempt} of write task {partition_id} refused: without option adminUrl the "
            "sink cannot check that broker deduplication is enabled, so a retried task could duplicate rows; the "
            "write fails and its transaction is aborted. Give adminUrl (with deduplication enabled on the output "
            "namespaces) to have retries written exactly once")

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return type(self), (self.partition_id, self.attempt)


# ------------------------------------------------------------------------- messages


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports: the transaction it wrote into and how much, per topic."""

    txn_id: str
    partition_id: int
    attempt: int
    counts: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    opened_at_ms: int = 0


def _totals(messages: list[Any]) -> tuple[dict[str, int], int, int]:
    outputs: dict[str, int] = {}
    rows = dups = 0
    for m in messages:
        if m is None:
            continue
        for topic, n in m.counts.items():
            outputs[topic] = outputs.get(topic, 0) + n
        rows += m.rows
        dups += m.duplicates
    return outputs, rows, dups


# ------------------------------------------------------------------------- writers


class _WriterBase:
    """What the batch and the streaming writer share: the task side."""

    opts: SinkOptions
    cols: _Columns
    txn_id: str | None
    opened_at_ms: int

    def _task_info(self) -> tuple[int, int]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise SinkError("the pulsar-txn writer's write() runs inside a Spark task")
        return ctx.partitionId(), ctx.attemptNumber()

    #: Whether ``write`` gets Arrow record batches (the Arrow writers) or rows.
    _ARROW = False

    def write(self, iterator: Any) -> SinkCommitMessage:
        if not self.txn_id:
            raise SinkError("the pulsar-txn writer reached a task without a transaction (unexpected PySpark "
                            "behaviour: the writer is expected to be pickled on the driver)")
        partition_id, attempt = self._task_info()
        o = self.opts
        if attempt > 0 and not o.admin_url:
            raise UncheckedRetry(partition_id, attempt)
        plan = TaskPlan(
            service_url=o.service_url, admin_url=o.admin_url, txn_id=self.txn_id, txn_timeout_ms=o.txn_timeout_ms,
            default_topic=o.topic, lease_topic=o.ledger_topic, partition_id=partition_id, attempt=attempt,
            deterministic_order=o.deterministic_order, has_key=self.cols.has_key, has_topic=self.cols.has_topic,
            has_props=self.cols.has_props, batch_max_rows=o.batch_max_rows, batch_max_bytes=o.batch_max_bytes,
            has_event_time=self.cols.has_event_time, settings=o.settings, value_schema=o.value_schema,
            hashing_scheme=int(o.hashing_scheme),
        )
        res = run(write_partition(plan, iterator, getattr(self, "_after_send", None), self._ARROW))
        log.info("pulsar-txn task p%d attempt %d: %d rows into %s (%d already stored) in %.2fs", partition_id,
                 attempt, res.rows, self.txn_id, res.duplicates, res.seconds)
        return SinkCommitMessage(self.txn_id, partition_id, attempt, res.counts, res.rows, res.duplicates,
                                 res.seconds, self.opened_at_ms)

    def _record(self, batch_id: str, messages: list[Any], extra: dict[str, Any]) -> LedgerRecord:
        outputs, rows, dups = _totals(messages)
        o = self.opts
        config = RecordConfig.of(
            sink=FORMAT, topic=o.topic, ledger_topic=o.ledger_topic, tasks=len(messages), rows=rows,
            duplicates_dropped=dups, deterministic_order=o.deterministic_order, batch_max_rows=o.batch_max_rows,
            task_attempts={str(m.partition_id): m.attempt for m in messages if m is not None}, **extra)
        return LedgerRecord(kind=Kind.COMMITTED, job=o.job, batch_id=batch_id, txn_id=self.txn_id, attempt=1, inputs={},
                            outputs=outputs, started_at_ms=self.opened_at_ms or now_ms(), config=config)


    def _replay_dropped(self, rec: LedgerRecord, reason: str) -> None:
        """A replayed micro-batch's transaction was aborted: say so in the ledger."""
        log.warning("pulsar-txn %s: %s", rec.batch_id, reason)
        rec.kind, rec.error, rec.ended_at_ms = Kind.ABORTED, f"DuplicateMicroBatch: {reason}", now_ms()
        run(write_ledger(self.opts.conn, self.opts.ledger_topic, rec))


class PulsarTxnWriter(_WriterBase, DataSourceWriter):
    """Batch writer: one transaction per write, opened here, on the driver."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.cols = _check_schema(schema, opts)
        if opts.topic:
            require_deduplication(opts.admin_url, opts.topic, settings=opts.settings)
        self.write_id = uuid.uuid4().hex[:16]
        if opts.batch_id is not None:  # a foreachBatch micro-batch: idempotent per (query, batch)
            self.batch_key = micro_batch_id(opts.job, opts.query_id, opts.batch_id)
        else:
            self.batch_key = write_batch_id(opts.job, self.write_id)
        self.opened_at_ms = now_ms()
        self.txn_id = run(open_transaction(opts.conn, opts.txn_timeout_ms))
        run(write_ledger(opts.conn, opts.ledger_topic,
                         LedgerRecord(kind=Kind.STARTED, job=opts.job, batch_id=self.batch_key, txn_id=self.txn_id,
                                      started_at_ms=self.opened_at_ms,
                                      config=RecordConfig.of(sink=FORMAT, topic=opts.topic))))
        log.info("pulsar-txn write %s: transaction %s opened", self.batch_key, self.txn_id)

    def commit(self, messages: list[Any]) -> None:
        o = self.opts
        extra: dict[str, Any] = {"write_id": self.write_id}
        stream_key = None
        if o.batch_id is not None:
            stream_key = o.query_id
            extra.update(stream_key=stream_key, query_id=o.query_id, spark_batch_id=o.batch_id)
        rec = self._record(self.batch_key, messages, extra)
        res = run(commit_transaction(o.conn, self.txn_id, o.txn_timeout_ms, o.ledger_topic, rec,
                                     stream_key, o.batch_id))
        if res.committed:
            log.info("pulsar-txn write %s: committed %s: %s", self.batch_key, self.txn_id, res.outputs)
        else:
            self._replay_dropped(rec, res.reason)

    def abort(self, messages: list[Any]) -> None:
        o = self.opts
        run(abort_transaction(o.conn, self.txn_id, o.txn_timeout_ms))
        outputs, _, _ = _totals(messages)
        failed = sum(1 for m in messages if m is None)
        run(write_ledger(o.conn, o.ledger_topic, LedgerRecord(
            kind=Kind.ABORTED, job=o.job, batch_id=self.batch_key, txn_id=self.txn_id, started_at_ms=self.opened_at_ms,
            ended_at_ms=now_ms(), outputs=outputs,
            error=f"SparkWriteAborted: {failed} of {len(messages)} task(s) failed",
            config=RecordConfig.of(sink=FORMAT, topic=o.topic))))
        log.warning("pulsar-txn write %s: aborted %s", self.batch_key, self.txn_id)


FAULT_ENV = "PULSAR_TXN_FAULT"


def _fault_hook(point: str, batch_id: int) -> None:
    """Test hook: SIGKILL the driver at ``point`` of micro-batch ``batch_id`` if ``$PULSAR_TXN_FAULT``
    is ``<point>:<batch_id>`` (points: ``kill_before_sink_commit``, ``kill_after_sink_commit``).

    The stream writer's ``commit`` runs in a Python process the driver JVM started (in the JVM's
    process group, or in the group of PySpark's worker daemon): kill the JVM's process group
    (the JVM and the Python driver that launched it), then this process's group, then this
    process. Set it only for the run that should die: the restart reaches the same point again.
    """
    import os
    import signal
    from pathlib import Path

    if os.environ.get(FAULT_ENV) != f"{point}:{batch_id}":
        return
    log.warning("%s=%s: SIGKILL of the driver", FAULT_ENV, os.environ[FAULT_ENV])
    pid, groups = os.getpid(), []
    for _ in range(16):  # up the parent chain to the driver JVM
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm == "java":
            groups.append(int(rest[2]))  # its process group
            break
        pid = int(rest[1])  # parent
        if pid <= 1:
            break
    groups.append(os.getpgid(0))
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


class PulsarTxnStreamWriter(_WriterBase, DataSourceStreamWriter):
    """Streaming writer: one transaction per micro-batch (see the module docs for how)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.cols = _check_schema(schema, opts)
        self.stream_key = opts.stream_key()
        if opts.topic:
            require_deduplication(opts.admin_url, opts.topic, settings=opts.settings)
        self.txn_id = None
        self.opened_at_ms = 0

    def __getstate__(self) -> dict[str, Any]:
        # Pickled only on the driver, once per micro-batch, to ship the writer to its tasks:
        # the moment to open the micro-batch's transaction.
        if self.txn_id is None:
            self.opened_at_ms = now_ms()
            self.txn_id = run(open_transaction(self.opts.conn, self.opts.txn_timeout_ms))
            o = self.opts
            run(record_stream_open(o.conn, o.ledger_topic, self.stream_key, LedgerRecord(
                kind=Kind.STARTED, job=o.job, batch_id=stream_next_id(o.job, self.stream_key), txn_id=self.txn_id,
                started_at_ms=self.opened_at_ms,
                config=RecordConfig.of(sink=FORMAT, stream_key=self.stream_key, topic=o.topic))))
            log.info("pulsar-txn stream %s: transaction %s opened for the next micro-batch", self.stream_key,
                     self.txn_id)
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _batch_txn(self, messages: list[Any]) -> str | None:
        ids = {m.txn_id for m in messages if m is not None}
        if len(ids) > 1:
            raise SinkError(f"tasks of one micro-batch wrote into different transactions: {sorted(ids)}")
        return next(iter(ids), None)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - PySpark's name
        o = self.opts
        self.txn_id = self._batch_txn(messages)
        opened = [m.opened_at_ms for m in messages if m is not None and m.opened_at_ms]
        self.opened_at_ms = min(opened) if opened else now_ms()
        batch_key = micro_batch_id(o.job, self.stream_key, int(batchId))
        rec = self._record(batch_key, messages, {"stream_key": self.stream_key, "query_id": self.stream_key,
                                                 "spark_batch_id": int(batchId)})
        _fault_hook("kill_before_sink_commit", batchId)
        res = run(commit_transaction(o.conn, self.txn_id, o.txn_timeout_ms, o.ledger_topic, rec,
                                     self.stream_key, int(batchId)))
        if res.committed:
            _fault_hook("kill_after_sink_commit", batchId)
            log.info("pulsar-txn stream %s batch %d: committed %s: %s", self.stream_key, batchId, res.txn_id,
                     res.outputs)
        else:
            self._replay_dropped(rec, res.reason)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        o = self.opts
        txn_id = self._batch_txn(messages)
        if txn_id is not None:
            run(abort_transaction(o.conn, txn_id, o.txn_timeout_ms))
        else:  # no task reported: find the transaction from the STARTED record its writer left
            txn_id = run(abort_stream_batch(o.conn, o.ledger_topic, self.stream_key, o.txn_timeout_ms))
            if txn_id is None:
                log.warning("pulsar-txn stream %s batch %d aborted; its transaction was not found and ends at its "
                            "timeout", self.stream_key, batchId)
                return
        run(write_ledger(o.conn, o.ledger_topic, LedgerRecord(
            kind=Kind.ABORTED, job=o.job, batch_id=micro_batch_id(o.job, self.stream_key, int(batchId)),
            txn_id=txn_id, ended_at_ms=now_ms(), error="SparkWriteAborted",
            config=RecordConfig.of(sink=FORMAT, stream_key=self.stream_key, spark_batch_id=int(batchId)))))


class PulsarTxnArrowWriter(PulsarTxnWriter, DataSourceArrowWriter):
    """Batch writer whose tasks get Arrow record batches (option ``writer=arrow``, the default)."""

    _ARROW = True


class PulsarTxnStreamArrowWriter(PulsarTxnStreamWriter, DataSourceStreamArrowWriter):
    """Streaming writer whose tasks get Arrow record batches (option ``writer=arrow``, the default)."""

    _ARROW = True


class PulsarTxnDataSource(DataSource):
    """The ``pulsar-txn`` format: this sink, and the ``pulsar`` source's reads under the same name
    (``spark.read.format("pulsar-txn")``; the source's options, see :mod:`spark_jobs.source`).
    ``pulsar``, which StreamNative's connector also calls itself, stays the source's old name."""

    #: The writer classes by option ``writer``: (batch, streaming).
    WRITERS: dict[str, tuple[type[PulsarTxnWriter], type[PulsarTxnStreamWriter]]] = {
        "arrow": (PulsarTxnArrowWriter, PulsarTxnStreamArrowWriter),
        "rows": (PulsarTxnWriter, PulsarTxnStreamWriter),
    }

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from .source import PulsarDataSource

        return PulsarDataSource(self.options).schema()  # the source's columns (value typed by decodeValue)

    def reader(self, schema: StructType) -> Any:
        from .source import PulsarDataSource

        return PulsarDataSource(self.options).reader(schema)

    def streamReader(self, schema: StructType) -> Any:  # noqa: N802
        from .source import PulsarDataSource

        return PulsarDataSource(self.options).streamReader(schema)

    def writer(self, schema: StructType, overwrite: bool) -> PulsarTxnWriter:
        if overwrite:
            raise SinkError("the pulsar-txn sink only appends; use mode('append')")
        opts = SinkOptions.parse(self.options)
        return self.WRITERS[opts.writer][0](opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PulsarTxnStreamWriter:  # noqa: N802
        if overwrite:
            raise SinkError("the pulsar-txn sink only appends; use outputMode('append')")
        opts = SinkOptions.parse(self.options)
        return self.WRITERS[opts.writer][1](opts, schema)


# --------------------------------------------------------------------- foreachBatch


_registered: set[int] = set()


def write_batch_exactly_once(batch_df: Any, batch_id: int, query_id: str, options: dict[str, Any]) -> bool:
    """Write one ``foreachBatch`` micro-batch exactly once; returns False if it was already committed.

    ``query_id`` names the stream (stable across restarts from the same checkpoint; change it
    when the checkpoint is reset). A batch that already has a COMMITTED marker is skipped before
    any task runs; otherwise it is written as one transaction whose commit re-checks the marker.
    """
    opts = {**{str(k): str(v) for k, v in options.items()}, "query_id": str(query_id), "batch_id": str(batch_id)}
    so = SinkOptions.parse(opts)
    done = run(is_stream_batch_committed(so.conn, so.ledger_topic, str(query_id), int(batch_id)))
    if done is not None:
        log.warning("pulsar-txn foreachBatch %s batch %d: already committed in %s; skipped", query_id, batch_id,
                    done.txn_id)
        return False
    spark = batch_df.sparkSession
    if id(spark) not in _registered:
        spark.dataSource.register(PulsarTxnDataSource)
        _registered.add(id(spark))
    batch_df.write.format(FORMAT).options(**opts).mode("append").save()
    return True
