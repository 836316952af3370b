"""Example jobs for ``pulsar-txn spark submit`` (short names: ``enrich``, ``windowed_counts``)."""

JOBS = {
    "enrich": "spark_jobs.jobs.enrich:transform",
    "windowed_counts": "spark_jobs.jobs.windowed_counts:transform",
}
