"""Helpers for reading and writing with the official ``pulsar-client`` (the independent peer)."""

from __future__ import annotations

import time
import uuid

import pulsar

SENTINEL_PROP = "sentinel"


def read_n(consumer: pulsar.Consumer, n: int, timeout_s: float = 30.0) -> list[pulsar.Message]:
    """Receive exactly ``n`` messages (acking them) or fail after ``timeout_s``."""
    out: list[pulsar.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0:
            raise AssertionError(f"received only {len(out)} of {n} messages in {timeout_s}s")
        try:
            m = consumer.receive(timeout_millis=min(left, 2000))
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        out.append(m)
    return out


def assert_nothing(consumer: pulsar.Consumer, wait_ms: int = 1500) -> None:
    """Assert no message arrives within ``wait_ms``."""
    try:
        m = consumer.receive(timeout_millis=wait_ms)
    except pulsar.Timeout:
        return
    raise AssertionError(f"unexpected message {m.data()!r} props={m.properties()}")


def read_until_sentinel(
    client: pulsar.Client, consumer: pulsar.Consumer, topic: str, timeout_s: float = 30.0
) -> list[pulsar.Message]:
    """Write a sentinel to ``topic`` and return every message read before it.

    Proves a negative ("these never appear") without guessing a wait: anything the
    broker would deliver is ordered before the sentinel on a single partition.
    """
    tag = uuid.uuid4().hex
    p = client.create_producer(topic, batching_enabled=False)
    p.send(b"sentinel", properties={SENTINEL_PROP: tag})
    p.close()
    before: list[pulsar.Message] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            m = consumer.receive(timeout_millis=2000)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        if m.properties().get(SENTINEL_PROP) == tag:
            return before
        before.append(m)
    raise AssertionError(f"sentinel not received within {timeout_s}s (got {len(before)} others)")
