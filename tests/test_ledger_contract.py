"""The ledger's contract in types, without a broker: :class:`Kind`, every batch id form
(:mod:`txn.delivery.batch_ids`), :class:`RecordConfig`, keyword-only records, and records written
by the previous (string-typed) code parsing and re-serialising byte for byte."""

from __future__ import annotations

import json

import pytest

from txn.delivery.batch_ids import (
    MicroBatchId,
    ProcessorBatchId,
    WriteBatchId,
    is_narrowed_from,
    is_stream_next,
    micro_batch_id,
    narrowed_batch_id,
    parse_micro_batch_id,
    parse_processor_batch_id,
    parse_write_batch_id,
    processor_batch_id,
    stream_next_id,
    write_batch_id,
)
from txn.delivery.ledger import COMMITTING_KINDS, KINDS, Kind, LedgerRecord, LedgerSchemaError, RecordConfig

#: Records as the previous code wrote them (the processor's STARTED/COMMITTED with duplicates/ABORTED of
#: a narrowed half, the Spark runtime's PARKED with a null handler, a replay's REPLAYED, the Spark sink's
#: stream placeholder, micro-batch COMMITTED and batch-write ABORTED).
PREVIOUS = [
    '{"attempt":1,"batch_id":"orders:1f2e3d4c:7","config":{"handler":"app.handlers:enrich","inputs":["persistent://public/default/in"],"ledger_topic":"persistent://public/default/pulsar-txn-ledger","output":"persistent://public/default/out","parking_suffix":"-parked","subscription":"orders-sub"},"duplicates":{},"duration_ms":null,"ended_at_ms":null,"error":null,"inputs":{"persistent://public/default/in":["(10,3,-1,-1)","(10,4,-1,-1)"]},"job":"orders","kind":"STARTED","outputs":{},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":1700000000000,"txn_id":"(0,12)"}',  # noqa: E501
    '{"attempt":1,"batch_id":"orders:1f2e3d4c:7","config":{},"duplicates":{"persistent://public/default/in":["(10,4,-1,-1)"]},"duration_ms":42,"ended_at_ms":1700000000042,"error":null,"inputs":{"persistent://public/default/in":["(10,3,-1,-1)"]},"job":"orders","kind":"COMMITTED","outputs":{"persistent://public/default/out":2},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":1700000000000,"txn_id":"(0,12)"}',  # noqa: E501
    '{"attempt":3,"batch_id":"orders:1f2e3d4c:8.1","config":{},"duplicates":{},"duration_ms":50,"ended_at_ms":1700000000150,"error":"ValueError: bad","inputs":{"persistent://public/default/in":["(10,9,-1,-1)"]},"job":"orders","kind":"ABORTED","outputs":{},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":1700000000100,"txn_id":"(0,13)"}',  # noqa: E501
    '{"attempt":2,"batch_id":"spark-job:0a1b2c3d:2","config":{"handler":null,"inputs":["persistent://public/default/in"],"ledger_topic":"persistent://public/default/pulsar-txn-ledger","output":"persistent://public/default/out","parking_suffix":"-parked","runtime":"spark","subscription":"s","transform":"jobs.t:fn"},"duplicates":{},"duration_ms":4,"ended_at_ms":9,"error":"boom","inputs":{"persistent://public/default/in-partition-1":["(11,2,1,-1)"]},"job":"spark-job","kind":"PARKED","outputs":{"persistent://public/default/in-partition-1-parked":1},"parked_topic":"persistent://public/default/in-partition-1-parked","replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":5,"txn_id":"(1,5)"}',  # noqa: E501
    '{"attempt":1,"batch_id":"spark-job:0a1b2c3d:2","config":{"transform":"jobs.t:fn"},"duplicates":{},"duration_ms":6,"ended_at_ms":26,"error":null,"inputs":{"persistent://public/default/in-partition-1-parked":["(12,0,-1,-1)"]},"job":"spark-job","kind":"REPLAYED","outputs":{"persistent://public/default/out":1},"parked_topic":null,"replay_of":"spark-job:0a1b2c3d:2","schema":"pulsar-txn.ledger/1","started_at_ms":20,"txn_id":"(2,1)"}',  # noqa: E501
    '{"attempt":1,"batch_id":"spark-pulsar-txn:q-1:next","config":{"sink":"pulsar-txn","stream_key":"q-1","topic":null},"duplicates":{},"duration_ms":null,"ended_at_ms":null,"error":null,"inputs":{},"job":"spark-pulsar-txn","kind":"STARTED","outputs":{},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":30,"txn_id":"(3,4)"}',  # noqa: E501
    '{"attempt":1,"batch_id":"spark-pulsar-txn:q-1:3","config":{"batch_max_rows":1000,"deterministic_order":true,"duplicates_dropped":0,"ledger_topic":"persistent://public/default/pulsar-txn-ledger","query_id":"q-1","rows":80,"sink":"pulsar-txn","spark_batch_id":3,"stream_key":"q-1","task_attempts":{"0":0,"1":1},"tasks":4,"topic":"persistent://public/default/out"},"duplicates":{},"duration_ms":1,"ended_at_ms":31,"error":null,"inputs":{},"job":"spark-pulsar-txn","kind":"COMMITTED","outputs":{"persistent://public/default/out":80},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":30,"txn_id":"(3,4)"}',  # noqa: E501
    '{"attempt":1,"batch_id":"spark-pulsar-txn:9f8e7d6c5b4a3928","config":{"sink":"pulsar-txn","topic":"persistent://public/default/out"},"duplicates":{},"duration_ms":1,"ended_at_ms":41,"error":"SparkWriteAborted: 1 of 2 task(s) failed","inputs":{},"job":"spark-pulsar-txn","kind":"ABORTED","outputs":{"persistent://public/default/out":3},"parked_topic":null,"replay_of":null,"schema":"pulsar-txn.ledger/1","started_at_ms":40,"txn_id":"(3,5)"}',  # noqa: E501
]


def test_kind_is_a_string_enum_with_the_wire_names() -> None:
    assert [k.value for k in Kind] == list(KINDS) == ["STARTED", "COMMITTED", "ABORTED", "PARKED", "REPLAYED"]
    assert Kind.COMMITTED == "COMMITTED" and str(Kind.PARKED) == "PARKED" and f"{Kind.ABORTED}" == "ABORTED"
    assert json.dumps(Kind.REPLAYED) == '"REPLAYED"'
    assert COMMITTING_KINDS == {Kind.COMMITTED, Kind.PARKED, Kind.REPLAYED}
    assert "PARKED" in {k.value for k in COMMITTING_KINDS}
    rec = LedgerRecord(kind="COMMITTED", job="j", batch_id="b")  # a name is converted
    assert rec.kind is Kind.COMMITTED
    with pytest.raises(LedgerSchemaError, match="unknown ledger record kind 'BOGUS'"):
        LedgerRecord(kind="BOGUS", job="j", batch_id="b")


def test_records_are_built_with_keywords_only() -> None:
    with pytest.raises(TypeError):
        LedgerRecord("COMMITTED", "j", "b")  # type: ignore[misc]
    rec = LedgerRecord(kind=Kind.STARTED, job="j", batch_id="b", config={"handler": "m:f", "x": 1})
    assert rec.config == RecordConfig(handler="m:f", extra={"x": 1})


@pytest.mark.parametrize("line", PREVIOUS)
def test_records_of_the_previous_code_parse_and_serialise_unchanged(line: str) -> None:
    rec = LedgerRecord.from_json(line)
    assert isinstance(rec.kind, Kind) and isinstance(rec.config, RecordConfig)
    assert rec.to_json().decode() == line


def test_typed_fields_of_previous_records() -> None:
    started, committed, aborted, parked, replayed, placeholder, micro, write = (
        LedgerRecord.from_json(x) for x in PREVIOUS)
    assert started.config.handler == "app.handlers:enrich" and started.config.inputs == (
        "persistent://public/default/in",)
    assert committed.duplicates == {"persistent://public/default/in": ["(10,4,-1,-1)"]}
    assert parse_processor_batch_id(aborted.batch_id) == ProcessorBatchId("orders", "1f2e3d4c", 8, (1,))
    assert parked.config.handler is None and "handler" in parked.config and parked.config.runtime == "spark"
    assert replayed.config.transform == "jobs.t:fn" and "handler" not in replayed.config
    assert placeholder.config.stream_key == "q-1" and is_stream_next(placeholder.batch_id)
    assert parse_micro_batch_id(placeholder.batch_id, placeholder.job) == MicroBatchId("spark-pulsar-txn", "q-1", None)
    c = micro.config
    assert (c.spark_batch_id, c.rows, c.tasks, c.deterministic_order, c.task_attempts) == (3, 80, 4, True,
                                                                                            {"0": 0, "1": 1})
    assert c["spark_batch_id"] == 3 and c.get("rows") == 80 and c.get("nope", 5) == 5  # the dict view
    assert parse_micro_batch_id(micro.batch_id, micro.job) == MicroBatchId("spark-pulsar-txn", "q-1", 3)
    assert parse_write_batch_id(write.batch_id, write.job) == WriteBatchId("spark-pulsar-txn", "9f8e7d6c5b4a3928")


def test_config_keeps_unknown_keys_and_foreign_types() -> None:
    raw = {"handler": 5, "inputs": "in", "spark_batch_id": True, "task_attempts": {"0": "x"}, "future": [1, {"a": 2}],
           "output": None, "rows": 7}
    cfg = RecordConfig.from_dict(raw)
    assert (cfg.handler, cfg.inputs, cfg.spark_batch_id, cfg.task_attempts, cfg.output, cfg.rows) == (
        None, None, None, None, None, 7)
    assert cfg.to_dict() == raw and len(cfg) == len(raw) and set(cfg) == set(raw)
    assert dict(cfg) == raw


def test_config_null_or_absent() -> None:
    assert RecordConfig(handler=None, sink="s").to_dict() == {"sink": "s"}
    assert RecordConfig.of(handler=None, sink="s").to_dict() == {"handler": None, "sink": "s"}
    assert RecordConfig.of(inputs=["a", "b"]).inputs == ("a", "b")
    cfg = RecordConfig.of(handler="m:f", output="o").updated(runtime="spark", transform=None)
    assert cfg.to_dict() == {"handler": "m:f", "output": "o", "runtime": "spark", "transform": None}
    with pytest.raises(TypeError, match="no field"):
        RecordConfig.of(hander="typo")


def test_config_bound_and_type_are_still_checked() -> None:
    base = json.loads(PREVIOUS[1])
    with pytest.raises(LedgerSchemaError, match="field 'config' must be an object of at most 256 keys, got list"):
        LedgerRecord.from_json(json.dumps({**base, "config": [1]}))
    with pytest.raises(LedgerSchemaError, match="at most 256 keys, got dict"):
        LedgerRecord.from_json(json.dumps({**base, "config": {str(i): i for i in range(257)}}))


@pytest.mark.parametrize(("job", "instance", "seq"), [("j", "ab12cd34", 1), ("a:b/c", "0f0f0f0f", 123456),
                                                      ("dash/abort", "x", 0)])
def test_processor_batch_ids_round_trip(job: str, instance: str, seq: int) -> None:
    bid = processor_batch_id(job, instance, seq)
    assert bid == f"{job}:{instance}:{seq}"
    parsed = parse_processor_batch_id(bid)
    assert parsed == ProcessorBatchId(job, instance, seq) and str(parsed) == bid and parsed.root == bid
    half = narrowed_batch_id(narrowed_batch_id(bid, 1), 0)
    assert half == f"{bid}.1.0"
    p = parse_processor_batch_id(half)
    assert p == ProcessorBatchId(job, instance, seq, (1, 0)) and str(p) == half and p.root == bid
    assert is_narrowed_from(half, bid) and is_narrowed_from(narrowed_batch_id(bid, 0), bid)
    assert not is_narrowed_from(bid, bid) and not is_narrowed_from(f"{bid}0", bid)


def test_batch_ids_that_are_not_of_a_form() -> None:
    for bad in ("", "j", "j:1", "j:ab:x", "j:ab:1.2", "j:ab:01", "j:a.b:1", ":ab:1.", "j::1"):
        assert parse_processor_batch_id(bad) is None, bad
    assert not is_narrowed_from("j:a:1.2", "j:a:1")
    assert parse_write_batch_id("other:abc", "j") is None and parse_write_batch_id("j:a:b", "j") is None
    assert parse_micro_batch_id("j:q:x", "j") is None and parse_micro_batch_id("j:5", "j") is None
    assert parse_micro_batch_id("k:q:5", "j") is None
    for build, args in ((processor_batch_id, ("j", "a:b", 1)), (processor_batch_id, ("j", "a.b", 1)),
                        (processor_batch_id, ("j", "ab", -1)), (narrowed_batch_id, ("j:a:1", 2)),
                        (narrowed_batch_id, ("j:a:1", True)), (write_batch_id, ("j", "a:b")),
                        (write_batch_id, ("j", "")), (micro_batch_id, ("j", "", 1)), (micro_batch_id, ("j", "q", -1)),
                        (stream_next_id, ("j", ""))):
        with pytest.raises(ValueError):
            build(*args)


@pytest.mark.parametrize(("job", "query"), [("spark-pulsar-txn", "5b1c4e0a-7f3d-4c1e-9a0b-2d8e6f4a1c3b"),
                                            ("a:b", "my:query"), ("j", "next")])
def test_spark_batch_ids_round_trip(job: str, query: str) -> None:
    w = write_batch_id(job, "9f8e7d6c5b4a3928")
    assert w == f"{job}:9f8e7d6c5b4a3928" and str(parse_write_batch_id(w, job)) == w
    for n in (0, 7, 10**12):
        m = micro_batch_id(job, query, n)
        assert m == f"{job}:{query}:{n}"
        parsed = parse_micro_batch_id(m, job)
        assert parsed == MicroBatchId(job, query, n) and not parsed.is_placeholder and str(parsed) == m
        assert not is_stream_next(m)
    nxt = stream_next_id(job, query)
    assert nxt == f"{job}:{query}:next" and is_stream_next(nxt)
    parsed = parse_micro_batch_id(nxt, job)
    assert parsed == MicroBatchId(job, query, None) and parsed.is_placeholder and str(parsed) == nxt
