"""Subscription types, initial positions, cumulative acks and flow control on a real broker."""

from __future__ import annotations

import time

import pulsar
import pytest

import txn


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


def _produce(client: txn.Client, topic: str, n: int, key=lambda i: None) -> list[bytes]:
    p = client.create_producer(topic, batching_enabled=False)
    out = []
    for i in range(n):
        d = f"m{i}".encode()
        p.send(d, partition_key=key(i))
        out.append(d)
    p.close()
    return out


def _drain(c: txn.Consumer, quiet_ms: int = 1500) -> list[txn.Message]:
    got = []
    while True:
        try:
            m = c.receive(quiet_ms)
        except txn.Timeout:
            return got
        c.acknowledge(m)
        got.append(m)


def test_initial_position_latest_vs_earliest(client, topic):
    _produce(client, topic, 3)
    latest = client.subscribe(topic, "late")
    earliest = client.subscribe(topic, "early", initial_position=txn.InitialPosition.Earliest)
    _produce(client, topic, 1)
    assert [m.data() for m in _drain(latest)] == [b"m0"]
    assert [m.data() for m in _drain(earliest)] == [b"m0", b"m1", b"m2", b"m0"]


def test_exclusive_rejects_second_consumer(client, topic):
    client.subscribe(topic, "ex")
    with pytest.raises(txn.ConsumerBusy) as ei:
        client.subscribe(topic, "ex")
    assert ei.value.topic == topic


def test_shared_splits_messages(client, topic):
    a = client.subscribe(topic, "sh", consumer_type=txn.ConsumerType.Shared, receiver_queue_size=5)
    b = client.subscribe(topic, "sh", consumer_type=txn.ConsumerType.Shared, receiver_queue_size=5)
    sent = _produce(client, topic, 40)
    got_a, got_b = [], []
    deadline = time.monotonic() + 30
    while len(got_a) + len(got_b) < 40 and time.monotonic() < deadline:
        for c, acc in ((a, got_a), (b, got_b)):
            try:
                m = c.receive(100)
            except txn.Timeout:
                continue
            c.acknowledge(m)
            acc.append(m.data())
    assert sorted(got_a + got_b) == sorted(sent)
    assert got_a and got_b


def test_failover_single_active(client, topic):
    a = client.subscribe(topic, "fo", consumer_type=txn.ConsumerType.Failover, consumer_name="a")
    b = client.subscribe(topic, "fo", consumer_type=txn.ConsumerType.Failover, consumer_name="b")
    sent = _produce(client, topic, 20)
    got_a = _drain(a, 1000)
    got_b = _drain(b, 1000)
    # Exactly one consumer is active and receives everything, in order.
    assert sorted([len(got_a), len(got_b)]) == [0, 20]
    assert [m.data() for m in (got_a or got_b)] == sent


def test_key_shared_keeps_keys_together(client, topic):
    cs = [
        client.subscribe(topic, "ks", consumer_type=txn.ConsumerType.KeyShared, consumer_name=f"c{i}")
        for i in range(2)
    ]
    _produce(client, topic, 60, key=lambda i: f"key-{i % 6}")
    owner: dict[str, int] = {}
    order: dict[str, list[bytes]] = {}
    total = 0
    deadline = time.monotonic() + 30
    while total < 60 and time.monotonic() < deadline:
        for idx, c in enumerate(cs):
            try:
                m = c.receive(100)
            except txn.Timeout:
                continue
            c.acknowledge(m)
            total += 1
            k = m.partition_key()
            assert owner.setdefault(k, idx) == idx, f"key {k} went to two consumers"
            order.setdefault(k, []).append(m.data())
    assert total == 60
    for k, datas in order.items():
        n = int(k.split("-")[1])
        assert datas == [f"m{i}".encode() for i in range(60) if i % 6 == n]


def test_cumulative_ack(client, broker, topic):
    _produce(client, topic, 10)
    c = client.subscribe(topic, "cum", initial_position=txn.InitialPosition.Earliest)
    msgs = [c.receive(10000) for _ in range(10)]
    c.acknowledge_cumulative(msgs[6])
    c.close()
    c2 = client.subscribe(topic, "cum")
    assert [m.data() for m in _drain(c2)] == [b"m7", b"m8", b"m9"]


def test_cumulative_ack_in_transaction(client, topic):
    _produce(client, topic, 6)
    c = client.subscribe(topic, "cumtx", initial_position=txn.InitialPosition.Earliest)
    msgs = [c.receive(10000) for _ in range(6)]
    with client.new_transaction() as t:
        c.acknowledge_cumulative(msgs[3], txn=t)
    c.close()
    c2 = client.subscribe(topic, "cumtx")
    assert [m.data() for m in _drain(c2)] == [b"m4", b"m5"]


def test_cumulative_ack_rejected_on_shared(client, topic):
    _produce(client, topic, 1)
    c = client.subscribe(topic, "sh", consumer_type=txn.ConsumerType.Shared,
                         initial_position=txn.InitialPosition.Earliest)
    m = c.receive(10000)
    with pytest.raises(ValueError, match="cumulative"):
        c.acknowledge_cumulative(m)


def test_flow_control_bounds_the_receive_queue(client, topic):
    _produce(client, topic, 200)
    c = client.subscribe(topic, "flow", receiver_queue_size=10, initial_position=txn.InitialPosition.Earliest)
    time.sleep(1.5)
    queued = len(c.async_consumer.receive_queue)
    assert queued == 10  # the broker sent only what the permits allowed
    got = [c.receive(10000).data() for _ in range(200)]
    assert got == [f"m{i}".encode() for i in range(200)]


def test_batched_partial_acks_redeliver_only_unacked(client, broker, topic):
    p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=200)
    for i in range(10):
        p.send_async(f"b{i}".encode(), None)
    p.flush()
    c = client.subscribe(topic, "part", consumer_type=txn.ConsumerType.Shared,
                         initial_position=txn.InitialPosition.Earliest)
    msgs = [c.receive(10000) for _ in range(10)]
    assert len({m.message_id().entry_key for m in msgs}) == 1  # one batch
    for m in msgs[:4]:
        c.acknowledge(m)
    time.sleep(0.5)  # let the grouped acks go out
    c.close()
    c2 = client.subscribe(topic, "part", consumer_type=txn.ConsumerType.Shared)
    assert [m.data() for m in _drain(c2)] == [f"b{i}".encode() for i in range(10)]  # entry not fully acked
    # Now ack everything and nothing comes back.
    c2.close()
    c3 = client.subscribe(topic, "part", consumer_type=txn.ConsumerType.Shared)
    assert _drain(c3) == []


def test_multi_topic_consumer(client, topic, unique_name):
    other = f"persistent://public/default/{unique_name('other')}"
    _produce(client, topic, 3)
    _produce(client, other, 2)
    c = client.subscribe([topic, other], "multi", initial_position=txn.InitialPosition.Earliest)
    got = _drain(c)
    assert sorted((m.topic_name(), m.data()) for m in got) == sorted(
        [(topic, b"m0"), (topic, b"m1"), (topic, b"m2"), (other, b"m0"), (other, b"m1")]
    )


def test_official_reads_our_key_shared_keys(client, broker, topic):
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    r = oc.subscribe(topic, "r", initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 3, key=lambda i: f"k{i}")
    keys = [r.receive(10000).partition_key() for _ in range(3)]
    oc.close()
    assert keys == ["k0", "k1", "k2"]
