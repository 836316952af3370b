"""The Spark exactly-once runtime: a DataFrame transform per micro-batch, one transaction each."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pulsar
import pytest

import txn
from spark_jobs.runtime import SparkProcessor, replay_outputs
from txn.delivery.processor import ProcessorConfig
from txn.delivery.replay import read_ledger, replay_batch

from peer import read_n, read_until_sentinel
from spark_session import spark  # noqa: F401


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _fill(official, topic, payloads, key=None, event_time=None):
    p = official.create_producer(topic, batching_enabled=False)
    for i, d in enumerate(payloads):
        kw = {}
        if key:
            kw["partition_key"] = key(i)
        if event_time:
            kw["event_timestamp"] = event_time(i)
        p.send(d, **kw)
    p.close()


def _run(broker, spark, transform, inputs, output, ledger, spec=None, **cfg):  # noqa: F811
    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=inputs, output=output, subscription="rt", job="rt", ledger_topic=ledger,
                                   handler_spec=spec, **cfg)
            proc = SparkProcessor(client, spark, transform, conf)
            await proc.start()
            try:
                await proc.run(idle_exit_ms=3000)
            finally:
                await proc.close()
            return proc.stats, await read_ledger(client, ledger)

    return asyncio.run(main())


def upper_transform(df):
    from pyspark.sql import functions as F

    return df.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))


def poison_transform(df):
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(v):
        if "poison" in v:
            raise ValueError(f"bad value {v}")
        return v.upper()

    f = F.udf(check, StringType())
    return df.select(f(F.col("value").cast("string")).alias("value"))


def fixed_transform(df):
    from pyspark.sql import functions as F

    return df.select(F.regexp_replace(F.col("value").cast("string"), "poison", "fixed").alias("value"))


def test_runtime_batches_commit_exactly_once(broker, spark, official, unique_name):  # noqa: F811
    inp, out, ledger = (f"persistent://public/default/{unique_name(x)}" for x in ("in", "out", "ledger"))
    _fill(official, inp, [f"v{i}".encode() for i in range(120)], key=lambda i: f"k{i % 3}")
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    stats, records = _run(broker, spark, upper_transform, [inp], out, ledger, batch_max_messages=50,
                          batch_max_delay_ms=1000)
    got = read_n(reader, 120)
    assert sorted(m.data() for m in got) == sorted(f"V{i}".encode() for i in range(120))
    assert {m.partition_key() for m in got} == {"k0", "k1", "k2"}
    assert read_until_sentinel(official, reader, out) == []
    committed = [r for r in records if r.kind == "COMMITTED"]
    assert sum(r.outputs[out] for r in committed) == 120 and stats.batches == len(committed) >= 3
    again = official.subscribe(inp, "rt", consumer_type=pulsar.ConsumerType.Shared)
    assert read_until_sentinel(official, again, inp) == []


def test_runtime_skips_inputs_the_ledger_shows_committed(broker, spark, official, unique_name):  # noqa: F811
    """Committed acks lost (here: the cursor reset to the start) never make the runtime commit a batch twice."""
    from txn.admin import admin_request

    inp, out, ledger = (f"persistent://public/default/{unique_name(x)}" for x in ("in", "out", "ledger"))
    # Never acks: the rewind re-reads inputs "rt" acked, which the broker (retention none) may delete otherwise.
    official.subscribe(inp, "keep", initial_position=pulsar.InitialPosition.Earliest)
    p = official.create_producer(inp, batching_enabled=True, batching_max_messages=7, batching_max_publish_delay_ms=50)
    for i in range(40):
        p.send_async(f"v{i}".encode(), None)
    p.flush()
    p.close()
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    stats, _ = _run(broker, spark, upper_transform, [inp], out, ledger, batch_max_messages=15, batch_max_delay_ms=1000)
    assert sorted(m.data() for m in read_n(reader, 40)) == sorted(f"V{i}".encode() for i in range(40))
    path = inp.replace("persistent://", "/admin/v2/persistent/")
    assert admin_request("POST", broker.admin_url, f"{path}/subscription/rt/resetcursor/0")[0] in (200, 204)
    stats, records = _run(broker, spark, upper_transform, [inp], out, ledger, batch_max_messages=15,
                          batch_max_delay_ms=1000)
    assert (stats.messages, stats.duplicates_skipped, stats.outputs) == (0, 40, 0)
    assert read_until_sentinel(official, reader, out) == []
    committed = [r for r in records if r.kind == "COMMITTED"]
    assert sum(len(ids) for r in committed for ids in r.inputs.values()) == 40
    assert sum(len(ids) for r in committed for ids in r.duplicates.values()) == 40


def test_runtime_windowed_counts_across_two_inputs(broker, spark, official, unique_name):  # noqa: F811
    from spark_jobs.jobs.windowed_counts import transform

    a, b, out, ledger = (f"persistent://public/default/{unique_name(x)}" for x in ("a", "b", "out", "ledger"))
    base = 1_700_000_000_000  # a window boundary (multiple of 10 s)
    _fill(official, a, [f"x,{i}".encode() for i in range(10)], event_time=lambda i: base + i * 1000)
    _fill(official, b, [f"y,{i}".encode() for i in range(10)], event_time=lambda i: base + 10_000 + i * 1000)
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    _run(broker, spark, transform, [a, b], out, ledger, batch_max_messages=100, batch_max_delay_ms=2000)
    rows = [json.loads(m.data()) for m in read_n(reader, 2)]
    assert read_until_sentinel(official, reader, out) == []
    assert sorted((r["key"], r["count"], r["sum"]) for r in rows) == [("x", 10, 45), ("y", 10, 45)]


def test_runtime_poison_parked_and_replayed(broker, spark, official, unique_name):  # noqa: F811
    inp, out, ledger = (f"persistent://public/default/{unique_name(x)}" for x in ("in", "out", "ledger"))
    payloads = [f"m{i}".encode() for i in range(8)]
    payloads[5] = b"poison-5"
    _fill(official, inp, payloads)
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    stats, records = _run(broker, spark, poison_transform, [inp], out, ledger,
                          spec="test_spark_runtime:fixed_transform", batch_max_messages=8, batch_max_delay_ms=2000,
                          max_attempts=1)
    assert sorted(m.data() for m in read_n(reader, 7)) == sorted(p.upper() for p in payloads if b"poison" not in p)
    assert stats.parked == 1
    (parked,) = [r for r in records if r.kind == "PARKED"]
    assert "bad value poison-5" in parked.error and parked.config["runtime"] == "spark"

    async def do_replay():
        async with txn.AsyncClient(broker.service_url) as client:
            return await replay_batch(client, parked.batch_id, ledger, output=out,
                                      transform="test_spark_runtime:fixed_transform", replayer=replay_outputs)

    res = asyncio.run(do_replay())  # the transform the caller names (never the ledger's), run by Spark
    assert res.replayed and res.messages == 1
    assert [m.data() for m in read_n(reader, 1)] == [b"fixed-5"]
    assert not asyncio.run(do_replay()).replayed
    assert read_until_sentinel(official, reader, out) == []


def test_spark_submit_cli(broker, official, unique_name):
    inp, out = (f"persistent://public/default/{unique_name(x)}" for x in ("in", "out"))
    _fill(official, inp, [b"sku=A,qty=3", b"sku=B,qty=2", b"sku=C,qty=5"])
    r = subprocess.run(
        [sys.executable, "-m", "txn_shell.cli", "spark", "submit", "enrich", "--service-url", broker.service_url,
         "--input", inp, "--output", out, "--subscription", "cli", "--master", "local[1]",
         "--exit-when-idle-ms", "3000", "--batch-max-delay-ms", "1500"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "committed: rows in=3 out=3" in r.stderr and "txn (" in r.stderr
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    rows = sorted((json.loads(m.data()) for m in read_n(reader, 3)), key=lambda d: d["sku"])
    assert [(d["sku"], d["qty"], d["total"], d["tier"]) for d in rows] == [
        ("A", 3, 7.5, "bronze"), ("B", 2, 20.0, "silver"), ("C", 5, 495.0, "gold")]
