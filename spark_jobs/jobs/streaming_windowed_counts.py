"""The classic case as a Structured Streaming query: ``pulsar`` source -> event-time windows ->
``pulsar-txn`` sink.

Two (or more) input topics carry values ``<key>,<amount>`` with an event time (the message's
``event_time``, else its publish time). The query counts and sums the amounts per key per
10 s event-time window, with a watermark, in append mode: a (window, key) row is emitted once,
when the watermark passes the window's end. Each micro-batch's rows are written in one Pulsar
transaction by ``pulsar-txn``, and a micro-batch Spark replays after a driver failure is
recognised by the sink's per-query marker and aborted, so every (window, key) row appears
exactly once even when the driver is killed mid-batch (the source's offsets and the
aggregation state are in the checkpoint).

Output rows: key = the input key, value = JSON
``{"window_start", "window_end", "key", "count", "sum"}`` (times ``yyyy-MM-dd'T'HH:mm:ss`` UTC).

.. code-block:: bash

    python -m spark_jobs.jobs.streaming_windowed_counts --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080 --input clicks-a --input clicks-b \\
        --output window-counts --checkpoint /tmp/wc-ckpt
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

WINDOW = "10 seconds"
WATERMARK = "10 seconds"


def windowed_counts(df: Any, window: str = WINDOW, watermark: str = WATERMARK) -> Any:
    """Source rows -> ``key``, ``value`` (JSON) per closed (window, key)."""
    from .windowed_counts import counts_per_window

    return counts_per_window(df, window, watermark)


def build_query(
    spark: Any,
    service_url: str,
    admin_url: str | None,
    inputs: Sequence[str],
    output: str,
    checkpoint: str,
    trigger_ms: int = 1000,
    *,
    max_messages_per_trigger: int | None = None,
    starting_offsets: str = "earliest",
    txn_timeout_ms: int = 60000,
    job: str = "streaming-windowed-counts",
    window: str = WINDOW,
    watermark: str = WATERMARK,
) -> Any:
    """Start the query (``pulsar`` and ``pulsar-txn`` must be registered: ``spark_jobs.register``)
    and return its ``StreamingQuery``."""
    reader = (spark.readStream.format("pulsar")
              .option("service_url", service_url)
              .option("topics", ",".join(inputs))
              .option("startingOffsets", starting_offsets))
    if admin_url:
        reader = reader.option("admin_url", admin_url)
    if max_messages_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(max_messages_per_trigger))
    out = windowed_counts(reader.load(), window, watermark)
    writer = (out.writeStream.format("pulsar-txn").outputMode("append")
              .option("service_url", service_url)
              .option("topic", output)
              .option("job", job)
              .option("txn_timeout_ms", str(txn_timeout_ms))
              .option("checkpointLocation", checkpoint)
              .trigger(processingTime=f"{int(trigger_ms)} milliseconds"))
    if admin_url:
        writer = writer.option("admin_url", admin_url)
    return writer.start()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--service-url", required=True)
    p.add_argument("--admin-url")
    p.add_argument("--input", action="append", required=True, help="an input topic (repeatable)")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--trigger-ms", type=int, default=1000)
    p.add_argument("--max-messages-per-trigger", type=int)
    p.add_argument("--txn-timeout-ms", type=int, default=60000)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--timeout-s", type=float, help="stop after this long (default: run until killed)")
    a = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_jobs

    spark = (SparkSession.builder.master(a.master).appName("streaming-windowed-counts")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark_jobs.register(spark)
    q = build_query(spark, a.service_url, a.admin_url, a.input, a.output, a.checkpoint, a.trigger_ms,
                    max_messages_per_trigger=a.max_messages_per_trigger, txn_timeout_ms=a.txn_timeout_ms)
    try:
        q.awaitTermination(a.timeout_s)
    finally:
        q.stop()
        spark.stop()
    return 0 if q.exception() is None else 1


if __name__ == "__main__":
    sys.exit(main())
