"""Bad input gets a clear, typed error at once, and never a hang."""

from __future__ import annotations

import asyncio

import pytest

import txn
from txn.transaction import AsyncTransaction


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url, operation_timeout_seconds=15)
    yield c
    c.close()


@pytest.mark.parametrize(
    "name",
    ["", " padded", "a/b", "a/b/c/d", "http://public/default/x", "persistent://public/default/", "bad name",
     "persistent://pub lic/default/x"],
)
def test_invalid_topic_names(client, name):
    with pytest.raises(txn.InvalidTopicName) as ei:
        client.create_producer(name)
    assert isinstance(ei.value, ValueError)
    with pytest.raises(txn.InvalidTopicName):
        client.subscribe(name, "s")


def test_invalid_service_url():
    with pytest.raises(ValueError, match="invalid service URL"):
        txn.Client("http://127.0.0.1:8080")


def test_connect_refused_is_typed():
    c = txn.Client("pulsar://127.0.0.1:1", operation_timeout_seconds=2, connection_timeout_ms=1000)
    try:
        with pytest.raises((txn.ConnectError, txn.Timeout)):
            c.create_producer("persistent://public/default/x")
    finally:
        c.close()


def test_oversize_message_rejected_and_producer_still_works(client, topic):
    p = client.create_producer(topic)
    with pytest.raises(txn.MessageTooBig) as ei:
        p.send(b"x" * (6 * 1024 * 1024))
    assert ei.value.topic == topic
    assert p.send(b"small").entry_id() >= 0


def test_wrong_payload_types(client, topic):
    p = client.create_producer(topic)
    with pytest.raises(TypeError):
        p.send("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.send(b"x", properties={"a": 1})  # type: ignore[dict-item]


def test_closed_client_producer_consumer(broker, topic):
    c = txn.Client(broker.service_url)
    p = c.create_producer(topic)
    cons = c.subscribe(topic, "s")
    p.close()
    with pytest.raises(txn.AlreadyClosed):
        p.send(b"x")
    with pytest.raises(txn.AlreadyClosed):
        p.send_async(b"x", None)
    cons.close()
    with pytest.raises(txn.AlreadyClosed):
        cons.receive(100)
    with pytest.raises(txn.AlreadyClosed):
        cons.acknowledge(txn.MessageId(ledger_id=1, entry_id=1))
    c.close()
    with pytest.raises(txn.AlreadyClosed):
        c.create_producer(topic)
    with pytest.raises(txn.AlreadyClosed):
        c.subscribe(topic, "s2")
    with pytest.raises(txn.AlreadyClosed):
        c.new_transaction()


def test_blocked_receive_is_woken_by_close(client, topic):
    import threading

    cons = client.subscribe(topic, "s")
    errors = []

    def wait():
        try:
            cons.receive()
        except txn.PulsarError as exc:
            errors.append(exc)

    th = threading.Thread(target=wait)
    th.start()
    cons.close()
    th.join(10)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], txn.AlreadyClosed)


def test_finished_transaction_cannot_be_reused(client, topic):
    p = client.create_producer(topic)
    t = client.new_transaction()
    p.send(b"once", txn=t)
    t.commit()
    with pytest.raises(txn.InvalidTxnStatus) as ei:
        p.send(b"again", txn=t)
    assert ei.value.txn_id == t.id
    with pytest.raises(txn.InvalidTxnStatus):
        t.commit()
    with pytest.raises(txn.InvalidTxnStatus):
        t.abort()
    t2 = client.new_transaction()
    t2.abort()
    with pytest.raises(txn.InvalidTxnStatus):
        p.send(b"x", txn=t2)
    with pytest.raises(txn.InvalidTxnStatus):
        t2.commit()


def test_unknown_transaction_id(client):
    inner = client.async_client

    async def go():
        # Make sure the coordinators are discovered, then commit an id nobody opened.
        await inner.new_transaction()
        ghost = AsyncTransaction(inner.transaction_coordinator, txn.TxnID(0, 987654321), 60000)
        await ghost.commit()

    with pytest.raises(txn.TransactionNotFound) as ei:
        client.bridge.run(go())
    assert ei.value.txn_id == txn.TxnID(0, 987654321)
    assert ei.value.server_error == "TransactionNotFound"


def test_txn_id_parse_errors():
    assert txn.TxnID.parse("(3,44)") == txn.TxnID(3, 44)
    with pytest.raises(ValueError, match="not a transaction id"):
        txn.TxnID.parse("3-44")


def test_bad_arguments(client, topic):
    with pytest.raises(ValueError):
        client.new_transaction(timeout_millis=0)
    with pytest.raises(ValueError):
        client.subscribe(topic, "")
    with pytest.raises(ValueError):
        client.create_producer(topic, max_pending_messages=0)


def test_queue_full_raises_without_blocking(client, topic):
    p = client.create_producer(topic, max_pending_messages=5, batching_enabled=True,
                               batching_max_publish_delay_ms=5000, batching_max_messages=1000)
    for i in range(5):
        p.send_async(f"{i}".encode(), None)
    with pytest.raises(txn.ProducerQueueIsFull) as ei:
        p.send_async(b"6", None)
    assert ei.value.topic == topic
    p.flush()


def test_async_queue_full_raises(broker, topic):
    async def go():
        async with txn.AsyncClient(broker.service_url) as c:
            p = await c.create_producer(topic, max_pending_messages=3, batching_max_publish_delay_ms=5000)
            for i in range(3):
                await p.send_async(f"{i}".encode())
            with pytest.raises(txn.ProducerQueueIsFull):
                await p.send_async(b"x")
            await p.flush()

    asyncio.run(go())
