"""Broker restart in the middle of a stream: every confirmed message is present exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pulsar
import pytest

import txn
from txn.admin import create_namespace, enable_namespace_dedup

N = 3000


@pytest.fixture
def dedup_topic(restartable_broker):
    broker = restartable_broker
    ns = f"public/dedup-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    return f"persistent://{ns}/restart-{uuid.uuid4().hex[:8]}"


def test_broker_restart_mid_stream(restartable_broker, dedup_topic):
    # A broker of its own: the session broker is never restarted (see conftest.restartable_broker).
    broker = restartable_broker
    client = txn.Client(broker.service_url, operation_timeout_seconds=60)
    consumer = client.subscribe(dedup_topic, "during", initial_position=txn.InitialPosition.Earliest)
    # "check" exists before the sends and acks nothing until the final read: with the default retention (none) the
    # broker deletes ledgers "during" has acked, even the current one. Closing its consumer keeps the subscription.
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    oc.subscribe(dedup_topic, "check", initial_position=pulsar.InitialPosition.Earliest).close()
    producer = client.create_producer(dedup_topic, block_if_queue_full=True, send_timeout_millis=180_000,
                                      max_pending_messages=500)
    results: dict[int, txn.Result] = {}
    lock = threading.Lock()

    def on_sent(i: int):
        def cb(res, _mid):
            with lock:
                results[i] = res
        return cb

    def send_all():
        for i in range(N):
            producer.send_async(f"{i}".encode(), on_sent(i), properties={"i": str(i)})
            if i % 50 == 0:
                time.sleep(0.02)

    received: list[int] = []

    def consume():
        deadline = time.monotonic() + 240
        while len(set(received)) < N and time.monotonic() < deadline:
            try:
                m = consumer.receive(1000)
            except txn.Timeout:
                continue
            received.append(int(m.data()))
            consumer.acknowledge(m)

    sender = threading.Thread(target=send_all)
    reader = threading.Thread(target=consume)
    sender.start()
    reader.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if len(results) >= 500:
                break
        time.sleep(0.05)
    confirmed_before = len(results)
    assert confirmed_before >= 500
    broker.local.stop()
    broker.local.start(timeout=240)
    sender.join(300)
    assert not sender.is_alive()
    producer.flush()
    reader.join(300)

    assert len(results) == N
    assert Counter(results.values()) == Counter({txn.Result.Ok: N})
    # The independent reader: each confirmed message exactly once.
    r = oc.subscribe(dedup_topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    seen = Counter()
    while True:
        try:
            m = r.receive(3000)
        except pulsar.Timeout:
            break
        seen[int(m.data())] += 1
        r.acknowledge(m)
    oc.close()
    lost = [i for i in range(N) if seen[i] == 0]
    dup = [i for i, c in seen.items() if c > 1]
    print(f"restart test: confirmed before restart={confirmed_before} in={N} stored={sum(seen.values())} "
          f"lost={len(lost)} duplicated={len(dup)} consumer_received={len(received)} distinct={len(set(received))}")
    assert lost == [] and dup == []
    # Our consumer rode through the restart too (at-least-once: repeats allowed, gaps not).
    assert set(received) == set(range(N))
    client.close()
