"""Producer names and sequence ids, broker deduplication, access modes and fencing,
send timeouts and keep-alive, on a real broker."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pulsar
import pytest

import txn
from txn.admin import create_namespace, enable_namespace_dedup


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def dedup_ns(broker):
    ns = f"public/dd-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    return ns


def _read_all(broker, topic: str) -> list[bytes]:
    """Everything stored on ``topic``, read from the start by the official client's reader."""
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    r = oc.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while r.has_message_available():
        got.append(r.read_next(timeout_millis=10000).data())
    oc.close()
    return got


def test_named_producer_resumes_sequence_and_dedup_drops_repeats(client, broker, dedup_ns):
    topic = f"persistent://{dedup_ns}/seq"
    p = client.create_producer(topic, producer_name="writer-1", batching_enabled=False)
    assert p.producer_name() == "writer-1"
    for i in range(3):
        p.send(f"m{i}".encode())
    assert p.last_sequence_id() == 2
    p.close()
    # Same name again: the broker remembers the last sequence id and we continue after it.
    p2 = client.create_producer(topic, producer_name="writer-1", batching_enabled=False)
    assert p2.last_sequence_id() == 2
    p2.send(b"m3")
    assert p2.last_sequence_id() == 3
    # A repeat of an already stored sequence id is dropped by broker deduplication.
    p2.send(b"m1-again", sequence_id=1)
    p2.close()
    assert _read_all(broker, topic) == [b"m0", b"m1", b"m2", b"m3"]


def test_batched_sequence_ids_and_dedup(client, broker, dedup_ns):
    topic = f"persistent://{dedup_ns}/batched"
    p = client.create_producer(topic, producer_name="bw", batching_max_publish_delay_ms=50)
    for i in range(10):
        p.send_async(f"b{i}".encode(), None)
    p.flush()
    assert p.last_sequence_id() == 9
    p.close()
    got = []
    c = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    for _ in range(10):
        m = c.receive(10000)
        got.append((m.data(), m.sequence_id(), m.producer_name()))
    assert got == [(f"b{i}".encode(), i, "bw") for i in range(10)]


def test_exclusive_with_fencing_fences_the_old_producer(client, broker, topic):
    old = client.create_producer(topic, access_mode=txn.ProducerAccessMode.ExclusiveWithFencing,
                                 batching_enabled=False)
    old.send(b"from-old")
    new = client.create_producer(topic, access_mode=txn.ProducerAccessMode.ExclusiveWithFencing,
                                 batching_enabled=False)
    new.send(b"from-new")
    deadline = time.monotonic() + 20
    err = None
    while time.monotonic() < deadline:
        try:
            old.send(b"zombie")
        except txn.ProducerFenced as exc:
            err = exc
            break
        except txn.PulsarError:
            time.sleep(0.2)
    assert isinstance(err, txn.ProducerFenced)
    assert err.topic == topic
    # The old producer re-creates itself in Exclusive mode with its old epoch, so the broker refuses
    # it without first closing the new one (which ExclusiveWithFencing would do).
    assert "existing exclusive producer" in err.message or "epoch" in err.message
    new.send(b"after")  # the new holder was not knocked out by the old one's attempts
    assert _read_all(broker, topic) == [b"from-old", b"from-new", b"after"]


def test_exclusive_producer_rejects_a_second_one(client, topic):
    client.create_producer(topic, access_mode=txn.ProducerAccessMode.Exclusive)
    with pytest.raises(txn.ProducerFenced, match="existing exclusive producer") as ei:
        client.create_producer(topic, access_mode=txn.ProducerAccessMode.Exclusive)
    assert ei.value.topic == topic


def test_send_timeout_with_a_paused_broker(broker, topic):
    if broker.local is None:
        pytest.skip("pausing the broker needs the broker this suite started")
    c = txn.Client(broker.service_url, operation_timeout_seconds=10)
    p = c.create_producer(topic, send_timeout_millis=1500, batching_enabled=False)
    p.send(b"before")
    results = []
    pid = broker.local.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(txn.Timeout) as ei:
            p.send(b"during")
        elapsed = time.monotonic() - t0
        p.send_async(b"during-async", lambda r, mid: results.append(r))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ei.value.topic == topic
    assert 1.0 <= elapsed < 10
    deadline = time.monotonic() + 20
    while not results and time.monotonic() < deadline:
        time.sleep(0.1)
    assert results and results[0] in (txn.Result.Timeout, txn.Result.Ok)
    c.close()


def test_keepalive_keeps_an_idle_connection(broker, topic):
    c = txn.Client(broker.service_url, keep_alive_interval_seconds=1)
    p = c.create_producer(topic, batching_enabled=False)
    conn = p.async_producer.partition_producers[0].conn
    time.sleep(3.5)  # idle for more than two keep-alive intervals: pings answered by pongs
    assert not conn.closed
    p.send(b"still-here")
    assert p.async_producer.partition_producers[0].conn is conn
    c.close()


def _by_partition(client_mod, service_url: str, topic: str, n: int) -> dict[int, list[bytes]]:
    c = client_mod.Client(service_url)
    try:
        consumer = c.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}",
                               initial_position=client_mod.InitialPosition.Earliest)
        got: dict[int, list[bytes]] = {}
        for _ in range(n):
            m = consumer.receive(10_000)
            got.setdefault(m.message_id().partition(), []).append(m.data())
            consumer.acknowledge(m)
        consumer.close()
        return got
    finally:
        c.close()


@pytest.mark.parametrize("batching", [False, True])
def test_message_router_places_every_message_as_the_official_client_does(client, broker, unique_name, batching):
    """``create_producer(..., message_router=f)``: ``f(message, num_partitions)`` chooses the partition
    of every message, keyed or not (the key's hash is not used). The same router on the official
    client's producer places the same messages on the same partitions of a second topic."""
    from txn.admin import create_partitioned_topic

    seen: list[tuple[bytes, str, dict[str, str], int]] = []

    def router(msg, num_partitions: int) -> int:
        seen.append((msg.value(), msg.partition_key(), msg.properties(), num_partitions))
        return (10 if msg.value().startswith(b"hello-") else 11) % num_partitions

    payloads = [(b"hello-0", None), (b"world-0", "k1"), (b"hello-1", "k2"), (b"world-1", None)]
    placed = {}
    for name, mod in (("ours", txn), ("official", pulsar)):
        topic = f"persistent://public/default/{unique_name('router-' + name)}"
        create_partitioned_topic(broker.admin_url, topic, 5)
        c = client if mod is txn else pulsar.Client(broker.service_url)
        try:
            p = c.create_producer(topic, message_router=router, batching_enabled=batching)
            for data, key in payloads:
                if key is None:
                    p.send(data, properties={"n": data.decode()})
                else:
                    p.send(data, properties={"n": data.decode()}, partition_key=key)
            p.close()
        finally:
            if mod is pulsar:
                c.close()
        placed[name] = _by_partition(pulsar, broker.service_url, topic, len(payloads))
    assert placed["ours"] == {0: [b"hello-0", b"hello-1"], 1: [b"world-0", b"world-1"]}
    assert placed["official"] == placed["ours"]
    ours_seen = seen[:len(payloads)]
    assert ours_seen == [(d, k or "", {"n": d.decode()}, 5) for d, k in payloads]


def test_a_message_router_answer_that_is_no_partition_sends_nothing(client, broker, unique_name):
    from txn.admin import create_partitioned_topic

    topic = f"persistent://public/default/{unique_name('router-bad')}"
    create_partitioned_topic(broker.admin_url, topic, 3)
    with pytest.raises(ValueError, match="callable"):
        client.create_producer(topic, message_router=3)
    answers = iter([3, -1, "0", 2])
    p = client.create_producer(topic, message_router=lambda m, n: next(answers), batching_enabled=False)
    for _ in range(3):
        with pytest.raises(ValueError, match="not a partition index"):
            p.send(b"x")
    mid = p.send(b"ok")
    p.close()
    assert mid.partition() == 2
    assert _by_partition(pulsar, broker.service_url, topic, 1) == {2: [b"ok"]}
