"""``MessageBatch`` side by side with the official client, on real batched entries: the payload
the admin API returns for an entry (``GET .../ledger/{l}/entry/{e}``) parsed by both."""

from __future__ import annotations

import urllib.request
import uuid
from types import ModuleType
from typing import Any

import pulsar
import pytest
from conftest import Broker

import txn
from txn.errors import ProtocolError
from txn.protocol import encode_entry, pb

CLIENTS = {"official": pulsar, "ours": txn}


def _entry(admin_url: str, topic: str, ledger: int, entry: int) -> tuple[bytes, int]:
    """An entry's batch payload and its message count, from the admin API."""
    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{admin_url}/admin/v2/{path}/ledger/{ledger}/entry/{entry}", timeout=10) as r:
        return r.read(), int(r.headers["X-Pulsar-num-batch-message"])


def _fields(m: Any) -> tuple[Any, ...]:
    i = m.message_id()
    return (m.data(), m.properties(), m.partition_key(), m.ordering_key(), m.event_timestamp(),
            m.publish_timestamp(), m.topic_name(), m.redelivery_count(), m.producer_name(),
            (i.ledger_id(), i.entry_id(), i.partition(), i.batch_index()), str(i))


def _produce_batch(m: ModuleType, service_url: str, topic: str) -> Any:
    """Three messages in one batch (properties, keys, an event time, an empty payload)."""
    client = m.Client(service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                          batching_max_publish_delay_ms=5000)
        ids: list[Any] = []
        producer.send_async(b"first", lambda _r, mid: ids.append(mid), properties={"n": "0", "kind": "x"},
                            partition_key="k0")
        producer.send_async(b"", lambda _r, mid: ids.append(mid), event_timestamp=1234567)
        producer.send_async(b"third", lambda _r, mid: ids.append(mid), properties={"n": "2"}, partition_key="k2")
        producer.flush()
        assert len(ids) == 3
        return ids[0]
    finally:
        client.close()


@pytest.mark.parametrize("producer_side", CLIENTS)
def test_parse_a_real_batched_entry(producer_side: str, broker: Broker) -> None:
    topic = f"persistent://public/default/message-batch-{uuid.uuid4().hex[:12]}"
    first = _produce_batch(CLIENTS[producer_side], broker.service_url, topic)
    payload, count = _entry(broker.admin_url, topic, first.ledger_id(), first.entry_id())
    assert count == 3
    official = pulsar.MessageBatch().with_message_id(
        pulsar.MessageId(-1, first.ledger_id(), first.entry_id(), -1)).parse_from(payload, count)
    ours = txn.MessageBatch().with_message_id(
        txn.MessageId(-1, first.ledger_id(), first.entry_id(), -1)).parse_from(payload, count)
    assert [_fields(m) for m in ours] == [_fields(m) for m in official]
    assert [(m.data(), m.properties(), m.partition_key(), m.event_timestamp()) for m in ours] == [
        (b"first", {"n": "0", "kind": "x"}, "k0", 0), (b"", {}, "", 1234567), (b"third", {"n": "2"}, "k2", 0)]
    assert [m.message_id().batch_index() for m in ours] == [0, 1, 2]


def test_without_an_id_and_fewer_than_all() -> None:
    payload = (encode_entry(pb.SingleMessageMetadata(payload_size=3, ordering_key=b"ok", sequence_id=7), b"abc")
               + encode_entry(pb.SingleMessageMetadata(payload_size=2), b"de"))
    for size in (2, 1, 0):
        official = pulsar.MessageBatch().parse_from(payload, size)
        ours = txn.MessageBatch().parse_from(payload, size)
        assert [_fields(m) for m in ours] == [_fields(m) for m in official]
        assert len(ours) == size
    assert txn.MessageBatch().parse_from(payload, 1)[0].ordering_key() == "ok"


def test_bad_arguments() -> None:
    for m in CLIENTS.values():
        with pytest.raises(TypeError, match="unknown message id type"):
            m.MessageBatch().with_message_id("(1,2,-1,-1)")
        with pytest.raises(TypeError):
            m.MessageBatch().parse_from(b"", -1)
        with pytest.raises(TypeError):
            m.MessageBatch().parse_from(b"", "1")
    # More messages asked for than the payload holds: the official client reads past the end (an
    # empty message); ours refuses.
    payload = encode_entry(pb.SingleMessageMetadata(payload_size=1), b"a")
    with pytest.raises(ProtocolError, match="truncated"):
        txn.MessageBatch().parse_from(payload, 2)
