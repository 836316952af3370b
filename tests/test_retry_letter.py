"""Retry-letter topic (``subscribe(..., retry_enable=True)``, ``consumer.reconsume_later``) on the real
broker, with the Java client's semantics: the official Python client has none, so the Java client
(``tests/java/RetryPeer.java``, run against the Pulsar distribution's jars) is the peer: a message
it reconsumes arrives at our consumer with the properties it wrote, and one we reconsume arrives at
it with the same properties."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from java_peer import compiled_peer, run_peer

import txn
from txn.admin import admin_request, topic_path

#: A receive that must succeed (the copy on the retry or dead-letter topic comes through a producer
#: the consumer creates, a topic lookup and, for delays, the broker's delayed-delivery tick): a CI
#: run under load timed out at 5 s in three tests at once. Receives expected to time out keep short waits.
MUST_MS = 30_000


def _java_id(mid: Any) -> str:
    """An id as the Java client prints it (``ledger:entry:partition``, unbatched)."""
    return f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"


def _expected(topic: str, origin: str, times: int, delay: int, **extra: str) -> dict[str, str]:
    return {"REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": origin, "ORIGIN_MESSAGE_IDY_TIME": origin,
            "REAL_SUBSCRIPTION": "s", "RECONSUMETIMES": str(times), "DELAY_TIME": str(delay), **extra}


def test_reconsume_later_to_the_retry_topic_then_the_dead_letter_topic(broker: Any, topic: str) -> None:
    """max 2: two ``reconsume_later`` go through ``<topic>-s-RETRY`` (each after its delay, with the
    properties counted up and the custom ones added), the third goes to ``<topic>-s-DLQ``; each
    original is acknowledged, so nothing else comes."""
    client = txn.Client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                    dead_letter_policy=txn.ConsumerDeadLetterPolicy(2))
        dlq = client.subscribe(f"{topic}-s-DLQ", "peek", initial_position=txn.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        mid = producer.send(b"x", properties={"a": "1"}, partition_key="k", event_timestamp=1234)
        origin = _java_id(mid)
        first = consumer.receive(MUST_MS)
        assert (first.topic_name(), first.properties()) == (topic, {"a": "1"})
        sent = time.monotonic()
        consumer.reconsume_later(first, timedelta(milliseconds=3000), {"c": "0"})
        second = consumer.receive(MUST_MS)
        # delivered after the delay (less the broker's delayedDeliveryTickTimeMillis, 1 s by default)
        assert time.monotonic() - sent >= 1.9
        assert (second.topic_name(), second.data(), second.partition_key(), second.event_timestamp()) == (
            f"{topic}-s-RETRY", b"x", "k", 1234)
        assert second.properties() == _expected(topic, origin, 1, 3000, a="1", c="0")
        consumer.reconsume_later(second, 0)
        third = consumer.receive(MUST_MS)
        assert third.properties() == _expected(topic, origin, 2, 0, a="1", c="0")
        consumer.reconsume_later(third, 100, {"c": "2"})  # reconsumed a third time: past the limit
        dead = dlq.receive(MUST_MS)
        assert (dead.topic_name(), dead.data(), dead.partition_key()) == (f"{topic}-s-DLQ", b"x", "k")
        assert dead.properties() == _expected(topic, origin, 3, 100, a="1", c="2")
        with pytest.raises(txn.Timeout):
            consumer.receive(1500)
        consumer.close()
        again = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                 dead_letter_policy=txn.ConsumerDeadLetterPolicy(2))
        with pytest.raises(txn.Timeout):  # every copy was acknowledged, on both topics
            again.receive(1500)
        again.close()
    finally:
        client.close()


def test_dead_letters_of_a_retry_enabled_consumer_carry_the_java_properties(broker: Any, topic: str) -> None:
    """A retry-enabled consumer is the Java client's: a message negatively acknowledged past the limit
    goes to the dead-letter topic with the Java client's origin properties (no reconsume count)."""
    client = txn.Client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                    negative_ack_redelivery_delay_ms=100,
                                    dead_letter_policy=txn.ConsumerDeadLetterPolicy(1))
        dlq = client.subscribe(f"{topic}-s-DLQ", "peek", initial_position=txn.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        mid = producer.send(b"n", properties={"a": "1"})
        for count in (0, 1):
            m = consumer.receive(MUST_MS)
            assert m.redelivery_count() == count
            consumer.negative_acknowledge(m)
        dead = dlq.receive(MUST_MS)
        origin = _java_id(mid)
        assert dead.properties() == {"a": "1", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": origin,
                                     "ORIGIN_MESSAGE_IDY_TIME": origin, "REAL_SUBSCRIPTION": "s"}
        with pytest.raises(txn.Timeout):
            consumer.receive(1000)
    finally:
        client.close()


def test_retry_topics_of_the_policy_and_the_async_client(broker: Any, topic: str) -> None:
    """``AsyncClient``: a retry topic and dead-letter topic named in the policy (short names are in
    public/default), ``reconsume_later`` awaited; a consumer without ``retry_enable`` refuses it."""
    retry_topic = f"{topic.rsplit('/', 1)[1]}-again"

    async def main() -> None:
        client = txn.AsyncClient(broker.service_url)
        try:
            policy = txn.ConsumerDeadLetterPolicy(1, dead_letter_topic=f"{topic}-dead", retry_letter_topic=retry_topic)
            assert policy.retry_letter_topic == retry_topic
            consumer = await client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                              dead_letter_policy=policy)
            assert consumer.partition_topics() == [topic, f"persistent://public/default/{retry_topic}"]
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"y")
            m = await consumer.receive(MUST_MS)
            await consumer.reconsume_later(m, timedelta(0))
            m = await consumer.receive(MUST_MS)
            assert m.topic_name() == f"persistent://public/default/{retry_topic}"
            assert m.properties()["RECONSUMETIMES"] == "1"
            await consumer.reconsume_later(m, 0)
            dead = await client.subscribe(f"{topic}-dead", "peek", initial_position=txn.InitialPosition.Earliest)
            d = await dead.receive(MUST_MS)
            assert (d.data(), d.properties()["RECONSUMETIMES"]) == (b"y", "2")
            plain = await client.subscribe(topic, "plain")
            with pytest.raises(txn.InvalidConfiguration):
                await plain.reconsume_later(m, 0)
            with pytest.raises(ValueError):
                await consumer.reconsume_later(m, "soon")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await consumer.reconsume_later(m, 0, {"a": 1})  # type: ignore[dict-item]
        finally:
            await client.close()

    asyncio.run(main())


def test_retry_enable_arguments(broker: Any, topic: str) -> None:
    client = txn.Client(broker.service_url)
    try:
        with pytest.raises(ValueError):
            client.subscribe(topic, "s", retry_enable="yes")
        with pytest.raises(ValueError):
            txn.ConsumerDeadLetterPolicy(1, retry_letter_topic=5)  # type: ignore[arg-type]
        assert txn.ConsumerDeadLetterPolicy(1).retry_letter_topic == ""
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True)
        assert consumer.topic() == topic
        assert consumer._inner.partition_topics() == [topic, f"{topic}-s-RETRY"]  # noqa: SLF001
        consumer.close()
    finally:
        client.close()


def test_older_default_names_are_kept_when_their_topics_exist(broker: Any, topic: str) -> None:
    """As the Java client: if ``<namespace>/<subscription>-RETRY`` (the older default) exists it is
    the retry topic; the dead-letter topic's older name does not exist, so the new default holds."""
    client = txn.Client(broker.service_url)
    try:
        sub = f"s-{topic.rsplit('-', 1)[1]}"
        old_retry = f"persistent://public/default/{sub}-RETRY"
        client.create_producer(old_retry).close()  # creates it
        consumer = client.subscribe(topic, sub, consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                    dead_letter_policy=txn.ConsumerDeadLetterPolicy(1))
        assert consumer._inner.partition_topics() == [topic, old_retry]  # noqa: SLF001
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"z")
        consumer.reconsume_later(consumer.receive(MUST_MS), 0)
        m = consumer.receive(MUST_MS)
        assert (m.topic_name(), m.properties()["RECONSUMETIMES"]) == (old_retry, "1")
        consumer.reconsume_later(m, 0)
        dlq = client.subscribe(f"{topic}-{sub}-DLQ", "peek", initial_position=txn.InitialPosition.Earliest)
        assert dlq.receive(MUST_MS).properties()["RECONSUMETIMES"] == "2"
    finally:
        client.close()


def test_reconsume_later_from_a_partitioned_topic(broker: Any, topic: str) -> None:
    """A partition's message: REAL_TOPIC is the partitioned topic (no ``-partition-N``), the origin
    id carries the partition, and the retry topic is named after the partitioned topic."""
    assert admin_request("PUT", broker.admin_url, f"/admin/v2/{topic_path(topic)}/partitions", 2)[0] == 204
    client = txn.Client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True)
        producer = client.create_producer(topic, batching_enabled=False)
        mid = producer.send(b"p", partition_key="one")
        m = consumer.receive(MUST_MS)
        assert m.topic_name() == f"{topic}-partition-{mid.partition()}"
        consumer.reconsume_later(m, 0)
        again = consumer.receive(MUST_MS)
        assert again.topic_name() == f"{topic}-s-RETRY"
        assert again.properties() == _expected(topic, f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}", 1, 0)
        consumer.acknowledge(again)
        consumer.close()
    finally:
        client.close()


def test_reconsume_later_of_a_chunked_message(broker: Any, topic: str) -> None:
    """A message larger than the broker's limit (chunked) is reconsumed whole (the retry and
    dead-letter producers chunk it too, as the Java client's); its origin id is ``first;last`` as the
    Java client prints a chunked id."""
    client = txn.Client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                    dead_letter_policy=txn.ConsumerDeadLetterPolicy(1))
        producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        big = os.urandom(6 * 1024 * 1024)
        producer.send(big)
        m = consumer.receive(MUST_MS)
        chunks = m.message_id().chunk_ids
        assert len(chunks) == 2
        consumer.reconsume_later(m, 0)
        again = consumer.receive(MUST_MS)
        assert (again.topic_name(), again.data() == big) == (f"{topic}-s-RETRY", True)
        origin = f"{_java_id(chunks[0])};{_java_id(chunks[-1])}"
        assert again.properties() == _expected(topic, origin, 1, 0)
        consumer.reconsume_later(again, 0)  # past the limit: to the dead-letter topic, chunked too
        dlq = client.subscribe(f"{topic}-s-DLQ", "peek", initial_position=txn.InitialPosition.Earliest)
        dead = dlq.receive(MUST_MS)
        assert (dead.data() == big, dead.properties()) == (True, _expected(topic, origin, 2, 0))
        consumer.close()
    finally:
        client.close()


# --------------------------------------------------------------------------- with the Java client


@pytest.fixture(scope="module")
def java_peer() -> Iterator[list[str]]:
    """The command (less its arguments) running tests/java/RetryPeer.java, compiled once."""
    with compiled_peer("RetryPeer") as cmd:
        yield cmd


def _run_peer(cmd: list[str], *args: str) -> dict[str, Any]:
    got: dict[str, Any] = {"props": {}}
    for line in run_peer(cmd, *args).splitlines():
        word, _, rest = line.partition(" ")
        if word == "prop":
            name, _, value = rest.partition("=")
            got["props"][name] = value
        elif word in ("topic", "id", "data", "key"):
            got[word] = rest
    return got


def test_reconsume_later_with_the_java_client(broker: Any, topic: str, java_peer: list[str]) -> None:
    """Java reconsumes (delay 300 ms, custom c=java); our retry-enabled consumer of the same
    subscription gets the copy from ``<topic>-s-RETRY`` with the Java client's properties and
    reconsumes it again; the Java client then gets ours with RECONSUMETIMES 2 and the same set."""
    client = txn.Client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        mid = producer.send(b"x", properties={"a": "1"}, partition_key="k")
        origin = _java_id(mid)
        java = _run_peer(java_peer, broker.service_url, topic, "s", "reconsume", "3", "300")
        assert (java["topic"], java["id"], java["data"], java["key"], java["props"]) == (
            topic, origin, "x", "k", {"a": "1"})
        consumer = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True,
                                    dead_letter_policy=txn.ConsumerDeadLetterPolicy(3))
        m = consumer.receive(MUST_MS)
        assert (m.topic_name(), m.data(), m.partition_key()) == (f"{topic}-s-RETRY", b"x", "k")
        assert m.properties() == _expected(topic, origin, 1, 300, a="1", c="java")
        consumer.reconsume_later(m, 200, {"c": "txn"})
        consumer.close()  # the Java client takes the next copy
        java = _run_peer(java_peer, broker.service_url, topic, "s", "ack", "3", "0")
        assert (java["topic"], java["data"], java["key"]) == (f"{topic}-s-RETRY", "x", "k")
        assert java["props"] == _expected(topic, origin, 2, 200, a="1", c="txn")
        again = client.subscribe(topic, "s", consumer_type=txn.ConsumerType.Shared, retry_enable=True)
        with pytest.raises(txn.Timeout):  # both clients acknowledged what they took
            again.receive(1500)
        again.close()
    finally:
        client.close()

