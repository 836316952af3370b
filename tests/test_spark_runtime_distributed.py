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
                                     batching_max_publish_delay_ms=20)
    else:
        p = official.create_producer(topic, batching_enabled=False)
    values = [f"v{i}".encode() for i in range(start, start + n)]
    for i, v in enumerate(values):
        p.send_async(v, None, partition_key=f"k{i % keys}")
    p.flush()
    p.close()
    return values


def read_all(official, topic: str) -> list[bytes]:  # noqa: ANN001
    """Every committed message of ``topic`` from the start, up to a sentinel."""
    c = official.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}", initial_position=pulsar.InitialPosition.Earliest)
    try:
        return [m.data() for m in read_until_sentinel(official, c, topic, timeout_s=60)
                if SENTINEL_PROP not in m.properties()]  # earlier checks' sentinels
    finally:
        c.close()


def upper(df):  # noqa: ANN001, ANN201
    from pyspark.sql import functions as F

    return df.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))


def poison_upper(df):  # noqa: ANN001, ANN201
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(v: str) -> str:
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
