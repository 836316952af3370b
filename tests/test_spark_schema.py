"""Spark source and sink with the topic's registered schema (``decodeValue`` / ``encodeValue``); the
official client writes with its schemas and reads what the sink wrote."""

from __future__ import annotations

import uuid

import pulsar
import pulsar.schema as ps
import pytest

from spark_jobs.value_schema import TopicValueSchema, ValueSchemaError, conform

from spark_session import spark  # noqa: F401


class Point(ps.Record):
    _avro_namespace = "geo.v1"
    x = ps.Double(required=True)
    y = ps.Double(required=True)


class Reading(ps.Record):
    _avro_namespace = "geo.v1"
    name = ps.String()
    count = ps.Integer(required=True)
    total = ps.Long()
    ok = ps.Boolean()
    tags = ps.Array(ps.String())
    scores = ps.Map(ps.Double())
    at = Point()


class ReadingV2(ps.Record):  # Reading with one more field with a default: a compatible version
    _avro_namespace = "geo.v1"
    name = ps.String()
    count = ps.Integer(required=True)
    total = ps.Long()
    ok = ps.Boolean()
    tags = ps.Array(ps.String())
    scores = ps.Map(ps.Double())
    at = Point()
    unit = ps.String(default="kg", required=True, required_default=True)


@pytest.fixture(scope="module")
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _reading(i: int, cls=Reading, **extra):
    return cls(name=f"r{i}", count=i, total=i * 1000, ok=i % 2 == 0, tags=[f"t{i}", "x"],
               scores={"a": i / 2}, at=Point(x=float(i), y=-float(i)), **extra)


def _load(spark, broker, topics: str, **options):  # noqa: F811
    r = (spark.read.format("pulsar-txn").option("serviceUrl", broker.service_url)
         .option("adminUrl", broker.admin_url).option("topics", topics).option("decodeValue", "true"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.parametrize(("kind", "batched"), [
    ("avro", True), ("json", False),  # the default suite; the other two shapes with --run-slow
    pytest.param("avro", False, marks=pytest.mark.slow), pytest.param("json", True, marks=pytest.mark.slow)],
    ids=["avro-batched", "json-unbatched", "avro-unbatched", "json-batched"])
def test_source_decodes_records_into_columns(spark, broker, official, unique_name, kind, batched):  # noqa: F811
    topic = f"persistent://public/default/{unique_name('rd')}"
    schema = ps.AvroSchema(Reading) if kind == "avro" else ps.JsonSchema(Reading)
    p = official.create_producer(topic, schema=schema, batching_enabled=batched)
    for i in range(25):
        p.send_async(_reading(i), None)
    p.flush()
    p.close()
    df = _load(spark, broker, topic)
    assert [f.name for f in df.schema["value"].dataType.fields] == ["name", "count", "total", "ok", "tags", "scores",
                                                                     "at"]
    rows = df.select("value.*", "message_id").orderBy("count").collect()
    assert len(rows) == 25
    for i, r in enumerate(rows):
        assert (r.name, r["count"], r.total, r.ok, r.tags, r.scores, (r.at.x, r.at.y)) == (
            f"r{i}", i, i * 1000, i % 2 == 0, [f"t{i}", "x"], {"a": i / 2}, (float(i), -float(i)))


def test_source_reads_two_avro_versions_as_the_planned_one(spark, broker, official, unique_name):  # noqa: F811
    topic = f"persistent://public/default/{unique_name('rd2')}"
    p1 = official.create_producer(topic, schema=ps.AvroSchema(Reading))
    for i in range(3):
        p1.send(_reading(i))
    p1.close()
    p2 = official.create_producer(topic, schema=ps.AvroSchema(ReadingV2))
    for i in range(3, 6):
        p2.send(_reading(i, ReadingV2, unit="lb"))
    p2.close()
    rows = _load(spark, broker, topic).select("value.count", "value.unit", "value.name").orderBy("count").collect()
    # Planned with the latest version: version 1's messages get the default unit.
    assert [(r["count"], r["unit"], r["name"]) for r in rows] == [
        (0, "kg", "r0"), (1, "kg", "r1"), (2, "kg", "r2"), (3, "lb", "r3"), (4, "lb", "r4"), (5, "lb", "r5")]


def test_source_string_schema_and_tombstones(spark, broker, official, unique_name):  # noqa: F811
    topic = f"persistent://public/default/{unique_name('rds')}"
    p = official.create_producer(topic, schema=ps.StringSchema(), batching_enabled=False)
    p.send("héllo")
    p.send(None)
    p.send("world")
    p.close()
    df = _load(spark, broker, topic)
    assert df.schema["value"].dataType.simpleString() == "string"
    assert [r.value for r in df.orderBy("message_id").collect()] == ["héllo", None, "world"]


def test_source_refuses_topics_it_cannot_decode(spark, broker, official, unique_name):  # noqa: F811
    plain = f"persistent://public/default/{unique_name('nos')}"
    p = official.create_producer(plain)
    p.send(b"raw")
    p.close()
    with pytest.raises(Exception, match="has no schema in the broker's registry"):
        _ = _load(spark, broker, plain).schema
    a = f"persistent://public/default/{unique_name('sa')}"
    b = f"persistent://public/default/{unique_name('sb')}"
    for t, s in ((a, ps.AvroSchema(Reading)), (b, ps.StringSchema())):
        pr = official.create_producer(t, schema=s)
        pr.close()
    with pytest.raises(Exception, match="have different schemas"):
        _ = _load(spark, broker, f"{a},{b}").schema
    with pytest.raises(Exception, match="decodeValue needs the option adminUrl"):
        spark.read.format("pulsar-txn").option("serviceUrl", broker.service_url).option("topics", a) \
            .option("decodeValue", "true").load()


def test_source_fails_on_a_message_that_does_not_decode(spark, broker, official, unique_name):  # noqa: F811
    topic = f"persistent://public/default/{unique_name('bad')}"
    good = official.create_producer(topic, schema=ps.JsonSchema(Reading), batching_enabled=False)
    good.send(_reading(1))
    raw = official.create_producer(topic, batching_enabled=False)  # no schema: the broker lets it write
    bad_id = raw.send(b"\x00 not json")
    good.close()
    raw.close()
    with pytest.raises(Exception) as info:
        _load(spark, broker, topic).collect()
    text = str(info.value)
    assert "does not decode by the topic's JSON schema" in text
    assert f"({bad_id.ledger_id()},{bad_id.entry_id()}," in text


def test_conform_and_registry_parsing():
    vs = TopicValueSchema.from_registry("t", {"type": "JSON", "data": ps.JsonSchema(Reading).schema_info().schema(),
                                              "version": 3})
    assert vs.version == 3
    d = vs.parsed()
    assert conform({"name": "n", "count": 1, "extra": 5}, d)["count"] == 1
    assert conform({"name": "n", "count": 1}, d)["tags"] is None
    with pytest.raises(ValueSchemaError, match="expected an integer"):
        conform({"count": "1"}, d)
    with pytest.raises(ValueSchemaError, match="has a PROTOBUF schema"):
        TopicValueSchema.from_registry("t", {"type": "PROTOBUF", "data": "{}"})
    with pytest.raises(ValueSchemaError, match="only a union of null and one type"):
        TopicValueSchema.from_registry("t", {"type": "AVRO", "data": '{"type":"record","name":"R","fields":'
                                                                     '[{"name":"u","type":["int","string"]}]}'})


# ----------------------------------------------------------------------------- the sink


@pytest.fixture(scope="module")
def dedup_ns(broker):
    from txn.admin import create_namespace, enable_namespace_dedup

    ns = f"public/spark-schema-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    return ns


def _sink(broker, topic: str, **extra):
    o = {"serviceUrl": broker.service_url, "adminUrl": broker.admin_url, "topic": topic,
         "job": f"job-{uuid.uuid4().hex[:8]}", "encodeValue": "true"}
    o.update(extra)
    return o


def _drain(consumer, n: int):
    from peer import read_n

    got = read_n(consumer, n)
    try:
        extra = consumer.receive(timeout_millis=1500)
    except pulsar.Timeout:
        return got
    raise AssertionError(f"more than {n} messages: {extra.value()!r}")


@pytest.mark.parametrize(("kind", "writer"), [
    ("avro", "arrow"), ("json", "rows"),  # the default suite; the other two with --run-slow
    pytest.param("avro", "rows", marks=pytest.mark.slow), pytest.param("json", "arrow", marks=pytest.mark.slow)],
    ids=["avro-arrow", "json-rows", "avro-rows", "json-arrow"])
def test_sink_encodes_struct_rows_by_the_topic_schema(spark, broker, official, dedup_ns, unique_name,  # noqa: F811
                                                      kind, writer):
    topic = f"persistent://{dedup_ns}/{unique_name('wr')}"
    schema = ps.AvroSchema(Reading) if kind == "avro" else ps.JsonSchema(Reading)
    official.create_producer(topic, schema=schema).close()  # registers the topic's schema
    consumer = official.subscribe(topic, "check", schema=schema, initial_position=pulsar.InitialPosition.Earliest)
    df = spark.sql(
        "SELECT named_struct('name', concat('r', id), 'count', CAST(id AS INT), 'total', id * 1000, "
        "'ok', id % 2 = 0, 'tags', array(concat('t', id), 'x'), 'scores', map('a', id / 2.0), "
        "'at', named_struct('x', CAST(id AS DOUBLE), 'y', -CAST(id AS DOUBLE))) AS value, "
        "concat('k', id % 3) AS key FROM range(30)").repartition(3)
    df.write.format("pulsar-txn").mode("append").options(**_sink(broker, topic, writer=writer)).save()
    got = _drain(consumer, 30)
    vals = sorted((m.value() for m in got), key=lambda v: v.count)
    assert [(v.name, v.count, v.total, v.ok, v.tags, v.scores, v.at.x, v.at.y) for v in vals] == [
        (f"r{i}", i, i * 1000, i % 2 == 0, [f"t{i}", "x"], {"a": i / 2}, float(i), -float(i)) for i in range(30)]
    assert sorted(m.partition_key() for m in got) == sorted(f"k{i % 3}" for i in range(30))
    # Produced under the registered version, not a new one: the registry still has one version.
    assert all(m.schema_version() == "\x00" * 8 for m in got)
    consumer.close()


def test_sink_string_schema_and_what_it_refuses(spark, broker, official, dedup_ns, unique_name):  # noqa: F811
    topic = f"persistent://{dedup_ns}/{unique_name('ws')}"
    official.create_producer(topic, schema=ps.StringSchema()).close()
    consumer = official.subscribe(topic, "check", schema=ps.StringSchema(),
                                  initial_position=pulsar.InitialPosition.Earliest)
    spark.sql("SELECT concat('é', id) AS value FROM range(5)").write.format("pulsar-txn").mode("append") \
        .options(**_sink(broker, topic)).save()
    assert sorted(m.value() for m in _drain(consumer, 5)) == [f"é{i}" for i in range(5)]
    consumer.close()
    # A struct for a STRING topic, a topic without a schema, no admin_url: refused before anything is written.
    with pytest.raises(Exception, match="has a STRING schema; the 'value' column must be string"):
        spark.sql("SELECT named_struct('a', 1) AS value").write.format("pulsar-txn").mode("append") \
            .options(**_sink(broker, topic)).save()
    bare = f"persistent://{dedup_ns}/{unique_name('wn')}"
    official.create_producer(bare).close()
    with pytest.raises(Exception, match="has no schema in the broker's registry"):
        spark.sql("SELECT 'x' AS value").write.format("pulsar-txn").mode("append").options(**_sink(broker, bare)).save()
    opts = _sink(broker, topic)
    del opts["adminUrl"]
    with pytest.raises(Exception, match="encodeValue needs options topic and adminUrl"):
        spark.sql("SELECT 'x' AS value").write.format("pulsar-txn").mode("append").options(**opts).save()


def test_source_to_sink_round_trip_keeps_the_schema(spark, broker, official, dedup_ns, unique_name):  # noqa: F811
    src = f"persistent://public/default/{unique_name('rt-in')}"
    dst = f"persistent://{dedup_ns}/{unique_name('rt-out')}"
    p = official.create_producer(src, schema=ps.AvroSchema(Reading))
    for i in range(12):
        p.send(_reading(i))
    p.close()
    official.create_producer(dst, schema=ps.JsonSchema(Reading)).close()
    consumer = official.subscribe(dst, "check", schema=ps.JsonSchema(Reading),
                                  initial_position=pulsar.InitialPosition.Earliest)
    _load(spark, broker, src).select("value").write.format("pulsar-txn").mode("append") \
        .options(**_sink(broker, dst)).save()
    vals = sorted((m.value() for m in _drain(consumer, 12)), key=lambda v: v.count)
    assert [v.__dict__ for v in vals] == [_reading(i).__dict__ for i in range(12)]
    consumer.close()
