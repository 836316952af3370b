"""``CustomEnum`` (Python ``Enum`` fields of a ``Record``) against ``pulsar.schema``: the same
definitions, the same accepted values and errors, the same JSON and Avro bytes, and through the
broker both ways (the official producer to our consumer, ours to the official consumer)."""

from __future__ import annotations

import enum
import json

import pulsar
import pulsar.schema as ps
import pytest

import txn
import txn.schema as ts

from peer import read_n


class Color(enum.Enum):
    red = 1
    green = 2
    blue = 3


class Size(enum.IntEnum):
    S = 10
    L = 20


class Word(enum.StrEnum):
    yes = "yes"
    no = "no"


class Spelled(enum.Enum):
    one = "uno"


def _records(m):
    """The same record classes from either module (``m`` is pulsar.schema or txn.schema)."""

    class Badge(m.Record):
        tint = m.CustomEnum(Color, required=True, default=Color.blue, required_default=True)

    class Shirt(m.Record):
        color = Color  # a bare Enum class is an enum field
        size = m.CustomEnum(Size, required=True, default=Size.L, required_default=True)
        trim = m.CustomEnum(Color)  # a second use of Color: a reference by name
        word = m.CustomEnum(Word)
        badge = Badge()
        n = m.Integer()

    class Lists(m.Record):  # an enum as an item or value type: "enum" (not valid Avro), as there
        colors = m.Array(m.CustomEnum(Color))
        by_name = m.Map(m.CustomEnum(Size))
        spelled = m.CustomEnum(Spelled)

    return Badge, Shirt, Lists


OB, OS, OL = _records(ps)
TB, TS, TL = _records(ts)


def _shirts(m, badge, shirt):
    """Three shirts built from a member, a member name and a member value, and one left to defaults."""
    return [
        shirt(color=Color.red, size=Size.S, trim=Color.green, word=Word.yes, badge=badge(tint=Color.red), n=1),
        shirt(color="green", size="L", trim="blue", word="no", badge=badge(tint="green"), n=2),
        shirt(color=3, size=10, trim=1, word=Word.no, badge=badge(tint=2), n=3),
        shirt(),
    ]


OV, TV = _shirts(ps, OB, OS), _shirts(ts, TB, TS)


def _fields(r) -> dict:
    """A record's field values, nested records as dicts (to compare across the two modules)."""
    return {k: _fields(v) if isinstance(v, (ps.Record, ts.Record)) else v for k, v in vars(r).items()
            if not k.startswith("_")}


# ------------------------------------------------------------------------------------------ no broker


def test_definition_is_the_official():
    assert TS.schema() == OS.schema()
    assert TL.schema() == OL.schema()
    assert TS.schema()["fields"][0] == {
        "name": "color", "type": ["null", {"type": "enum", "name": "Color", "symbols": ["red", "green", "blue"]}]}
    assert TS.schema()["fields"][1] == {
        "name": "size", "default": "L", "type": {"type": "enum", "name": "Size", "symbols": ["S", "L"]}}
    assert TS.schema()["fields"][2] == {"name": "trim", "type": ["null", "Color"]}
    assert TL.schema()["fields"][0] == {"name": "colors", "type": ["null", {"type": "array", "items": "enum"}]}
    assert ts.CustomEnum(Color).schema() == ps.CustomEnum(Color).schema()
    assert ts.CustomEnum(Color).type() == ps.CustomEnum(Color).type() == "enum"


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_schema_info_is_the_official(kind):
    o, t = (ps.JsonSchema(OS), ts.JsonSchema(TS)) if kind == "json" else (ps.AvroSchema(OS), ts.AvroSchema(TS))
    assert json.loads(t.schema_info().schema()) == json.loads(o.schema_info().schema())
    assert t.schema_info().schema() == o.schema_info().schema()
    assert t.schema_info().schema_type() == int(o.schema_info().schema_type())


def test_values_are_read_as_the_official():
    assert [_fields(v) for v in TV] == [_fields(v) for v in OV]
    assert (TV[1].color, TV[1].size, TV[2].color, TV[2].size) == (Color.green, Size.L, Color.blue, Size.S)
    assert (TV[3].color, TV[3].size, TV[3].trim) == (None, Size.L, None)  # the defaults
    for m, shirt in ((ps, OS), (ts, TS)):
        s = shirt()
        s.size = None  # None stays None, even on a required field
        assert s.size is None
        assert m.CustomEnum(Color, default="red").default() is Color.red
        assert m.CustomEnum(Size).validate_type("f", Size.S) is Size.S


BAD = [
    ("color", "purple"),  # no such member name
    ("color", 7),  # no such member value
    ("color", Size.S),  # a member of another enum
    ("color", True),  # a bool is not an int here
    ("color", 1.0),
    ("size", "10"),  # a value as text is looked up as a name
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_bad_values_raise_type_error_on_both(field, value):
    with pytest.raises(TypeError) as official:
        OS(**{field: value})
    with pytest.raises(TypeError) as ours:
        TS(**{field: value})
    assert str(ours.value) == str(official.value)


def test_not_an_enum_type_is_refused():
    with pytest.raises(Exception, match="int is not a valid Enum type"):
        ps.CustomEnum(int)
    with pytest.raises(TypeError, match="int is not a valid Enum type"):
        ts.CustomEnum(int)
    with pytest.raises(TypeError):
        ts.CustomEnum("Color")


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_encodings_are_the_official(kind):
    o, t = (ps.JsonSchema(OS), ts.JsonSchema(TS)) if kind == "json" else (ps.AvroSchema(OS), ts.AvroSchema(TS))
    for ov, tv in zip(OV, TV, strict=True):
        data = o.encode(ov)
        assert t.encode(tv) == data
        assert _fields(t.decode(data)) == _fields(ov)
        assert _fields(o.decode(t.encode(tv))) == _fields(tv)


def test_json_writes_values_and_avro_writes_names():
    assert json.loads(ts.JsonSchema(TS).encode(TV[0]))["color"] == 1
    assert json.loads(ts.JsonSchema(TS).encode(TV[0]))["word"] == "yes"
    # Avro: the symbol's index in the enum, as the official client writes it from the name
    assert ts.AvroSchema(TS).encode(TV[0]) == ps.AvroSchema(OS).encode(OV[0])


def test_json_value_that_is_not_a_name_does_not_decode_on_either():
    """JSON carries an enum's value, but a text value is read back as a member name (as there)."""

    class OR(ps.Record):
        spelled = ps.CustomEnum(Spelled)

    class TR(ts.Record):
        spelled = ts.CustomEnum(Spelled)

    data = ps.JsonSchema(OR).encode(OR(spelled=Spelled.one))
    assert ts.JsonSchema(TR).encode(TR(spelled=Spelled.one)) == data
    with pytest.raises(TypeError) as official:
        ps.JsonSchema(OR).decode(data)
    with pytest.raises(TypeError) as ours:
        ts.JsonSchema(TR).decode(data)
    assert str(ours.value) == str(official.value)


# ------------------------------------------------------------------------------------------ with the broker


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


SCHEMAS = {"json": (ps.JsonSchema, ts.JsonSchema), "avro": (ps.AvroSchema, ts.AvroSchema)}


@pytest.mark.parametrize("kind", list(SCHEMAS))
def test_official_producer_to_our_consumer(client, official, topic, kind):
    make_official, make_ours = SCHEMAS[kind]
    consumer = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest, schema=make_ours(TS))
    producer = official.create_producer(topic, schema=make_official(OS))
    for v in OV:
        producer.send(v)
    got = []
    for _ in OV:
        m = consumer.receive(timeout_millis=20000)
        consumer.acknowledge(m)
        got.append(m.value())
    assert all(type(g) is TS for g in got)
    assert [_fields(g) for g in got] == [_fields(v) for v in OV]
    assert [g.color for g in got] == [Color.red, Color.green, Color.blue, None]


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
@pytest.mark.parametrize("kind", list(SCHEMAS))
def test_our_producer_to_official_consumer(client, official, topic, kind, batching):
    make_official, make_ours = SCHEMAS[kind]
    producer = client.create_producer(topic, schema=make_ours(TS), batching_enabled=batching)
    consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                  schema=make_official(OS))
    for v in TV:
        producer.send(v)
    got = [m.value() for m in read_n(consumer, len(TV))]
    assert all(type(g) is OS for g in got)
    assert [_fields(g) for g in got] == [_fields(v) for v in TV]
    assert [g.size for g in got] == [Size.S, Size.L, Size.S, Size.L]
