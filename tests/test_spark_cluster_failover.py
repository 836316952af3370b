"""A Spark sink write and a distributed runtime batch while a broker of the cluster is SIGKILLed.

Both run on the local multi-broker cluster (``cluster`` fixture: ZooKeeper, 3 bookies, 3 brokers,
4 coordinators). A UDF holds one Spark task at a gate (a file) while the transaction is open: the
test then SIGKILLs the broker that owns the topic that matters (the sink's output; the runtime's
input, where the driver acknowledges), opens the gate, and the write goes on against the brokers
left. The topic is read back with the official client, one copy per message id: every row exactly
once. The killed broker is restarted and the coordinators spread again afterwards. Slow
(``--run-slow``): a cluster start and a failover take minutes on this machine.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import LongType, StringType  # noqa: E402
from test_cluster import _OFFICIAL_LOG, _stored  # noqa: E402

from spark_jobs.runtime import run_job  # noqa: E402
from txn.admin import admin_request, create_namespace, enable_namespace_dedup, topic_path  # noqa: E402

from spark_session import spark  # noqa: E402, F401

pytestmark = pytest.mark.slow


def _owner(cluster: Any, topic: str) -> int:
    """Index of the broker that owns ``topic`` (looked up, so the bundle gets an owner)."""
    status, body = admin_request("GET", cluster.admin_url, f"/lookup/v2/topic/{topic_path(topic)}")
    assert status == 200, (status, body)
    port = int(body["brokerUrl"].rsplit(":", 1)[1])
    return next(i for i, b in enumerate(cluster.brokers) if b.ports["broker"] == port)


def _gate(directory: Path, value: str) -> Any:
    """``udf(x)``: identity, except that the task meeting ``value`` writes ``waiting`` and blocks
    until ``go`` exists."""
    waiting, go = str(directory / "waiting"), str(directory / "go")

    def wait(x):  # noqa: ANN001, ANN202 - no hints: Spark would take them for a pandas UDF's
        import os
        import time as t

        if str(x) == value and not os.path.exists(go):
            open(waiting, "w").close()
            while not os.path.exists(go):
                t.sleep(0.1)
        return x

    return wait


class _Killer(threading.Thread):
    """Waits for the gate, SIGKILLs ``broker-<victim>`` (``killed`` set), opens the gate. Spark writes
    run in the test's own thread (a Python data source is not found from another thread)."""

    def __init__(self, cluster: Any, directory: Path, victim: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.directory, self.victim = cluster, directory, victim
        self.killed: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 600
            while not (self.directory / "waiting").exists():
                if time.monotonic() > deadline:
                    raise AssertionError("no task reached the gate")
                time.sleep(0.2)
            time.sleep(2)  # the other task's rows are on their way to the broker
            self.cluster.kill(f"broker-{self.victim}")
            self.killed = self.victim
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc
        finally:
            (self.directory / "go").touch()


@pytest.fixture
def dedup_ns(cluster) -> str:  # noqa: ANN001
    ns = f"public/spark-fo-{uuid.uuid4().hex[:8]}"
    create_namespace(cluster.admin_url, ns)
    enable_namespace_dedup(cluster.admin_url, ns)
    return ns


def _restore(cluster: Any, victim: int | None) -> None:
    if victim is not None:
        cluster.restart_node(f"broker-{victim}")
        cluster.load_coordinators()


@pytest.mark.timeout(1200)
def test_sink_write_while_the_output_owner_is_killed(cluster, spark, dedup_ns, tmp_path) -> None:  # noqa: ANN001, F811
    topic = f"persistent://{dedup_ns}/sink-{uuid.uuid4().hex[:8]}"
    victim = _owner(cluster, topic)
    gate = F.udf(_gate(tmp_path, "150"), LongType())
    df = spark.range(0, 200, 1, 2).select(gate(F.col("id")).alias("id")).select(
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"))
    killer = _Killer(cluster, tmp_path, victim)
    killer.start()
    # With admin_url the tasks check deduplication: until ownership moves, the admin API redirects the
    # topic-level request to the dead owner, and the check retries (bounded) instead of failing the write.
    admin = cluster.admin_url_of(next(i for i in range(len(cluster.brokers)) if i != victim))
    try:
        df.write.format("pulsar-txn").mode("append").options(
            service_url=cluster.service_url, admin_url=admin, topic=topic, job="sink-fo", batch_max_rows="10").save()
        killer.join(60)
        assert killer.error is None and killer.killed == victim, killer.error
        off = pulsar.Client(cluster.service_url, operation_timeout_seconds=120, logger=_OFFICIAL_LOG)
        try:
            got = _stored(off, topic)
        finally:
            off.close()
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(200))
    finally:
        (tmp_path / "go").touch()
        killer.join(60)
        _restore(cluster, killer.killed)


@pytest.mark.timeout(1200)
def test_runtime_batch_while_the_input_owner_is_killed(cluster, spark, dedup_ns, tmp_path) -> None:  # noqa: ANN001, F811
    inp, out = (f"persistent://{dedup_ns}/rt-{x}-{uuid.uuid4().hex[:8]}" for x in ("in", "out"))
    victim = _owner(cluster, inp)
    admin = cluster.admin_url_of(next(i for i in range(len(cluster.brokers)) if i != victim))
    off = pulsar.Client(cluster.service_url, operation_timeout_seconds=120, logger=_OFFICIAL_LOG)
    try:
        # initial_sequence_id=1: deduplication is on and the cluster's load manager may move the
        # bundle; the official client would reuse sequence ids after a reconnect before its first
        # receipt (tests/test_sequence_ids.py). Safe here: a fresh producer name the broker does not know.
        p = off.create_producer(inp, batching_enabled=False, initial_sequence_id=1)
        for i in range(150):
            p.send(f"v{i}".encode())
        p.close()
    finally:
        off.close()
    wait = _gate(tmp_path, "v100")

    def transform(df):  # noqa: ANN001, ANN202
        gate = F.udf(wait, StringType())
        return df.select(F.upper(gate(F.col("value").cast("string"))).alias("value"))

    killer = _Killer(cluster, tmp_path, victim)
    killer.start()
    try:  # rows sent 10 at a time as they come, so some are in the transaction before the kill
        st = run_job(spark, cluster.service_url, [inp], out, "rt-fo", transform, job="rt-fo", batch_max_messages=1000,
                     idle_exit_ms=5000, admin_url=admin, progress=None, txn_timeout_ms=600_000,
                     runtime_options={"deterministic_order": False, "write_batch_max_rows": 10})
        killer.join(60)
        assert killer.error is None and killer.killed == victim, killer.error
        print(f"\nruntime batch with broker-{victim} (owner of the input) SIGKILLed: {st.batches} batch(es), "
              f"{st.aborts} abort(s), {st.messages} in, {st.outputs} out")
        assert (st.messages, st.outputs) == (150, 150)
        off = pulsar.Client(cluster.service_url, operation_timeout_seconds=120, logger=_OFFICIAL_LOG)
        try:
            got = _stored(off, out)
        finally:
            off.close()
        assert sorted(got) == sorted(f"V{i}".encode() for i in range(150))
    finally:
        (tmp_path / "go").touch()
        killer.join(60)
        _restore(cluster, killer.killed)
