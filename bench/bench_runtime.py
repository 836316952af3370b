#!/usr/bin/env python
"""Benchmark the distributed Spark runtime against a plain Spark job and the in-driver runtime.

Run from the repository root against a running broker (transactions on)::

    .venv/bin/python bench/bench_runtime.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080 [--sizes 10000,100000] [--runs 3]
    # a 1M-message batch with a small driver:
    .venv/bin/python bench/bench_runtime.py ... --sizes 1000000 --runs 1 --only distributed,plain \\
        --driver-memory 512m --max-result-size 16m

For each size N an input topic (``--input-partitions`` partitions) is pre-filled with N messages of
``--size`` bytes (official client, batched). Then, interleaved in alternating order, ``--runs``
times each (after one small warm-up run of each), the same transform (``select(key, value)``) runs:

- ``distributed``: :class:`spark_jobs.runtime_driver.DistributedRuntime` with
  ``batch_max_messages=N`` on a fresh subscription, batches until the N messages are committed
  (usually one; a partition holding more than its share of N adds a small second batch). The
  clock starts after ``start()`` (subscribing) and stops at the last commit: planning, the
  Spark job (executors read the ranges, transform, write into the transaction), acks,
  COMMITTED record, commit.
- ``plain``: the same transform as a plain Spark batch job: ``spark.read.format("pulsar")``
  (earliest to latest) -> transform -> ``foreachPartition`` producing with the official client
  (batching on), no transaction. The clock covers the action.
- ``driver``: the in-driver runtime (:class:`spark_jobs.runtime.SparkProcessor`,
  ``mode="driver"``), ``batch_max_messages=N``, one batch; clock from ``run()`` to the commit
  (it receives the N messages on the driver, ``createDataFrame``, transform, ``collect()``,
  produces from the driver). Only for N <= ``--driver-max`` (its ledger record lists every id).

Every run's output topic must hold exactly N messages (the broker's ``msgInCounter``). Medians
of rows/s are reported, and the ratios against ``plain`` from the same run. After the runs, the
broker's limit for a consume-and-produce pipeline of ``--size``-byte messages is measured on the
same broker with ``bin/pulsar-perf`` (``bench_client.pipeline_limit``, ``--limit-seconds``): the
"% of the broker's limit" column divides by it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_client import pipeline_limit  # noqa: E402
from bench_spark import msg_in_counter, official_partition_writer, prefill  # noqa: E402

from spark_jobs import runtime_driver  # noqa: E402
from spark_jobs.runtime import DISTRIBUTED_BATCH_MAX_BYTES, SparkProcessor  # noqa: E402
from spark_jobs.runtime_driver import DistributedRuntime  # noqa: E402
from spark_jobs.source import PulsarDataSource  # noqa: E402
from txn import AsyncClient  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402
from txn.delivery.processor import ProcessorConfig  # noqa: E402

from machine import machine_load  # noqa: E402

T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def transform(df: Any) -> Any:
    return df.select("key", "value")


def start_spark(args: argparse.Namespace) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(args.master).appName("bench-runtime")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.pyspark.python", sys.executable))
    if args.driver_memory:
        b = b.config("spark.driver.memory", args.driver_memory)
    if args.max_result_size:
        b = b.config("spark.driver.maxResultSize", args.max_result_size)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    s.dataSource.register(PulsarDataSource)
    return s


def conf(inp: str, out: str, ledger: str, n: int, args: argparse.Namespace) -> ProcessorConfig:
    # run_job's default for the distributed runtime, unless --batch-max-bytes says otherwise
    extra = {"batch_max_bytes": DISTRIBUTED_BATCH_MAX_BYTES if args.batch_max_bytes is None else args.batch_max_bytes}
    return ProcessorConfig(inputs=[inp], output=out, subscription=f"bench-{uuid.uuid4().hex[:8]}", job="bench-rt",
                           batch_max_messages=n, batch_max_delay_ms=600_000, ledger_topic=ledger,
                           txn_timeout_ms=args.txn_timeout_ms, progress_interval_s=3600, ledger_guard=False, **extra)


class Phases:
    """Where the distributed runtime's batches spend their time: the driver's planning (cursor and
    last positions), the transaction's open and STARTED record, the Spark job (executors read the
    ranges, transform, write into the transaction), and the commit (acks, COMMITTED record,
    END_TXN). Wraps the runtime's own methods; the sums are per run."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {"planning": 0.0, "open + STARTED": 0.0, "Spark job": 0.0, "commit": 0.0}
        self.runs: list[dict[str, float]] = []
        rt = DistributedRuntime
        names = ("_plan", "_attempt", "_commit")  # bench-only instrumentation of the runtime's own steps
        self._orig = (*(getattr(rt, n) for n in names), runtime_driver.run_batch)

        def plan(this: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return self._orig[0](this)
            finally:
                self.s["planning"] += time.perf_counter() - t0

        def attempt(this: Any, *a: Any) -> Any:
            t0 = time.perf_counter()
            before = self.s["Spark job"] + self.s["commit"]
            try:
                return self._orig[1](this, *a)
            finally:
                self.s["open + STARTED"] += time.perf_counter() - t0 - (self.s["Spark job"] + self.s["commit"] - before)

        async def commit(this: Any, *a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await self._orig[2](this, *a)
            finally:
                self.s["commit"] += time.perf_counter() - t0

        def run_batch(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return self._orig[3](*a, **k)
            finally:
                self.s["Spark job"] += time.perf_counter() - t0

        for name, fn in zip(names, (plan, attempt, commit), strict=True):
            setattr(rt, name, fn)
        runtime_driver.run_batch = run_batch

    def take(self) -> dict[str, float]:
        """This run's sums, reset for the next."""
        out, self.s = self.s, dict.fromkeys(self.s, 0.0)
        self.runs.append(out)
        return out


def run_distributed(spark: Any, url: str, admin: str, inp: str, out: str, ledger: str, n: int,
                    args: argparse.Namespace) -> tuple[float, str]:
    rt = DistributedRuntime(spark, url, transform, conf(inp, out, ledger, n, args), admin_url=admin)
    rt.start()
    try:
        t0 = time.perf_counter()
        batches = 0
        while rt.stats.messages < n:
            rt.run(max_batches=1)
            batches += 1
            if batches > 10:
                raise RuntimeError(f"distributed: {rt.stats.messages} of {n} after {batches} batches")
        return time.perf_counter() - t0, f"{batches} batch(es)"
    finally:
        rt.close()


def run_plain(spark: Any, url: str, inp: str, out: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    df = spark.read.format("pulsar").option("service_url", url).option("topics", inp).load()
    transform(df).select("value").foreachPartition(official_partition_writer(url, out))
    return time.perf_counter() - t0, "-"


def run_driver(spark: Any, url: str, inp: str, out: str, ledger: str, n: int,
               args: argparse.Namespace) -> tuple[float, str]:
    async def go() -> tuple[float, str]:
        async with AsyncClient(url) as client:
            proc = SparkProcessor(client, spark, transform, conf(inp, out, ledger, n, args))
            await proc.start()
            try:
                t0 = time.perf_counter()
                stats = await proc.run(max_batches=1)
                dt = time.perf_counter() - t0
            finally:
                await proc.close()
            if stats.messages != n:
                raise RuntimeError(f"driver: {stats.messages} of {n} in one batch")
            return dt, "1 batch"

    return asyncio.run(go())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service-url", default=os.environ.get("PULSAR_SERVICE_URL", "pulsar://127.0.0.1:6650"))
    ap.add_argument("--admin-url", default=os.environ.get("PULSAR_ADMIN_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--sizes", default="10000,100000", help="messages per batch (comma-separated)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, default=100, help="message size in bytes")
    ap.add_argument("--input-partitions", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--only", default="distributed,plain,driver")
    ap.add_argument("--driver-max", type=int, default=100_000, help="largest N the in-driver runtime runs")
    ap.add_argument("--txn-timeout-ms", type=int, default=600_000)
    ap.add_argument("--driver-memory", help="spark.driver.memory (e.g. 512m)")
    ap.add_argument("--max-result-size", help="spark.driver.maxResultSize (e.g. 16m)")
    ap.add_argument("--batch-max-bytes", type=int,
                    help="the runtime's batch_max_bytes (default: run_job's for the distributed runtime, 64 MiB; "
                         "0: no bound by bytes)")
    ap.add_argument("--limit-seconds", type=int, default=20,
                    help="pulsar-perf produce/consume -time for the broker's limit, after the runs (0 = skip it)")
    ap.add_argument("--pulsar-home", help="Pulsar distribution for bin/pulsar-perf (default: txn's cache)")
    args = ap.parse_args()
    url, admin = args.service_url, args.admin_url
    kinds = [k for k in ("distributed", "plain", "driver") if k in args.only.split(",")]
    ns = f"public/bench-rt-{uuid.uuid4().hex[:8]}"
    create_namespace(admin, ns)
    enable_namespace_dedup(admin, ns)
    progress(f"namespace {ns} (deduplication on); Spark {args.master}; {machine_load(None)}")
    spark = start_spark(args)
    uid = uuid.uuid4().hex[:6]
    ledger = f"persistent://{ns}/ledger-{uid}"
    phases = Phases()

    def once(kind: str, inp: str, n: int, tag: str) -> tuple[float, str]:
        out = f"persistent://{ns}/out-{kind}-{tag}-{uuid.uuid4().hex[:6]}"
        if kind == "distributed":
            phases.take()
            dt, note = run_distributed(spark, url, admin, inp, out, ledger, n, args)
            ph = phases.take()
            note += "; " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items())
        elif kind == "plain":
            dt, note = run_plain(spark, url, inp, out)
        else:
            dt, note = run_driver(spark, url, inp, out, ledger, n, args)
        got = msg_in_counter(admin, out)
        if got != n:
            raise RuntimeError(f"{kind}: the output topic holds {got} messages, expected {n}")
        return dt, note

    try:
        warm = f"persistent://{ns}/warm-{uid}"
        prefill(url, admin, warm, 2000, args.size, args.input_partitions)
        for k in kinds:
            once(k, warm, 2000, "warm")
        progress("warm-up done")
        rows: list[tuple[int, str, float, str, str]] = []  # (N, mode, rows/s, vs plain, runs)
        for n in [int(x) for x in args.sizes.split(",") if x.strip()]:
            inp = f"persistent://{ns}/in-{n}-{uid}"
            progress(f"pre-filling {inp} with {n:,} x {args.size} B")
            prefill(url, admin, inp, n, args.size, args.input_partitions)
            secs: dict[str, list[float]] = {k: [] for k in kinds}
            notes: dict[str, str] = {}
            todo = [k for k in kinds if k != "driver" or n <= args.driver_max]
            for i in range(args.runs):
                for k in (todo if i % 2 == 0 else list(reversed(todo))):
                    dt, notes[k] = once(k, inp, n, f"{n}-{i}")
                    secs[k].append(dt)
                    progress(f"N={n:,} run {i + 1} {k}: {dt:.2f} s = {n / dt:,.0f} rows/s ({notes[k]})")
            med = {k: statistics.median(v) for k, v in secs.items() if v}
            base = n / med["plain"] if "plain" in med else None
            for k in kinds:
                if k not in med:
                    rows.append((n, k, float("nan"), "", ""))
                    continue
                rate = n / med[k]
                ratio = f"{rate / base:.2f}x" if base else "-"
                runs = ", ".join(f"{n / s:,.0f}" for s in secs[k])
                rows.append((n, k, rate, ratio, f"{runs} ({notes[k]})"))
        limit, limit_note = pipeline_limit(url, args.size, args.limit_seconds, args.pulsar_home, progress)
        print(f"\n## Runtime vs plain Spark vs in-driver ({args.master}, {args.size} B messages, "
              f"{args.input_partitions}-partition input, driver memory {args.driver_memory or 'default'}, "
              f"maxResultSize {args.max_result_size or 'default'})\n")
        print("| messages per batch | mode | rows/s (median) | vs plain | % of the broker's limit | runs (rows/s) |")
        print("|---:|---|---:|---:|---:|---|")
        for n, k, rate, ratio, runs in rows:
            pct = "n/a" if rate != rate or limit != limit else f"{100 * rate / limit:.0f}%"
            print(f"| {n:,} | {k} | {'n/a' if rate != rate else f'{rate:,.0f}'} | {ratio} | {pct} | {runs} |")
        print(f"\n{limit_note}\n\nMachine: {machine_load(None)}.\n")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
