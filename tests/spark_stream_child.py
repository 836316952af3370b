"""Child process for tests/test_spark_driver_kill.py: runs the streaming windowed-counts query.

Usage: ``python spark_stream_child.py '<json config>'`` with keys service_url, admin_url, inputs,
output, checkpoint, trigger_ms, max_messages_per_trigger, txn_timeout_ms, job.

Prints ``READY <query id>`` once the query has started, then one line per completed micro-batch
``BATCH <batch id> <input rows>`` (flushed), so the parent can time a kill. A line ``stop`` on
stdin (or EOF) stops the query and exits 0; a failed query prints ``FAILED <error>`` and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    cfg = json.loads(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import spark_jobs
    from spark_jobs.jobs.streaming_windowed_counts import build_query

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark-stream-child")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_jobs.register(spark)
    q = build_query(
        spark, cfg["service_url"], cfg["admin_url"], cfg["inputs"], cfg["output"], cfg["checkpoint"],
        trigger_ms=cfg.get("trigger_ms", 500), max_messages_per_trigger=cfg.get("max_messages_per_trigger"),
        txn_timeout_ms=cfg.get("txn_timeout_ms", 60000), job=cfg.get("job", "streaming-windowed-counts"),
    )
    print(f"READY {q.id}", flush=True)

    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    seen: set[int] = set()
    rc = 0
    while not stop.is_set():
        if not q.isActive:
            break
        for p in q.recentProgress:
            if p["batchId"] not in seen:
                seen.add(p["batchId"])
                print(f"BATCH {p['batchId']} {p['numInputRows']}", flush=True)
        time.sleep(0.05)
    if q.exception() is not None:
        print(f"FAILED {str(q.exception())[:2000]!r}", flush=True)
        rc = 1
    q.stop()
    spark.stop()
    print("STOPPED", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
