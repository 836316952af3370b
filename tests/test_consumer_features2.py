"""More consumer and producer features side by side with the official ``pulsar-client`` (issue 19,
section 2): each test runs one scenario on both clients and asserts that the outcomes are equal
(and what they are)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
from txn.admin import admin_request, topic_path


@pytest.fixture
def clients(broker: Any) -> Iterator[dict[str, Any]]:
    """``{"pulsar": official client, "txn": ours}``, both on the test broker."""
    theirs = pulsar.Client(broker.service_url)
    ours = txn.Client(broker.service_url)
    try:
        yield {"pulsar": theirs, "txn": ours}
    finally:
        ours.close()
        theirs.close()


BOTH = ["pulsar", "txn"]


def _mod(side: str) -> Any:
    """The module of that side: ``pulsar`` or ``txn`` (the names tested exist in both)."""
    return pulsar if side == "pulsar" else txn


def _parallel(calls: dict[Any, Callable[[], Any]]) -> dict[Any, Any]:
    """Run the calls at once, each on a thread of its own (the scenarios mostly wait); return
    their results by key, or raise the first failure."""
    results: dict[Any, Any] = {}
    errors: list[BaseException] = []

    def run(key: Any, call: Callable[[], Any]) -> None:
        try:
            results[key] = call()
        except BaseException as exc:  # re-raised below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert len(results) == len(calls), "a scenario did not finish"
    return results


def _each(topic: str, scenario: Callable[[str, str], Any]) -> dict[str, Any]:
    """Run ``scenario(side, topic_of_that_side)`` for both clients at once; return their outcomes."""
    return _parallel({side: (lambda side=side: scenario(side, f"{topic}-{side}")) for side in BOTH})


def _same(outcomes: dict[str, Any]) -> Any:
    """Assert both clients had the same outcome; return it."""
    assert outcomes["txn"] == outcomes["pulsar"]
    return outcomes["txn"]


def _produce(client: Any, topic: str, n: int, size: int = 0) -> list[str]:
    """Send ``m0``..``m{n-1}`` (padded with ``.`` to ``size`` bytes) unbatched; return the payloads."""
    p = client.create_producer(topic, batching_enabled=False)
    sent = []
    for i in range(n):
        data = f"m{i}".ljust(size, ".").encode()
        p.send(data)
        sent.append(data.decode())
    p.close()
    return sent


def _stats(broker: Any, topic: str) -> dict[str, Any]:
    status, body = admin_request("GET", broker.admin_url, f"/admin/v2/{topic_path(topic)}/stats")
    assert status == 200, body
    return body


# ====================================================================== consumer_name


def test_consumer_name(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """``consumer_name=`` reaches the broker (topic stats) and ``consumer_name()`` returns it; without
    one a consumer of a topic gets a random 10-hex-digit name, one of a list of topics ``""``."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        named = c.subscribe(t, "named", consumer_name="my-consumer")
        unnamed = c.subscribe(t, "unnamed")
        listed = c.subscribe([t, f"{t}-b"], "listed")
        listed_named = c.subscribe([t, f"{t}-b"], "listed-named", consumer_name="ln")
        subs = _stats(broker, t)["subscriptions"]
        on_broker = {s: [x["consumerName"] for x in subs[s]["consumers"]] for s in ("named", "unnamed")}
        out = (named.consumer_name(), on_broker["named"], listed.consumer_name(), listed_named.consumer_name(),
               bool(re.fullmatch(r"[0-9a-f]{10}", unnamed.consumer_name())),
               on_broker["unnamed"] == [unnamed.consumer_name()],
               [x["consumerName"] for x in subs["listed-named"]["consumers"]])
        for x in (named, unnamed, listed, listed_named):
            x.close()
        return out

    assert _same(_each(topic, scenario)) == ("my-consumer", ["my-consumer"], "", "ln", True, True, ["ln"])
    with pytest.raises(ValueError):
        clients["txn"].subscribe(topic, "s", consumer_name=5)


def test_async_consumer_name(broker: Any, topic: str) -> None:
    async def main() -> tuple[str, str]:
        async with txn.AsyncClient(broker.service_url) as client:
            a = await client.subscribe(topic, "a", consumer_name="n1")
            b = await client.subscribe(topic, "b")
            return a.consumer_name(), b.consumer_name()

    named, unnamed = asyncio.run(main())
    assert named == "n1"
    assert re.fullmatch(r"[0-9a-f]{10}", unnamed)


# ====================================================================== batch_receive


def _earliest(side: str) -> Any:
    return _mod(side).InitialPosition.Earliest


def _policy(side: str, *args: int) -> Any:
    return _mod(side).ConsumerBatchReceivePolicy(*args)


def _batches(consumer: Any, n: int) -> list[list[str]]:
    """``n`` calls of ``batch_receive()``: the payloads of each batch (each acknowledged)."""
    out = []
    for _ in range(n):
        batch = consumer.batch_receive()
        for m in batch:
            consumer.acknowledge(m)
        out.append([m.data().decode() for m in batch])
    return out


def _settle(consumer: Any, n: int) -> None:
    """Wait until ``n`` messages can have reached the consumer's queue."""
    time.sleep(0.4 + 0.01 * n)


def test_batch_receive_policy_arguments() -> None:
    for side in BOTH:
        for bad in ((0, 0, 0), (-1, -1, -1)):
            with pytest.raises(ValueError, match="At least one of maxNumMessages, maxNumBytes and timeoutMs"):
                _policy(side, *bad)
        with pytest.raises(TypeError):
            _policy(side, "1", 1, 1)
    got = {side: [(p.getMaxNumMessages(), p.getMaxNumBytes(), p.getTimeoutMs())
                  for p in (_policy(side, *a).policy() for a in ((-1, -1, 100), (5, -1, 0), (0, 7, 3)))]
           for side in BOTH}
    assert _same(got) == [(-1, 10 * 1024 * 1024, 100), (5, -1, 0), (0, 7, 3)]


def test_batch_receive_policy_type_is_checked(clients: dict[str, Any], topic: str) -> None:
    for side in BOTH:
        with pytest.raises(ValueError):
            clients[side].subscribe(topic, "s", batch_receive_policy="x")


def test_batch_receive_defaults(clients: dict[str, Any], topic: str) -> None:
    """No policy: everything queued comes in one batch; an empty queue gives ``[]`` after 100 ms."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        consumer = c.subscribe(t, "s")
        sent = _produce(c, t, 5)
        _settle(consumer, 5)
        first = _batches(consumer, 1)
        start = time.monotonic()
        empty = consumer.batch_receive()
        waited = time.monotonic() - start
        consumer.close()
        return first == [sent], empty, 0.09 <= waited < 1.0

    assert _same(_each(topic, scenario)) == (True, [], True)


#: policy, payload sizes of the messages sent, the batches expected (message indexes)
LIMIT_CASES = {
    "count": ((3, -1, 150), [0] * 7, [[0, 1, 2], [3, 4, 5], [6], []]),  # count limit, then the timeout
    "bytes": ((-1, 250, 150), [100] * 5, [[0, 1], [2, 3], [4], []]),  # byte limit
    "big-first": ((-1, 50, 150), [100, 10, 10], [[0], [1, 2], []]),  # the first message always fits
    "count-and-bytes": ((2, 1000, 150), [400, 400, 400, 10], [[0, 1], [2, 3], []]),  # the first reached
}


def test_batch_receive_limits(clients: dict[str, Any], topic: str) -> None:
    def scenario(side: str, t: str, policy: tuple[int, int, int], sizes: list[int], n: int) -> Any:
        c = clients[side]
        consumer = c.subscribe(t, "s", batch_receive_policy=_policy(side, *policy))
        p = c.create_producer(t, batching_enabled=False)
        sent = []
        for i, size in enumerate(sizes):
            data = f"m{i}".ljust(size, ".").encode()
            p.send(data)
            sent.append(data.decode())
        p.close()
        _settle(consumer, len(sizes))
        got = _batches(consumer, n)
        consumer.close()
        return [[sent.index(x) for x in batch] for batch in got]

    calls = {(case, side): (lambda case=case, side=side, policy=policy, sizes=sizes, expected=expected: scenario(
        side, f"{topic}-{case}-{side}", policy, sizes, len(expected)))
        for case, (policy, sizes, expected) in LIMIT_CASES.items() for side in BOTH}
    got = _parallel(calls)
    for case, (_, _, expected) in LIMIT_CASES.items():
        assert got[(case, "txn")] == got[(case, "pulsar")] == expected, case


def test_batch_receive_of_batched_messages_and_queue_cap(clients: dict[str, Any], topic: str) -> None:
    """Messages of a producer's batch count one by one; ``max_num_message`` above
    ``receiver_queue_size`` is capped to it. Acknowledged batches are not redelivered."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        consumer = c.subscribe(t, "s", receiver_queue_size=4, batch_receive_policy=_policy(side, 10, -1, 250))
        p = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50)
        for i in range(10):
            p.send_async(f"m{i}".encode(), None)
        p.flush()
        p.close()
        got = _batches(consumer, 4)
        consumer.close()
        again = c.subscribe(t, "s")
        left = consumer_left(again)
        again.close()
        return got, left

    got, left = _same(_each(topic, scenario))
    assert got == [["m0", "m1", "m2", "m3"], ["m4", "m5", "m6", "m7"], ["m8", "m9"], []]
    assert left == []


def consumer_left(consumer: Any) -> list[bytes]:
    """What ``consumer`` still gets within a short wait."""
    out = []
    while True:
        try:
            out.append(consumer.receive(700).data())
        except Exception as exc:  # both clients' Timeout
            assert "imeout" in type(exc).__name__ or "imeout" in str(exc), exc
            return out


def test_batch_receive_returns_when_the_count_is_reached(clients: dict[str, Any], topic: str) -> None:
    """A waiting ``batch_receive()`` returns once its count is reached, long before its timeout;
    with no timeout (``timeout_ms`` 0) it waits for the count."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        out = []
        for sub, policy in (("a", (3, -1, 5000)), ("b", (2, -1, 0))):
            consumer = c.subscribe(t, sub, batch_receive_policy=_policy(side, *policy))
            result: list[Any] = []
            waiter = threading.Thread(target=lambda consumer=consumer, result=result: result.append(
                consumer.batch_receive()))
            start = time.monotonic()
            waiter.start()
            time.sleep(0.3)
            assert waiter.is_alive()
            _produce(c, t, policy[0])
            waiter.join(10)
            elapsed = time.monotonic() - start
            out.append(([m.data() for m in result[0]], elapsed < 2.5))
            consumer.close()
        return out

    assert _same(_each(topic, scenario)) == [([b"m0", b"m1", b"m2"], True), ([b"m0", b"m1"], True)]


def test_batch_receive_on_a_closed_consumer(clients: dict[str, Any], topic: str) -> None:
    for side in BOTH:
        consumer = clients[side].subscribe(topic, f"s-{side}")
        consumer.close()
        with pytest.raises(_mod(side).AlreadyClosed):
            consumer.batch_receive()


def test_async_batch_receive(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """``AsyncConsumer.batch_receive()`` (the C++ client's batchReceiveAsync; ``pulsar.asyncio`` has
    none): the same batches as the official blocking consumer's."""

    def theirs() -> list[list[str]]:
        consumer = clients["pulsar"].subscribe(f"{topic}-pulsar", "s",
                                               batch_receive_policy=_policy("pulsar", 3, -1, 150))
        _produce(clients["pulsar"], f"{topic}-pulsar", 7)
        _settle(consumer, 7)
        got = _batches(consumer, 4)
        consumer.close()
        return got

    async def ours() -> list[list[str]]:
        async with txn.AsyncClient(broker.service_url) as client:
            consumer = await client.subscribe(f"{topic}-txn", "s",
                                              batch_receive_policy=txn.ConsumerBatchReceivePolicy(3, -1, 150))
            producer = await client.create_producer(f"{topic}-txn", batching_enabled=False)
            for i in range(7):
                await producer.send(f"m{i}".encode())
            await asyncio.sleep(0.5)
            got = []
            for _ in range(4):
                batch = await consumer.batch_receive()
                for m in batch:
                    consumer.acknowledge(m)
                got.append([m.data().decode() for m in batch])
            return got

    got = _parallel({"pulsar": theirs, "txn": lambda: asyncio.run(ours())})
    assert _same(got) == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6"], []]


# ====================================================================== message_listener


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_message_listener(clients: dict[str, Any], topic: str) -> None:
    """``message_listener(consumer, message)`` gets every message in order on a thread other than the
    caller's; one that raises is logged and the next message still comes; ``receive()`` raises
    ``InvalidConfiguration``; ``pause_message_listener()`` holds messages back until
    ``resume_message_listener()``; what the listener did not acknowledge is redelivered."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        got: list[tuple[bytes, bool]] = []
        caller = threading.current_thread()

        def listener(consumer: Any, msg: Any) -> None:
            got.append((msg.data(), threading.current_thread() is not caller))
            if msg.data() == b"m1":
                raise RuntimeError("listener failure (expected by the test)")
            consumer.acknowledge(msg)

        consumer = c.subscribe(t, "s", message_listener=listener)
        p = c.create_producer(t, batching_enabled=False)
        for i in range(4):
            p.send(f"m{i}".encode())
        _wait_for(lambda: len(got) >= 4)
        with pytest.raises(Exception) as refused:
            consumer.receive(100)
        consumer.pause_message_listener()
        for i in range(4, 6):
            p.send(f"m{i}".encode())
        time.sleep(0.5)
        while_paused = len(got)
        consumer.resume_message_listener()
        _wait_for(lambda: len(got) >= 6)
        consumer.close()
        p.close()
        again = c.subscribe(t, "s")
        left = consumer_left(again)
        again.close()
        return got, type(refused.value).__name__, while_paused, left

    got, refused, while_paused, left = _same(_each(topic, scenario))
    assert got == [(f"m{i}".encode(), True) for i in range(6)]
    assert (refused, while_paused, left) == ("InvalidConfiguration", 4, [b"m1"])


def test_pause_without_listener_is_refused(clients: dict[str, Any], topic: str) -> None:
    for side in BOTH:
        consumer = clients[side].subscribe(topic, f"s-{side}")
        for call in (consumer.pause_message_listener, consumer.resume_message_listener):
            with pytest.raises(_mod(side).InvalidConfiguration):
                call()
        consumer.close()


def test_async_message_listener(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """On ``txn.AsyncClient`` the listener runs on the event loop (``pulsar.asyncio`` has none): a
    coroutine listener is awaited before the next message; the same messages as the official one."""

    def theirs() -> list[bytes]:
        got: list[bytes] = []
        consumer = clients["pulsar"].subscribe(
            f"{topic}-pulsar", "s", message_listener=lambda c, m: (got.append(m.data()), c.acknowledge(m)))
        _produce(clients["pulsar"], f"{topic}-pulsar", 5)
        _wait_for(lambda: len(got) >= 5)
        consumer.close()
        return got

    async def ours() -> tuple[list[bytes], str]:
        got: list[bytes] = []

        async def listener(consumer: txn.AsyncConsumer, msg: txn.Message) -> None:
            await asyncio.sleep(0.01)
            got.append(msg.data())
            consumer.acknowledge(msg)

        async with txn.AsyncClient(broker.service_url) as client:
            consumer = await client.subscribe(f"{topic}-txn", "s", message_listener=listener)
            producer = await client.create_producer(f"{topic}-txn", batching_enabled=False)
            for i in range(5):
                await producer.send(f"m{i}".encode())
            for _ in range(500):
                if len(got) >= 5:
                    break
                await asyncio.sleep(0.02)
            try:
                await consumer.receive(100)
                refused = ""
            except txn.InvalidConfiguration as exc:
                refused = type(exc).__name__
            return got, refused

    got = _parallel({"pulsar": theirs, "txn": lambda: asyncio.run(ours())})
    assert got["txn"] == (got["pulsar"], "InvalidConfiguration")
    assert got["pulsar"] == [f"m{i}".encode() for i in range(5)]


# ====================================================================== ack timeout, negative-ack delay


def test_unacked_messages_timeout_is_checked(clients: dict[str, Any], topic: str) -> None:
    for side in BOTH:
        with pytest.raises(ValueError, match="greater than 10 seconds"):
            clients[side].subscribe(topic, "s", unacked_messages_timeout_ms=5000)
        with pytest.raises(ValueError):
            clients[side].subscribe(topic, "s", unacked_messages_timeout_ms="10000")
        clients[side].subscribe(topic, f"off-{side}", unacked_messages_timeout_ms=0).close()


def test_unacked_messages_timeout(clients: dict[str, Any], topic: str) -> None:
    """What was received and not acknowledged comes again 10 to 12 s later (the official minimum
    timeout and its 1 s tick): by id on a Shared subscription (the broker counts a redelivery),
    everything unacknowledged on an Exclusive one. Negatively acknowledged, a message follows the
    negative-ack delay instead. The four scenarios run at once: the test takes one timeout."""

    def scenario(side: str, t: str, kind: str) -> Any:
        c = clients[side]
        shared = kind == "Shared"
        consumer = c.subscribe(t, "s", consumer_type=getattr(_mod(side).ConsumerType, kind),
                               unacked_messages_timeout_ms=10000, negative_ack_redelivery_delay_ms=500)
        _produce(c, t, 4 if shared else 3)
        first = [consumer.receive(5000) for _ in range(4 if shared else 3)]
        start = time.monotonic()
        consumer.acknowledge(first[1])
        nacked = None
        if shared:  # (on Exclusive a negative ack redelivers everything unacknowledged)
            consumer.negative_acknowledge(first[3])  # comes back after 0.5 s, not with the timeout
            m = consumer.receive(5000)
            nacked = (m.data(), m.redelivery_count(), 0.4 < time.monotonic() - start < 2.0)
            consumer.acknowledge(m)
        again = [consumer.receive(15000) for _ in range(2)]
        elapsed = time.monotonic() - start
        for m in again:
            consumer.acknowledge(m)
        left = consumer_left(consumer)
        consumer.close()
        return nacked, sorted((m.data(), m.redelivery_count()) for m in again), 9.8 < elapsed < 13.0, left

    calls = {(kind, side): (lambda kind=kind, side=side: scenario(side, f"{topic}-{kind}-{side}", kind))
             for kind in ("Shared", "Exclusive") for side in BOTH}
    got = _parallel(calls)
    assert got[("Shared", "txn")] == got[("Shared", "pulsar")] == (
        (b"m3", 1, True), [(b"m0", 1), (b"m2", 1)], True, [])
    assert got[("Exclusive", "txn")] == got[("Exclusive", "pulsar")] == (None, [(b"m0", 0), (b"m2", 0)], True, [])


def test_negative_ack_redelivery_delay(clients: dict[str, Any], topic: str) -> None:
    """A negatively acknowledged message comes again after ``negative_ack_redelivery_delay_ms``,
    not before; with the default (60 s) not within a short wait."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        fast = c.subscribe(t, "fast", consumer_type=_mod(side).ConsumerType.Shared,
                           negative_ack_redelivery_delay_ms=600)
        slow = c.subscribe(t, "slow", consumer_type=_mod(side).ConsumerType.Shared)
        _produce(c, t, 1)
        out = []
        for consumer in (fast, slow):
            m = consumer.receive(5000)
            start = time.monotonic()
            consumer.negative_acknowledge(m)
            try:
                back = consumer.receive(1000)
                out.append((back.data(), back.redelivery_count(), 0.55 < time.monotonic() - start < 1.5))
            except Exception as exc:  # both clients' Timeout
                assert "imeout" in type(exc).__name__ or "imeout" in str(exc), exc
                out.append(None)
            consumer.close()
        return out

    assert _same(_each(topic, scenario)) == [(b"m0", 1, True), None]


# ====================================================================== tombstones


def test_null_value_messages(clients: dict[str, Any], topic: str) -> None:
    """``send(None)`` writes a null-value message (a tombstone): ``has_null_value()`` is True, the
    payload ``b""`` (and an empty payload is not null); batched or not, by ``send`` and
    ``send_async``; each client reads the other's."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        other = clients["txn" if side == "pulsar" else "pulsar"]
        consumer = c.subscribe(t, "s")
        for writer in (c, other):
            for batching in (False, True):
                p = writer.create_producer(t, batching_enabled=batching)
                p.send(b"a", partition_key="k")
                p.send(None, partition_key="k", properties={"x": "1"})
                p.send(b"", partition_key="k")
                p.send_async(None, None, partition_key="k2")
                p.flush()
                p.close()
        got = [consumer.receive(5000) for _ in range(16)]
        consumer.close()
        return [(m.data(), m.has_null_value(), m.value(), m.partition_key(), m.properties()) for m in got]

    rows = [(b"a", False, b"a", "k", {}), (b"", True, b"", "k", {"x": "1"}), (b"", False, b"", "k", {}),
            (b"", True, b"", "k2", {})]
    assert _same(_each(topic, scenario)) == rows * 4


def test_null_value_with_a_schema(clients: dict[str, Any], topic: str) -> None:
    """With a schema, ``send(None)`` is not encoded: the value read is the schema's empty value."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        schema = _mod(side).schema.StringSchema()
        consumer = c.subscribe(t, "s", schema=schema)
        p = c.create_producer(t, schema=schema)
        p.send(None)
        p.send("x")
        got = [consumer.receive(5000) for _ in range(2)]
        p.close()
        consumer.close()
        return [(m.data(), m.has_null_value(), m.value()) for m in got]

    assert _same(_each(topic, scenario)) == [(b"", True, ""), (b"x", False, "x")]
