"""Conventions users bring from other connectors: option aliases, the sink's ``event_time`` and
extra columns, and the Python interpreter Spark starts for its workers.

Option parsing is checked without Spark; the sink's columns against the real broker (read back
with the official client); the worker check in a child process run by the venv's interpreter
with a ``PATH`` that does not lead to the venv (what running ``.venv/bin/python job.py`` without
activating the venv does).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pulsar
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F  # noqa: E402

from spark_jobs.options import OptionConflict, OptionError, UnknownOption  # noqa: E402
from spark_jobs.sink import ExtraColumnsError, SinkError, SinkOptions  # noqa: E402
from spark_jobs.source import SourceOptions  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402

from peer import read_n, read_until_sentinel  # noqa: E402
from spark_session import spark  # noqa: E402, F401

URL = "pulsar://127.0.0.1:6650"
ADMIN = "http://127.0.0.1:8080"


# ---------------------------------------------------------------------------- aliases


def test_source_accepts_streamnative_names() -> None:
    o = SourceOptions.parse({"service.url": URL, "admin.url": ADMIN + "/", "topic": "orders", "poolTimeoutMs": "5000"})
    assert o.service_url == URL and o.admin_url == ADMIN
    assert o.topics == ("persistent://public/default/orders",)
    assert o.poll_timeout_ms == 5000
    same = SourceOptions.parse({"service_url": URL, "service.url": URL, "topic": "orders", "topics": "orders"})
    assert same.service_url == URL and same.topics == ("persistent://public/default/orders",)


@pytest.mark.parametrize(("options", "option"), [
    ({"service_url": URL, "service.url": "pulsar://other:6650", "topics": "a"}, "serviceUrl"),
    ({"service_url": URL, "admin_url": ADMIN, "ADMIN.URL": "http://other:8080", "topics": "a"}, "adminUrl"),
    ({"serviceUrl": URL, "service_url": "pulsar://other:6650", "topics": "a"}, "serviceUrl"),
    ({"service_url": URL, "topic": "a", "topics": "b"}, "topics"),
])
def test_source_alias_conflict_is_a_typed_error(options: dict[str, str], option: str) -> None:
    with pytest.raises(OptionConflict) as info:
        SourceOptions.parse(options)
    assert info.value.option == option
    assert len(info.value.given) == 2 and "give it once" in str(info.value)


@pytest.mark.parametrize(("options", "option", "hint"), [
    ({"maxMessagesPerTriger": "10"}, "maxmessagespertriger", "did you mean maxMessagesPerTrigger"),
    ({"maxOffsetsPerTrigger": "10"}, "maxoffsetspertrigger", "maxMessagesPerTrigger"),
    ({"pulsar.client.authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationToken"},
     "pulsar.client.authpluginclassname", "authToken"),
    ({"authtokn": "x"}, "authtokn", "did you mean authToken"),
    ({"path": "/tmp/x"}, "path", "known: "),
])
def test_source_refuses_unknown_options(options: dict[str, str], option: str, hint: str) -> None:
    """An ignored cap or credential changes what a job does without a word: refused, with a pointer."""
    with pytest.raises(UnknownOption) as info:
        SourceOptions.parse({"service_url": URL, "topics": "orders", **options})
    assert info.value.option == option and hint in str(info.value)
    assert isinstance(info.value, OptionError) and isinstance(info.value, ValueError)


def test_sink_refuses_unknown_options() -> None:
    with pytest.raises(UnknownOption, match="did you mean txnTimeoutMs"):
        SinkOptions.parse({"service_url": URL, "topic": "out", "txn_timeout": "1000"})
    with pytest.raises(UnknownOption, match="StreamNative"):
        SinkOptions.parse({"service_url": URL, "topic": "out", "pulsar.client.authParams": "token:x"})
    ok = SinkOptions.parse({"service_url": URL, "topic": "out", "checkpointLocation": "/tmp/c", "writer": "rows"})
    assert ok.topic == "persistent://public/default/out"


def test_options_are_camel_case_with_the_older_names_as_aliases() -> None:
    """One style, Spark's: every option a face lists (and names in its errors) is camelCase; the
    snake-case names of before give the same options, and both at once must agree."""
    from spark_jobs.sink import SINK_OPTIONS
    from spark_jobs.source import SOURCE_OPTIONS

    for name in (*SOURCE_OPTIONS, *SINK_OPTIONS):
        assert "_" not in name and name[0].islower(), name
    camel = SinkOptions.parse({"serviceUrl": URL, "adminUrl": ADMIN, "topic": "out", "ledgerTopic": "led",
                               "txnTimeoutMs": "5000", "deterministicOrder": "false", "batchMaxRows": "7",
                               "batchMaxBytes": "999", "queryId": "q1", "batchId": "3"})
    snake = SinkOptions.parse({"service_url": URL, "admin_url": ADMIN, "topic": "out", "ledger_topic": "led",
                               "txn_timeout_ms": "5000", "deterministic_order": "false", "batch_max_rows": "7",
                               "batch_max_bytes": "999", "query_id": "q1", "batch_id": "3"})
    assert camel == snake
    assert (camel.service_url, camel.admin_url, camel.ledger_topic, camel.txn_timeout_ms, camel.deterministic_order,
            camel.batch_max_rows, camel.batch_max_bytes, camel.query_id, camel.batch_id) == (
        URL, ADMIN, "persistent://public/default/led", 5000, False, 7, 999, "q1", 3)
    both = SinkOptions.parse({"serviceUrl": URL, "topic": "out", "txnTimeoutMs": "5000", "txn_timeout_ms": "5000"})
    assert both.txn_timeout_ms == 5000
    with pytest.raises(OptionConflict) as info:
        SinkOptions.parse({"serviceUrl": URL, "topic": "out", "txnTimeoutMs": "5000", "txn_timeout_ms": "6000"})
    assert info.value.option == "txnTimeoutMs"
    assert info.value.given == {"txntimeoutms": "5000", "txn_timeout_ms": "6000"}
    with pytest.raises(SinkError, match="option batchMaxRows must be positive"):
        SinkOptions.parse({"serviceUrl": URL, "topic": "out", "batch_max_rows": "0"})
    with pytest.raises(SinkError, match="needs option serviceUrl"):
        SinkOptions.parse({"topic": "out"})
    with pytest.raises(UnknownOption) as unknown:
        SinkOptions.parse({"serviceUrl": URL, "topic": "out", "batch_maxrows": "5"})
    listed = str(unknown.value).split("(known: ")[1]
    assert "txnTimeoutMs" in listed and "serviceUrl" in listed and "_" not in listed
    src = SourceOptions.parse({"serviceUrl": URL, "adminUrl": ADMIN, "topics": "orders"})
    assert src == SourceOptions.parse({"service_url": URL, "admin_url": ADMIN, "topics": "orders"})
    with pytest.raises(UnknownOption, match="did you mean topicsPattern"):
        SourceOptions.parse({"serviceUrl": URL, "topics_pattern": "a.*"})


def test_source_topic_is_one_topic() -> None:
    with pytest.raises(OptionError, match="names one topic"):
        SourceOptions.parse({"service.url": URL, "topic": "a,b"})


def test_sink_accepts_aliases_and_security_options(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here\n")
    o = SinkOptions.parse({"service.url": URL, "admin.url": ADMIN, "topic": "out", "authToken": "file:///tok",
                           "tlsTrustCertsFilePath": str(ca), "tlsAllowInsecureConnection": "true"})
    assert o.service_url == URL and o.admin_url == ADMIN
    s = o.settings
    assert s is not None and s.auth_token_file == "/tok" and s.auth_token is None
    assert s.tls_trust_certs_file_path == str(ca) and s.tls_allow_insecure_connection
    assert o.writer == "arrow" and o.extra_columns == "error"
    with pytest.raises(OptionConflict):
        SinkOptions.parse({"service_url": URL, "serviceUrl": "pulsar://x:6650", "topic": "out"})
    with pytest.raises(Exception, match="extraColumns must be error or ignore"):
        SinkOptions.parse({"service_url": URL, "topic": "out", "extraColumns": "drop"})
    with pytest.raises(Exception, match="writer must be arrow or rows"):
        SinkOptions.parse({"service_url": URL, "topic": "out", "writer": "pandas"})


def test_settings_round_trip_through_spark_options(tmp_path: Path) -> None:
    """What the runtime passes on: BrokerSettings -> Spark options -> the same settings, on the
    source and the sink."""
    from spark_jobs.options import broker_settings, lower_options, settings_options
    from txn.settings import BrokerSettings

    ca = tmp_path / "ca.pem"
    ca.write_text("x\n")
    for s in (BrokerSettings(URL, ADMIN, auth_token="t0k", tls_trust_certs_file_path=str(ca),
                             tls_validate_hostname=True),
              BrokerSettings(URL, None, auth_token_file="/run/tok", tls_allow_insecure_connection=True)):
        opts = settings_options(s)
        assert broker_settings(lower_options(opts)) == s
        assert SourceOptions.parse({**opts, "topics": "a"}).settings() == s
        assert SinkOptions.parse({**opts, "topic": "a"}).settings == s


# ------------------------------------------------------------------- sink: columns


@pytest.fixture(scope="module")
def dedup_ns(broker) -> str:  # noqa: ANN001
    ns = f"public/spark-conv-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    return ns


def _df(session, n: int = 6):  # noqa: ANN001, ANN202
    """value, key, event_time (row i: 2024-01-01 + i seconds + 7 ms; null for i == 0), note."""
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = [(f"v{i}".encode(), f"k{i}", None if i == 0 else base + dt.timedelta(seconds=i, milliseconds=7), f"n{i}")
            for i in range(n)]
    return session.createDataFrame(rows, "value binary, key string, event_time timestamp, note string")


def _expected_event_ms(i: int) -> int:
    return 0 if i == 0 else int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp() * 1000) + i * 1000 + 7


def test_one_name_reads_and_writes(spark, broker, dedup_ns, unique_name, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """``pulsar-txn`` writes, and reads back (batch and streaming) what ``pulsar``, the source's old
    name (StreamNative's connector's too), reads: the same rows, in order."""
    from spark_jobs.sink import PulsarTxnDataSource
    from spark_jobs.source import SCHEMA, PulsarDataSource

    assert (PulsarTxnDataSource.name(), PulsarDataSource.name()) == ("pulsar-txn", "pulsar")
    topic = f"persistent://{dedup_ns}/{unique_name('one')}"
    df = spark.createDataFrame([(f"v{i}".encode(), f"k{i}") for i in range(5)], "value binary, key string")
    df.write.format("pulsar-txn").mode("append").options(serviceUrl=broker.service_url, adminUrl=broker.admin_url,
                                                         topic=topic, job=unique_name("job")).save()
    expected = [(f"k{i}".encode(), f"v{i}".encode(), topic, -1) for i in range(5)]  # sorted; written by 2 tasks

    def rows(frame) -> list[tuple]:  # noqa: ANN001
        return [(r.key, r.value, r.topic, r.partition) for r in frame.orderBy("message_id").collect()]

    new = spark.read.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic).load()
    old = spark.read.format("pulsar").option("service_url", broker.service_url).option("topics", topic).load()
    assert new.schema == old.schema == SCHEMA
    assert rows(new) == rows(old) and sorted(rows(new)) == expected
    stream = (spark.readStream.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic,
                                                            startingOffsets="earliest").load())
    assert stream.isStreaming
    table = unique_name("one").replace("-", "_")
    q = (stream.writeStream.format("memory").queryName(table).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert rows(spark.table(table)) == rows(old)


def test_starting_timestamp_by_publish_time(spark, broker, unique_name, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """``startingTimestamp`` starts at the first message published at or after it: batch and
    streaming, from the topic's first entry, from the first entry of a later ledger (the topic
    unloaded in between), mid-ledger, and past the end (nothing)."""
    import time

    from txn.admin import admin_request

    topic = f"persistent://public/default/{unique_name('ts')}"
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        client.subscribe(topic, "hold")  # a durable subscription keeps the first ledger (retention 0 would trim it)
        for half in range(2):
            p = client.create_producer(topic, batching_enabled=False)
            for i in range(3):
                p.send(f"m{3 * half + i}".encode())
                time.sleep(0.02)
            p.close()
            if half == 0:  # the next three go to a new ledger
                status, _ = admin_request("PUT", broker.admin_url, "/admin/v2/" + topic.replace("://", "/") + "/unload")
                assert status in (200, 204)
        r = client.create_reader(topic, pulsar.MessageId.earliest)
        msgs = [r.read_next(10000) for _ in range(6)]
    finally:
        client.close()
    times = [m.publish_timestamp() for m in msgs]
    ledgers = [m.message_id().ledger_id() for m in msgs]
    assert times == sorted(set(times)) and ledgers[2] != ledgers[3]
    assert [m.message_id().entry_id() for m in msgs[3:]] == [0, 1, 2]

    def batch(ts: int) -> list[str]:
        df = spark.read.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic,
                                                     startingTimestamp=str(ts)).load()
        return [r.value.decode() for r in df.collect()]

    everything = [f"m{i}" for i in range(6)]
    assert batch(times[0]) == everything  # the topic's first entry
    assert batch(times[0] - 5000) == everything
    assert batch(times[3]) == everything[3:]  # the first entry of the second ledger
    assert batch(times[3] - 1) == everything[3:]
    assert batch(times[4]) == everything[4:]  # mid-ledger
    assert batch(times[1]) == everything[1:]
    assert batch(times[5] + 1) == []  # past the end
    got: list[str] = []
    q = (spark.readStream.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic,
                                                       startingTimestamp=str(times[4])).load()
         .writeStream.foreachBatch(lambda df, _: got.extend(r.value.decode() for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    assert got == everything[4:]
    with pytest.raises(ValueError, match="one of the options startingOffsets and startingTimestamp"):
        SourceOptions.parse({"serviceUrl": URL, "topics": "a", "startingOffsets": "earliest",
                             "startingTimestamp": "1"})


def test_min_partitions_cuts_ranges_at_entries(spark, broker, unique_name, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """``minPartitions`` cuts a topic partition's range at entry boundaries into pieces of about the
    same size (never more pieces than entries); the rows are the same, in order, batch and streaming."""
    topic = f"persistent://public/default/{unique_name('minp')}"
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            p.send(f"m{i}".encode())
        p.close()
    finally:
        client.close()
    everything = [f"m{i}" for i in range(10)]

    def pieces(**extra: str) -> tuple[int, list[int], list[str]]:
        df = spark.read.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic, **extra).load()
        rows = df.select(F.spark_partition_id().alias("pid"), "value").collect()
        sizes = [sum(1 for r in rows if r.pid == i) for i in range(df.rdd.getNumPartitions())]
        return df.rdd.getNumPartitions(), sizes, [r.value.decode() for r in rows]

    assert pieces() == (1, [10], everything)
    assert pieces(minPartitions="4") == (4, [2, 3, 2, 3], everything)  # cut after entries 1, 4 and 6
    assert pieces(minPartitions="50") == (10, [1] * 10, everything)  # one entry each at most
    sizes: list[int] = []
    got: list[str] = []

    def collect(df, _: int) -> None:  # noqa: ANN001
        sizes.append(df.rdd.getNumPartitions())
        got.extend(r.value.decode() for r in df.collect())

    q = (spark.readStream.format("pulsar-txn").options(serviceUrl=broker.service_url, topics=topic,
                                                       startingOffsets="earliest", minPartitions="3").load()
         .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    assert (sizes, got) == ([3], everything)

    # A range over two ledgers (the topic unloaded in between) is cut in the second only, the
    # first cut before its first entry.
    from txn.admin import admin_request

    two = f"persistent://public/default/{unique_name('minp2')}"
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        client.subscribe(two, "hold")  # keeps the first ledger
        for half in range(2):
            p = client.create_producer(two, batching_enabled=False)
            ids = [p.send(f"m{3 * half + i}".encode()) for i in range(3)]
            p.close()
            if half == 0:
                first = ids[0]
                status, _ = admin_request("PUT", broker.admin_url, "/admin/v2/" + two.replace("://", "/") + "/unload")
                assert status in (200, 204)
    finally:
        client.close()
    df = spark.read.format("pulsar-txn").options(
        serviceUrl=broker.service_url, topics=two, minPartitions="4",
        startingOffsets=json.dumps({two: f"{first.ledger_id()}:{first.entry_id()}"})).load()
    rows = df.select(F.spark_partition_id().alias("pid"), "value").collect()
    assert df.rdd.getNumPartitions() == 4
    assert [sum(1 for r in rows if r.pid == i) for i in range(4)] == [2, 1, 1, 1]
    assert [r.value.decode() for r in rows] == everything[1:6]
    with pytest.raises(ValueError, match="minPartitions must be a positive integer"):
        SourceOptions.parse({"serviceUrl": URL, "topics": "a", "minPartitions": "0"})


def _capped_batches(spark, url: str, topic: str, checkpoint: Path, **caps: str) -> list[list[str]]:  # noqa: ANN001, F811
    """The non-empty micro-batches (values, in order) of a query from earliest to what is there."""
    batches: list[tuple[int, list[str]]] = []

    def collect(df, batch_id: int) -> None:  # noqa: ANN001
        batches.append((batch_id, [r.value.decode() for r in df.collect()]))  # one topic partition: in order

    q = (spark.readStream.format("pulsar-txn").options(serviceUrl=url, topics=topic, startingOffsets="earliest",
                                                       **caps)
         .load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    return [v for _, v in sorted(batches) if v]


def test_streaming_caps_by_bytes_and_by_count(spark, broker, unique_name, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """``maxBytesPerTrigger`` caps a micro-batch's payload bytes (a message larger than the cap
    comes alone, never stalls the query); with ``maxMessagesPerTrigger`` both caps hold."""
    topic = f"persistent://public/default/{unique_name('cap')}"
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = client.create_producer(topic, batching_enabled=False)
        values = [f"m{i}".ljust(100, ".") for i in range(7)] + ["big".ljust(1000, ".")] + \
                 [f"n{i}".ljust(100, ".") for i in range(3)]
        for v in values:
            p.send(v.encode())
        p.close()
    finally:
        client.close()
    names = [v.rstrip(".") for v in values]
    by_bytes = _capped_batches(spark, broker.service_url, topic, tmp_path / "b", maxBytesPerTrigger="350")
    assert [[v.rstrip(".") for v in b] for b in by_bytes] == [names[0:3], names[3:6], names[6:7], names[7:8],
                                                               names[8:11]]
    both = _capped_batches(spark, broker.service_url, topic, tmp_path / "c", maxBytesPerTrigger="350",
                           maxMessagesPerTrigger="2")
    assert [[v.rstrip(".") for v in b] for b in both] == [names[0:2], names[2:4], names[4:6], names[6:7],
                                                          names[7:8], names[8:10], names[10:11]]
    # Two partitions share the byte cap: 400 bytes = 2 messages of 100 from each, per micro-batch.
    from txn.admin import create_partitioned_topic

    parted = f"persistent://public/default/{unique_name('capp')}"
    create_partitioned_topic(broker.admin_url, parted, 2)
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for part in range(2):
            p = client.create_producer(f"{parted}-partition-{part}", batching_enabled=False)
            for i in range(4):
                p.send(f"p{part}-{i}".ljust(100, ".").encode())
            p.close()
    finally:
        client.close()
    shared = _capped_batches(spark, broker.service_url, parted, tmp_path / "p", maxBytesPerTrigger="400")
    assert [len(b) for b in shared] == [4, 4]
    assert sorted(v for b in shared for v in b) == sorted(f"p{k}-{i}".ljust(100, ".") for k in range(2)
                                                          for i in range(4))
    assert all(sorted({v.split("-")[0] for v in b}) == ["p0", "p1"] for b in shared)
    with pytest.raises(ValueError, match="maxBytesPerTrigger must be a positive integer"):
        SourceOptions.parse({"serviceUrl": URL, "topics": "a", "maxBytesPerTrigger": "0"})


@pytest.mark.parametrize("writer", ["arrow", "rows"])
def test_sink_event_time_and_extra_columns(spark, broker, dedup_ns, unique_name, writer: str) -> None:  # noqa: ANN001, F811
    """Extra columns are refused by default (the error lists them and nothing is written); with
    ``extraColumns=ignore`` they are dropped and ``event_time`` lands on each message (0 = unset
    for the null one). Options given by StreamNative's names."""
    topic = f"persistent://{dedup_ns}/{unique_name('ev')}"
    opts = {"service.url": broker.service_url, "admin.url": broker.admin_url, "topic": topic,
            "job": unique_name("job"), "writer": writer}
    with pytest.raises(Exception, match=r"also has \['note'\]") as info:
        _df(spark).write.format("pulsar-txn").mode("append").options(**opts).save()
    assert ExtraColumnsError.__name__ in str(info.value) or "extraColumns=ignore" in str(info.value)
    _df(spark).write.format("pulsar-txn").mode("append").options(**opts, extraColumns="ignore").save()
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        c = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
        got = {m.data(): (m.partition_key(), m.event_timestamp(), m.properties()) for m in read_n(c, 6)}
    finally:
        client.close()
    assert got == {f"v{i}".encode(): (f"k{i}", _expected_event_ms(i), {}) for i in range(6)}


def test_sink_refuses_a_bad_event_time_type(spark, broker, dedup_ns, unique_name) -> None:  # noqa: ANN001, F811
    topic = f"persistent://{dedup_ns}/{unique_name('ev')}"
    df = spark.range(2).select(F.col("id").cast("string").cast("binary").alias("value"), F.lit("x").alias("event_time"))
    with pytest.raises(Exception, match="column 'event_time' must be a timestamp"):
        df.write.format("pulsar-txn").mode("append").option("service_url", broker.service_url) \
            .option("topic", topic).save()


# ------------------------------------------------------------------ worker python

#: Run by the venv's interpreter: register, then run a Python task that imports txn.
WORKER_SCRIPT = r"""
import sys
from pyspark.sql import SparkSession
import spark_jobs
spark = (SparkSession.builder.master("local[1]").appName("worker-python").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
try:
    spark_jobs.register(spark)
    print("registered")
    print("task:", spark.sparkContext.parallelize([1], 1).map(lambda _: __import__("txn").__name__).collect())
finally:
    spark.stop()
"""


def _env_without_venv() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return env


def test_register_names_a_worker_python_that_cannot_import_the_project(tmp_path: Path) -> None:
    env = _env_without_venv()
    probe = subprocess.run(["python3", "-c", "import txn"], env=env, capture_output=True, text=True)
    if probe.returncode == 0:
        pytest.skip("python3 on PATH imports txn here: nothing to detect")
    script = tmp_path / "job.py"
    script.write_text(WORKER_SCRIPT)
    bad = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "registered" not in bad.stdout
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.startswith("spark_jobs.WorkerPythonError: ")]
    assert "Spark's Python workers run 'python3'" in line and "cannot import the project" in line
    assert f"set PYSPARK_PYTHON={sys.executable}" in line
    good = subprocess.run([sys.executable, str(script)], env={**env, "PYSPARK_PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr[-3000:]
    assert "registered" in good.stdout and "task: ['txn']" in good.stdout


# ------------------------------------------------------- sink: retries it cannot check

#: Run by the venv's interpreter with task retries (``local[2,3]``): partition 0's first attempt
#: fails in a UDF upstream of the sink, so Spark retries it. argv: service URL, topic, job[, admin URL].
RETRY_SCRIPT = r"""
import sys
from pyspark import TaskContext
from pyspark.sql import SparkSession, functions as F
import spark_jobs
url, topic, job = sys.argv[1:4]
spark = (SparkSession.builder.master("local[2,3]").appName("sink-retry").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

def flaky(i):
    if i == 7 and TaskContext.get().attemptNumber() == 0:
        raise ValueError("first attempt fails")
    return f"v{i}"

try:
    spark_jobs.register(spark)
    df = spark.range(0, 20, 1, 2).select(F.udf(flaky, "string")("id").alias("value"))
    opts = {"service_url": url, "topic": topic, "job": job}
    if len(sys.argv) > 4:
        opts["admin_url"] = sys.argv[4]
    try:
        df.write.format("pulsar-txn").mode("append").options(**opts).save()
        print("written")
    except Exception as exc:
        print("failed:", " ".join(str(exc).split()))
finally:
    spark.stop()
"""


def test_sink_without_admin_url_fails_a_retried_task(broker, dedup_ns, unique_name, tmp_path: Path) -> None:  # noqa: ANN001
    """Without ``admin_url`` nothing shows that broker deduplication would drop what a failed attempt
    stored, so a retried task attempt fails the write (UncheckedRetry) instead of only logging: the
    transaction is aborted, nothing is visible, the ledger says ABORTED. With ``admin_url`` the same
    retry is written exactly once."""
    script = tmp_path / "retry.py"
    script.write_text(RETRY_SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        for admin in ((), (broker.admin_url,)):
            topic, job = f"persistent://{dedup_ns}/{unique_name('retry')}", unique_name("job")
            proc = subprocess.run([sys.executable, str(script), broker.service_url, topic, job, *admin], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            c = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
            got = sorted(m.data() for m in read_until_sentinel(client, c, topic, timeout_s=60))
            records = [r for r in _ledger(broker, topic) if r.job == job]
            if admin:
                assert proc.stdout.splitlines() == ["written"], proc.stdout
                assert got == sorted(f"v{i}".encode() for i in range(20))
                assert [r.kind for r in records] == ["STARTED", "COMMITTED"]
                assert records[1].config["task_attempts"]["0"] == 1
            else:
                (line,) = proc.stdout.splitlines()
                assert line.startswith("failed: "), line
                assert "UncheckedRetry: pulsar-txn sink: attempt 2 of write task 0 refused" in line, line
                assert "without option adminUrl" in line, line
                assert got == []
                assert [r.kind for r in records] == ["STARTED", "ABORTED"]
    finally:
        client.close()


def _ledger(broker, topic: str) -> list:  # noqa: ANN001
    """The records of ``topic``'s default ledger (read with txn's ledger reader)."""
    import asyncio

    from txn.client import AsyncClient
    from txn.delivery.ledger import default_ledger_topic
    from txn.delivery.replay import read_ledger

    async def go() -> list:
        async with AsyncClient(broker.service_url) as c:
            return await read_ledger(c, default_ledger_topic(topic))

    return asyncio.run(go())


@pytest.mark.parametrize("scheme", [None, "JavaStringHash"])
def test_sink_puts_each_key_on_the_partition_a_producer_would(spark, broker, dedup_ns, scheme) -> None:  # noqa: ANN001, F811
    """Keyed rows land where a producer of the same scheme puts the key: by default the official
    Python client's (and txn's) hash, with ``hashingScheme=JavaStringHash`` the Java client's."""
    import txn
    from txn.admin import create_partitioned_topic

    keys = [f"key-{i}" for i in range(40)] + ["ünï", "日本", ""]
    by_sink = f"persistent://{dedup_ns}/hash-sink-{uuid.uuid4().hex[:8]}"
    by_producer = f"persistent://{dedup_ns}/hash-prod-{uuid.uuid4().hex[:8]}"
    for t in (by_sink, by_producer):
        create_partitioned_topic(broker.admin_url, t, 4)
    opts = {"serviceUrl": broker.service_url, "adminUrl": broker.admin_url, "topic": by_sink,
            "job": f"hash-{uuid.uuid4().hex[:6]}"}
    if scheme:
        opts["hashingScheme"] = scheme
    rows = [(k or None, k.encode() or b"-") for k in keys]
    spark.createDataFrame(rows, "key string, value binary").repartition(3).write.format("pulsar-txn") \
        .mode("append").options(**opts).save()
    if scheme:
        with txn.Client(broker.service_url) as c:
            p = c.create_producer(by_producer, batching_enabled=False,
                                  hashing_scheme=txn.HashingScheme.JavaStringHash)
            for k in keys:
                p.send(k.encode() or b"-", partition_key=k or None)
    else:
        c = pulsar.Client(broker.service_url)  # the official Python client is the reference
        p = c.create_producer(by_producer, batching_enabled=False)
        for k in keys:
            p.send(k.encode() or b"-", partition_key=k or None)
        c.close()

    def partition_of_key(topic: str) -> dict[str, int]:
        peer = pulsar.Client(broker.service_url)
        try:
            sub = peer.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
            got = read_n(sub, len(keys))
            return {m.partition_key(): int(m.topic_name().rsplit("-", 1)[1]) for m in got if m.partition_key()}
        finally:
            peer.close()

    sink_parts, producer_parts = partition_of_key(by_sink), partition_of_key(by_producer)
    assert len(sink_parts) == len(keys) - 1  # every keyed row; the empty key goes round robin
    assert sink_parts == producer_parts
    assert len(set(sink_parts.values())) == 4
    with pytest.raises(SinkError, match="hashingScheme must be one of"):
        SinkOptions.parse({**opts, "hashingScheme": "md5"})
