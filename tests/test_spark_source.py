"""The ``pulsar`` Spark source (spark_jobs.source) against a real broker, one local SparkSession."""

from __future__ import annotations

import json
import pathlib
import re
import threading
import time

import pulsar
import pytest

import txn
from spark_jobs.offsets import (
    EARLIEST_POS,
    format_position,
    offsets_from_json,
    offsets_to_json,
    parse_offsets,
    parse_position,
    pos_key,
)
from spark_jobs.source import SourceOptions
from txn.admin import admin_request, create_partitioned_topic

from spark_session import spark  # noqa: F401

COLUMNS = ("key, value, topic, partition, message_id, message_id_bytes, unix_millis(publish_time) AS publish_ms, "
           "unix_millis(event_time) AS event_ms, properties")


@pytest.fixture(scope="module")
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _read(spark, broker, **options):  # noqa: F811
    r = spark.read.format("pulsar").option("service_url", broker.service_url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _values(rows):
    return [r.value.decode() for r in rows]


def _pos(mid) -> str:
    """A txn / official message id as an offsets-JSON position."""
    return f"{mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}"


# ---------------------------------------------------------------- offsets (no broker)


def test_positions_and_offsets_json():
    assert parse_position("18:7:-1", "x") == (18, 7, -1)
    assert parse_position("18:7", "x") == (18, 7, -1)
    assert parse_position(" (18,8,2,3) ", "x") == (18, 8, 3)
    assert parse_position("EARLIEST", "x") == "earliest" and parse_position("latest", "x") == "latest"
    assert parse_position("-1:-1:-1", "x") == "earliest"
    # -1 (the whole entry) sorts after every index of its entry, before the next entry.
    assert pos_key((5, 1, 0)) < pos_key((5, 1, 9)) < pos_key((5, 1, -1)) < pos_key((5, 2, 0)) < pos_key((6, 0, -1))
    assert pos_key(EARLIEST_POS) < pos_key((0, 0, 0))
    assert parse_offsets('{"t-partition-1": "3:4:5", "persistent://a/b/c": "earliest"}', "startingOffsets") == {
        "persistent://public/default/t-partition-1": (3, 4, 5),
        "persistent://a/b/c": "earliest",
    }
    assert parse_offsets(" Latest ", "startingOffsets") == "latest"
    stored = offsets_to_json({"persistent://public/default/b": (1, 2, -1),
                              "persistent://public/default/a": EARLIEST_POS})
    assert list(stored.items()) == [("persistent://public/default/a", "earliest"),
                                    ("persistent://public/default/b", "1:2:-1")]
    assert offsets_from_json(stored) == {"persistent://public/default/a": EARLIEST_POS,
                                         "persistent://public/default/b": (1, 2, -1)}
    assert format_position((1, 2, 3)) == "1:2:3"
    for bad, match in [
        ("{not json", "startingOffsets is neither"),
        ("[1]", "must be an object"),
        ('{"t": 5}', r"startingOffsets\['t'\]: a position must be a string"),
        ('{"t": "1:x"}', r"startingOffsets\['t'\]: invalid position"),
        ('{"t": "1:2:-7"}', "invalid batch index"),
        ('{"bad topic": "1:2"}', "startingOffsets key 'bad topic'"),
        ('{"t": "1:2", "public/default/t": "3:4"}', "twice"),
        ("", "startingOffsets must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_offsets(bad, "startingOffsets")
    with pytest.raises(ValueError, match="endingOffsets: \"earliest\" is not allowed"):
        parse_offsets("earliest", "endingOffsets", allow_earliest=False)


def test_option_errors_without_spark():
    ok = {"service_url": "pulsar://h:6650", "topics": "a"}
    assert SourceOptions.parse(ok).topics == ("persistent://public/default/a",)
    parsed = SourceOptions.parse(ok)
    assert (parsed.fail_on_data_loss, parsed.subscription) == (True, None)
    parsed = SourceOptions.parse({**ok, "FAILONDATALOSS": "False", "predefinedSubscription": "q-1"})
    assert (parsed.fail_on_data_loss, parsed.subscription) == (False, "q-1")
    assert SourceOptions.parse({**ok, "TOPICS": " a, b ,a"}).topics == (
        "persistent://public/default/a", "persistent://public/default/b")
    for opts, match in [
        ({"topics": "a"}, "service_url"),
        ({**ok, "service_url": "http://h"}, "service_url must start with pulsar://"),
        ({**ok, "topicsPattern": "a.*"}, "exactly one of the options topics and topicsPattern"),
        ({"service_url": "pulsar://h:6650"}, "one of the options topics .* or topicsPattern"),
        ({**ok, "topics": " , "}, "topics names no topic"),
        ({**ok, "topics": "non-persistent://public/default/x"}, "not persistent"),
        ({"service_url": "pulsar://h:6650", "topicsPattern": "a.*"}, "topicsPattern needs the option admin_url"),
        ({"service_url": "pulsar://h:6650", "topicsPattern": "a(", "admin_url": "http://h"}, "not a valid regex"),
        ({"service_url": "pulsar://h:6650", "topicsPattern": "a/b", "admin_url": "http://h"},
         "expected \\[persistent://\\]tenant/namespace"),
        ({**ok, "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger must be a positive integer"),
        ({**ok, "maxMessagesPerTrigger": "ten"}, "maxMessagesPerTrigger must be a positive integer"),
        ({**ok, "pollTimeoutMs": "-5"}, "pollTimeoutMs"),
        ({**ok, "endingOffsets": "earliest"}, "endingOffsets"),
        ({**ok, "startingOffsets": '{"a": "zz"}'}, "startingOffsets"),
        ({**ok, "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({**ok, "subscription": "a b"}, "subscription must be 1-200 characters"),
        ({**ok, "subscription": "a", "predefinedSubscription": "b"}, "name different subscriptions"),
    ]:
        with pytest.raises(ValueError, match=match):
            SourceOptions.parse(opts)


# -------------------------------------------------------------------------- batch


def test_batch_read_of_official_client_messages_all_columns_exact(spark, broker, official, topic):  # noqa: F811
    single = official.create_producer(topic, batching_enabled=False)
    sent = []  # (value, key, properties, event time)
    for i in range(3):
        m = (f"single-{i}".encode(), f"key-{i}" if i != 1 else None, {"n": str(i), "kind": "single"} if i else {},
             1_700_000_000_000 + i if i != 2 else None)
        single.send(m[0], properties=m[2], partition_key=m[1], event_timestamp=m[3])
        sent.append(m)
    single.close()
    batched = official.create_producer(topic, batching_enabled=True, batching_max_messages=4,
                                       batching_max_publish_delay_ms=200)
    done = threading.Semaphore(0)
    for i in range(6):
        m = (f"batched-{i}".encode(), f"bk-{i}" if i % 2 else None, {"b": str(i)},
             1_600_000_000_000 + i if i % 3 else None)
        batched.send_async(m[0], lambda res, mid: done.release(), properties=m[2], partition_key=m[1],
                           event_timestamp=m[3])
        sent.append(m)
    batched.flush()
    for _ in range(6):
        assert done.acquire(timeout=30)
    batched.close()

    # The official client reads the ground truth: ids and publish times.
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    truth = [reader.read_next(10000) for _ in range(9)]
    reader.close()
    assert [m.data() for m in truth] == [s[0] for s in sent]
    assert {m.message_id().batch_index() for m in truth[:3]} == {-1}
    assert [m.message_id().batch_index() for m in truth[3:]] == [0, 1, 2, 3, 0, 1]  # two batch entries
    expected = []
    for m, (value, key, props, event) in zip(truth, sent, strict=True):
        mid = m.message_id()
        expected.append((
            key.encode() if key is not None else None, value, topic, -1,
            f"({mid.ledger_id()},{mid.entry_id()},-1,{mid.batch_index()})",
            m.publish_timestamp(), event, props,
        ))

    rows = _read(spark, broker, topics=topic).selectExpr(*COLUMNS.split(", ")).collect()
    got = [(r.key, r.value, r.topic, r.partition, r.message_id, r.publish_ms, r.event_ms, r.properties) for r in rows]
    assert got == expected
    for r, m, size in zip(rows, truth, [0, 0, 0, 4, 4, 4, 4, 2, 2], strict=True):
        ours = txn.MessageId.deserialize(r.message_id_bytes)
        theirs = pulsar.MessageId.deserialize(r.message_id_bytes)
        mid = m.message_id()
        assert (ours.ledger_id(), ours.entry_id(), ours.partition(), ours.batch_index()) == (
            mid.ledger_id(), mid.entry_id(), -1, mid.batch_index())
        assert (theirs.ledger_id(), theirs.entry_id(), theirs.batch_index()) == (
            mid.ledger_id(), mid.entry_id(), mid.batch_index())
        assert ours.batch_size == size

    # Ranges inside batch entries: after batched-1 (exclusive) up to batched-4 (inclusive), the
    # message_id column's form accepted as a position too.
    df = _read(spark, broker, topics=topic, startingOffsets=f'{{"{topic}": "{_pos(truth[4].message_id())}"}}',
               endingOffsets=f'{{"{topic}": "{rows[7].message_id}"}}')
    assert _values(df.collect()) == ["batched-2", "batched-3", "batched-4"]
    # Start after a whole entry (batch index -1 = the whole batch entry), end latest.
    mid = truth[3].message_id()
    df = _read(spark, broker, topics=topic, startingOffsets=f'{{"{topic}": "{mid.ledger_id()}:{mid.entry_id()}"}}')
    assert _values(df.collect()) == ["batched-4", "batched-5"]
    # startingOffsets latest and an empty range read nothing.
    assert _read(spark, broker, topics=topic, startingOffsets="latest").count() == 0


def test_partitioned_topic_pattern_and_offsets_json(spark, broker, client, unique_name):  # noqa: F811
    prefix = unique_name("sp")
    pt = f"persistent://public/default/{prefix}-parts"
    create_partitioned_topic(broker.admin_url, pt, 3)
    ids = {}
    for p in range(3):
        prod = client.create_producer(f"{pt}-partition-{p}", batching_enabled=False)
        ids[p] = [prod.send(f"p{p}-{j}".encode(), partition_key=f"k{j}") for j in range(4)]
        prod.close()
    other = f"persistent://public/default/{prefix}-plain"
    prod = client.create_producer(other, batching_enabled=False)
    prod.send(b"plain-0")
    prod.close()
    empty = f"persistent://public/default/{prefix}-empty"
    create_partitioned_topic(broker.admin_url, empty, 2)

    rows = _read(spark, broker, topics=f"{pt},{empty}").collect()
    by_part = {}
    for r in rows:
        assert r.topic == pt
        by_part.setdefault(r.partition, []).append(r)
    assert sorted(by_part) == [0, 1, 2]
    for p in range(3):
        assert _values(by_part[p]) == [f"p{p}-{j}" for j in range(4)]
        assert [r.message_id for r in by_part[p]] == [
            f"({m.ledger_id()},{m.entry_id()},{p},-1)" for m in ids[p]]
        assert [r.key for r in by_part[p]] == [f"k{j}".encode() for j in range(4)]

    # One partition starts after its 2nd message; another ends at its 3rd (message_id form).
    start = f'{{"{pt}-partition-1": "{_pos(ids[1][1])}"}}'
    end = f'{{"{prefix}-parts-partition-2": "({ids[2][2].ledger_id()},{ids[2][2].entry_id()},2,-1)"}}'
    rows = _read(spark, broker, topics=pt, startingOffsets=start, endingOffsets=end).collect()
    got = sorted((r.partition, r.value.decode()) for r in rows)
    assert got == sorted([(0, f"p0-{j}") for j in range(4)] + [(1, "p1-2"), (1, "p1-3")]
                         + [(2, f"p2-{j}") for j in range(3)])
    # A single partition by name.
    assert _values(_read(spark, broker, topics=f"{pt}-partition-2").collect()) == [f"p2-{j}" for j in range(4)]

    # topicsPattern over the namespace: the partitioned topic (all partitions) and the plain one.
    rows = _read(spark, broker, topicsPattern=f"persistent://public/default/{prefix}-p.*",
                 admin_url=broker.admin_url).collect()
    assert sorted((r.topic, r.partition, r.value.decode()) for r in rows) == sorted(
        [(pt, p, f"p{p}-{j}") for p in range(3) for j in range(4)] + [(other, -1, "plain-0")])
    rows = _read(spark, broker, topicsPattern=f"{prefix}-pl.*", admin_url=broker.admin_url).collect()
    assert _values(rows) == ["plain-0"]


def test_read_committed(spark, broker, client, topic):  # noqa: F811
    p = client.create_producer(topic, batching_enabled=False)
    p.send(b"c0")
    t = client.new_transaction()
    p.send(b"t1", txn=t)
    p.send(b"t2", txn=t)
    p.send(b"c-after")  # held back too: a partition is not delivered past an open transaction
    # The last message id is the last deliverable one, so the read ends (no wait for pollTimeoutMs).
    assert _values(_read(spark, broker, topics=topic, pollTimeoutMs="20000").collect()) == ["c0"]
    t.commit()
    t2 = client.new_transaction()
    p.send(b"aborted", txn=t2)
    t2.abort()
    p.send(b"c1")
    assert _values(_read(spark, broker, topics=topic).collect()) == ["c0", "t1", "t2", "c-after", "c1"]
    p.close()


def test_tls_and_token_options(spark, broker, client, topic):  # noqa: F811
    if not (broker.service_url_tls and broker.token):
        pytest.skip("needs the local broker's TLS port and token")
    p = client.create_producer(topic)
    p.send(b"secure")
    p.close()
    rows = (spark.read.format("pulsar").option("service_url", broker.service_url_tls)
            .option("tlsTrustCertsFilePath", broker.ca_cert).option("authToken", broker.token)
            .option("admin_url", broker.admin_url).option("topics", topic).load().collect())
    assert _values(rows) == ["secure"]


# ---------------------------------------------------------------------- streaming


def _run_stream(spark, broker, topic, checkpoint, cap=None):  # noqa: F811
    """Run a query to the end of what is available; its non-empty micro-batches."""
    batches = []

    def collect(df, batch_id):
        batches.append((batch_id, [r.value.decode() for r in df.select("value").collect()]))

    r = (spark.readStream.format("pulsar").option("service_url", broker.service_url).option("topics", topic)
         .option("startingOffsets", "earliest"))
    if cap is not None:
        r = r.option("maxMessagesPerTrigger", str(cap))
    w = r.load().writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
    if cap is None:  # Trigger.AvailableNow: one micro-batch up to what is there at the start
        q = w.trigger(availableNow=True).start()
        assert q.awaitTermination(120)
    else:  # maxMessagesPerTrigger needs a repeating trigger (see the module docstring of spark_jobs.source)
        q = w.start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert q.exception() is None
    return [(b, v) for b, v in batches if v], q


def test_streaming_capped_micro_batches_exactly_once_across_restart(spark, broker, client, unique_name,  # noqa: F811
                                                                    tmp_path):
    topic = f"persistent://public/default/{unique_name('st')}"
    create_partitioned_topic(broker.admin_url, topic, 2)
    # Batch entries of up to 16 messages: the 100-message caps fall inside batch entries.
    prod = client.create_producer(topic, batching_enabled=True, batching_max_messages=16,
                                  batching_max_publish_delay_ms=50, block_if_queue_full=True)

    def write(lo, hi):  # keys key0..key4 fall on both partitions (the default hash, the official client's)
        for i in range(lo, hi):
            prod.send_async(f"m{i:03d}".encode(), None, partition_key=f"key{i % 5}")
        prod.flush()

    write(0, 250)
    checkpoint = str(tmp_path / "checkpoint")
    t0 = time.monotonic()
    batches, _ = _run_stream(spark, broker, topic, checkpoint, 100)
    print(f"streaming 250: {time.monotonic() - t0:.1f}s")
    got = [v for _, v in batches for v in v]
    assert sorted(got) == [f"m{i:03d}" for i in range(250)]  # every message exactly once
    assert [len(v) for _, v in batches] == [100, 100, 50]
    # The checkpointed offset: {topic partition: position of the last message read}.
    log = pathlib.Path(checkpoint, "offsets")
    last = max((f for f in log.iterdir() if f.name.isdigit()), key=lambda f: int(f.name))
    offsets = json.loads(last.read_text().splitlines()[-1])
    sub = offsets.pop("subscription")  # the query's durable subscription, held on every partition
    assert re.fullmatch(r"spark-pulsar-[0-9a-f]{32}", sub)
    assert sorted(offsets) == [f"{topic}-partition-0", f"{topic}-partition-1"]
    assert all(re.fullmatch(r"\d+:\d+:-?\d+", v) for v in offsets.values()), offsets
    for p in range(2):
        status, stats = admin_request("GET", broker.admin_url,
                                      "/admin/v2/" + f"{topic}-partition-{p}".replace("://", "/") + "/stats")
        assert status == 200 and sub in stats["subscriptions"]
    # Per partition, messages come in order.
    for k in range(5):
        mine = [v for v in got if int(v[1:]) % 5 == k]
        assert mine == sorted(mine)

    # Restart from the checkpoint: exactly the new messages.
    write(250, 300)
    batches, _ = _run_stream(spark, broker, topic, checkpoint, 40)
    got = [v for _, v in batches for v in v]
    assert sorted(got) == [f"m{i:03d}" for i in range(250, 300)]
    assert [len(v) for _, v in batches] == [40, 10]
    assert batches[0][0] >= 3  # batch ids go on from the checkpoint
    # Again with Trigger.AvailableNow (no cap): one micro-batch of exactly the new ones.
    write(300, 320)
    prod.close()
    batches, _ = _run_stream(spark, broker, topic, checkpoint)
    assert [sorted(v) for _, v in batches] == [[f"m{i:03d}" for i in range(300, 320)]]
    print(f"streaming test: {time.monotonic() - t0:.1f}s")


# ------------------------------------------------------------------------- errors


def test_bad_options_raise_clear_errors(spark, broker, topic, client):  # noqa: F811
    def load(**options):
        r = spark.read.format("pulsar")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match="needs the option service_url"):
        load(topics=topic)
    with pytest.raises(Exception, match="exactly one of the options topics and topicsPattern"):
        load(service_url=broker.service_url, topics=topic, topicsPattern="x.*", admin_url=broker.admin_url)
    with pytest.raises(Exception, match="one of the options topics"):
        load(service_url=broker.service_url)
    with pytest.raises(Exception, match="startingOffsets is neither"):
        load(service_url=broker.service_url, topics=topic, startingOffsets="{oops")
    with pytest.raises(Exception, match="topicsPattern needs the option admin_url"):
        load(service_url=broker.service_url, topicsPattern="x.*")
    with pytest.raises(Exception, match="maxMessagesPerTrigger must be a positive integer"):
        spark.readStream.format("pulsar").option("service_url", broker.service_url).option("topics", topic) \
            .option("maxMessagesPerTrigger", "-1").load()

    # Checked when the query is planned (they need the broker).
    p = client.create_producer(topic)
    p.send(b"x")
    p.close()
    missing = topic + "-missing"
    with pytest.raises(Exception, match=f"unknown topic {missing}"):
        load(service_url=broker.service_url, topics=f"{topic},{missing}", admin_url=broker.admin_url).collect()
    with pytest.raises(Exception, match="startingOffsets names .*-other, not among the topic partitions read"):
        load(service_url=broker.service_url, topics=topic, startingOffsets=f'{{"{topic}-other": "1:2"}}').collect()
    with pytest.raises(Exception, match="matches no topic"):
        load(service_url=broker.service_url, topicsPattern="no-such-topic-.*", admin_url=broker.admin_url).collect()

    # Streaming: endingOffsets is refused.
    df = (spark.readStream.format("pulsar").option("service_url", broker.service_url).option("topics", topic)
          .option("endingOffsets", "latest").load())
    with pytest.raises(Exception, match="endingOffsets is for batch queries only"):
        q = df.writeStream.format("console").start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
