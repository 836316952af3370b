#!/usr/bin/env python
"""Benchmark the ``pulsar-txn`` sink's two write paths against a plain Spark write.

Run from the repository root::

    .venv/bin/python bench/bench_sink.py [--rows 200000] [--runs 5] [--size 100] [--partitions 4]
        [--service-url pulsar://... --admin-url http://...]

Without ``--service-url`` a throw-away :class:`txn_shell.localbroker.LocalBroker` is started (and
stopped at the end). Spark runs in this process (``--master local[2]``). One DataFrame of
``--rows`` rows (a distinct ``--size``-byte binary ``value`` and a string ``key`` out of 1000) in
``--partitions`` partitions is written, each time to a fresh topic of a namespace with
deduplication on, by:

- ``arrow``: ``df.write.format("pulsar-txn")`` with ``writer=arrow`` (the default: tasks get Arrow
  record batches);
- ``rows``: the same with ``writer=rows`` (tasks get PySpark ``Row`` objects);
- ``official``: the baseline, ``df.foreachPartition(f)`` where ``f`` opens an official
  ``pulsar.Client`` and a producer (its own batching on, ``block_if_queue_full``), calls
  ``send_async(value, None, partition_key=key)`` per row, then ``flush()``: no transaction, no
  deduplication guarantee.

Both sink paths write one transaction per write, cut the same deterministic batches and commit
from the driver. The writers run interleaved in a rotating order, ``--runs`` times after one
warm-up each, in the same process against the same broker; after every run the broker's
``msgInCounter`` of the topic must equal ``--rows``, and the first run of each writer is read back
with the official client. The table gives the median rows/s and the ratios. Progress goes to
stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spark_jobs.sink import PulsarTxnDataSource  # noqa: E402
from txn.admin import admin_request, create_namespace, enable_namespace_dedup  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from official import count_topic  # noqa: E402

T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def fmt(v: float) -> str:
    return "n/a" if v != v else f"{v:,.0f}"


def msg_in_counter(admin: str, topic: str) -> int:
    status, body = admin_request("GET", admin, f"/admin/v2/{topic.replace('://', '/')}/stats")
    return int(body.get("msgInCounter", -1)) if status == 200 and isinstance(body, dict) else -1


def start_spark(master: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master(master).appName("bench-sink")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.pyspark.python", sys.executable).getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    s.dataSource.register(PulsarTxnDataSource)
    return s


def make_df(spark: Any, rows: int, size: int, partitions: int) -> Any:
    """``rows`` distinct values of ``size`` bytes (a 12-digit id, then padding) and keys ``k0..k999``."""
    from pyspark.sql import functions as F

    digits = F.lpad(F.col("id").cast("string"), 12, "0")
    value = F.concat(digits, F.lit("x" * (size - 12))) if size > 12 else digits
    key = F.concat(F.lit("k"), (F.col("id") % 1000).cast("string"))
    return spark.range(0, rows, 1, partitions).select(value.cast("binary").alias("value"), key.alias("key"))


def sink_write(df: Any, url: str, admin: str, topic: str, writer: str) -> float:
    t0 = time.perf_counter()
    (df.write.format("pulsar-txn").mode("append")
     .options(service_url=url, admin_url=admin, topic=topic, job="bench-sink", writer=writer,
              txn_timeout_ms="600000").save())
    return time.perf_counter() - t0


def official_partition_writer(url: str, topic: str) -> Callable[[Iterable[Any]], None]:
    """The baseline's ``foreachPartition`` function (pickled by value into the Python workers)."""

    def write(rows: Iterable[Any]) -> None:
        import logging as lg

        import pulsar as pl

        client = pl.Client(url, logger=lg.getLogger("bench.pulsar-client"))
        try:
            prod = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
            send = prod.send_async
            for r in rows:
                send(bytes(r[0]), None, partition_key=r[1])
            prod.flush()
            prod.close()
        finally:
            client.close()

    return write


def official_write(df: Any, url: str, topic: str) -> float:
    t0 = time.perf_counter()
    df.foreachPartition(official_partition_writer(url, topic))
    return time.perf_counter() - t0


@dataclass
class Writer:
    key: str
    label: str
    write: Callable[[str], float]
    secs: list[float] = field(default_factory=list)
    verified: str = "-"


def bench(args: argparse.Namespace, spark: Any, url: str, admin: str, ns: str) -> list[str]:
    n = args.rows
    df = make_df(spark, n, args.size, args.partitions)
    writers = [
        Writer("arrow", "pulsar-txn sink, Arrow writer (`writer=arrow`, default)",
               lambda t: sink_write(df, url, admin, t, "arrow")),
        Writer("rows", "pulsar-txn sink, row writer (`writer=rows`)", lambda t: sink_write(df, url, admin, t, "rows")),
        Writer("official", "baseline: `foreachPartition` + official client (batching on, no txn)",
               lambda t: official_write(df, url, t)),
    ]
    progress(f"{n:,} rows x {args.size} B + key, {args.partitions} partitions, {args.master}; warm-up")
    small = make_df(spark, max(n // 10, 1), args.size, args.partitions)
    sink_write(small, url, admin, f"persistent://{ns}/warm-{uuid.uuid4().hex[:8]}", "arrow")
    sink_write(small, url, admin, f"persistent://{ns}/warm-{uuid.uuid4().hex[:8]}", "rows")
    official_write(small, url, f"persistent://{ns}/warm-{uuid.uuid4().hex[:8]}")
    for run_ in range(args.runs):
        k = run_ % len(writers)
        for w in writers[k:] + writers[:k]:  # rotate who goes first
            topic = f"persistent://{ns}/{w.key}-{uuid.uuid4().hex[:10]}"
            secs = w.write(topic)
            stored = msg_in_counter(admin, topic)
            if stored != n:
                raise RuntimeError(f"{w.key}: the broker counts {stored} messages on {topic}, expected {n}")
            if w.verified == "-":
                got = count_topic(url, topic, n, python_logger=True)
                if got != n:
                    raise RuntimeError(f"{w.key}: read {got} messages back from {topic}, expected {n}")
                w.verified = f"{got:,}"
            w.secs.append(secs)
            progress(f"run {run_ + 1}/{args.runs} {w.key:8s}: {n / secs:9,.0f} rows/s ({secs:.2f} s)")
    med = {w.key: statistics.median(n / s for s in w.secs) for w in writers}
    out = ["", f"## pulsar-txn sink: Arrow writer vs row writer vs `foreachPartition` (median of {args.runs} runs; "
               f"{n:,} rows x {args.size} B + key, {args.partitions} partitions, Spark {args.master})", "",
           "| writer | rows/s (median) | vs row writer | vs baseline | per-run rows/s | read back |",
           "|---|---:|---:|---:|---|---:|"]
    for w in writers:
        v = med[w.key]
        per = ", ".join(fmt(n / s) for s in w.secs)
        out.append(f"| {w.label} | {fmt(v)} | {v / med['rows']:.2f}x | {v / med['official']:.2f}x | {per} | "
                   f"{w.verified} |")
    out += ["", "Time = the whole Spark action (scheduling, Python workers, clients, and for the sink the driver's "
                "transaction open and commit). Each run wrote a fresh topic whose msgInCounter matched the row "
                "count."]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--service-url")
    ap.add_argument("--admin-url")
    args = ap.parse_args(argv)
    local = tmp = None
    if args.service_url and args.admin_url:
        url, admin = args.service_url, args.admin_url
    else:
        tmp = tempfile.mkdtemp(prefix="bench-sink-", dir="/tmp")
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        a, b, c = ports
        local = LocalBroker(tmp, broker_port=a, web_port=b, bookie_port=c, progress=progress)
        local.start(timeout=240)
        url, admin = local.service_url, local.admin_url
    try:
        ns = f"public/bench-sink-{uuid.uuid4().hex[:8]}"
        create_namespace(admin, ns)
        enable_namespace_dedup(admin, ns)
        spark = start_spark(args.master)
        try:
            print("\n".join(bench(args, spark, url, admin, ns)))
        finally:
            spark.stop()
    finally:
        if local is not None:
            local.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
