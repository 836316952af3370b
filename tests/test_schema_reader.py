"""``Message.schema_version()`` and ``create_reader(schema=...)`` side by side with the official
client: the same version strings, readers that register/check their schema like a consumer and
decode ``value()`` by it, on the blocking client, ``txn.AsyncClient`` and ``txn.asyncio``."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pulsar
import pulsar.asyncio
import pulsar.schema as ps
import pytest

import txn
import txn.asyncio
import txn.schema as ts


def _event(m, extra: bool):
    class Event(m.Record):
        id = m.Integer(required=True)
        if extra:
            note = m.String(default=None, required_default=True)

    return Event


OE1, OE2 = _event(ps, False), _event(ps, True)
TE1, TE2 = _event(ts, False), _event(ts, True)


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield c
    c.close()


def _read(reader, n):
    return [reader.read_next(20000) for _ in range(n)]


def _admin_schema_versions(broker, topic: str) -> list[int]:
    path = topic.split("://", 1)[1]
    with urllib.request.urlopen(f"{broker.admin_url}/admin/v2/schemas/{path}/schemas", timeout=10) as r:
        return [s["version"] for s in json.load(r)["getSchemaResponses"]]


# ------------------------------------------------------------------------------------ schema_version()


def test_schema_version_without_a_schema_is_empty_on_both(client, official, topic):
    official.create_producer(topic).send(b"a")
    client.create_producer(topic).send(b"b")
    o = _read(official.create_reader(topic, pulsar.MessageId.earliest), 2)
    t = _read(client.create_reader(topic, txn.EARLIEST), 2)
    assert [m.schema_version() for m in t] == [m.schema_version() for m in o] == ["", ""]


def test_schema_version_is_the_writers_version_on_both(client, official, topic, broker):
    """Two versions (0 from the official producer, 1 from ours); readers with and without a schema."""
    official.create_producer(topic, schema=ps.JsonSchema(OE1)).send(OE1(id=1))
    client.create_producer(topic, schema=ts.JsonSchema(TE2), batching_enabled=False).send(TE2(id=2, note="n"))
    assert _admin_schema_versions(broker, topic) == [0, 1]
    want = ["\x00" * 8, "\x00" * 7 + "\x01"]
    o_plain = _read(official.create_reader(topic, pulsar.MessageId.earliest), 2)
    o_typed = _read(official.create_reader(topic, pulsar.MessageId.earliest, schema=ps.JsonSchema(OE2)), 2)
    t_plain = _read(client.create_reader(topic, txn.EARLIEST), 2)
    t_typed = _read(client.create_reader(topic, txn.EARLIEST, schema=ts.JsonSchema(TE2)), 2)
    for got in (o_plain, o_typed, t_plain, t_typed):
        assert [m.schema_version() for m in got] == want
        assert all(type(m.schema_version()) is str for m in got)
    # a subscribed consumer without a schema sees the versions too
    c = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    got = [c.receive(20000) for _ in range(2)]
    assert [m.schema_version() for m in got] == want
    assert [m.value() for m in t_plain] == [m.value() for m in o_plain] == [m.data() for m in t_plain]
    assert [m.value().id for m in o_typed] == [m.value().id for m in t_typed] == [1, 2]


# ------------------------------------------------------------------------------------ create_reader(schema=)


KINDS = {
    "string": (ps.StringSchema, ts.StringSchema, ["a", "é"], ["a", "é"]),
    "json": (lambda: ps.JsonSchema(OE2), lambda: ts.JsonSchema(TE2), [OE2(id=1), OE2(id=2, note="x")],
             [TE2(id=1), TE2(id=2, note="x")]),
    "avro": (lambda: ps.AvroSchema(OE2), lambda: ts.AvroSchema(TE2), [OE2(id=1), OE2(id=2, note="x")],
             [TE2(id=1), TE2(id=2, note="x")]),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_official_producer_to_our_reader_and_the_reverse(client, official, topic, kind, unique_name):
    make_official, make_ours, official_values, our_values = KINDS[kind]
    official.create_producer(topic, schema=make_official()).send(official_values[0])
    client.create_producer(topic, schema=make_ours()).send(our_values[1])
    ours = _read(client.create_reader(topic, txn.EARLIEST, schema=make_ours()), 2)
    theirs = _read(official.create_reader(topic, pulsar.MessageId.earliest, schema=make_official()), 2)
    assert [m.value() for m in ours] == our_values
    assert [m.value() for m in theirs] == official_values
    assert [m.schema_version() for m in ours] == [m.schema_version() for m in theirs] == ["\x00" * 8] * 2


def test_reader_decodes_an_older_avro_version_by_its_writer(client, official, topic):
    """Version 0 written without ``note``, version 1 with it: a reader of version 1 reads both."""
    official.create_producer(topic, schema=ps.AvroSchema(OE1)).send(OE1(id=1))
    client.create_producer(topic, schema=ts.AvroSchema(TE2)).send(TE2(id=2, note="n"))
    ours = _read(client.create_reader(topic, txn.EARLIEST, schema=ts.AvroSchema(TE2)), 2)
    theirs = _read(official.create_reader(topic, pulsar.MessageId.earliest, schema=ps.AvroSchema(OE2)), 2)
    assert [m.value() for m in ours] == [TE2(id=1), TE2(id=2, note="n")]
    assert [(m.value().id, m.value().note) for m in theirs] == [(1, None), (2, "n")]


def test_reader_on_a_partitioned_topic_decodes(client, official, topic, broker):
    path = topic.split("://", 1)[1]
    req = urllib.request.Request(f"{broker.admin_url}/admin/v2/persistent/{path}/partitions", data=b"2",
                                 method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()
    p = official.create_producer(topic, schema=ps.JsonSchema(OE2),
                                 message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                                 batching_enabled=False)
    for i in range(4):
        p.send(OE2(id=i))
    got = _read(client.create_reader(topic, txn.EARLIEST, schema=ts.JsonSchema(TE2)), 4)
    assert sorted(m.value().id for m in got) == [0, 1, 2, 3]
    assert all(type(m.value()) is TE2 for m in got)


def test_incompatible_reader_schema_is_refused_on_both(client, official, topic):
    official.create_producer(topic, schema=ps.StringSchema()).send("a")
    with pytest.raises(pulsar.IncompatibleSchema):
        official.create_reader(topic, pulsar.MessageId.earliest, schema=ps.JsonSchema(OE1))
    with pytest.raises(txn.IncompatibleSchema):
        client.create_reader(topic, txn.EARLIEST, schema=ts.JsonSchema(TE1))
    # a bytes schema is no schema on both: it reads the raw payload
    assert official.create_reader(topic, pulsar.MessageId.earliest, schema=ps.BytesSchema()).read_next(20000).value() \
        == client.create_reader(topic, txn.EARLIEST, schema=ts.BytesSchema()).read_next(20000).value() == b"a"


def test_reader_schema_of_a_wrong_type_is_a_value_error_on_both(client, official, topic):
    with pytest.raises(ValueError):
        official.create_reader(topic, pulsar.MessageId.earliest, schema="x")
    with pytest.raises(ValueError):
        client.create_reader(topic, txn.EARLIEST, schema="x")


# ------------------------------------------------------------------------------------ asyncio


def test_async_readers_take_a_schema(broker, official, topic):
    official.create_producer(topic, schema=ps.JsonSchema(OE2)).send(OE2(id=7, note="a"))

    async def go():
        got = {}
        for name, cl, schema, start in (
            ("pulsar.asyncio", pulsar.asyncio.Client(broker.service_url), ps.JsonSchema(OE2),
             pulsar.MessageId.earliest),
            ("txn.asyncio", txn.asyncio.Client(broker.service_url), ts.JsonSchema(TE2), txn.MessageId.earliest),
        ):
            reader = await cl.create_reader(topic, start, schema=schema)
            m = await reader.read_next()
            got[name] = (m.value().id, m.value().note, m.schema_version())
            await cl.close()
        ac = txn.AsyncClient(broker.service_url)
        try:
            m = await (await ac.create_reader(topic, txn.EARLIEST, schema=ts.JsonSchema(TE2))).read_next(20000)
            got["txn.AsyncClient"] = (m.value().id, m.value().note, m.schema_version())
            with pytest.raises(txn.IncompatibleSchema):
                await ac.create_reader(topic, txn.EARLIEST, schema=ts.StringSchema())
        finally:
            await ac.close()
        return got

    got = asyncio.run(go())
    assert got == dict.fromkeys(("pulsar.asyncio", "txn.asyncio", "txn.AsyncClient"), (7, "a", "\x00" * 8))
