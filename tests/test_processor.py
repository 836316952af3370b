"""The exactly-once processor, its ledger, parking and replay, on a real broker."""

from __future__ import annotations

import asyncio
from collections import Counter

import pulsar
import pytest

import txn
from txn.delivery.ledger import LedgerRecord
from txn.delivery.output import Output
from txn.delivery.processor import PARK_BATCH, PARK_ERROR, AsyncProcessor, ProcessorConfig
from txn.delivery.replay import ReplayError, read_ledger, replay_batch

from peer import read_n, read_until_sentinel


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _fill(official, topic: str, payloads: list[bytes]) -> None:
    p = official.create_producer(topic)
    for d in payloads:
        p.send(d)
    p.close()


def _run(broker, handler, inputs, output, ledger, **cfg):
    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=inputs, output=output, subscription="proc", job=cfg.pop("job", "test"),
                                   ledger_topic=ledger, **cfg)
            proc = AsyncProcessor(client, handler, conf)
            await proc.start()
            try:
                await proc.run(idle_exit_ms=2500)
            finally:
                await proc.close()
            return proc.stats, await read_ledger(client, ledger)

    return asyncio.run(main())


def _names(unique_name):
    return tuple(f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))


def test_happy_path_exactly_once_with_ledger(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    payloads = [f"msg-{i}".encode() for i in range(57)]
    _fill(official, inp, payloads)
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    stats, records = _run(broker, lambda m: m.data().upper(), [inp], out, ledger, batch_max_messages=10)
    got = read_n(reader, 57)
    assert sorted(m.data() for m in got) == sorted(p.upper() for p in payloads)
    assert read_until_sentinel(official, reader, out) == []
    assert (stats.messages, stats.outputs, stats.parked) == (57, 57, 0)
    committed = [r for r in records if r.kind == "COMMITTED"]
    assert sum(r.outputs.get(out, 0) for r in committed) == 57
    assert sum(len(ids) for r in committed for ids in r.inputs.values()) == 57
    assert len(committed) == stats.batches >= 6  # batches close at 10 messages
    started = {r.batch_id for r in records if r.kind == "STARTED"}
    assert {r.batch_id for r in committed} <= started
    assert all(r.txn_id and txn.TxnID.parse(r.txn_id) for r in committed)
    # Every input acknowledged.
    again = official.subscribe(inp, "proc", consumer_type=pulsar.ConsumerType.Shared)
    assert read_until_sentinel(official, again, inp) == []


def test_handler_failure_aborts_and_retries(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    _fill(official, inp, [f"m{i}".encode() for i in range(20)])
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    failures = Counter()

    def flaky(m):
        if m.data() == b"m7" and failures["m7"] < 2:
            failures["m7"] += 1
            raise RuntimeError("transient trouble")
        return m.data() + b"!"

    stats, records = _run(broker, flaky, [inp], out, ledger, batch_max_messages=20, batch_max_delay_ms=500)
    assert sorted(m.data() for m in read_n(reader, 20)) == sorted(f"m{i}!".encode() for i in range(20))
    assert read_until_sentinel(official, reader, out) == []
    aborted = [r for r in records if r.kind == "ABORTED"]
    assert len(aborted) == 2 and all("transient trouble" in r.error for r in aborted)
    assert {r.attempt for r in aborted} == {1, 2}
    assert stats.parked == 0


def test_poison_is_parked_then_replayed_exactly_once(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    payloads = [f"m{i}".encode() for i in range(16)]
    payloads[11] = b"poison-11"
    _fill(official, inp, payloads)
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)

    def handler(m):
        if b"poison" in m.data():
            raise ValueError("bad record")
        return m.data().upper()

    stats, records = _run(broker, handler, [inp], out, ledger, batch_max_messages=16, batch_max_delay_ms=500,
                          max_attempts=2)
    good = [p.upper() for p in payloads if b"poison" not in p]
    assert sorted(m.data() for m in read_n(reader, 15)) == sorted(good)
    assert read_until_sentinel(official, reader, out) == []
    assert stats.parked == 1
    parked = [r for r in records if r.kind == "PARKED"]
    assert len(parked) == 1 and "bad record" in parked[0].error
    batch_id = parked[0].batch_id
    assert parked[0].parked_topic == inp + "-parked"
    # The parking topic holds exactly the poison message with its error and batch id.
    # Not acked: once every subscription acked it, the broker (retention none) may delete the ledger the replay reads.
    pr = official.subscribe(inp + "-parked", "peek", initial_position=pulsar.InitialPosition.Earliest)
    pm = pr.receive(timeout_millis=30000)
    assert pm.data() == b"poison-11"
    assert pm.properties()[PARK_BATCH] == batch_id and "bad record" in pm.properties()[PARK_ERROR]
    # The input no longer holds it.
    again = official.subscribe(inp, "proc", consumer_type=pulsar.ConsumerType.Shared)
    assert read_until_sentinel(official, again, inp) == []

    async def do_replay(handler):
        async with txn.AsyncClient(broker.service_url) as client:
            return await replay_batch(client, batch_id, ledger, handler=handler, output=out)

    res = asyncio.run(do_replay(lambda m: Output(m.data().replace(b"poison", b"fixed"))))
    assert res.replayed and res.messages == 1 and res.outputs == {out: 1}
    assert [m.data() for m in read_n(reader, 1)] == [b"fixed-11"]
    # A second replay does nothing, and says so.
    res2 = asyncio.run(do_replay(lambda m: m.data()))
    assert not res2.replayed and "already replayed" in res2.message and res2.txn_id == res.txn_id
    assert read_until_sentinel(official, reader, out) == []
    # Replaying a batch that was never parked is a clear error.
    committed = next(r for r in records if r.kind == "COMMITTED")
    with pytest.raises(ReplayError, match="no parked messages"):
        _replay_id(broker, committed.batch_id, ledger)


def _replay_id(broker, batch_id, ledger):
    async def go():
        async with txn.AsyncClient(broker.service_url) as client:
            return await replay_batch(client, batch_id, ledger, handler=lambda m: m.data())

    return asyncio.run(go())


def test_multi_topic_outputs_commit_together(broker, official, unique_name):
    inp, out, ledger = _names(unique_name)
    side = f"persistent://public/default/{unique_name('side')}"
    _fill(official, inp, [f"x{i}".encode() for i in range(12)])
    r_out = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    r_side = official.subscribe(side, "r", initial_position=pulsar.InitialPosition.Earliest)

    def handler(m):
        return [Output(m.data()), Output(m.data() + b"-side", topic=side, properties={"k": "v"})]

    stats, records = _run(broker, handler, [inp], out, ledger, batch_max_messages=5)
    assert sorted(m.data() for m in read_n(r_out, 12)) == sorted(f"x{i}".encode() for i in range(12))
    side_msgs = read_n(r_side, 12)
    assert sorted(m.data() for m in side_msgs) == sorted(f"x{i}-side".encode() for i in range(12))
    assert all(m.properties() == {"k": "v"} for m in side_msgs)
    committed = [r for r in records if r.kind == "COMMITTED"]
    assert sum(r.outputs.get(side, 0) for r in committed) == 12


def test_ledger_record_round_trip():
    rec = LedgerRecord(kind="COMMITTED", job="j", batch_id="j:1:1", txn_id="(0,5)", attempt=2,
                       inputs={"t": ["(1,2,-1,-1)"]}, outputs={"o": 3}, started_at_ms=100, ended_at_ms=150)
    back = LedgerRecord.from_json(rec.to_json())
    assert back == rec and back.duration_ms == 50
    import json

    assert json.loads(rec.to_json())["schema"] == "pulsar-txn.ledger/1"
    with pytest.raises(ValueError):
        LedgerRecord.from_json(b'{"schema":"other/9"}')
    with pytest.raises(ValueError):
        LedgerRecord(kind="BOGUS", job="j", batch_id="b")


def test_a_batch_never_holds_one_message_twice(broker, official, unique_name):
    """Redelivered copies of messages still queued must not enter the same transaction twice.

    (A Shared subscription with fencing off: only there does the broker resend chosen messages
    while their first copies are still queued.)"""
    inp, out, ledger = _names(unique_name)
    _fill(official, inp, [f"d{i}".encode() for i in range(5)])
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", ledger_topic=ledger,
                                   batch_max_messages=50, batch_max_delay_ms=1500,
                                   consumer_type=txn.ConsumerType.Shared, fencing=False)
            proc = AsyncProcessor(client, lambda m: m.data(), conf)
            await proc.start()
            deadline = asyncio.get_running_loop().time() + 20
            while len(proc.consumer.receive_queue) < 5 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            sub = proc.consumer.topic_consumers[0]
            queued = proc.consumer.receive_queue.snapshot()
            sub.redeliver([m.message_id() for m in queued])  # the broker sends them again
            while len(proc.consumer.receive_queue) < 10 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            assert len(proc.consumer.receive_queue) == 10  # two copies of each
            batch = await proc._collect()  # drives the batch loop's steps by hand (per-file SLF ignore)
            await proc._process(batch, "dup-test")
            await proc.close()
            return [m.data() for m in batch]

    batch = asyncio.run(main())
    assert sorted(batch) == [f"d{i}".encode() for i in range(5)]
    assert sorted(m.data() for m in read_n(reader, 5)) == sorted(batch)
    assert read_until_sentinel(official, reader, out) == []
