"""Chunked messages (issue 19): a producer with ``chunking_enabled`` splits a message larger than the
broker's ``max_message_size`` (5 MB here) into chunks, one entry each; consumers reassemble them.
Ours reads the official producer's chunked messages whole, acknowledges, negatively acknowledges
and redelivers them whole; the official consumer reads ours whole; both refuse batching with
chunking."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
import txn.asyncio
from txn.admin import admin_request, create_partitioned_topic, topic_path
from txn.consumer.chunks import ChunkBuffer
from txn.message import ChunkMessageId, MessageId
from txn.protocol import pb

MB = 1024 * 1024


@pytest.fixture
def clients(broker: Any) -> Iterator[tuple[Any, txn.Client]]:
    """(official client, ours), both on the test broker."""
    theirs = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    ours = txn.Client(broker.service_url)
    try:
        yield theirs, ours
    finally:
        ours.close()
        theirs.close()


@pytest.fixture
def topic(unique_name: Callable[[str], str]) -> str:
    return f"persistent://public/default/{unique_name('chunk')}"


def _backlog(broker: Any, topic: str, sub: str) -> int:
    status, body = admin_request("GET", broker.admin_url, f"/admin/v2/{topic_path(topic)}/stats")
    assert status == 200, body
    return int(body["subscriptions"][sub]["msgBacklog"])


def _wait_backlog(broker: Any, topic: str, sub: str, want: int) -> int:
    deadline = time.monotonic() + 10
    while (n := _backlog(broker, topic, sub)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return n


def test_official_chunked_messages_read_whole_in_order(clients: tuple[Any, txn.Client], topic: str,
                                                       broker: Any) -> None:
    """Several chunked messages between normal ones, and two producers' chunks interleaved: each
    message whole and byte-equal, each producer's in order; its id is the official chunk id."""
    theirs, ours = clients
    c = ours.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    q = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    big = [os.urandom(12 * MB), os.urandom(6 * MB)]
    sent = [b"a", big[0], b"b", big[1], b"c"]
    ids = [p.send(x) for x in sent]
    # Two producers at once: their chunks interleave in the topic.
    other = [os.urandom(11 * MB), b"d", os.urandom(7 * MB)]
    done: list[Any] = []
    for x in other:
        q.send_async(x, lambda res, mid: done.append(res))
        p.send_async(x[::-1], lambda res, mid: done.append(res))
    p.flush()
    q.flush()
    got = [c.receive(timeout_millis=20000) for _ in range(len(sent) + 2 * len(other))]
    first = got[:len(sent)]
    assert [m.data() for m in first] == sent
    assert [str(m.message_id()) for m in first] == [str(i) for i in ids]  # "first;last" for a chunked one
    assert isinstance(first[1].message_id(), ChunkMessageId) and len(first[1].message_id().chunk_ids) == 3
    assert [m.producer_name() for m in first] == [p.producer_name()] * len(sent)
    rest = got[len(sent):]
    assert [m.data() for m in rest if m.producer_name() == q.producer_name()] == other
    assert [m.data() for m in rest if m.producer_name() == p.producer_name()] == [x[::-1] for x in other]
    for m in got:
        c.acknowledge(m)
    c.close()
    assert _wait_backlog(broker, topic, "s", 0) == 0


def test_acknowledge_removes_every_chunk(clients: tuple[Any, txn.Client], topic: str, broker: Any) -> None:
    theirs, ours = clients
    c = ours.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    p.send(os.urandom(12 * MB))
    assert _wait_backlog(broker, topic, "s", 3) == 3  # three chunk entries
    m = c.receive(timeout_millis=20000)
    c.acknowledge(m.message_id())  # by id: every chunk entry
    c.close()
    assert _wait_backlog(broker, topic, "s", 0) == 0


@pytest.mark.parametrize("kind", [txn.ConsumerType.Shared, txn.ConsumerType.Exclusive], ids=["shared", "exclusive"])
def test_negative_ack_brings_the_whole_message_back(clients: tuple[Any, txn.Client], topic: str, broker: Any,
                                                    kind: txn.ConsumerType) -> None:
    theirs, ours = clients
    c = ours.subscribe(topic, "s", consumer_type=kind, initial_position=txn.InitialPosition.Earliest,
                       negative_ack_redelivery_delay_ms=100)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    payload = os.urandom(12 * MB)
    p.send(payload)
    p.send(b"after")
    m = c.receive(timeout_millis=20000)
    assert m.data() == payload
    c.negative_acknowledge(m)
    seen = []
    for _ in range(3):
        try:
            seen.append(c.receive(timeout_millis=5000))
        except txn.Timeout:
            break
    again = [x for x in seen if x.data() == payload]
    assert len(again) == 1
    if kind == txn.ConsumerType.Shared:  # the broker counts redeliveries of shared subscriptions only
        assert again[0].redelivery_count() >= 1
    assert str(again[0].message_id()) == str(m.message_id())
    for x in seen:
        c.acknowledge(x)
    c.close()
    assert _wait_backlog(broker, topic, "s", 0) == 0


def test_consumer_closed_before_ack_gets_it_again(clients: tuple[Any, txn.Client], topic: str) -> None:
    theirs, ours = clients
    c = ours.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    payload = os.urandom(12 * MB)
    p.send(payload)
    assert c.receive(timeout_millis=20000).data() == payload
    c.close()
    c = ours.subscribe(topic, "s")
    m = c.receive(timeout_millis=20000)
    assert m.data() == payload
    c.acknowledge(m)


def test_ack_timeout_redelivers_every_chunk(clients: tuple[Any, txn.Client], topic: str) -> None:
    """A Shared consumer's ack timeout names the last chunk's entry; every chunk comes back."""
    theirs, ours = clients
    c = ours.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared,
                       initial_position=txn.InitialPosition.Earliest, unacked_messages_timeout_ms=10000)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    payload = os.urandom(12 * MB)
    p.send(payload)
    m = c.receive(timeout_millis=20000)
    again = c.receive(timeout_millis=20000)
    assert again.data() == payload and str(again.message_id()) == str(m.message_id())
    c.acknowledge(again)


def test_zero_queue_consumer_and_reader(clients: tuple[Any, txn.Client], topic: str) -> None:
    theirs, ours = clients
    c = ours.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest, receiver_queue_size=0)
    # Never acks: the readers re-read what "s" acked, which retention none may delete.
    theirs.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=0)
    p = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    sent = [os.urandom(6 * MB), b"x", os.urandom(11 * MB)]
    for x in sent:
        p.send(x)
    ids = []
    for x in sent:
        m = c.receive()
        assert m.data() == x
        ids.append(m.message_id())
        c.acknowledge(m)
    r = ours.create_reader(topic, txn.MessageId.earliest)
    assert [r.read_next(20000).data() for _ in sent] == sent
    assert not r.has_message_available()
    r = ours.create_reader(topic, ids[1])  # after "x": the last chunked message
    assert r.read_next(20000).data() == sent[2]
    r.close()
    r = ours.create_reader(topic, ids[0])  # after the first chunked message (its last chunk)
    assert r.read_next(20000).data() == sent[1]
    r.close()
    r = ours.create_reader(topic, ids[2], start_message_id_inclusive=True)  # from its first chunk
    assert r.read_next(20000).data() == sent[2]
    r.close()


@pytest.mark.parametrize("compression", [txn.CompressionType.NONE, txn.CompressionType.LZ4])
def test_ours_produce_chunked_and_the_official_consumer_reads_them(clients: tuple[Any, txn.Client], topic: str,
                                                                   compression: txn.CompressionType) -> None:
    """``chunking_enabled=True`` (batching then defaults to off); the send's receipt is the chunk id."""
    theirs, ours = clients
    c_theirs = theirs.subscribe(topic, "theirs", initial_position=pulsar.InitialPosition.Earliest)
    c_ours = ours.subscribe(topic, "ours", initial_position=txn.InitialPosition.Earliest)
    p = ours.create_producer(topic, chunking_enabled=True, compression_type=compression)
    # Half random: compressed, still more than 5 MB.
    payloads = [os.urandom(7 * MB) + bytes(5 * MB), b"small", os.urandom(6 * MB)]
    ids = [p.send(x) for x in payloads]
    assert isinstance(ids[0], ChunkMessageId) and len(ids[0].chunk_ids) >= 2
    assert not isinstance(ids[1], ChunkMessageId)
    for side in (c_theirs, c_ours):
        got = [side.receive(timeout_millis=20000) for _ in payloads]
        assert [m.data() for m in got] == payloads
        assert [str(m.message_id()) for m in got] == [str(i) for i in ids]
        for m in got:
            side.acknowledge(m)


def test_chunking_with_batching_raises_value_error(clients: tuple[Any, txn.Client], topic: str,
                                                   broker: Any) -> None:
    theirs, ours = clients
    for client in (theirs, ours):
        with pytest.raises(ValueError, match="Batching and chunking"):
            client.create_producer(topic, chunking_enabled=True, batching_enabled=True)

    async def go() -> None:
        client = txn.asyncio.Client(broker.service_url)
        try:
            with pytest.raises(ValueError, match="Batching and chunking"):
                await client.create_producer(topic, chunking_enabled=True)  # batching on by default there
            producer = await client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
            consumer = await client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
            payload = os.urandom(6 * MB)
            await producer.send(payload)
            m = await consumer.receive()
            assert m.data() == payload
            await consumer.acknowledge(m)
        finally:
            await client.close()

    asyncio.run(go())


def test_partitioned_topic(clients: tuple[Any, txn.Client], topic: str, broker: Any) -> None:
    theirs, ours = clients
    create_partitioned_topic(broker.admin_url, topic, 2)
    c = ours.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    p_theirs = theirs.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    p_ours = ours.create_producer(topic, chunking_enabled=True)
    sent = {os.urandom(6 * MB) for _ in range(2)} | {b"x", b"y"}
    for i, x in enumerate(sorted(sent)):
        (p_theirs if i % 2 else p_ours).send(x)
    got = [c.receive(timeout_millis=20000) for _ in sent]
    assert {m.data() for m in got} == sent
    assert {m.message_id().partition() for m in got if len(m.data()) > MB} <= {0, 1}
    for m in got:
        c.acknowledge(m)


# ------------------------------------------------------------ the buffer alone (no broker)


def _meta(uuid: str, chunk: int, n: int = 2, publish_time: int | None = None) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_time or int(time.time() * 1000),
                              uuid=uuid, chunk_id=chunk, num_chunks_from_msg=n, total_chunk_msg_size=2 * n)


@pytest.mark.parametrize("auto_ack", [False, True])
def test_max_pending_chunked_message_drops_the_oldest(auto_ack: bool) -> None:
    buf = ChunkBuffer(max_pending=1, auto_ack_oldest=auto_ack)
    a0, b0, b1, a1 = (MessageId(-1, 1, e) for e in range(4))
    assert buf.add(a0, _meta("a", 0), b"a0").to_ack == []
    dropped = buf.add(b0, _meta("b", 0), b"b0")
    assert dropped.to_ack == ([a0] if auto_ack else [])
    done = buf.add(b1, _meta("b", 1), b"b1")
    assert done.payload == b"b0b1" and done.message_id is not None and done.message_id.chunk_ids == (b0, b1)
    lost = buf.add(a1, _meta("a", 1), b"a1")  # its first chunk is gone: not assembled
    assert lost.payload is None and lost.to_ack == []


def test_duplicate_first_chunk_restarts_and_expired_chunks_are_acked() -> None:
    buf = ChunkBuffer(expire_ms=1000)
    c0, c1 = MessageId(-1, 1, 0), MessageId(-1, 1, 1)
    buf.add(c0, _meta("u", 0), b"x0")
    assert buf.add(c0, _meta("u", 0), b"x0").to_ack == []  # redelivered: restart, nothing acked
    assert buf.add(c1, _meta("u", 1), b"x1").payload == b"x0x1"
    old = int(time.time() * 1000) - 5000
    assert buf.add(c1, _meta("v", 1, publish_time=old), b"y1").to_ack == [c1]  # no first chunk, expired
