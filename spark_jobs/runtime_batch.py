"""One micro-batch of the distributed runtime as a Spark job: read ranges, transform, write into the transaction.

The job is a normal Spark plan, and its rows stay on the executors:

1. ``spark.range(n, numPartitions=n).mapInArrow(read)``: task ``i`` reads range ``i`` (the
   ``pulsar`` source's reading code: a reader per task, Arrow record batches with the source's
   columns). A capped range ends at the first entry boundary after its cap; each task reports the
   entry it ended at and how many messages it read through an accumulator (merged by position,
   so a re-run task or a second scan of the same range reports the same end).
2. The user's ``DataFrame -> DataFrame`` transform, as it is (filters, joins, windows, shuffles).
3. ``mapInArrow(write)`` over the result: each task produces its rows into the batch's transaction
   with the ``pulsar-txn`` sink's write path (:func:`spark_jobs.sink_runtime.write_partition`):
   producer names from (transaction, task partition), deterministic batches and sequence ids,
   so a retried or speculative attempt re-sends the same batches and broker deduplication drops
   what is already stored. Each task returns one summary row (counts per topic): the only rows
   the driver collects.

A retried write attempt is exact only where broker deduplication is on. The driver says whether
it verified that (``exact_retries``, through the admin API); if it did not, a retried attempt
refuses to write and fails, which fails the job: the driver aborts the transaction and runs the
batch again in a new one (nothing of the failed attempt is ever visible).

:func:`list_entries` is the same read reporting only ``(partition, ledger, entry, messages)`` per
entry: the driver narrows a failing batch with it without seeing a message body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import txn
from txn.settings import BrokerSettings

from .runtime_plan import Entry, Range, ReadEnd, wire_entry
from .sink_runtime import TaskPlan, run, write_partition
from .source import SCHEMA, SourceOptions, _arrow_schema, _Pulsar, _to_arrow

#: Messages per Arrow record batch a read task hands to Spark.
ROWS_PER_BATCH = 4096
SUMMARY_SCHEMA = "partition long, attempt long, counts string, rows long, duplicates long"
ENTRY_SCHEMA = "name string, ledger long, entry long, messages long"
OUTPUT_COLUMNS = ("key", "value", "topic", "properties", "event_time")


class TransformError(RuntimeError):
    """The transform, or the Spark job that runs it, failed: the batch aborts (and is retried)."""


class BrokerSideError(TransformError):
    """A task of the batch's job failed on the broker's side (a lost connection, a timeout, a busy
    coordinator): not the batch's fault, so it does not count towards ``max_attempts``."""


#: Marks a task failure that is the broker's side (see :func:`_broker_side`); Spark passes the
#: task's error text to the driver.
BROKER_SIDE = "[pulsar-txn broker-side]"


def _broker_side(exc: BaseException) -> bool:
    """A Pulsar error that another attempt may not meet (not a bad output, like a message too big)."""
    from txn.errors import InvalidTopicName, MessageTooBig, NotAllowed, TopicNotFound

    return isinstance(exc, txn.PulsarError) and not isinstance(
        exc, (MessageTooBig, InvalidTopicName, TopicNotFound, NotAllowed))


# ---------------------------------------------------------------------------------- reading


@dataclass
class _ReadState:
    r: Range
    count: int = 0
    size: int = 0  # payload bytes read
    last: Entry | None = None
    entry_open: bool = False
    done: bool = False


async def _take(reader: Any, st: _ReadState, limit: int, poll_ms: int, sink: list[txn.Message]) -> None:
    """Read up to ``limit`` more messages of ``st.r`` into ``sink`` (fewer when the range ends)."""
    r = st.r
    n = 0
    while n < limit and not st.done:
        try:
            m = await reader.read_next(poll_ms)
        except txn.Timeout:
            raise RuntimeError(f"pulsar-txn runtime: no message from {r.name} within {poll_ms} ms after "
                               f"{st.last or r.after} while reading its range up to {r.to}") from None
        mid = m.message_id()
        entry = (mid.ledger_id(), mid.entry_id())
        if entry <= r.after or (st.last is not None and entry < st.last):
            continue  # before the range (a redelivery)
        capped = _capped(r, st)
        if entry > r.to or (capped and st.last is not None and entry != st.last):
            st.done = True  # past the range, or the cap reached and a new entry begins
            return
        sink.append(m)
        n += 1
        st.count += 1
        st.size += len(m.data())
        st.last = entry
        st.entry_open = mid.batch_index() >= 0 and not (mid.batch_size > 0 and mid.batch_index() >= mid.batch_size - 1)
        if not st.entry_open and (entry == r.to or _capped(r, st)):
            st.done = True


def _capped(r: Range, st: _ReadState) -> bool:
    """The range's cap is reached: its messages, or its payload bytes."""
    return (r.cap is not None and st.count >= r.cap) or (r.cap_bytes is not None and st.size >= r.cap_bytes)


def _scan(opts: SourceOptions, r: Range, poll_ms: int) -> Iterator[tuple[list[txn.Message], _ReadState]]:
    """The messages of range ``r`` in chunks, then its final state."""
    conn = _Pulsar(opts)
    try:
        start = txn.EARLIEST if r.after[0] < 0 else txn.MessageId(ledger_id=r.after[0], entry_id=wire_entry(r.after[1]))
        reader = conn.run(conn.client.create_reader(r.name, start, receiver_queue_size=1000))
        st = _ReadState(r)
        while not st.done:
            msgs: list[txn.Message] = []
            conn.run(_take(reader, st, ROWS_PER_BATCH, poll_ms, msgs))
            yield msgs, st
    finally:
        conn.close()


def reader_fn(opts: SourceOptions, ranges: list[Range], acc: Any, poll_ms: int) -> Callable[[Any], Iterator[Any]]:
    """The ``mapInArrow`` function of step 1 (row ``i`` of ``spark.range`` reads ``ranges[i]``)."""

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        schema = _arrow_schema()
        for b in batches:
            for i in b.column(0).to_pylist():
                r = ranges[i]
                final = None
                try:
                    for msgs, st in _scan(opts, r, poll_ms):
                        final = st
                        if msgs:
                            yield _to_arrow(msgs, r, schema)  # type: ignore[arg-type] - has .topic, .partition
                except Exception as exc:
                    if _broker_side(exc):
                        raise RuntimeError(f"{BROKER_SIDE} read of {r.name}: {type(exc).__name__}: {exc}") from exc
                    raise
                if final is not None and final.last is not None:
                    acc.add({r.name: (final.last[0], final.last[1], final.count)})

    return read


def entries_fn(opts: SourceOptions, ranges: list[Range], poll_ms: int) -> Callable[[Any], Iterator[Any]]:
    """The ``mapInArrow`` function of :func:`list_entries`."""

    def entries(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for b in batches:
            for i in b.column(0).to_pylist():
                r = ranges[i]
                rows: dict[Entry, int] = {}
                for msgs, _ in _scan(opts, r, poll_ms):
                    for m in msgs:
                        mid = m.message_id()
                        e = (mid.ledger_id(), mid.entry_id())
                        rows[e] = rows.get(e, 0) + 1
                if rows:
                    yield pa.RecordBatch.from_pylist(
                        [{"name": r.name, "ledger": e[0], "entry": e[1], "messages": n}
                         for e, n in sorted(rows.items())],
                        schema=pa.schema([("name", pa.string()), ("ledger", pa.int64()), ("entry", pa.int64()),
                                          ("messages", pa.int64())]))

    return entries


def _ends_param() -> Any:
    from pyspark.accumulators import AccumulatorParam

    class Ends(AccumulatorParam):  # type: ignore[misc, type-arg]
        """{partition: (ledger, entry, count)}, the furthest end wins."""

        def zero(self, value: Any) -> dict[str, tuple[int, int, int]]:
            return {}

        def addInPlace(self, a: dict, b: dict) -> dict:  # noqa: N802 - PySpark's name
            for k, v in b.items():
                if k not in a or tuple(v[:2]) > tuple(a[k][:2]):
                    a[k] = tuple(v)
            return a

    return Ends()


# ---------------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class WriteConfig:
    """What a write task needs (pickled into the tasks)."""

    service_url: str
    txn_id: str
    txn_timeout_ms: int
    default_topic: str
    lease_topic: str
    exact_retries: bool
    deterministic_order: bool = True
    batch_max_rows: int = 1000
    batch_max_bytes: int = 128 * 1024
    #: Credentials and TLS of the executors' clients (None: ``service_url`` without them).
    settings: BrokerSettings | None = None


def writer_fn(cfg: WriteConfig, columns: tuple[str, ...],
              fail_hook: str | None = None) -> Callable[[Any], Iterator[Any]]:
    """The ``mapInArrow`` function of step 3: produce the task's rows into the transaction."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        pid, attempt = ctx.partitionId(), ctx.attemptNumber()
        if attempt > 0 and not cfg.exact_retries:
            raise RuntimeError(
                f"pulsar-txn runtime: attempt {attempt} of write task {pid} refused: broker deduplication is not "
                "verified on the output (give admin_url and enable it), so a retried task could duplicate rows; "
                "the batch is aborted and run again in a new transaction")
        hook = _fail_hook(fail_hook, pid, attempt) if fail_hook else None
        plan = TaskPlan(
            service_url=cfg.service_url, admin_url=None, txn_id=cfg.txn_id, txn_timeout_ms=cfg.txn_timeout_ms,
            default_topic=cfg.default_topic, lease_topic=cfg.lease_topic, partition_id=pid, attempt=attempt,
            deterministic_order=cfg.deterministic_order, has_key="key" in columns, has_topic="topic" in columns,
            has_props="properties" in columns, has_event_time="event_time" in columns,
            batch_max_rows=cfg.batch_max_rows, batch_max_bytes=cfg.batch_max_bytes, settings=cfg.settings)
        try:
            res = run(write_partition(plan, batches, hook, arrow=True))
        except Exception as exc:
            if _broker_side(exc):
                raise RuntimeError(f"{BROKER_SIDE} write task {pid}: {type(exc).__name__}: {exc}") from exc
            raise
        yield pa.RecordBatch.from_pylist(
            [{"partition": pid, "attempt": attempt, "counts": json.dumps(res.counts), "rows": res.rows,
              "duplicates": res.duplicates}],
            schema=pa.schema([("partition", pa.int64()), ("attempt", pa.int64()), ("counts", pa.string()),
                              ("rows", pa.int64()), ("duplicates", pa.int64())]))

    return write


def _fail_hook(directory: str, pid: int, attempt: int) -> Any:
    """Test hook (``write_fail_dir``): the first attempt of each write task (the one that creates
    ``<dir>/p<partition>``) fails after it has sent its first batch of rows: a task that dies
    midway, its first rows already in the transaction (with a ``<dir>/broker-side`` file, with a
    broker-side error). Returns the send hook, or None."""
    import os

    marker = os.path.join(directory, f"p{pid}")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return None
    os.close(fd)
    broker_side = os.path.exists(os.path.join(directory, "broker-side"))

    async def hook(index: int, fut: Any) -> None:
        await fut  # the row is stored (in the open transaction)
        what = f"test fault: write task {pid} attempt {attempt} fails after sending row {index}"
        if broker_side:  # as if its connection to the broker broke
            raise txn.ConnectError(what)
        raise RuntimeError(what)

    return hook


# ---------------------------------------------------------------------------------- the job


@dataclass(slots=True)
class BatchResult:
    """What a batch's Spark job did: where each range's read ended, and the writes' totals."""

    ends: dict[str, ReadEnd]
    outputs: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    duplicates: int = 0
    tasks: int = 0
    attempts: dict[str, int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(e.count for e in self.ends.values())


def run_batch(spark: Any, transform: Callable[[Any], Any], opts: SourceOptions, ranges: list[Range],
              cfg: WriteConfig, poll_ms: int, fail_hook: str | None = None) -> BatchResult:
    """Run one batch's Spark job (see the module docs); raises :class:`TransformError` if it fails."""
    sc = spark.sparkContext
    acc = sc.accumulator({}, _ends_param())
    try:
        in_df = spark.range(len(ranges), numPartitions=len(ranges)).mapInArrow(
            reader_fn(opts, ranges, acc, poll_ms), SCHEMA)
        out = transform(in_df)
        cols = tuple(c for c in OUTPUT_COLUMNS if c in out.columns)
        if "value" not in cols:
            raise ValueError("the transform's result needs a 'value' column (binary or string)")
        summaries = out.select(*cols).mapInArrow(writer_fn(cfg, cols, fail_hook), SUMMARY_SCHEMA).collect()
    except Exception as exc:  # the transform, or the Spark job running it, failed: the batch fails
        if BROKER_SIDE in str(exc):
            raise BrokerSideError(f"{type(exc).__name__}: {_short(exc)}") from exc
        raise TransformError(f"{type(exc).__name__}: {_short(exc)}") from exc
    ends = {k: ReadEnd((v[0], v[1]), v[2]) for k, v in acc.value.items()}
    unread = [r.name for r in ranges if r.name not in ends]
    if unread:
        raise TransformError(f"the transform did not read the whole batch (no end reported for {', '.join(unread)}): "
                             "a transform must consume its input (no limit() on it)")
    res = BatchResult(ends, tasks=len(summaries))
    for s in summaries:
        for topic, n in json.loads(s["counts"]).items():
            res.outputs[topic] = res.outputs.get(topic, 0) + n
        res.rows += s["rows"]
        res.duplicates += s["duplicates"]
        res.attempts[str(s["partition"])] = s["attempt"]
    return res


def list_entries(spark: Any, opts: SourceOptions, ranges: list[Range],
                 poll_ms: int) -> dict[str, list[tuple[Entry, int]]]:
    """The entries of ``ranges`` (as they would be read) and their message counts, per partition."""
    rows = spark.range(len(ranges), numPartitions=len(ranges)).mapInArrow(
        entries_fn(opts, ranges, poll_ms), ENTRY_SCHEMA).collect()
    out: dict[str, list[tuple[Entry, int]]] = {}
    for row in rows:
        out.setdefault(row["name"], []).append(((row["ledger"], row["entry"]), row["messages"]))
    for v in out.values():
        v.sort()
    return out


def read_messages(opts: SourceOptions, r: Range, poll_ms: int) -> list[txn.Message]:
    """The messages of a (small) range, on the driver: parking a poison entry."""
    out: list[txn.Message] = []
    for msgs, _ in _scan(opts, r, poll_ms):
        out.extend(msgs)
    return out


def _short(exc: BaseException, limit: int = 2000) -> str:
    text = str(exc)
    # A Python error raised in a task: keep its last line (the error) rather than the JVM's trace.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            if not ln.lstrip().startswith("at "):
                return ln.strip()[:limit]
    return text[:limit]


__all__ = ["BROKER_SIDE", "BatchResult", "BrokerSideError", "TransformError", "WriteConfig", "list_entries",
           "read_messages", "run_batch"]

