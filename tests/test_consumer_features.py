"""Consumer and producer features side by side with the official ``pulsar-client`` (issue 19,
section 2): each test runs the same calls on both clients and asserts the same outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pulsar
import pytest

import txn


@pytest.fixture
def clients(broker: Any) -> Iterator[dict[str, Any]]:
    """``{"pulsar": official client, "txn": ours}``, both on the test broker."""
    theirs = pulsar.Client(broker.service_url)
    ours = txn.Client(broker.service_url)
    try:
        yield {"pulsar": theirs, "txn": ours}
    finally:
        ours.close()
        theirs.close()


BOTH = ["pulsar", "txn"]


def _produce(client: Any, topic: str, n: int, gap_s: float = 0.0) -> list[Any]:
    """Send ``m0``..``m{n-1}`` unbatched; return their (id, publish time) pairs."""
    p = client.create_producer(topic, batching_enabled=False)
    out = []
    for i in range(n):
        out.append(p.send(f"m{i}".encode()))
        if gap_s:
            time.sleep(gap_s)
    p.close()
    return out


def _drain(receive: Callable[[int], Any], timeout_ms: int = 1500) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(receive(timeout_ms).data())
        except Exception as exc:  # both clients' Timeout
            assert "imeout" in type(exc).__name__ or "imeout" in str(exc), exc
            return got


def _mid(side: str, mid: Any) -> Any:
    """The same id in the other client's type (by its serialized bytes)."""
    cls = pulsar.MessageId if side == "pulsar" else txn.MessageId
    return cls.deserialize(mid.serialize())


# ====================================================================== seek


@pytest.mark.parametrize("side", BOTH)
def test_consumer_seek_by_message_id(clients: dict[str, Any], topic: str, side: str) -> None:
    c = clients[side]
    consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest
                           if side == "pulsar" else txn.InitialPosition.Earliest)
    # Never acks: the seek back re-reads what "s" acked, which retention none may delete.
    clients["pulsar"].subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    ids = _produce(c, topic, 6)
    got = [consumer.receive(5000) for _ in range(6)]
    for m in got:
        consumer.acknowledge(m)
    consumer.seek(_mid(side, ids[2]))
    # The official client resumes after the id sought (start_message_id_inclusive=False).
    assert _drain(consumer.receive) == [b"m3", b"m4", b"m5"]
    consumer.seek(pulsar.MessageId.earliest if side == "pulsar" else txn.MessageId.earliest)
    assert _drain(consumer.receive) == [f"m{i}".encode() for i in range(6)]
    consumer.close()


@pytest.mark.parametrize("side", BOTH)
def test_consumer_seek_drops_queued_messages(clients: dict[str, Any], topic: str, side: str) -> None:
    """Messages received into the queue but not yet taken are not handed out after a seek."""
    c = clients[side]
    pos = pulsar.InitialPosition.Earliest if side == "pulsar" else txn.InitialPosition.Earliest
    ids = _produce(c, topic, 10)
    consumer = c.subscribe(topic, "s", initial_position=pos)
    assert consumer.receive(5000).data() == b"m0"
    time.sleep(0.5)  # the rest arrives in the receive queue
    consumer.seek(_mid(side, ids[7]))
    assert _drain(consumer.receive) == [b"m8", b"m9"]
    consumer.close()


@pytest.mark.parametrize("side", BOTH)
def test_consumer_seek_by_publish_time(clients: dict[str, Any], topic: str, side: str) -> None:
    c = clients[side]
    pos = pulsar.InitialPosition.Earliest if side == "pulsar" else txn.InitialPosition.Earliest
    consumer = c.subscribe(topic, "s", initial_position=pos)
    # Never acks: the seek back re-reads what "s" acked, which retention none may delete.
    clients["pulsar"].subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    _produce(c, topic, 4, gap_s=0.05)
    got = [consumer.receive(5000) for _ in range(4)]
    for m in got:
        consumer.acknowledge(m)
    consumer.seek(got[2].publish_timestamp())
    assert _drain(consumer.receive) == [b"m2", b"m3"]
    consumer.seek(0)
    assert _drain(consumer.receive) == [b"m0", b"m1", b"m2", b"m3"]
    consumer.close()


@pytest.mark.parametrize("side", BOTH)
def test_reader_seek_by_message_id_and_publish_time(clients: dict[str, Any], topic: str, side: str) -> None:
    c = clients[side]
    ids = _produce(c, topic, 5, gap_s=0.05)
    earliest = pulsar.MessageId.earliest if side == "pulsar" else txn.MessageId.earliest
    reader = c.create_reader(topic, earliest)
    got = [reader.read_next(30000) for _ in range(5)]
    assert [m.data() for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    reader.seek(_mid(side, ids[1]))
    first = _drain(reader.read_next)
    reader.seek(got[3].publish_timestamp())
    second = _drain(reader.read_next)
    reader.close()
    # What the official client does (asserted for both):
    assert first == [b"m2", b"m3", b"m4"]
    assert second == [b"m3", b"m4"]


def test_seek_arguments_are_checked_like_the_official_client(clients: dict[str, Any], topic: str) -> None:
    for side in BOTH:
        consumer = clients[side].subscribe(topic, f"s-{side}")
        with pytest.raises(ValueError):
            consumer.seek("abc")
        consumer.close()


def test_async_consumer_and_reader_seek(broker: Any, topic: str) -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        async with txn.AsyncClient(broker.service_url) as client:
            # Never acks: the seek and the reader re-read what "s" acked, which retention none may delete.
            await client.subscribe(topic, "keep", initial_position=txn.InitialPosition.Earliest)
            producer = await client.create_producer(topic, batching_enabled=False)
            ids = [await producer.send(f"m{i}".encode()) for i in range(4)]
            consumer = await client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
            for _ in range(4):
                consumer.acknowledge(await consumer.receive(30000))
            await consumer.seek(ids[1])
            a = [(await consumer.receive(30000)).data() for _ in range(2)]
            reader = await client.create_reader(topic, txn.MessageId.earliest)
            for _ in range(4):
                await reader.read_next(30000)
            await reader.seek(ids[2])
            b = [(await reader.read_next(30000)).data() for _ in range(1)]
            await consumer.close()
            await reader.close()
            return a, b

    a, b = asyncio.run(main())
    assert a == [b"m2", b"m3"]
    assert b == [b"m3"]


# ====================================================================== deliver_at / deliver_after


def _shared(side: str) -> Any:
    return pulsar.ConsumerType.Shared if side == "pulsar" else txn.ConsumerType.Shared


@pytest.mark.parametrize("side", BOTH)
@pytest.mark.parametrize("how", ["deliver_after", "deliver_at"])
def test_delayed_delivery_to_a_shared_subscription(clients: dict[str, Any], topic: str, side: str,
                                                    how: str) -> None:
    """A delayed message reaches a Shared consumer no earlier than its time; the one sent after
    it without a delay comes first. Batching on: a delayed message is sent on its own."""
    c = clients[side]
    consumer = c.subscribe(topic, "s", consumer_type=_shared(side))
    producer = c.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
    delay_ms = 2500
    sent = int(time.time() * 1000)
    if how == "deliver_after":
        producer.send(b"late", deliver_after=timedelta(milliseconds=delay_ms))
    else:
        producer.send(b"late", deliver_at=sent + delay_ms)
    producer.send(b"now")
    first = consumer.receive(5000)
    assert first.data() == b"now"
    consumer.acknowledge(first)
    late = consumer.receive(10000)
    arrived = int(time.time() * 1000)
    assert late.data() == b"late"
    assert arrived >= sent + delay_ms
    consumer.acknowledge(late)
    producer.close()
    consumer.close()


def test_delayed_delivery_arguments_are_checked_like_the_official_client(clients: dict[str, Any],
                                                                         topic: str) -> None:
    for side in BOTH:
        producer = clients[side].create_producer(topic)
        for kwargs in ({"deliver_at": "soon"}, {"deliver_after": 5}):
            with pytest.raises(ValueError):
                producer.send(b"x", **kwargs)
            with pytest.raises(ValueError):
                producer.send_async(b"x", None, **kwargs)
        producer.close()


def test_async_producer_deliver_after(broker: Any, topic: str) -> None:
    async def main() -> tuple[int, int]:
        async with txn.AsyncClient(broker.service_url) as client:
            consumer = await client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared)
            producer = await client.create_producer(topic)
            sent = int(time.time() * 1000)
            await producer.send(b"late", deliver_after=timedelta(seconds=2))
            m = await consumer.receive(10000)
            arrived = int(time.time() * 1000)
            consumer.acknowledge(m)
            await producer.close()
            await consumer.close()
            return sent, arrived

    sent, arrived = asyncio.run(main())
    assert arrived >= sent + 2000


# ====================================================================== dead-letter policy


def _dlq_policy(side: str, *args: Any, **kwargs: Any) -> Any:
    cls = pulsar.ConsumerDeadLetterPolicy if side == "pulsar" else txn.ConsumerDeadLetterPolicy
    return cls(*args, **kwargs)


@pytest.mark.parametrize("side", BOTH)
def test_dead_letter_policy_defaults(clients: dict[str, Any], topic: str, side: str) -> None:
    """After ``max_redeliver_count`` redeliveries a nacked message goes to ``<topic>-<sub>-DLQ``
    with its properties, key, ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``, and is acknowledged."""
    c = clients[side]
    earliest = pulsar.InitialPosition.Earliest if side == "pulsar" else txn.InitialPosition.Earliest
    consumer = c.subscribe(topic, "s", consumer_type=_shared(side), negative_ack_redelivery_delay_ms=200,
                           dead_letter_policy=_dlq_policy(side, 2))
    dlq = c.subscribe(f"{topic}-s-DLQ", "peek", initial_position=earliest)
    producer = c.create_producer(topic, batching_enabled=False)
    mid = producer.send(b"x", properties={"a": "1"}, partition_key="k")
    counts = []
    try:
        while len(counts) < 6:  # bounded: without a dead-letter policy it would come forever
            m = consumer.receive(3000)
            counts.append(m.redelivery_count())
            consumer.negative_acknowledge(m)
    except Exception as exc:
        assert "imeout" in type(exc).__name__ or "imeout" in str(exc), exc
    assert counts == [0, 1, 2]
    dead = dlq.receive(5000)
    assert dead.data() == b"x"
    assert dead.partition_key() == "k"
    assert dead.properties() == {"a": "1", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": str(mid)}
    assert dead.topic_name() == f"{topic}-s-DLQ"
    consumer.close()  # the dead letter was acknowledged: a new consumer gets nothing
    again = c.subscribe(topic, "s", consumer_type=_shared(side))
    assert _drain(again.receive) == []
    for x in (again, dlq, producer):
        x.close()


@pytest.mark.parametrize("side", BOTH)
def test_dead_letter_topic_and_initial_subscription(clients: dict[str, Any], topic: str, side: str) -> None:
    c = clients[side]
    dlq_topic = f"{topic}-dead"
    policy = _dlq_policy(side, 1, dead_letter_topic=dlq_topic, initial_subscription_name="init")
    assert (policy.max_redeliver_count, policy.dead_letter_topic, policy.initial_subscription_name) == (
        1, dlq_topic, "init")
    consumer = c.subscribe(topic, "s", consumer_type=_shared(side), negative_ack_redelivery_delay_ms=100,
                           dead_letter_policy=policy)
    producer = c.create_producer(topic, batching_enabled=False)
    producer.send(b"y")
    for _ in range(2):
        consumer.negative_acknowledge(consumer.receive(5000))
    time.sleep(1.0)
    init = c.subscribe(dlq_topic, "init")  # created before the dead letter was sent: it is there
    assert init.receive(5000).data() == b"y"
    for x in (init, consumer, producer):
        x.close()


def test_dead_letter_policy_arguments_like_the_official_client() -> None:
    for side in BOTH:
        for bad in (0, -1):
            with pytest.raises(ValueError):
                _dlq_policy(side, bad)
        p = _dlq_policy(side, 3)
        assert p.max_redeliver_count == 3
        assert p.dead_letter_topic == ""
        assert p.initial_subscription_name == ""


# ====================================================================== get_last_message_id


@pytest.mark.parametrize("side", BOTH)
def test_consumer_get_last_message_id(clients: dict[str, Any], topic: str, side: str) -> None:
    c = clients[side]
    consumer = c.subscribe(topic, "s")
    ids = _produce(c, topic, 3)
    last = consumer.get_last_message_id()
    assert str(last) == str(ids[-1])
    assert (last.ledger_id(), last.entry_id()) == (ids[-1].ledger_id(), ids[-1].entry_id())
    consumer.close()
