"""The official ``pulsar-client``, as the benchmarks' peer and independent reader."""

from __future__ import annotations

import logging

import pulsar


def official_client(url: str, python_logger: bool = False) -> pulsar.Client:
    """A client that only logs warnings; ``python_logger`` sends them to stderr via ``logging``."""
    if python_logger:
        return pulsar.Client(url, logger=logging.getLogger("bench.pulsar-client"))
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def count_topic(url: str, topic: str, expect: int, idle_ms: int = 1500, python_logger: bool = False) -> int:
    """Read ``topic`` from the start (read-committed) and count messages until it stays idle.

    It waits up to 30 s for each message while fewer than ``expect`` were read, then
    ``idle_ms`` for any extra ones, so duplicates beyond ``expect`` are counted too.
    """
    client = official_client(url, python_logger)
    try:
        r = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
        n = 0
        while True:
            try:
                r.read_next(timeout_millis=idle_ms if n >= expect else 30_000)
            except Exception:  # noqa: BLE001 - pulsar.Timeout
                break
            n += 1
        r.close()
        return n
    finally:
        client.close()
