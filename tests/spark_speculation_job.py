"""Run one ``pulsar-txn`` write with ``spark.speculation`` on a throwaway standalone cluster.

Usage: ``spark_speculation_job.py SERVICE_URL ADMIN_URL TOPIC JOB N``. Spark never speculates in
local mode, and never runs a speculative copy on the host of the running attempt, so this starts
a master and two workers bound to 127.0.0.2 and 127.0.0.3 (loopback aliases), writes N numbered
rows in 4 partitions where partition 3's first attempt is slow before its first send (a UDF
sleeps), and prints ``RESULT {json}``. The test then checks the topic and the ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> int:
    service_url, admin_url, topic, job, n = sys.argv[1:6]
    n = int(n)
    home = Path(pyspark.__file__).parent
    work = Path(tempfile.mkdtemp(prefix="spark-spec-"))
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable, SPARK_WORKER_DIR=str(work),
               SPARK_LOG_DIR=str(work), SPARK_LOCAL_IP="127.0.0.1")
    port = _free_port()
    log = open(work / "cluster.log", "wb")  # noqa: SIM115
    procs = [subprocess.Popen([str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())],
                              env=env, stdout=log, stderr=subprocess.STDOUT)]
    for host in ("127.0.0.2", "127.0.0.3"):
        procs.append(subprocess.Popen(
            [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", "--host", host,
             "--cores", "1", "--memory", "1g", "--webui-port", str(_free_port()), f"spark://127.0.0.1:{port}"],
            env=dict(env, SPARK_LOCAL_IP=host), stdout=log, stderr=subprocess.STDOUT))
    t0 = time.monotonic()
    ok = False
    try:
        spark = (
            SparkSession.builder.master(f"spark://127.0.0.1:{port}")
            .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
            .config("spark.executor.memory", "512m").config("spark.pyspark.python", sys.executable)
            .config("spark.speculation", "true").config("spark.speculation.multiplier", "2")
            .config("spark.speculation.quantile", "0.5").config("spark.speculation.minTaskRuntime", "1s")
            .config("spark.speculation.interval", "200ms").config("spark.task.maxFailures", "4")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        from spark_jobs.sink import PulsarTxnDataSource

        spark.dataSource.register(PulsarTxnDataSource)
        started = time.monotonic() - t0

        def value(i):
            from pyspark import TaskContext

            if i == 300 and TaskContext.get().attemptNumber() == 0:
                time.sleep(25)  # partition 3's first attempt is slow before it writes anything
            return f"v{i}"

        df = spark.range(0, n, 1, 4)
        df = df.select(
            F.udf(value, "string")(F.col("id")).cast("binary").alias("value"),
            F.when(F.col("id") % 4 == 0, F.lit(None))
            .otherwise(F.concat(F.lit("k"), (F.col("id") % 5).cast("string"))).alias("key"),
            F.create_map(F.lit("id"), F.col("id").cast("string"), F.lit("parity"),
                         F.when(F.col("id") % 2 == 0, "even").otherwise("odd")).alias("properties"),
        )
        t1 = time.monotonic()
        # warm the executors' Python workers first, so the slow task stands out
        spark.range(0, 8, 1, 4).selectExpr("id").collect()
        (df.write.format("pulsar-txn").mode("append")
         .option("service_url", service_url).option("admin_url", admin_url).option("topic", topic)
         .option("job", job).save())
        write_s = time.monotonic() - t1
        spark.stop()
        print("RESULT " + json.dumps({"session_s": round(started, 1), "write_s": round(write_s, 1)}), flush=True)
        ok = True
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"cluster logs kept in {work}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
