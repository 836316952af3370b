"""The processor with schemas: inputs decoded by the topic's registered schema, outputs encoded and
registered by the output's; the official client writes the inputs and reads the outputs."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pulsar
import pulsar.schema as ps
import pytest

import txn
import txn.schema as ts
from txn.delivery.output import Output, OutputEncodingError, normalise
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.replay import read_ledger, replay_batch

from peer import read_n, read_until_sentinel


def _classes(m):
    """The same record classes from either module (``m`` is pulsar.schema or txn.schema)."""

    class Order(m.Record):
        _avro_namespace = "shop.v1"
        id = m.Integer(required=True)
        item = m.String()
        qty = m.Integer(required=True)

    class OrderV2(m.Record):  # Order with one more field, which has a default: a compatible version
        _avro_namespace = "shop.v1"
        id = m.Integer(required=True)
        item = m.String()
        qty = m.Integer(required=True)
        note = m.String(default="none", required=True, required_default=True)

    class Line(m.Record):
        _avro_namespace = "shop.v1"
        order = m.Integer(required=True)
        n = m.Integer(required=True)
        item = m.String()

    return Order, OrderV2, Line


P_ORDER, P_ORDER2, P_LINE = _classes(ps)
T_ORDER, T_ORDER2, T_LINE = _classes(ts)


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _names(unique_name):
    return tuple(f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))


def _registered(broker, topic: str) -> dict:
    name = topic.removeprefix("persistent://")
    with urllib.request.urlopen(f"{broker.admin_url}/admin/v2/schemas/{name}/schema", timeout=10) as r:
        return json.load(r)


def _run(broker, handler, inputs, output, ledger, **cfg):
    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=inputs, output=output, subscription="proc", job="schema",
                                   ledger_topic=ledger, **cfg)
            proc = AsyncProcessor(client, handler, conf)
            await proc.start()
            try:
                await proc.run(idle_exit_ms=2500)
            finally:
                await proc.close()
            return proc.stats

    return asyncio.run(main())


def _lines(m):
    """One output per unit of the order (none for qty 0), each a Line record."""
    o = m.value()
    return [T_LINE(order=o.id, n=i, item=o.item) for i in range(o.qty)]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_json_inputs_decoded_avro_outputs_registered(broker, official, unique_name, batched):
    inp, out, ledger = _names(unique_name)
    p = official.create_producer(inp, schema=ps.JsonSchema(P_ORDER), batching_enabled=batched)
    orders = [(i, f"item-{i}", i % 3) for i in range(40)]  # 0, 1 or 2 outputs per input
    for i, item, qty in orders:
        p.send_async(P_ORDER(id=i, item=item, qty=qty), None)
    p.flush()
    p.close()
    reader = official.subscribe(out, "r", schema=ps.AvroSchema(P_LINE),
                                initial_position=pulsar.InitialPosition.Earliest)
    stats = _run(broker, _lines, [inp], out, ledger, batch_max_messages=7,
                 input_schema=ts.JsonSchema(T_ORDER), output_schema=ts.AvroSchema(T_LINE))
    want = sorted((i, n, item) for i, item, qty in orders for n in range(qty))
    got = read_n(reader, len(want))
    assert sorted((m.value().order, m.value().n, m.value().item) for m in got) == want
    assert read_until_sentinel(official, reader, out) == []
    assert (stats.messages, stats.outputs, stats.parked) == (40, len(want), 0)
    # The broker's registry holds the output's Avro definition, the one the official client makes.
    reg = _registered(broker, out)
    assert reg["type"] == "AVRO"
    assert json.loads(reg["data"]) == json.loads(ps.AvroSchema(P_LINE).schema_info().schema())


def test_two_avro_versions_decode_by_their_writer(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    p1 = official.create_producer(inp, schema=ps.AvroSchema(P_ORDER))
    for i in range(5):
        p1.send(P_ORDER(id=i, item=f"v1-{i}", qty=1))
    p1.close()
    p2 = official.create_producer(inp, schema=ps.AvroSchema(P_ORDER2))
    for i in range(5, 10):
        p2.send(P_ORDER2(id=i, item=f"v2-{i}", qty=1, note=f"n{i}"))
    p2.close()
    reader = official.subscribe(out, "r", schema=ps.StringSchema(), initial_position=pulsar.InitialPosition.Earliest)

    def describe(m):  # str outputs, encoded by the output's StringSchema
        o = m.value()
        return f"{o.id}:{o.item}:{o.note}"

    stats = _run(broker, describe, [inp], out, ledger, input_schema=ts.AvroSchema(T_ORDER2),
                 output_schema=ts.StringSchema())
    got = sorted(m.value() for m in read_n(reader, 10))
    # Version 1's messages lack ``note``: the reader's default fills it; version 2's keep theirs.
    assert got == sorted([f"{i}:v1-{i}:none" for i in range(5)] + [f"{i}:v2-{i}:n{i}" for i in range(5, 10)])
    assert (stats.messages, stats.outputs, stats.parked) == (10, 10, 0)


def test_incompatible_input_schema_fails_the_start(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    p = official.create_producer(inp, schema=ps.AvroSchema(P_ORDER))
    p.send(P_ORDER(id=1, item="x", qty=1))
    p.close()
    with pytest.raises(txn.IncompatibleSchema):
        _run(broker, _lines, [inp], out, ledger, input_schema=ts.AvroSchema(T_LINE), start_timeout_ms=0)


def test_an_undecodable_input_is_parked_not_dropped(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    good = official.create_producer(inp, schema=ps.JsonSchema(P_ORDER), batching_enabled=False)
    raw = official.create_producer(inp, batching_enabled=False)  # no schema: the broker lets it write
    good.send(P_ORDER(id=1, item="a", qty=1))
    raw.send(b"\xff not json")
    good.send(P_ORDER(id=2, item="b", qty=2))
    good.close()
    raw.close()
    reader = official.subscribe(out, "r", schema=ps.JsonSchema(P_LINE),
                                initial_position=pulsar.InitialPosition.Earliest)
    stats = _run(broker, _lines, [inp], out, ledger, max_attempts=2, input_schema=ts.JsonSchema(T_ORDER),
                 output_schema=ts.JsonSchema(T_LINE))
    got = sorted((m.value().order, m.value().n) for m in read_n(reader, 3))
    assert got == [(1, 0), (2, 0), (2, 1)]
    assert read_until_sentinel(official, reader, out) == []
    assert (stats.messages, stats.outputs, stats.parked) == (2, 3, 1)  # committed inputs; one parked
    parked = official.subscribe(inp + "-parked", "peek", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in read_n(parked, 1)] == [b"\xff not json"]


def test_a_value_the_output_schema_cannot_encode_fails_the_batch(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    p = official.create_producer(inp, batching_enabled=False)
    for d in (b"1", b"oops", b"2"):
        p.send(d)
    p.close()
    reader = official.subscribe(out, "r", schema=ps.JsonSchema(P_LINE),
                                initial_position=pulsar.InitialPosition.Earliest)

    def handler(m):
        return T_LINE(order=int(m.data()), n=0, item="x") if m.data() != b"oops" else 42  # 42 is no Line

    stats = _run(broker, handler, [inp], out, ledger, max_attempts=2, output_schema=ts.JsonSchema(T_LINE))
    assert sorted(m.value().order for m in read_n(reader, 2)) == [1, 2]
    assert (stats.messages, stats.outputs, stats.parked) == (2, 2, 1)


def test_normalise_with_an_output_schema():
    enc = ts.StringSchema().encode
    # A str, a dict or a record is one value; lists, tuples and generators are several.
    assert [o.content for o in normalise("a", encode=enc)] == [b"a"]
    assert [o.content for o in normalise(["a", b"raw"], encode=enc)] == [b"a", b"raw"]
    assert [o.content for o in normalise((s for s in "xy"), encode=enc)] == [b"x", b"y"]
    out = normalise(Output("k", topic="t", properties={"p": "1"}, partition_key="key"), encode=enc)
    assert [(o.content, o.topic, o.properties, o.partition_key) for o in out] == [(b"k", "t", {"p": "1"}, "key")]
    js = ts.JsonSchema(T_LINE)
    line = T_LINE(order=1, n=2, item="z")
    assert [js.decode(o.content) for o in normalise(line, encode=js.encode)] == [line]
    with pytest.raises(OutputEncodingError, match="cannot encode a int"):
        normalise(5, encode=js.encode)
    # Without a schema, as before: str is refused, and an Output must hold bytes.
    with pytest.raises(TypeError, match="returned str"):
        normalise("a")
    with pytest.raises(TypeError, match="Output.content is a str"):
        normalise(Output("a"))


def test_a_parked_input_replays_decoded_by_its_own_version(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    p1 = official.create_producer(inp, schema=ps.AvroSchema(P_ORDER), batching_enabled=False)
    for i in range(3):
        p1.send(P_ORDER(id=i, item=f"v1-{i}", qty=1))
    p1.close()
    p2 = official.create_producer(inp, schema=ps.AvroSchema(P_ORDER2), batching_enabled=False)
    p2.send(P_ORDER2(id=3, item="v2-3", qty=1, note="n3"))
    p2.close()
    reader = official.subscribe(out, "r", schema=ps.StringSchema(), initial_position=pulsar.InitialPosition.Earliest)

    def describe(m):
        o = m.value()
        if o.id == 1:
            raise ValueError("bad order 1")  # a version 1 input: parked
        return f"{o.id}:{o.item}:{o.note}"

    stats = _run(broker, describe, [inp], out, ledger, max_attempts=2, input_schema=ts.AvroSchema(T_ORDER2),
                 output_schema=ts.StringSchema())
    assert sorted(m.value() for m in read_n(reader, 3)) == ["0:v1-0:none", "2:v1-2:none", "3:v2-3:n3"]
    assert (stats.messages, stats.parked) == (3, 1)

    async def replay_it():
        async with txn.AsyncClient(broker.service_url) as client:
            records = await read_ledger(client, ledger)
            batch = next(r.batch_id for r in records if r.kind == "PARKED")
            return await replay_batch(client, batch, ledger, lambda m: f"fixed {m.value().id}:{m.value().note}",
                                      out, input_schema=ts.AvroSchema(T_ORDER2), output_schema=ts.StringSchema())

    res = asyncio.run(replay_it())
    assert res.replayed and res.messages == 1
    # The parked copy is the input's bytes, written with version 1: decoded by it, the new field's default.
    assert [m.value() for m in read_n(reader, 1)] == ["fixed 1:none"]
    assert read_until_sentinel(official, reader, out) == []
