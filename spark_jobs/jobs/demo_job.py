"""The Spark job of ``pulsar-txn demo``: windowed counts and sums over two topics, with trouble.

The transform is :func:`spark_jobs.jobs.windowed_counts.transform` plus two kinds of trouble,
both switched by files that environment variables name (so the control plane, which replays
parked batches with this same transform, sees the same switches):

- ``$PULSAR_TXN_DEMO_FAULT_FILE``: while the file exists, the row marked with the property
  ``demo.inject=fault`` fails its Spark task, once: the task deletes the file as it fails, so
  the batch's retry commits (a transient fault, e.g. a lost executor);
- ``$PULSAR_TXN_DEMO_BUG_FLAG``: while the file exists, the job has a bug: a refund (an event
  with a negative amount) fails the Spark job, every time (a poison message). The processor
  narrows the batch down to it and parks it; once the file is removed ("the bug is fixed") the
  parked batch can be replayed.

``python -m spark_jobs.jobs.demo_job --service-url ... --input A --input B --output O ...``
runs the job on a local Spark (``local[2]``, loopback, UTC) until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

BUG_FLAG_ENV = "PULSAR_TXN_DEMO_BUG_FLAG"
FAULT_FILE_ENV = "PULSAR_TXN_DEMO_FAULT_FILE"
#: Property of the input row the transient fault is injected on (value ``fault``).
INJECT_PROP = "demo.inject"
#: The transform's ``module:function`` (what the ledger records, and replay loads).
TRANSFORM = "spark_jobs.jobs.demo_job:transform"


def _flag(env: str) -> str | None:
    """The path ``$env`` names, if that file exists."""
    path = os.environ.get(env)
    return path if path and os.path.exists(path) else None


def _fault_once(path: str) -> Any:
    """A filter UDF that keeps every row, but fails the task of the marked row while ``path`` exists."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    def keep(props):  # no type hints here: Spark would take them for a pandas UDF's
        if props and props.get(INJECT_PROP) == "fault":
            try:
                os.unlink(path)  # only the first task to get here fails
            except FileNotFoundError:
                return True
            raise RuntimeError("injected fault: a Spark task failed (transient, once)")
        return True

    return F.udf(keep, BooleanType())


def transform(df: Any) -> Any:
    """Messages -> one row per (window, key) with count and sum (with the demo's fault and bug)."""
    from pyspark.sql import functions as F

    from .windowed_counts import transform as windowed_counts

    fault = _flag(FAULT_FILE_ENV)
    if fault:
        df = df.where(_fault_once(fault)(F.col("properties")))
    if _flag(BUG_FLAG_ENV):
        text = F.col("value").cast("string")
        amount = F.split(text, ",").getItem(1).cast("long")
        df = df.withColumn("value", F.when(amount < 0, F.raise_error(
            F.concat(F.lit("refunds are not supported: "), text))).otherwise(F.col("value")))
    return windowed_counts(df)


#: Settings for tiny micro-batches on a small machine: interpreted plans, no adaptive re-planning and one
#: shuffle partition beat code generation and AQE when a batch has hundreds of rows (about 2x here).
SMALL_BATCH_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
}


def spark_session(master: str = "local[2]", app: str = "pulsar-txn demo") -> Any:
    """A local SparkSession for the demo (:data:`SMALL_BATCH_CONF`: no UI, loopback only, UTC)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    for k, v in SMALL_BATCH_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo job until SIGTERM; prints the final stats as JSON on stdout."""
    import logging

    from spark_jobs.runtime import run_job

    p = argparse.ArgumentParser(prog="python -m spark_jobs.jobs.demo_job", description=__doc__.splitlines()[0])
    p.add_argument("--service-url", required=True)
    p.add_argument("--input", action="append", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--subscription", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--batch-max-messages", type=int, default=100)
    p.add_argument("--batch-max-delay-ms", type=int, default=500)
    p.add_argument("--max-attempts", type=int, default=3)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = spark_session(args.master, f"pulsar-txn demo {args.job}")
    print(f"spark {spark.version} on {args.master}: {TRANSFORM} {', '.join(args.input)} -> {args.output}",
          file=sys.stderr, flush=True)
    try:
        stats = run_job(spark, args.service_url, args.input, args.output, args.subscription, TRANSFORM,
                        job=args.job, batch_max_messages=args.batch_max_messages,
                        batch_max_delay_ms=args.batch_max_delay_ms, max_attempts=args.max_attempts,
                        txn_timeout_ms=120000, progress_interval_s=5.0)
    finally:
        spark.stop()
    print(json.dumps({"batches": stats.batches, "messages": stats.messages, "outputs": stats.outputs,
                      "aborts": stats.aborts, "parked": stats.parked}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
