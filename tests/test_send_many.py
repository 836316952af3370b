"""``AsyncProducer.send_many``: many messages, one future per batch they went into.

What the processor sends its outputs with. Each test writes with ``send_many`` on a real broker
and reads back with the official client: the same messages, in order, with their properties and
keys, on the same partitions as ``send_async`` puts them; inside a transaction they appear on
commit only.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pulsar
import pytest
from conftest import Broker

import txn
from txn.admin import create_partitioned_topic

pytestmark = pytest.mark.timeout(300)


def _topic(name: str) -> str:
    return f"persistent://public/default/send-many-{name}-{uuid.uuid4().hex[:8]}"


def _read_all(url: str, topic: str, n: int) -> list[Any]:
    """The first ``n`` messages of ``topic`` (official client, a subscription that never acks)."""
    client = pulsar.Client(url)
    try:
        consumer = client.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}",
                                    initial_position=pulsar.InitialPosition.Earliest)
        out = [consumer.receive(timeout_millis=30000) for _ in range(n)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
        return out
    finally:
        client.close()


def _hold(url: str, topic: str) -> pulsar.Client:
    """A subscription made before the sends that never acks: the topic keeps what they wrote."""
    client = pulsar.Client(url)
    client.subscribe(topic, "hold", initial_position=pulsar.InitialPosition.Earliest)
    return client


def test_one_future_per_batch_in_order(broker: Broker) -> None:
    """1000 messages with batches of 100: 10 futures, each the id of its batch's first message
    (batch index 0, 100 messages in the entry, entries in order); read back in order with their
    properties and keys."""
    topic = _topic("order")
    hold = _hold(broker.service_url, topic)

    async def main() -> list[txn.MessageId]:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(topic, batching_max_messages=100, batching_max_publish_delay_ms=10000)
            msgs = [(f"m-{i}".encode(), {"i": str(i)} if i % 7 == 0 else None, f"k{i % 3}" if i % 5 == 0 else None)
                    for i in range(1000)]
            futs = await p.send_many(msgs)
            p.flush_now()
            ids = list(await asyncio.gather(*futs))
            await p.close()
            return ids

    try:
        ids = asyncio.run(main())
        assert len(ids) == 10
        assert [i.batch_index() for i in ids] == [0] * 10
        assert [i.batch_size for i in ids] == [100] * 10
        entries = [(i.ledger_id(), i.entry_id()) for i in ids]
        assert entries == sorted(entries) and len(set(entries)) == 10
        got = _read_all(broker.service_url, topic, 1000)
        assert [m.data() for m in got] == [f"m-{i}".encode() for i in range(1000)]
        assert [m.properties() for m in got] == [{"i": str(i)} if i % 7 == 0 else {} for i in range(1000)]
        assert [m.partition_key() for m in got] == [f"k{i % 3}" if i % 5 == 0 else "" for i in range(1000)]
        assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got[::100]] == entries
    finally:
        hold.close()


def test_inside_a_transaction_commit_and_abort(broker: Broker) -> None:
    """Sent in a committed transaction: all of them, in order; in an aborted one: none."""
    topic = _topic("txn")
    hold = _hold(broker.service_url, topic)

    async def main() -> None:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(topic)
            aborted = await client.new_transaction()
            await asyncio.gather(*await p.send_many([(b"gone-%d" % i, None, None) for i in range(300)], aborted))
            await aborted.abort()
            t = await client.new_transaction()
            futs = await p.send_many([(b"kept-%d" % i, None, None) for i in range(300)], t)
            p.flush_now()
            await asyncio.gather(*futs)
            await t.commit()
            await p.close()

    try:
        asyncio.run(main())
        assert [m.data() for m in _read_all(broker.service_url, topic, 300)] == [b"kept-%d" % i for i in range(300)]
    finally:
        hold.close()


def test_mixed_with_send_async_and_unbatched(broker: Broker) -> None:
    """``send_async`` before and after keeps its own future and id; the order holds across both.
    On a producer with batching off every message is its own entry with its own future."""
    topic, plain = _topic("mixed"), _topic("plain")
    holds = [_hold(broker.service_url, topic), _hold(broker.service_url, plain)]

    async def main() -> tuple[list[txn.MessageId], list[txn.MessageId]]:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(topic, batching_max_publish_delay_ms=10000)
            first = await p.send_async(b"a")
            many = await p.send_many([(b"b", None, None), (b"c", None, None)])
            last = await p.send_async(b"d")
            p.flush_now()
            ids = [await first, *await asyncio.gather(*many), await last]
            q = await client.create_producer(plain, batching_enabled=False)
            unbatched = await asyncio.gather(*await q.send_many([(b"x%d" % i, None, None) for i in range(5)]))
            await p.close()
            await q.close()
            return ids, list(unbatched)

    try:
        ids, unbatched = asyncio.run(main())
        # one entry of four: a, b (the shared future: the first of the call), d
        assert [(i.entry_id(), i.batch_index()) for i in ids] == [(ids[0].entry_id(), k) for k in (0, 1, 3)]
        assert [m.data() for m in _read_all(broker.service_url, topic, 4)] == [b"a", b"b", b"c", b"d"]
        assert len(unbatched) == 5 and len({(i.ledger_id(), i.entry_id()) for i in unbatched}) == 5
        assert [i.batch_index() for i in unbatched] == [-1] * 5
        assert [m.data() for m in _read_all(broker.service_url, plain, 5)] == [b"x%d" % i for i in range(5)]
    finally:
        for h in holds:
            h.close()


def test_keys_land_on_the_partitions_send_async_picks(broker: Broker) -> None:
    """On a 4-partition topic each keyed message goes where ``send_async`` sends the same key."""
    many_topic, one_topic = _topic("keys-many"), _topic("keys-one")
    for t in (many_topic, one_topic):
        create_partitioned_topic(broker.admin_url, t, 4)
    holds = [_hold(broker.service_url, many_topic), _hold(broker.service_url, one_topic)]
    keys = [f"key-{i}" for i in range(40)]

    async def main() -> int:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(many_topic, batching_max_publish_delay_ms=10000)
            futs = await p.send_many([(k.encode(), None, k) for k in keys])
            p.flush_now()
            await asyncio.gather(*futs)
            q = await client.create_producer(one_topic)
            await asyncio.gather(*[await q.send_async(k.encode(), partition_key=k) for k in keys])
            await p.close()
            await q.close()
            return len(futs)

    try:
        frames = asyncio.run(main())
        assert 1 < frames <= 4  # one batch per partition the keys hash to

        def where(topic: str) -> dict[str, str]:
            return {m.partition_key(): m.topic_name().rsplit("-partition-", 1)[1]
                    for m in _read_all(broker.service_url, topic, len(keys))}

        assert where(many_topic) == where(one_topic)
    finally:
        for h in holds:
            h.close()


def test_bad_message_raises_after_queueing_the_ones_before(broker: Broker) -> None:
    """A message with properties that are not a dict raises ``ValueError``; the ones before it
    are queued and sent, nothing after it; a closed producer raises ``AlreadyClosed``."""
    topic = _topic("bad")
    hold = _hold(broker.service_url, topic)

    async def main() -> None:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(topic)
            msgs: list[Any] = [(b"ok-0", None, None), (b"ok-1", None, None), (b"bad", "x=1", None),
                               (b"after", None, None)]
            with pytest.raises(ValueError, match="properties"):
                await p.send_many(msgs)
            await p.flush()
            await p.close()
            with pytest.raises(txn.AlreadyClosed):
                await p.send_many([(b"late", None, None)])

    try:
        asyncio.run(main())
        assert [m.data() for m in _read_all(broker.service_url, topic, 2)] == [b"ok-0", b"ok-1"]
    finally:
        hold.close()
