"""A simple enrichment job: parse ``key=value`` order lines, add a priced total and a tier.

Input values look like ``sku=A,qty=3``; the output is JSON with the price list joined in.
"""

from __future__ import annotations

from typing import Any

PRICES = {"A": 2.5, "B": 10.0, "C": 99.0}


def transform(df: Any) -> Any:
    """DataFrame of messages -> DataFrame of enriched JSON values keyed like the input."""
    from pyspark.sql import functions as F

    spark = df.sparkSession
    prices = spark.createDataFrame(list(PRICES.items()), "sku string, price double")
    fields = F.from_json(
        F.concat(F.lit('{"'), F.regexp_replace(F.regexp_replace(F.col("value").cast("string"), "=", '":"'), ",",
                                               '","'), F.lit('"}')),
        "sku string, qty string",
    )
    parsed = df.select(F.col("key"), F.col("message_id"), fields.alias("o"))
    joined = parsed.join(prices, parsed["o.sku"] == prices["sku"], "left")
    total = F.col("price") * F.col("o.qty").cast("int")
    return joined.select(
        F.col("key"),
        F.to_json(F.struct(
            F.col("o.sku").alias("sku"), F.col("o.qty").cast("int").alias("qty"), F.col("price"),
            total.alias("total"),
            F.when(total >= 100, "gold").when(total >= 10, "silver").otherwise("bronze").alias("tier"),
            F.col("message_id").alias("source"),
        )).alias("value"),
    )
