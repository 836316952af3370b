"""txn.schema against pulsar.schema: the same definitions, encodings and registry behaviour, both ways."""

from __future__ import annotations

import json
import urllib.request

import pulsar
import pulsar.schema as ps
import pytest

import txn
import txn.schema as ts
from txn.protocol import pb

from peer import read_n


def _records(m):
    """The same record classes built from either module (``m`` is pulsar.schema or txn.schema)."""

    class Point(m.Record):
        _avro_namespace = "geo.v1"
        x = m.Double(required=True)
        y = m.Double(required=True)

    class Reading(m.Record):
        name = m.String()
        count = m.Integer(required=True)
        total = m.Long(default=7, required=True, required_default=True)
        ratio = m.Float()
        exact = m.Double()
        ok = m.Boolean(default=True, required=True, required_default=True)
        note = m.String(default=None, required_default=True)
        blob = m.Bytes()
        tags = m.Array(m.String())
        scores = m.Map(m.Double())
        at = Point()
        path = m.Array(Point())
        named = m.Map(Point())
        unit = m.String(default="kg", required=True, required_default=True)

    class Sorted(m.Record):
        _sorted_fields = True
        b = m.String()
        a = m.Integer()

    return Point, Reading, Sorted


OP, OR, OS = _records(ps)
TP, TR, TS = _records(ts)


def _value(m, point, reading, count=3):
    return reading(name="n", count=count, ratio=0.5, exact=2.25, blob=b"by", tags=["a", "b"],
                   scores={"k": 1.5}, at=point(x=1.0, y=2.0), path=[point(x=3.0, y=4.0)],
                   named={"p": point(x=5.0, y=6.0)})


OV, TV = _value(ps, OP, OR), _value(ts, TP, TR)
OV2, TV2 = _value(ps, OP, OR, 9), _value(ts, TP, TR, 9)


def _pairs():
    return [
        (ps.StringSchema(), ts.StringSchema()),
        (ps.JsonSchema(OR), ts.JsonSchema(TR)),
        (ps.AvroSchema(OR), ts.AvroSchema(TR)),
        (ps.JsonSchema(OS), ts.JsonSchema(TS)),
        (ps.AvroSchema(OP), ts.AvroSchema(TP)),
    ]


@pytest.mark.parametrize("i", range(5))
def test_schema_info_is_the_official(i):
    official, ours = _pairs()[i]
    a, b = official.schema_info(), ours.schema_info()
    assert b.schema() == a.schema()
    assert b.name() == a.name()
    assert b.schema_type() == int(a.schema_type())


def test_bytes_schema_registers_nothing():
    info = ts.BytesSchema().schema_info()
    assert info.schema_type() == int(ps.BytesSchema().schema_info().schema_type()) == -1
    assert ts.schema_to_pb(ts.BytesSchema()) is None
    wire = ts.schema_to_pb(ts.AvroSchema(TR))
    assert wire.type == pb.Schema.Avro and wire.name == "AVRO"
    assert json.loads(wire.schema_data) == OR.schema()


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_encodings_are_the_official(kind):
    o, t = (ps.JsonSchema(OR), ts.JsonSchema(TR)) if kind == "json" else (ps.AvroSchema(OR), ts.AvroSchema(TR))
    assert t.encode(TV) == o.encode(OV)
    assert t.decode(o.encode(OV)) == TV
    assert o.decode(t.encode(TV)) == OV


def test_record_defaults_and_checks_as_the_official():
    plain = [k for k in OR._fields if k != "at"]
    assert [getattr(TR(), k) for k in plain] == [getattr(OR(), k) for k in plain]  # same defaults
    assert list(TR._fields) == list(OR._fields)
    for bad in ({"count": "x"}, {"tags": [1]}, {"scores": {"k": "v"}}, {"at": 5}):
        with pytest.raises(TypeError):
            OR(**bad)
        with pytest.raises(TypeError):
            TR(**bad)
    with pytest.raises(AttributeError):
        TR().nope = 1
    with pytest.raises(TypeError):
        ts.JsonSchema(TR).encode(TP(x=1.0, y=2.0))


# ----------------------------------------------------------------------------------------- with the broker


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


KINDS = {
    "string": (lambda: ps.StringSchema(), lambda: ts.StringSchema(), ["a", "é", ""], ["a", "é", ""]),
    "json": (lambda: ps.JsonSchema(OR), lambda: ts.JsonSchema(TR), [OV, OV2], [TV, TV2]),
    "avro": (lambda: ps.AvroSchema(OR), lambda: ts.AvroSchema(TR), [OV, OV2], [TV, TV2]),
}


def _receive(consumer, n):
    out = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=20000)
        consumer.acknowledge(m)
        out.append(m)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_official_producer_to_our_consumer(client, official, topic, kind):
    make_official, make_ours, official_values, our_values = KINDS[kind]
    consumer = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest, schema=make_ours())
    producer = official.create_producer(topic, schema=make_official())
    for v in official_values:
        producer.send(v)
    got = [m.value() for m in _receive(consumer, len(official_values))]
    assert got == our_values


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_our_producer_to_official_consumer(client, official, topic, kind, batching):
    make_official, make_ours, official_values, our_values = KINDS[kind]
    producer = client.create_producer(topic, schema=make_ours(), batching_enabled=batching)
    consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                  schema=make_official())
    for v in our_values:
        producer.send(v)
    got = read_n(consumer, len(our_values))
    assert [m.value() for m in got] == official_values
    # the version the broker gave our producer (PRODUCER_SUCCESS) is on every message: the first, 0
    assert [m.schema_version() for m in got] == ["\x00" * 8] * len(got)


def test_incompatible_schema_is_refused_on_both_clients(client, official, topic):
    client.create_producer(topic, schema=ts.AvroSchema(TR)).close()
    with pytest.raises(txn.IncompatibleSchema):
        client.create_producer(topic, schema=ts.StringSchema())
    with pytest.raises(pulsar.IncompatibleSchema):
        official.create_producer(topic, schema=ps.StringSchema())
    # a producer without a schema is let in by the broker, for both clients alike
    official.create_producer(topic).close()
    client.create_producer(topic).close()


def _v(m, extra: bool):
    class Event(m.Record):
        id = m.Integer(required=True)
        if extra:
            note = m.String(default=None, required_default=True)

    return Event


def _admin_versions(broker, topic: str) -> int:
    path = topic.split("://", 1)[1]
    with urllib.request.urlopen(f"{broker.admin_url}/admin/v2/schemas/{path}/schema", timeout=10) as r:
        return json.load(r)["version"]


def test_two_compatible_json_versions_decode_with_ours(client, official, topic, broker):
    v1, v2 = _v(ts, False), _v(ts, True)
    # Never acks (no schema: registers none): "o" re-reads what "s" acked, which retention none may delete.
    official.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    p1 = client.create_producer(topic, schema=ts.JsonSchema(v1))
    p1.send(v1(id=1))
    p2 = client.create_producer(topic, schema=ts.JsonSchema(v2))  # a second, compatible version
    p2.send(v2(id=2, note="n"))
    assert _admin_versions(broker, topic) == 1
    c = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest, schema=ts.JsonSchema(v2))
    got = [m.value() for m in _receive(c, 2)]
    assert got == [v2(id=1), v2(id=2, note="n")]
    o = official.subscribe(topic, "o", initial_position=pulsar.InitialPosition.Earliest,
                           schema=ps.JsonSchema(_v(ps, True)))
    assert [m.schema_version() for m in read_n(o, 2)] == ["\x00" * 8, "\x00" * 7 + "\x01"]


def test_two_compatible_avro_versions_decode_by_their_writer(client, official, topic):
    v1, v2 = _v(ts, False), _v(ts, True)
    # Never acks (no schema: registers none): "old" and "o" re-read what "new" acked, which retention none may delete.
    official.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    p1 = client.create_producer(topic, schema=ts.AvroSchema(v1), batching_enabled=False)
    p1.send(v1(id=1))
    o1 = _v(ps, False)
    official.create_producer(topic, schema=ps.AvroSchema(o1)).send(o1(id=2))
    p2 = client.create_producer(topic, schema=ts.AvroSchema(v2))  # version 1: the optional field added
    p2.send(v2(id=3, note="n"))
    new = client.subscribe(topic, "new", initial_position=txn.InitialPosition.Earliest, schema=ts.AvroSchema(v2))
    assert [m.value() for m in _receive(new, 3)] == [v2(id=1), v2(id=2), v2(id=3, note="n")]
    old = client.subscribe(topic, "old", initial_position=txn.InitialPosition.Earliest, schema=ts.AvroSchema(v1))
    assert [m.value() for m in _receive(old, 3)] == [v1(id=1), v1(id=2), v1(id=3)]
    # and the official consumer reads what we wrote under both versions alike
    o = official.subscribe(topic, "o", initial_position=pulsar.InitialPosition.Earliest,
                           schema=ps.AvroSchema(_v(ps, True)))
    assert [m.value().id for m in read_n(o, 3)] == [1, 2, 3]
