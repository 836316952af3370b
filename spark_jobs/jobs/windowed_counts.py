"""The classic case: events from two input topics, counted and summed per key per time window.

Input values are ``<key>,<amount>`` and carry an event time. Each micro-batch's result rows are
``{"window_start", "window_end", "key", "count", "sum"}`` per (window, key) over that batch's
events; since the batch's outputs, its input acks and its ledger record commit in one
transaction, a crash between writing the result and acking the inputs can neither double-count
nor lose a window's contribution: either the batch's aggregates and its acks are both there,
or neither is and the inputs are aggregated again.
"""

from __future__ import annotations

from typing import Any

WINDOW = "10 seconds"


def transform(df: Any) -> Any:
    """Messages -> one row per (window, key) with count and sum."""
    return counts_per_window(df)


def counts_per_window(df: Any, window: str = WINDOW, watermark: str | None = None) -> Any:
    """Source rows (value ``<key>,<amount>``) -> ``key``, ``value`` (JSON count and sum) per
    (window, key) of event time; with ``watermark``, for a streaming query in append mode."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("value").cast("string"), ",")
    events = df.select(
        F.coalesce(F.col("event_time"), F.col("publish_time")).alias("ts"),
        parts.getItem(0).alias("key"),
        parts.getItem(1).cast("long").alias("amount"),
    )
    if watermark is not None:
        events = events.withWatermark("ts", watermark)
    agg = events.groupBy(F.window("ts", window), F.col("key")).agg(
        F.count("*").alias("count"), F.sum("amount").alias("sum")
    )
    return agg.select(
        F.col("key"),
        F.to_json(F.struct(
            F.date_format(F.col("window.start"), "yyyy-MM-dd'T'HH:mm:ss").alias("window_start"),
            F.date_format(F.col("window.end"), "yyyy-MM-dd'T'HH:mm:ss").alias("window_end"),
            F.col("key"), F.col("count"), F.col("sum"),
        )).alias("value"),
    )
