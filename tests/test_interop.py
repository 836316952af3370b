"""Interop without transactions, both directions, with the official client as the peer."""

from __future__ import annotations

import pulsar
import pytest

import txn

from peer import read_n

CODECS = ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _expected(n: int) -> list[tuple[bytes, dict[str, str], str, int]]:
    return [
        (
            (f"payload-{i}-" + "x" * (i * 37 % 900)).encode(),
            {"i": str(i), "kind": "interop"} if i % 3 else {},
            f"key-{i % 7}" if i % 2 else "",
            1_700_000_000_000 + i if i % 4 else 0,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
@pytest.mark.parametrize("codec", CODECS)
def test_ours_to_official(client, official, topic, codec, batching):
    reader = official.subscribe(topic, "r", initial_position=pulsar.InitialPosition.Earliest)
    p = client.create_producer(
        topic, compression_type=getattr(txn.CompressionType, codec), batching_enabled=batching,
        block_if_queue_full=True,
    )
    want = _expected(60)
    results = []
    for data, props, key, ts in want:
        p.send_async(data, lambda r, mid: results.append((r, mid)), properties=props or None,
                     partition_key=key or None, event_timestamp=ts or None)
    p.flush()
    assert len(results) == 60 and all(r is txn.Result.Ok for r, _ in results)
    got = read_n(reader, 60)
    assert [(m.data(), m.properties(), m.partition_key(), m.event_timestamp()) for m in got] == want
    assert len({str(m.message_id()) for m in got}) == 60


@pytest.mark.parametrize("codec", ["LZ4", "ZLIB", "ZSTD", "SNAPPY"])
def test_official_to_ours(client, official, topic, codec):
    ours = client.subscribe(topic, "r", initial_position=txn.InitialPosition.Earliest)
    p = official.create_producer(
        topic,
        compression_type=getattr(pulsar.CompressionType, "ZLib" if codec == "ZLIB" else codec),
        batching_enabled=True,
        batching_max_messages=25,
        batching_max_publish_delay_ms=50,
    )
    want = _expected(60)
    for data, props, key, ts in want:
        kw = {}
        if props:
            kw["properties"] = props
        if key:
            kw["partition_key"] = key
        if ts:
            kw["event_timestamp"] = ts
        p.send_async(data, None, **kw)
    p.flush()
    got = [ours.receive(10000) for _ in range(60)]
    for m in got:
        ours.acknowledge(m)
    assert [(m.data(), m.properties(), m.partition_key(), m.event_timestamp()) for m in got] == want
    # They really were batched: several messages share an entry.
    entries = {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}
    assert len(entries) < 60
    assert all(m.message_id().batch_index() >= 0 for m in got)
    assert [m.topic_name() for m in got] == [topic] * 60


def test_official_unbatched_to_ours_and_redelivery_count(client, official, topic):
    c = client.subscribe(topic, "r", consumer_type=txn.ConsumerType.Shared,
                         initial_position=txn.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=200)
    p = official.create_producer(topic, batching_enabled=False)
    p.send(b"again", properties={"a": "1"})
    m = c.receive(10000)
    assert (m.data(), m.redelivery_count()) == (b"again", 0)
    c.negative_acknowledge(m)
    m2 = c.receive(10000)
    assert (m2.data(), m2.message_id(), m2.redelivery_count()) == (b"again", m.message_id(), 1)
    c.acknowledge(m2)
