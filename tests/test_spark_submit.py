"""``spark-submit spark_jobs/submit.py module:function`` on a Spark standalone cluster.

A master and a worker on loopback (txn_shell/spark_cluster.py). The job's module is not
installed: it is shipped with ``--py-files`` (the driver imports it from there, and the executors
too, for its Python UDF); ``txn`` and ``spark_jobs`` come from the venv, named by
``spark.pyspark.python``. The job reads a topic with the ``pulsar`` source and writes it upper-cased
with the ``pulsar-txn`` sink; the output is checked with the official client.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

pytest.importorskip("pyspark")

import spark_jobs.submit as submit  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402
from txn_shell import spark_cluster  # noqa: E402

from peer import assert_nothing, read_n  # noqa: E402

JOB = '''
from pyspark.sql import functions as F


def shout(value):
    return value.decode().upper().encode()


def run(spark, service_url, admin_url, source, output, job):
    upper = F.udf(shout, "binary")
    df = spark.read.format("pulsar").option("service.url", service_url).option("topic", source).load()
    (df.select(upper("value").alias("value"), "key").write.format("pulsar-txn").mode("append")
       .option("service.url", service_url).option("admin.url", admin_url).option("topic", output)
       .option("job", job).save())
    print("JOB DONE", df.count())
    return 0
'''


def test_load_job_errors() -> None:
    assert submit.main(["no-colon"]) == 2
    assert submit.main(["spark_jobs_no_such_module:run"]) == 2
    with pytest.raises(ValueError, match="has no 'nope'"):
        submit.load_job("spark_jobs.submit:nope")
    assert submit.load_job("spark_jobs.submit:load_job") is submit.load_job


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, Path]]:
    d = Path(tempfile.mkdtemp(prefix="spark-submit-test-", dir="/tmp"))
    url = spark_cluster.start_cluster(d, cores=1, memory="1g", timeout=180)
    try:
        yield url, d
    finally:
        spark_cluster.stop_cluster(d)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow  # test_spark_cluster.py submits to a standalone cluster in the default suite
def test_spark_submit_module_function_on_standalone_cluster(  # noqa: ANN001
        cluster: tuple[str, Path], broker, tmp_path: Path) -> None:
    master_url, d = cluster
    ns = f"public/submit-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    source, output = f"persistent://{ns}/in", f"persistent://{ns}/out"
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = official.create_producer(source, batching_enabled=False)
        for i in range(20):
            p.send(f"row-{i}".encode(), partition_key=f"k{i % 3}")
        p.close()
        job = tmp_path / "submitted_job.py"
        job.write_text(JOB)
        spark_submit = spark_cluster.spark_home() / "bin" / "spark-submit"
        env = {**spark_cluster._env(d), "PYSPARK_DRIVER_PYTHON": sys.executable}  # noqa: SLF001
        r = subprocess.run(
            [str(spark_submit), "--master", master_url, "--conf", f"spark.pyspark.python={sys.executable}",
             "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false", "--py-files", str(job),
             submit.__file__, "submitted_job:run", broker.service_url, broker.admin_url, source, output, "submit"],
            capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        assert "JOB DONE 20" in r.stdout
        reader = official.subscribe(output, "check", initial_position=pulsar.InitialPosition.Earliest)
        got = sorted((m.data(), m.partition_key()) for m in read_n(reader, 20))
        assert_nothing(reader, 1000)
        assert got == sorted((f"ROW-{i}".encode(), f"k{i % 3}") for i in range(20))
    finally:
        official.close()
    assert any((d / "work").glob("app-*/*/stderr")), "no executor ran on the standalone worker"
