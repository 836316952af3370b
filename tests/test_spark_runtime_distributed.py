"""The distributed Spark runtime (``run_job(mode="distributed")``): executors read message-id ranges,
run the transform and write into the batch's transaction; the driver acknowledges the ranges,
writes a COMMITTED record with ``input_ranges`` and commits.

Every test reads the output back with the official client up to a sentinel and asserts the exact
multiset of values: nothing lost, nothing twice. Crash tests run the driver in a child process
(this file run as a script) that SIGKILLs its own process group at a fixed point
(``PULSAR_TXN_FAULT``), then run it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")

import txn  # noqa: E402
from spark_jobs.runtime import run_job  # noqa: E402
from txn.admin import create_namespace, create_partitioned_topic, enable_namespace_dedup  # noqa: E402
from txn.delivery.ledger import Kind  # noqa: E402
from txn.delivery.replay import read_ledger, replay_batch  # noqa: E402

from peer import SENTINEL_PROP, read_until_sentinel  # noqa: E402
from spark_session import spark  # noqa: E402, F401

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def official(broker):  # noqa: ANN001, ANN201
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


@pytest.fixture(scope="module")
def ns(broker) -> str:  # noqa: ANN001
    name = f"public/rt-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, name)
    enable_namespace_dedup(broker.admin_url, name)
    return name


def _topics(ns: str, unique_name, *names: str) -> list[str]:  # noqa: ANN001
    return [f"persistent://{ns}/{unique_name(n)}" for n in names]


def fill(official, topic: str, n: int, batched: bool = False, start: int = 0, keys: int = 3) -> list[bytes]:  # noqa: ANN001
    """``n`` messages ``v<i>`` (keys k0.., ``keys`` of them), batched (entries of up to 7) or one per entry."""
    if batched:
        p = official.create_producer(topic, batching_enabled=True, batching_max_messages=7,
                                     batching_max_publish_delay_ms=20, block_if_queue_full=True)
    else:
        p = official.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    values = [f"v{i}".encode() for i in range(start, start + n)]
    for i, v in enumerate(values):
        p.send_async(v, None, partition_key=f"k{i % keys}")
    p.flush()
    p.close()
    return values


def read_all(official, topic: str, timeout_s: float = 60) -> list[bytes]:  # noqa: ANN001
    """Every committed message of ``topic`` from the start, up to a sentinel."""
    c = official.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}", initial_position=pulsar.InitialPosition.Earliest)
    try:
        return [m.data() for m in read_until_sentinel(official, c, topic, timeout_s=timeout_s)
                if SENTINEL_PROP not in m.properties()]  # earlier checks' sentinels
    finally:
        c.close()


def upper(df):  # noqa: ANN001, ANN201
    from pyspark.sql import functions as F

    return df.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))


def poison_upper(df):  # noqa: ANN001, ANN201
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(v):  # noqa: ANN001, ANN202 - no hints: Spark would take them for a pandas UDF's
        if "poison" in v:
            raise ValueError(f"bad value {v}")
        return v.upper()

    return df.select(F.udf(check, StringType())(F.col("value").cast("string")).alias("value"))


def fixed(df):  # noqa: ANN001, ANN201
    from pyspark.sql import functions as F

    return df.select(F.regexp_replace(F.col("value").cast("string"), "poison", "fixed").alias("value"))


def run(broker, spark, transform, inputs, output, ledger, **kw):  # noqa: ANN001, ANN003, ANN201, F811
    kw.setdefault("batch_max_messages", 50)
    kw.setdefault("idle_exit_ms", 1500)
    return run_job(spark, broker.service_url, inputs, output, kw.pop("subscription", "rt"), transform, job="rt",
                   ledger_topic=ledger, admin_url=broker.admin_url, progress=None, **kw)


def records(broker, ledger):  # noqa: ANN001, ANN201
    async def main():  # noqa: ANN202
        async with txn.AsyncClient(broker.service_url) as c:
            return await read_ledger(c, ledger)

    return asyncio.run(main())


def upper_of(values: list[bytes]) -> Counter:
    return Counter(v.upper() for v in values)


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_batches_commit_exactly_once_with_ranges(broker, spark, official, ns, unique_name, batched):  # noqa: ANN001, F811
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    # Never acks: the second read_all from the earliest needs what the first acked (retention none deletes it).
    official.subscribe(out, "keep", initial_position=pulsar.InitialPosition.Earliest)
    values = fill(official, inp, 130, batched)
    stats = run(broker, spark, upper, [inp], out, ledger)
    got = read_all(official, out)
    assert Counter(got) == upper_of(values) and len(got) == 130
    recs = records(broker, ledger)
    committed = [r for r in recs if r.kind == Kind.COMMITTED]
    assert stats.batches == len(committed) >= 3 and stats.messages == 130
    assert sum(r.input_count for r in committed) == 130 and all(not r.inputs for r in committed)
    assert sum(r.outputs[out] for r in committed) == 130
    # The ranges chain: each starts where the previous one ended, and the record stays small.
    chain = [r.input_ranges[inp] for r in committed]
    assert all(a["to"] == b["after"] for a, b in zip(chain, chain[1:], strict=False))
    assert all(len(r.to_json()) < 2000 for r in committed)
    # Everything is acknowledged: a second run finds nothing.
    assert run(broker, spark, upper, [inp], out, ledger).messages == 0
    # New input continues from the cursor.
    more = fill(official, inp, 20, batched, start=130)
    assert run(broker, spark, upper, [inp], out, ledger).messages == 20
    assert Counter(read_all(official, out)) == upper_of(values + more)


def test_batches_bounded_by_bytes(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    """``batch_max_bytes``: 12 inputs of 10 kB with a bound of 25 kB make batches of 3 (a range ends
    at the first entry boundary at or past its share of the bound); one of 60 kB goes alone."""
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    p = official.create_producer(inp, batching_enabled=False)
    values = [bytes([97 + i % 26]) * 10_000 for i in range(6)] + [b"z" * 60_000] + \
        [bytes([97 + i % 26]) * 10_000 for i in range(6)]
    for v in values:
        p.send(v)
    p.close()
    stats = run(broker, spark, upper, [inp], out, ledger, batch_max_bytes=25_000)
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert [r.input_count for r in committed] == [3, 3, 1, 3, 3]
    assert stats.messages == 13
    assert Counter(read_all(official, out)) == upper_of(values)


def test_driver_start_reads_the_ledger_from_its_checkpoint(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    """A driver's start-up scan begins after the newest checkpoint (written in a batch's transaction
    at its COMMITTED record), not at the ledger's start: 1500 records of another job before it are
    not read again; the furthest ends it carries keep the job exact."""
    from spark_jobs.runtime_driver import DistributedRuntime
    from txn.delivery.processor import ProcessorConfig

    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")

    async def noise():  # noqa: ANN202
        async with txn.AsyncClient(broker.service_url) as c:
            p = await c.create_producer(ledger, block_if_queue_full=True)
            sends = [await p.send_async(json.dumps({"schema": "x", "n": i}).encode()) for i in range(1500)]
            await asyncio.gather(*sends)
            await p.close()

    asyncio.run(noise())

    def driver():  # noqa: ANN202
        conf = ProcessorConfig(inputs=[inp], output=out, subscription="rt", job="rt", ledger_topic=ledger,
                               batch_max_messages=50, guard_checkpoint_s=0.001)
        return DistributedRuntime(spark, broker.service_url, upper, conf, admin_url=broker.admin_url)

    values = fill(official, inp, 130)
    first = driver()
    try:
        first.start()
        assert first.scan_from is None and first.scan_records >= 1500
        assert first.run(idle_exit_ms=1500).messages == 130
    finally:
        first.close()
    more = fill(official, inp, 20, start=130)
    second = driver()
    try:
        second.start()
        assert second.scan_from is not None and second.scan_records < 20, second.scan_records
        assert second.run(idle_exit_ms=1500).messages == 20
    finally:
        second.close()
    assert Counter(read_all(official, out)) == upper_of(values + more)


def test_partitioned_inputs_two_topics(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    a, b, out, ledger = _topics(ns, unique_name, "a", "b", "out", "ledger")
    create_partitioned_topic(broker.admin_url, a, 3)
    values = fill(official, a, 90, keys=90) + fill(official, b, 25, batched=True, start=500)
    stats = run(broker, spark, upper, [a, b], out, ledger, batch_max_messages=40)
    assert Counter(read_all(official, out)) == upper_of(values)
    assert stats.messages == 115
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    names = {n for r in committed for n in r.input_ranges}
    assert names == {f"{a}-partition-{i}" for i in range(3)} | {b}


def test_poison_entry_narrowed_parked_and_replayed(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    from spark_jobs.runtime import replay_outputs

    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    # Never acks: the second read_all from the earliest needs what the first acked (retention none deletes it).
    official.subscribe(out, "keep", initial_position=pulsar.InitialPosition.Earliest)
    p = official.create_producer(inp, batching_enabled=False)
    values = [f"m{i}".encode() if i != 11 else b"poison-11" for i in range(16)]
    for v in values:
        p.send(v)
    p.close()
    stats = run(broker, spark, "test_spark_runtime_distributed:poison_upper", [inp], out, ledger,
                batch_max_messages=16, max_attempts=1)
    assert stats.parked == 1
    assert Counter(read_all(official, out)) == Counter(v.upper() for v in values if b"poison" not in v)
    recs = records(broker, ledger)
    (parked,) = [r for r in recs if r.kind == Kind.PARKED]
    assert "bad value poison-11" in parked.error and parked.config["runtime"] == "spark"
    assert parked.input_count == 1 and parked.parked_topic == inp + "-parked"
    assert sum(r.input_count for r in recs if r.kind == Kind.COMMITTED) == 15

    async def do_replay():  # noqa: ANN202
        async with txn.AsyncClient(broker.service_url) as client:
            return await replay_batch(client, parked.batch_id, ledger, output=out,
                                      transform="test_spark_runtime_distributed:fixed", replayer=replay_outputs)

    res = asyncio.run(do_replay())
    assert res.replayed and res.messages == 1
    assert not asyncio.run(do_replay()).replayed
    assert Counter(read_all(official, out)) == Counter(
        [v.upper() for v in values if b"poison" not in v] + [b"fixed-11"])


def test_poison_in_a_batch_entry_parks_only_the_poison(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    """A batching producer: the poison shares its entry with other messages. The batch is narrowed to
    that entry, the entry is bisected on the driver, and one transaction commits the entry's other
    messages' outputs and parks the poison alone."""
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    p = official.create_producer(inp, batching_enabled=True, batching_max_messages=7, batching_max_publish_delay_ms=50)
    values = [f"m{i}".encode() if i != 17 else b"poison-17" for i in range(28)]
    for v in values:
        p.send_async(v, None)
    p.flush()
    p.close()
    stats = run(broker, spark, "test_spark_runtime_distributed:poison_upper", [inp], out, ledger,
                batch_max_messages=28, max_attempts=1)
    assert stats.parked == 1 and stats.messages == 27
    assert Counter(read_all(official, out)) == Counter(v.upper() for v in values if b"poison" not in v)
    recs = records(broker, ledger)
    (parked,) = [r for r in recs if r.kind == Kind.PARKED]
    assert parked.input_count == 1 and "poison-17" in parked.error
    assert sum(r.input_count for r in recs if r.kind == Kind.COMMITTED) == 27


# ------------------------------------------------------------------------------ failures


def test_failing_write_task_aborts_and_the_batch_runs_again(broker, spark, official, ns, unique_name, tmp_path):  # noqa: ANN001, F811
    """Each write task's first attempt fails after sending rows into the transaction (local[2]: no
    task retries, so the Spark job fails): the batch aborts and runs again in a new transaction."""
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    values = fill(official, inp, 60, batched=True)
    stats = run(broker, spark, upper, [inp], out, ledger, batch_max_messages=100,
                runtime_options={"write_fail_dir": str(tmp_path), "write_batch_max_rows": 5})
    assert Counter(read_all(official, out)) == upper_of(values) and stats.messages == 60
    recs = records(broker, ledger)
    assert len([r for r in recs if r.kind == Kind.ABORTED]) >= 1 and stats.aborts >= 1
    assert sum(r.input_count for r in recs if r.kind == Kind.COMMITTED) == 60


def test_broker_side_task_failure_does_not_count_as_an_attempt(broker, spark, official, ns, unique_name,  # noqa: ANN001, F811
                                                                  tmp_path):
    """A write task fails with a broker-side error (a broken connection): with max_attempts=1 the
    batch is still not narrowed or parked, it is planned again and commits."""
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    values = fill(official, inp, 30)
    (tmp_path / "broker-side").touch()
    stats = run(broker, spark, upper, [inp], out, ledger, batch_max_messages=100, max_attempts=1,
                runtime_options={"write_fail_dir": str(tmp_path), "write_batch_max_rows": 5})
    assert (stats.messages, stats.parked) == (30, 0) and stats.aborts >= 1
    assert Counter(read_all(official, out)) == upper_of(values)
    recs = records(broker, ledger)
    assert [r for r in recs if r.kind == Kind.PARKED] == []
    assert any("ConnectError" in (r.error or "") for r in recs if r.kind == Kind.ABORTED)


def test_zombie_driver_cannot_commit(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    """Driver A has produced, acknowledged and written its COMMITTED record, then pauses; the broker
    drops its consumers and driver B takes the subscription over (aborting A's open transaction),
    processes everything and commits. A resumes and tries to commit: refused. Exactly once."""
    from spark_jobs.runtime_driver import DistributedRuntime
    from txn.delivery.processor import ProcessorConfig

    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    create_partitioned_topic(broker.admin_url, inp, 2)
    values = fill(official, inp, 40, keys=40)

    def runtime() -> DistributedRuntime:
        conf = ProcessorConfig(inputs=[inp], output=out, subscription="rt", job="rt", ledger_topic=ledger,
                               batch_max_messages=100, txn_timeout_ms=60000)
        return DistributedRuntime(spark, broker.service_url, upper, conf, admin_url=broker.admin_url)

    a, b = runtime(), runtime()
    b_stats = []

    def pause_and_replace() -> None:
        a.before_commit = None
        a.release()  # the broker drops the paused driver
        b.start()
        try:
            b_stats.append(b.run(idle_exit_ms=1500))
        finally:
            b.close()
        a.stop()

    a.before_commit = pause_and_replace
    a.start()
    try:
        a_stats = a.run()
    finally:
        a.close()
    assert a_stats.batches == 0 and b_stats[0].messages == 40
    assert Counter(read_all(official, out)) == upper_of(values)
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert sum(r.input_count for r in committed) == 40


def test_stalled_driver_beside_a_second_driver_exactly_once(broker, spark, official, ns, unique_name):  # noqa: ANN001, F811
    """Driver A stalls for 10 s right before its commit, still connected (a pause far shorter than the
    keep-alive), while a second driver B of the same job starts. B cannot take the subscription while
    A holds it, so it waits; A resumes and commits; later batches arrive and A stops; B then takes
    every partition over (fencing A) and processes the rest. Every input is committed once."""
    import threading
    import time

    from spark_jobs.runtime_driver import DistributedRuntime
    from txn.delivery.processor import ProcessorConfig

    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    create_partitioned_topic(broker.admin_url, inp, 2)
    values = fill(official, inp, 40, keys=40)

    def runtime() -> DistributedRuntime:
        conf = ProcessorConfig(inputs=[inp], output=out, subscription="rt", job="rt", ledger_topic=ledger,
                               batch_max_messages=100, txn_timeout_ms=60000)
        return DistributedRuntime(spark, broker.service_url, upper, conf, admin_url=broker.admin_url)

    a, b = runtime(), runtime()
    b_result: list = []

    def run_b() -> None:
        try:
            b.start()  # waits while A holds the subscription
            b_result.append(b.run(idle_exit_ms=3000))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            b_result.append(exc)
        finally:
            b.close()

    started_b = threading.Thread(target=run_b, daemon=True)

    def stall() -> None:
        a.before_commit = None
        started_b.start()
        time.sleep(10)  # A is paused with its batch's transaction open; B is trying to start

    a.before_commit = stall
    a.start()
    try:
        a_stats = a.run(max_batches=1)
        more = fill(official, inp, 20, keys=20, start=40)  # arrives while A still holds the inputs
    finally:
        a.close()  # A goes away; B gets the subscription
    started_b.join(240)
    assert not started_b.is_alive()
    assert not isinstance(b_result[0], BaseException), b_result[0]
    assert a_stats.messages == 40 and b_result[0].messages == 20
    assert Counter(read_all(official, out)) == upper_of(values + more)
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert sum(r.input_count for r in committed) == 60


# ------------------------------------------------------------------------- driver kills


def _child(broker, cfg: dict, log: Path, fault: str | None = None) -> tuple[int, dict | None]:  # noqa: ANN001
    env = {k: v for k, v in os.environ.items() if k != "PULSAR_TXN_FAULT"}
    if fault:
        env["PULSAR_TXN_FAULT"] = fault
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    with log.open("ab") as f:
        p = subprocess.run([sys.executable, __file__, json.dumps({**cfg, "service_url": broker.service_url,
                                                                  "admin_url": broker.admin_url})],
                           stdout=subprocess.PIPE, stderr=f, cwd=str(HERE.parent), env=env, timeout=600,
                           start_new_session=True)
    lines = p.stdout.decode().strip().splitlines()
    return p.returncode, (json.loads(lines[-1]) if p.returncode == 0 and lines else None)


def _kill_case(broker, official, ns, unique_name, tmp_path, point: str, batched: bool, partitions: int,
               n: int = 90, master: str = "local[2]") -> None:  # noqa: ANN001
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    if partitions:
        create_partitioned_topic(broker.admin_url, inp, partitions)
    values = fill(official, inp, n, batched, keys=n)
    cfg = {"inputs": [inp], "output": out, "ledger": ledger, "batch_max_messages": 30, "txn_timeout_ms": 30000,
           "master": master}
    log = tmp_path / "child.log"
    code, _ = _child(broker, cfg, log, f"{point}:2")
    assert code == -9, log.read_text()[-3000:]
    code, stats = _child(broker, cfg, log)
    assert code == 0 and stats is not None, log.read_text()[-3000:]
    got = read_all(official, out)
    assert Counter(got) == upper_of(values) and len(got) == n
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert sum(r.input_count for r in committed) == n
    assert sum(sum(r.outputs.values()) for r in committed) == n


@pytest.mark.parametrize(("point", "batched", "partitions"), [
    ("kill_before_runtime_commit", True, 2),
    # The kill after the commit: the streaming sink's short test kills there too (default suite).
    pytest.param("kill_after_runtime_commit", False, 0, marks=pytest.mark.slow),
], ids=["before-commit-batched-partitioned", "after-commit-unbatched"])
def test_driver_sigkill_exactly_once(broker, official, ns, unique_name, tmp_path, point, batched, partitions):  # noqa: ANN001
    _kill_case(broker, official, ns, unique_name, tmp_path, point, batched, partitions)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["kill_before_runtime_commit", "kill_after_runtime_commit"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("partitions", [0, 3], ids=["plain", "partitioned"])
def test_driver_sigkill_matrix(broker, official, ns, unique_name, tmp_path, point, batched, partitions):  # noqa: ANN001
    _kill_case(broker, official, ns, unique_name, tmp_path, point, batched, partitions, n=400)


@pytest.fixture(scope="module")
def standalone():  # noqa: ANN201
    """A Spark standalone cluster (master + one 2-core worker on loopback) for the module."""
    import shutil
    import tempfile

    from txn_shell import spark_cluster

    d = tempfile.mkdtemp(prefix="spark-rt-cluster-", dir="/tmp")
    url = spark_cluster.start_cluster(d, cores=2, memory="1g", timeout=180)
    try:
        yield url
    finally:
        spark_cluster.stop_cluster(d)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["kill_before_runtime_commit", "kill_after_runtime_commit"])
def test_driver_sigkill_on_standalone_cluster(broker, official, ns, unique_name, tmp_path, standalone, point):  # noqa: ANN001
    """The same SIGKILLs with the executors on a standalone cluster (other processes than the driver)."""
    _kill_case(broker, official, ns, unique_name, tmp_path, point, True, 2, n=200, master=standalone)


@pytest.mark.slow
def test_retried_write_task_on_standalone_cluster(broker, official, ns, unique_name, tmp_path, standalone):  # noqa: ANN001
    _retried_write_case(broker, official, ns, unique_name, tmp_path, standalone)


def test_retried_write_task_is_exact_with_deduplication(broker, official, ns, unique_name, tmp_path):  # noqa: ANN001
    """local[2,3]: Spark retries a write task whose first attempt failed after sending rows into the
    transaction; broker deduplication (verified through admin_url) drops what it sent again."""
    _retried_write_case(broker, official, ns, unique_name, tmp_path, "local[2,3]")


def _retried_write_case(broker, official, ns, unique_name, tmp_path, master: str) -> None:  # noqa: ANN001
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    create_partitioned_topic(broker.admin_url, inp, 2)
    values = fill(official, inp, 80, batched=True, keys=80)
    cfg = {"inputs": [inp], "output": out, "ledger": ledger, "batch_max_messages": 200, "master": master,
           "runtime_options": {"write_fail_dir": str(tmp_path), "write_batch_max_rows": 5}}
    code, stats = _child(broker, cfg, tmp_path / "child.log")
    assert code == 0 and stats is not None, (tmp_path / "child.log").read_text()[-3000:]
    assert stats["aborts"] == 0 and stats["messages"] == 80
    assert Counter(read_all(official, out)) == upper_of(values)
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert sum(r.input_count for r in committed) == 80
    assert sum(r.config["duplicates_dropped"] for r in committed) > 0  # the retry re-sent stored rows
    assert any(a > 0 for r in committed for a in r.config["task_attempts"].values())


@pytest.mark.slow
def test_million_message_batch_with_a_small_driver(broker, official, ns, unique_name, tmp_path):  # noqa: ANN001
    """One batch of 1M messages with spark.driver.memory=512m and spark.driver.maxResultSize=16m:
    the driver never holds the rows; every output exactly once."""
    n = 1_000_000
    inp, out, ledger = _topics(ns, unique_name, "in", "out", "ledger")
    create_partitioned_topic(broker.admin_url, inp, 4)
    values = fill(official, inp, n, batched=True, keys=1000)
    cfg = {"inputs": [inp], "output": out, "ledger": ledger, "batch_max_messages": n, "txn_timeout_ms": 600_000,
           "driver_memory": "512m", "max_result_size": "16m"}
    code, stats = _child(broker, cfg, tmp_path / "child.log")
    assert code == 0 and stats is not None, (tmp_path / "child.log").read_text()[-3000:]
    assert stats["messages"] == n and stats["aborts"] == 0
    assert Counter(read_all(official, out, timeout_s=900)) == upper_of(values)
    committed = [r for r in records(broker, ledger) if r.kind == Kind.COMMITTED]
    assert sum(r.input_count for r in committed) == n and all(len(r.to_json()) < 4000 for r in committed)


def _child_main(cfg: dict) -> None:
    """This file run as a script: one driver, own SparkSession; prints its stats as JSON."""
    import logging

    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = (SparkSession.builder.master(cfg.get("master", "local[2]")).config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.memory", cfg.get("driver_memory", "1g"))
         .config("spark.driver.maxResultSize", cfg.get("max_result_size", "1g")).getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    stats = run_job(s, cfg["service_url"], cfg["inputs"], cfg["output"], "rt", upper, job="rt",
                    ledger_topic=cfg["ledger"], admin_url=cfg["admin_url"], progress=sys.stderr,
                    batch_max_messages=cfg.get("batch_max_messages", 50), idle_exit_ms=2000,
                    txn_timeout_ms=cfg.get("txn_timeout_ms", 60000), runtime_options=cfg.get("runtime_options"))
    s.stop()
    print(json.dumps({"batches": stats.batches, "messages": stats.messages, "aborts": stats.aborts,
                      "outputs": stats.outputs}), flush=True)


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))


def test_run_job_bounds_distributed_batches_at_64_mib_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every distributed batch is a Spark job: ``run_job`` closes one at 64 MiB of inputs unless told
    otherwise (the processor's 8 MiB made a 400k x 100 B backlog five Spark jobs)."""
    import spark_jobs.runtime as runtime
    from txn.delivery.processor import ProcessorConfig, ProcessorStats

    seen: list[ProcessorConfig] = []

    def capture(session: object, settings: object, fn: object, conf: ProcessorConfig, *rest: object) -> ProcessorStats:
        seen.append(conf)
        return ProcessorStats()

    monkeypatch.setattr(runtime, "_run_distributed", capture)
    for extra in ({}, {"batch_max_bytes": 1024}, {"batch_max_bytes": 0}):
        runtime.run_job(None, "pulsar://127.0.0.1:6650", ["in"], "out", "sub", lambda df: df, **extra)
    assert [c.batch_max_bytes for c in seen] == [64 * 1024 * 1024, 1024, 0]
    assert runtime.DISTRIBUTED_BATCH_MAX_BYTES == 64 * 1024 * 1024
    assert ProcessorConfig(inputs=["in"], output="out", subscription="s").batch_max_bytes == 8 * 1024 * 1024
