"""Chunked messages' ids side by side with the official ``pulsar-client``: ``serialize()`` keeps the
first chunk's position (``first_chunk_message_id``) besides the last's, in the same bytes as the
official client, and both clients read each other's back as the same chunked id; ``seek()`` to a
chunked id (received or deserialized) starts at the message's first chunk, so that the message
itself comes again (inclusive) or what follows it (exclusive). Also: chunking is off on a
non-persistent topic, as in the official client (a message over the broker's limit is
``MessageTooBig``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
from txn.admin import create_partitioned_topic
from txn.message import ChunkMessageId

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


@pytest.fixture(params=["pulsar", "txn"])
def api(request: pytest.FixtureRequest, broker: Any) -> Iterator[tuple[Any, Any]]:
    if request.param == "pulsar":
        mod: Any = pulsar
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    else:
        mod, client = txn, txn.Client(broker.service_url)
    yield mod, client
    client.close()


def _read(reader: Any, n: int) -> list[Any]:
    got = [reader.read_next(20000) for _ in range(n)]
    assert reader.has_message_available() is False
    return got


@pytest.mark.parametrize("partitions", [0, 2])
def test_serialized_chunk_ids_are_the_official_bytes(clients: tuple[Any, txn.Client], broker: Any,
                                                     unique_name: Callable[[str], str], partitions: int) -> None:
    """The same chunked message read by both clients: the same ``serialize()`` bytes (last chunk,
    and first chunk as ``first_chunk_message_id``), each deserialized by the other client as the
    same ``first;last`` id; a plain message's id is unchanged."""
    theirs, ours = clients
    topic = f"persistent://public/default/{unique_name('cid')}"
    if partitions:
        create_partitioned_topic(broker.admin_url, topic, partitions)
    target = f"{topic}-partition-1" if partitions else topic
    producer = theirs.create_producer(target, chunking_enabled=True, batching_enabled=False)
    sent = [b"a", os.urandom(6 * MB), b"b"]
    sent_ids = [producer.send(d) for d in sent]
    their_msgs = _read(theirs.create_reader(topic, pulsar.MessageId.earliest), 3)
    our_msgs = _read(ours.create_reader(topic, txn.MessageId.earliest), 3)
    assert [m.data() for m in our_msgs] == sent
    assert [str(m.message_id()) for m in our_msgs] == [str(m.message_id()) for m in their_msgs]
    big_theirs, big_ours = their_msgs[1].message_id(), our_msgs[1].message_id()
    assert isinstance(big_ours, ChunkMessageId)
    assert str(big_ours) == str(big_theirs)
    if not partitions:  # (a producer of one partition names none in its ids)
        assert str(big_ours) == str(sent_ids[1])
    assert ";" in str(big_ours)
    for t, o in zip(their_msgs, our_msgs, strict=True):
        assert o.message_id().serialize() == t.message_id().serialize()
    # Each client reads the other's bytes back as the same (chunked) id.
    back = txn.MessageId.deserialize(big_theirs.serialize())
    assert isinstance(back, ChunkMessageId)
    assert str(back) == str(big_theirs)
    assert back == big_ours
    assert back.first_chunk_message_id() == big_ours.first_chunk_message_id()
    assert back.last_chunk_message_id() == big_ours.last_chunk_message_id()
    assert back.partition() == (1 if partitions else -1)
    assert back.serialize() == big_theirs.serialize()
    theirs_back = pulsar.MessageId.deserialize(big_ours.serialize())
    assert str(theirs_back) == str(big_theirs)
    assert theirs_back == big_theirs
    plain = txn.MessageId.deserialize(their_msgs[0].message_id().serialize())
    assert type(plain) is txn.MessageId
    assert str(plain) == str(their_msgs[0].message_id())


@pytest.mark.parametrize("inclusive", [False, True])
def test_reader_seeks_a_chunked_message_to_its_first_chunk(api: tuple[Any, Any], unique_name: Callable[[str], str],
                                                           inclusive: bool) -> None:
    """Read five messages (two chunked), then seek to the second chunked one, received, and to the
    first, deserialized: inclusive, the message sought comes again whole, then what follows it;
    exclusive, what follows it."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('cseek')}"
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    sent = [b"a", os.urandom(6 * MB), b"b", os.urandom(7 * MB), b"c"]
    for d in sent:
        producer.send(d)
    reader = client.create_reader(topic, mod.MessageId.earliest, start_message_id_inclusive=inclusive)
    got = _read(reader, 5)
    assert [m.data() for m in got] == sent
    first = 3 if inclusive else 4
    reader.seek(got[3].message_id())
    assert [m.data() for m in _read(reader, 5 - first)] == sent[first:]
    first = 1 if inclusive else 2
    reader.seek(mod.MessageId.deserialize(got[1].message_id().serialize()))
    assert [m.data() for m in _read(reader, 5 - first)] == sent[first:]
    reader.close()


def test_consumer_seeks_a_chunked_message(api: tuple[Any, Any], unique_name: Callable[[str], str]) -> None:
    """A consumer's seek to a chunked message's id: what follows the message comes again, whole."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('cseekc')}"
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    sent = [b"a", os.urandom(6 * MB), b"b", os.urandom(7 * MB), b"c"]
    for d in sent:
        producer.send(d)
    consumer = client.subscribe(topic, "s", initial_position=mod.InitialPosition.Earliest)
    got = [consumer.receive(20000) for _ in range(5)]
    assert [m.data() for m in got] == sent
    consumer.seek(got[1].message_id())
    again = [consumer.receive(20000) for _ in range(3)]
    assert [m.data() for m in again] == sent[2:]
    assert [str(m.message_id()) for m in again] == [str(m.message_id()) for m in got[2:]]
    consumer.close()


def test_no_chunking_on_a_non_persistent_topic(api: tuple[Any, Any], unique_name: Callable[[str], str]) -> None:
    """``chunking_enabled`` on a non-persistent topic: a message over the broker's limit is
    ``MessageTooBig``, as without chunking; one under it is sent and received whole. On a
    persistent topic the same message goes in chunks."""
    mod, client = api
    topic = f"non-persistent://public/default/{unique_name('npchunk')}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    # (A non-persistent topic drops what a busy consumer connection cannot take: the small one stays small.)
    small, big = os.urandom(64 * 1024), os.urandom(6 * MB)
    producer.send(small)
    with pytest.raises(mod.MessageTooBig):
        producer.send(big)
    producer.send(b"after")
    assert [consumer.receive(20000).data() for _ in range(2)] == [small, b"after"]
    persistent = f"persistent://public/default/{unique_name('pchunk')}"
    reader = client.create_reader(persistent, mod.MessageId.earliest)
    client.create_producer(persistent, chunking_enabled=True, batching_enabled=False).send(big)
    msg = reader.read_next(20000)
    assert msg.data() == big
    assert ";" in str(msg.message_id())
