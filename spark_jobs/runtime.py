"""The exactly-once function runtime: Pulsar Functions semantics, with a Spark DataFrame transform.

Each micro-batch runs the user's transform, ``DataFrame -> DataFrame``, on a DataFrame of input
messages (the ``pulsar`` source's columns: key, value, topic, partition, message_id,
publish_time, event_time, properties) — window aggregations, joins, anything Spark does — and
produces the result rows (columns ``value``, optional ``key``, ``topic``, ``properties``) to the
output topic(s); outputs, input acknowledgements and the ledger record commit in one Pulsar
transaction. :func:`run_job` is the entry point, in one of two modes:

- ``"distributed"`` (the default; :mod:`spark_jobs.runtime_driver`, ``runtime_plan``,
  ``runtime_batch``): the driver plans message-id ranges per input partition, executors read
  them, run the transform and write into the transaction, the driver acknowledges the ranges
  cumulatively and commits. Rows never pass through the driver, and a ledger record holds
  ranges, not ids.
- ``"driver"`` (:class:`SparkProcessor`): :class:`txn.delivery.processor.AsyncProcessor` with a
  DataFrame transform in place of a per-message handler: the driver consumes the batch,
  ``createDataFrame``, transform, ``collect()``, and produces from the driver. Faster for
  batches of a few thousand messages (no distributed job's fixed cost); bounded by the driver.

Both share the ledger, parking (the processor's ``PARK_*`` conventions) and replay
(:func:`replay_outputs`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Callable
from typing import Any, TextIO

from txn import AsyncClient, Message
from txn.bridge import run_blocking
from txn.delivery.ledger import RecordConfig
from txn.delivery.output import Output, load_handler
from txn.delivery.processor import AsyncProcessor, BatchFailed, ProcessorConfig, ProcessorStats
from txn.delivery.processor.metrics import BacklogProbe, MetricsOptions, ProcessorMetrics, require_prometheus
from txn.settings import BrokerSettings

from .compat import check_pyspark
from .runtime_rows import message_row, messages_schema, to_outputs  # messages_schema, to_outputs: public here too

Transform = Callable[[Any], Any]  # pyspark DataFrame -> DataFrame
#: ``run_job`` modes: executors read, transform and write (default), or all of it in the driver.
DISTRIBUTED = "distributed"
DRIVER = "driver"
#: The distributed runtime's default ``batch_max_bytes``: every batch is a Spark job, whose fixed
#: cost (about a second here) an 8 MiB batch does not repay (400k x 100 B rows: 0.76x of a plain
#: Spark job in 5 batches of 8 MiB, 1.34x in one; bench/bench_runtime.py). No row passes through
#: the driver, so the bound only caps a transaction's size. ``ProcessorConfig``'s 8 MiB stays the
#: in-process processor's and the in-driver runtime's, which hold a batch in memory.
DISTRIBUTED_BATCH_MAX_BYTES = 64 * 1024 * 1024


def replay_outputs(spec: str, msgs: list[Message]) -> list[Output]:
    """Replay hook: run a Spark job's transform (``module:function``) on parked messages.

    Uses the active SparkSession, or a local one.
    """
    from pyspark.sql import SparkSession

    transform = load_handler(spec)
    spark = SparkSession.getActiveSession() or SparkSession.builder.master("local[1]").config(
        "spark.ui.enabled", "false").getOrCreate()
    df = spark.createDataFrame([message_row(m) for m in msgs], messages_schema())
    return to_outputs(transform(df).collect())


class SparkProcessor(AsyncProcessor):
    """:class:`AsyncProcessor` whose batches go through a Spark DataFrame transform."""

    def __init__(self, client: AsyncClient, spark: Any, transform: Transform, config: ProcessorConfig,
                 progress: TextIO | None = None) -> None:
        spec = config.handler_spec
        super().__init__(client, _unused_handler, config, progress)
        self.spark = spark
        self.transform = transform
        self.config.handler_spec = spec  # the transform's module:function (for replay)

    async def _transform(self, msgs: list[Message]) -> list[tuple[Message, list[Output]]]:
        def run() -> list[Output]:
            df = self.spark.createDataFrame([message_row(m) for m in msgs], messages_schema())
            try:
                return to_outputs(self.transform(df).collect())
            except Exception as exc:  # the transform (or the Spark job) failed: the batch fails
                raise BatchFailed(exc, msgs[0] if len(msgs) == 1 else None) from exc

        outputs = await asyncio.get_running_loop().run_in_executor(None, run)
        # Outputs of a DataFrame transform belong to the batch as a whole.
        return [(msgs[0], outputs)] if msgs else []

    def _record_config(self) -> RecordConfig:
        return super()._record_config().updated(runtime="spark", transform=self.config.handler_spec)


def _run_distributed(spark: Any, settings: BrokerSettings, fn: Transform, conf: ProcessorConfig,
                     progress: TextIO | None, max_batches: int | None, idle_exit_ms: int | None,
                     options: dict[str, Any], metrics: MetricsOptions | None) -> ProcessorStats:
    import signal
    import threading

    from .runtime_driver import DistributedRuntime

    rt = DistributedRuntime(spark, settings.require_service_url(), fn, conf, admin_url=settings.admin_url,
                            progress=progress, settings=settings, **options)
    job = conf.job
    if progress is not None:
        rt.on_commit = lambda b, t, n, counts, ms: print(
            f"[{job}] batch {b} txn {t} committed: rows in={n} out={sum(counts.values())} commit={ms:.0f} ms",
            file=progress, flush=True)
    if metrics is not None:
        rt.metrics = _serve_metrics(rt, conf, settings, metrics, progress)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: rt.stop())
    try:
        rt.start()
        return rt.run(max_batches=max_batches, idle_exit_ms=idle_exit_ms)
    finally:
        rt.close()
        if rt.metrics is not None:
            rt.metrics.close()
        for sig, h in previous.items():
            signal.signal(sig, h)


def _serve_metrics(rt: Any, conf: ProcessorConfig, settings: BrokerSettings, options: MetricsOptions,
                   progress: TextIO | None) -> ProcessorMetrics:
    """Serve the distributed runtime's Prometheus metrics (``runtime="spark"``); the backlog of the
    job's subscription comes from ``options.admin_url``, else from the runtime's admin URL."""
    probe = None
    admin_url, token, context = options.admin_url, options.admin_token, options.admin_context
    if admin_url is None and settings.admin_url:
        kw = settings.admin_kwargs()
        admin_url, token, context = settings.admin_url, kw.get("token"), kw.get("context")
    if admin_url:
        probe = BacklogProbe(admin_url, conf.subscription, list(conf.inputs), token=token, context=context,
                             ttl_s=options.backlog_ttl_s)
    m = ProcessorMetrics(conf.job, lambda: rt.stats, lambda: rt.inflight_commits, backlog=probe, runtime="spark")
    m.serve(options.port, options.host)
    if progress is not None:
        print(f"[{conf.job}] metrics at {m.url}", file=progress, flush=True)
    return m


def _unused_handler(message: Message) -> None:  # pragma: no cover - SparkProcessor overrides _transform
    raise RuntimeError("SparkProcessor transforms DataFrames, not single messages")


def run_job(
    spark: Any,
    service_url: str | None,
    inputs: list[str],
    output: str,
    subscription: str,
    transform: Transform | str,
    *,
    job: str = "spark-job",
    batch_max_messages: int = 10000,
    batch_max_delay_ms: int = 1000,
    max_batches: int | None = None,
    idle_exit_ms: int | None = None,
    progress: TextIO | None = sys.stderr,
    mode: str = DISTRIBUTED,
    admin_url: str | None = None,
    runtime_options: dict[str, Any] | None = None,
    settings: BrokerSettings | None = None,
    metrics: MetricsOptions | None = None,
    **config: Any,
) -> ProcessorStats:
    """Run a Spark exactly-once job until stopped (or ``max_batches`` / ``idle_exit_ms``).

    ``mode``: ``"distributed"`` (the default; :mod:`spark_jobs.runtime_driver`: executors read,
    transform and write, rows never reach the driver) or ``"driver"`` (the in-driver
    :class:`SparkProcessor`). ``admin_url`` lets the distributed runtime check broker
    deduplication on the output (then a retried Spark write task is exact; without it a retried
    write task fails the batch, which runs again). ``runtime_options``: further keywords of
    :class:`spark_jobs.runtime_driver.DistributedRuntime` (``source_options`` for authentication
    and TLS, ``poll_timeout_ms``, ``deterministic_order``). ``settings``: the broker connection
    (:class:`txn.settings.BrokerSettings`: token or token file, TLS trust certificates) of every
    client and admin call, the driver's and the executors' (sink and source); ``service_url`` and
    ``admin_url``, where given, override its URLs. ``batch_max_bytes`` (in ``config``) defaults to
    :data:`DISTRIBUTED_BATCH_MAX_BYTES` (64 MiB) in distributed mode, where every batch is a Spark
    job, and to ``ProcessorConfig``'s 8 MiB in driver mode. ``metrics``: serve Prometheus metrics
    (:mod:`txn.delivery.processor.metrics`, ``runtime="spark"``) on ``metrics.port`` while running;
    raises :class:`txn.delivery.processor.metrics.MetricsUnavailable` first without prometheus_client.

    Raises :class:`spark_jobs.compat.UnsupportedPySparkError` first when the installed pyspark is
    outside the tested range."""
    check_pyspark()
    if mode not in (DISTRIBUTED, DRIVER):
        raise ValueError(f"mode must be {DISTRIBUTED!r} or {DRIVER!r}, got {mode!r}")
    if metrics is not None:
        require_prometheus()
        metrics = dataclasses.replace(metrics, runtime="spark")
        if mode == DRIVER:
            config["metrics"] = metrics
    spec = transform if isinstance(transform, str) else None
    fn = load_handler(transform) if isinstance(transform, str) else transform
    if mode == DISTRIBUTED:
        config.setdefault("batch_max_bytes", DISTRIBUTED_BATCH_MAX_BYTES)
    conf = ProcessorConfig(inputs=inputs, output=output, subscription=subscription, job=job,
                           batch_max_messages=batch_max_messages, batch_max_delay_ms=batch_max_delay_ms,
                           handler_spec=spec, **config)
    broker = (settings or BrokerSettings()).with_urls(service_url, admin_url)
    broker.require_service_url()
    if mode == DISTRIBUTED:
        return _run_distributed(spark, broker, fn, conf, progress, max_batches, idle_exit_ms, runtime_options or {},
                                metrics)

    async def main() -> ProcessorStats:
        async with AsyncClient(broker.require_service_url(), **broker.client_kwargs()) as client:
            proc = SparkProcessor(client, spark, fn, conf, progress)
            if progress is not None:
                proc.on_commit = lambda b, t, n, counts, ms: print(
                    f"[{job}] batch {b} txn {t} committed: rows in={n} out={sum(counts.values())} commit={ms:.0f} ms",
                    file=progress, flush=True)
            loop = asyncio.get_running_loop()
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, proc.stop)
                except (NotImplementedError, RuntimeError):
                    pass
            await proc.start()
            try:
                return await proc.run(max_batches=max_batches, idle_exit_ms=idle_exit_ms)
            finally:
                await proc.close()

    return run_blocking(main(), "run_job()")
