"""Schemas with the Java client (``tests/java/SchemaPeer.java``, run against the Pulsar
distribution's jars), both ways on the same topic and schema, beside the official client doing the
same on a topic of its own: AVRO and JSON records (Java reads with ``Schema.AUTO_CONSUME()`` and
writes with ``Schema.generic`` of our definition), AVRO in batches, STRING with non-ASCII text; a
different AVRO record refused on either side and a compatible one from Java read by its definition.
One Java process per test, running its jobs in order."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from typing import Any

import pulsar
import pulsar.schema as ps
import pytest
from java_peer import compiled_peer, run_peer

import txn
import txn.schema as ts
from txn.admin import admin_request, topic_path

from peer import read_n

N = 3
FIRST = "\x00" * 8  # the registry's first schema version, as Message.schema_version() gives it


class Color(enum.Enum):
    red = 1
    green = 2
    blue = 3


def _records(m: Any) -> tuple[Any, Any, Any]:
    """The record classes, from ``txn.schema`` or ``pulsar.schema`` (``m``): Inner, Item and Other
    (an AVRO record no Item topic accepts: another name, a required field of its own)."""

    class Inner(m.Record):
        _avro_namespace = "interop.v1"
        label = m.String(required=True)
        weight = m.Double(required=True)

    class Item(m.Record):
        _avro_namespace = "interop.v1"
        name = m.String()
        count = m.Integer()
        total = m.Long()
        ratio = m.Double()
        ok = m.Boolean()
        note = m.String()
        tags = m.Array(m.String())
        scores = m.Map(m.Double())
        inner = Inner()
        color = m.CustomEnum(Color)
        blob = m.Bytes()

    class Other(m.Record):
        _avro_namespace = "interop.v1"
        code = m.Long(required=True)

    return Inner, Item, Other


Inner, Item, Other = _records(ts)
OInner, OItem, OOther = _records(ps)


def _item(i: int, m: Any = ts) -> Any:
    """Message ``i`` (a ``txn.schema`` Item, or ``pulsar.schema``'s): every field set, but ``note``
    is None on the odd ones."""
    inner, item = (Inner, Item) if m is ts else (OInner, OItem)
    return item(name=f"naïve ☃ {i}", count=-i - 1, total=2**40 + i, ratio=i + 0.25, ok=i % 2 == 0,
                note=None if i % 2 else f"n{i}", tags=[f"t{i}", "日本"][: i + 1], scores={"a": 1.5 * i, "é": -0.5},
                inner=inner(label=f"in{i}", weight=i / 8), color=list(Color)[i % 3], blob=_blob(i))


def _blob(i: int) -> bytes:
    return bytes([0, i]) + "é".encode()


def _plain(i: int, kind: str) -> dict[str, Any]:
    """Message ``i`` as plain JSON, as the Java peer prints and takes it: for ``"avro"`` the enum by
    name and the bytes as latin-1 text (one char a byte), for ``"json"`` the enum by value and the
    bytes as UTF-8 text (both as the official client writes them)."""
    color = list(Color)[i % 3]
    return {"name": f"naïve ☃ {i}", "count": -i - 1, "total": 2**40 + i, "ratio": i + 0.25, "ok": i % 2 == 0,
            "note": None if i % 2 else f"n{i}", "tags": [f"t{i}", "日本"][: i + 1], "scores": {"a": 1.5 * i, "é": -0.5},
            "inner": {"label": f"in{i}", "weight": i / 8}, "color": color.name if kind == "avro" else color.value,
            "blob": _blob(i).decode("latin-1" if kind == "avro" else "utf-8")}


@pytest.fixture(scope="module")
def java_peer() -> Iterator[list[str]]:
    """The command (less its arguments) running tests/java/SchemaPeer.java, compiled once."""
    with compiled_peer("SchemaPeer") as cmd:
        yield cmd


def _run(java_peer: list[str], service_url: str, *jobs: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Run the jobs in one Java process; each job's output lines, in order."""
    out: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for line in run_peer(java_peer, service_url, stdin=json.dumps(list(jobs))).splitlines():
        if line.startswith("RESULT "):
            got = json.loads(line.removeprefix("RESULT "))
            out[got.pop("job")].append(got)
    return out


def _schemas(admin_url: str, topic: str) -> list[dict[str, Any]]:
    """The registry's versions of the topic's schema, oldest first."""
    status, body = admin_request("GET", admin_url, f"/admin/v2/schemas/{topic_path(topic).split('/', 1)[1]}/schemas")
    assert status == 200, body
    return body["getSchemaResponses"]


def _versions(admin_url: str, topic: str) -> list[int]:
    return [r["version"] for r in _schemas(admin_url, topic)]


def _java_id(mid: Any) -> str:
    """An id as the Java client prints it: ``ledger:entry:partition``, ``:batch`` if batched."""
    batch = f":{mid.batch_index()}" if mid.batch_index() >= 0 else ""
    return f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}{batch}"


def _write(client: Any, topic: str, schema: Any, values: list[Any], batch: bool) -> list[str]:
    """Send ``values`` (one batch if ``batch``) with our client or the official one; the ids as Java prints them."""
    producer = client.create_producer(topic, schema=schema, batching_enabled=batch,
                                      batching_max_publish_delay_ms=10000, batching_max_messages=len(values))
    sent: list[Any] = []
    for v in values:
        producer.send_async(v, lambda res, mid: sent.append((res.name, mid)))
    producer.flush()
    assert [res for res, _ in sent] == ["Ok"] * len(values)
    ids = [_java_id(mid) for _, mid in sent]
    assert len({i.split(":")[1] for i in ids}) == (1 if batch else len(values))
    return ids


def _both_ways(broker: Any, java_peer: list[str], topic: str, kind: str, schemas: tuple[Any, Any],
               values: tuple[list[Any], list[Any]], java_reads: list[Any], java_writes: list[Any],
               batch: bool = False, java_version: int = 0) -> None:
    """On ``topic`` we write ``values[0]`` with ``schemas[0]``, on ``<topic>-official`` the official
    client writes ``values[1]`` with ``schemas[1]`` (in one batch each if ``batch``). One Java
    process reads each topic's (equal to ``java_reads``, with the writer's ids, at the first schema
    version) and writes ``java_writes`` to it with our definition (one batch if ``batch``). Each
    client reads Java's back equal to what it wrote, with Java's ids, at schema version
    ``java_version``; the registry holds versions 0 to that one, the same on both topics."""
    official_topic = f"{topic}-official"
    client, official = txn.Client(broker.service_url), pulsar.Client(broker.service_url)
    try:
        ids = [_write(c, t, schema, v, batch) for c, t, schema, v in
               zip((client, official), (topic, official_topic), schemas, values, strict=True)]
        consumers = [c.subscribe(t, "ours", schema=schema)  # from the latest: Java's messages only
                     for c, t, schema in zip((client, official), (topic, official_topic), schemas, strict=True)]
        definition = None if kind == "string" else json.loads(schemas[0].schema_info().schema())
        jobs = [[{"op": "consume", "topic": t, "kind": kind, "count": len(java_reads)},
                 {"op": "produce", "topic": t, "kind": kind, "definition": definition, "values": java_writes,
                  "batch": batch}] for t in (topic, official_topic)]
        out = _run(java_peer, broker.service_url, *jobs[0], *jobs[1])
        registry = []
        for t, (read, wrote), ours_ids, consumer, written in zip(
                (topic, official_topic), (out[:2], out[2:]), ids, consumers, values, strict=True):
            assert [r["value"] for r in read] == java_reads
            assert [r["id"] for r in read] == ours_ids
            assert {r["version"] for r in read} == {"0000000000000000"}
            assert len(wrote) == len(java_writes) and all("sent" in w for w in wrote), wrote
            assert {len(w["sent"].split(":")) for w in wrote} == {4 if batch else 3}
            got = read_n(consumer, len(java_writes))
            assert [m.value() for m in got] == written
            assert [_java_id(m.message_id()) for m in got] == [w["sent"] for w in wrote]
            assert {m.schema_version() for m in got} == {java_version.to_bytes(8).decode()}
            registry.append([(r["version"], r["type"], r["data"]) for r in _schemas(broker.admin_url, t)])
        assert [v for v, _, _ in registry[0]] == list(range(java_version + 1))
        assert registry[1] == registry[0]
    finally:
        client.close()
        official.close()


def _avro_json(kind: str, batch: bool = False) -> dict[str, Any]:
    ours, official = (ts.AvroSchema, ps.AvroSchema) if kind == "avro" else (ts.JsonSchema, ps.JsonSchema)
    plain = [_plain(i, kind) for i in range(N)]
    return {"kind": kind, "schemas": (ours(Item), official(OItem)), "batch": batch,
            "values": ([_item(i) for i in range(N)], [_item(i, ps) for i in range(N)]),
            "java_reads": plain, "java_writes": plain}


def test_avro_both_ways(broker: Any, topic: str, java_peer: list[str]) -> None:
    """``AvroSchema(Item)``: Java's ``AUTO_CONSUME`` reads every field of ours (the enum by name, the
    nested record, null note) as the official client's; Java's ``Schema.generic`` of our definition
    writes records our consumer decodes to equal ``Item``\\ s, at the same (only) schema version."""
    _both_ways(broker, java_peer, topic, **_avro_json("avro"))


def test_avro_batches_both_ways(broker: Any, topic: str, java_peer: list[str]) -> None:
    """The same in one batch each way (the Java producer's default is batching): each side reads
    the other's batch message by message, with the batch's schema version."""
    _both_ways(broker, java_peer, topic, **_avro_json("avro", batch=True))


def test_json_both_ways(broker: Any, topic: str, java_peer: list[str]) -> None:
    """``JsonSchema(Item)``: Java reads our JSON text as the same tree (the enum by value, as the
    official client writes it); it writes that tree back and we decode equal ``Item``\\ s."""
    _both_ways(broker, java_peer, topic, **_avro_json("json"))


def test_string_both_ways(broker: Any, topic: str, java_peer: list[str]) -> None:
    """``StringSchema``: non-ASCII text (accents, CJK, an astral emoji) and the empty string, both
    ways. The Java producer's STRING schema (data ``""``) is a second version beside ours (``"null"``,
    as the official client's), so Java's messages are at version 1, on the official client's topic too."""
    values = ["plain", "ünïcödé 日本語 🎉", ""]
    _both_ways(broker, java_peer, topic, "string", (ts.StringSchema(), ps.StringSchema()), (values, values),
               values, values, java_version=1)
    assert [(r["version"], r["data"]) for r in _schemas(broker.admin_url, topic)] == [(0, "null"), (1, "")]


def test_other_records_by_compatibility_both_ways(broker: Any, topic: str, java_peer: list[str]) -> None:
    """Our ``AvroSchema(Item)`` registered first: the Java producer of another record (``Other``) gets
    IncompatibleSchemaException, one of Item plus a nullable field (defaulted, first) registers version 1,
    and both Python clients' ``Item`` consumers read its message by that writer's definition. Java's
    ``Other`` registered first: a producer or consumer of ``Item`` gets ``txn.IncompatibleSchema``
    (``pulsar.IncompatibleSchema`` from the official client), one of ``Other`` reads Java's message."""
    java_first = f"{topic}-java"
    client, official = txn.Client(broker.service_url), pulsar.Client(broker.service_url)
    try:
        client.create_producer(topic, schema=ts.AvroSchema(Item)).close()
        other, evolved = Other.schema(), Item.schema()
        # the new field first: read by the reader's definition alone, the message would not decode
        evolved["fields"] = [{"name": "extra", "type": ["null", "string"], "default": None}, *evolved["fields"]]
        refused, registered, added = _run(
            java_peer, broker.service_url,
            {"op": "produce", "topic": topic, "kind": "avro", "definition": other, "values": [{"code": 1}]},
            {"op": "produce", "topic": java_first, "kind": "avro", "definition": other, "values": [{"code": 7}]},
            {"op": "produce", "topic": topic, "kind": "avro", "definition": evolved,
             "values": [{**_plain(1, "avro"), "extra": "more"}]})
        assert refused == [{"error": "IncompatibleSchemaException"}]
        assert len(registered) == 1 and "sent" in registered[0], registered
        assert len(added) == 1 and "sent" in added[0], added
        for c, error, m, item, other_cls, earliest in (
                (client, txn.IncompatibleSchema, ts, Item, Other, txn.InitialPosition.Earliest),
                (official, pulsar.IncompatibleSchema, ps, OItem, OOther, pulsar.InitialPosition.Earliest)):
            with pytest.raises(error):
                c.create_producer(java_first, schema=m.AvroSchema(item))
            with pytest.raises(error):
                c.subscribe(java_first, "s", schema=m.AvroSchema(item))
            with pytest.raises(error):
                c.create_producer(topic, schema=m.AvroSchema(other_cls))
            for t, schema, value, version, sent in (
                    (java_first, m.AvroSchema(other_cls), other_cls(code=7), FIRST, registered[0]["sent"]),
                    (topic, m.AvroSchema(item), _item(1, m), "\x00" * 7 + "\x01", added[0]["sent"])):
                reader = c.subscribe(t, "s", schema=schema, initial_position=earliest)
                got = reader.receive(10000)
                assert (got.value(), got.schema_version(), _java_id(got.message_id())) == (value, version, sent)
                reader.close()  # unacknowledged: the next client's consumer of "s" gets it again
        assert (_versions(broker.admin_url, topic), _versions(broker.admin_url, java_first)) == ([0, 1], [0])
    finally:
        client.close()
        official.close()
