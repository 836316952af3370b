"""Spark as the exactly-once function runtime: a ``pulsar`` source and a ``pulsar-txn`` sink
through Spark's Python Data Source API, and a micro-batch runtime.

``spark_jobs.register(spark)`` registers both formats with a SparkSession.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``pulsar`` source and the ``pulsar-txn`` sink with ``spark``.

    Raises :class:`spark_jobs.compat.UnsupportedPySparkError` when the installed pyspark is
    outside the tested range."""
    from .compat import check_pyspark

    check_pyspark()
    from .sink import PulsarTxnDataSource
    from .source import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
    spark.dataSource.register(PulsarTxnDataSource)
