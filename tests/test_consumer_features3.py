"""Subscribe options, Key_Shared policies, readers and client calls side by side with the official
``pulsar-client`` (issue 19, section 2): each test runs one scenario on both clients and asserts
that the outcomes are equal (and what they are)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
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
    return pulsar if side == "pulsar" else txn


def _each(topic: str, scenario: Callable[[str, str], Any]) -> dict[str, Any]:
    """Run ``scenario(side, topic_of_that_side)`` for both clients at once, each on a thread."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(side: str) -> None:
        try:
            results[side] = scenario(side, f"{topic}-{side}")
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(side,), daemon=True) for side in BOTH]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert len(results) == 2, "a scenario did not finish"
    return results


def _same(outcomes: dict[str, Any]) -> Any:
    assert outcomes["txn"] == outcomes["pulsar"]
    return outcomes["txn"]


def _produce(client: Any, topic: str, items: list[str] | int, batched: bool = False) -> list[Any]:
    """Send ``items`` (``key=value`` strings are keyed; an int n sends ``m0``..); return the ids."""
    if isinstance(items, int):
        items = [f"m{i}" for i in range(items)]
    p = client.create_producer(topic, batching_enabled=batched, batching_max_publish_delay_ms=1000)
    ids: list[Any] = []
    if batched:
        done = threading.Event()

        def cb(_res: Any, mid: Any) -> None:
            ids.append(mid)
            if len(ids) == len(items):
                done.set()

        for item in items:
            p.send_async(item.encode(), cb)
        p.flush()
        assert done.wait(10)
    for item in items if not batched else []:
        key, _, _value = item.partition("=")
        ids.append(p.send(item.encode(), partition_key=key if "=" in item else None))
    p.close()
    return ids


def _drain(consumer: Any, wait_ms: int = 300, ack: bool = True) -> list[str]:
    """What ``consumer`` receives until nothing comes for ``wait_ms``, acknowledged."""
    out = []
    while True:
        try:
            m = consumer.receive(timeout_millis=wait_ms)
        except Exception as exc:  # both clients' Timeout
            assert type(exc).__name__ == "Timeout", exc
            return out
        out.append(m.data().decode())
        if ack:
            consumer.acknowledge(m)


def _error(call: Callable[[], Any]) -> str:
    """The name of the exception ``call()`` raises (``"-"`` if none)."""
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "-"


def _stats(broker: Any, topic: str) -> dict[str, Any]:
    status, body = admin_request("GET", broker.admin_url, f"/admin/v2/{topic_path(topic)}/stats")
    assert status == 200, body
    return body


# ====================================================================== receiver_queue_size=0


def test_receiver_queue_size_zero(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """A zero-queue consumer prefetches nothing: on a Shared subscription every message goes to the
    consumer with permits until it leaves; then each ``receive()`` gets the next one. A timeout,
    or a partitioned topic, is ``InvalidConfiguration``; a list of topics may take a timeout. A
    listener gets every message, asking for the next when it returns."""
    status, _ = admin_request("PUT", broker.admin_url, f"/admin/v2/{topic_path(topic)}-parted/partitions", 2)
    assert status in (200, 204)

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        shared = _mod(side).ConsumerType.Shared
        heard: list[str] = []
        listened = c.subscribe(t, "l", receiver_queue_size=0,
                               message_listener=lambda cons, m: (heard.append(m.data().decode()), cons.acknowledge(m)))
        zero = c.subscribe(t, "s", consumer_type=shared, receiver_queue_size=0)
        other = c.subscribe(t, "s", consumer_type=shared)
        _produce(c, t, 6)
        by_other = _drain(other)
        other.close()
        _produce(c, t, ["m6", "m7", "m8"])
        by_zero = []
        for _ in range(3):
            m = zero.receive()
            by_zero.append(m.data().decode())
            zero.acknowledge(m)
        permits = [x["availablePermits"] for x in _stats(broker, t)["subscriptions"]["s"]["consumers"]]
        errors = (_error(lambda: zero.receive(timeout_millis=100)),
                  _error(lambda: c.subscribe(f"{topic}-parted", "z", receiver_queue_size=0)),
                  _error(lambda: c.subscribe([t], "listed", receiver_queue_size=0).receive(timeout_millis=50)))
        zero.close()
        deadline = time.monotonic() + 5
        while len(heard) < 9 and time.monotonic() < deadline:
            time.sleep(0.02)
        listened.close()
        return by_other, by_zero, permits, errors, heard

    assert _same(_each(topic, scenario)) == (
        ["m0", "m1", "m2", "m3", "m4", "m5"], ["m6", "m7", "m8"], [0],
        ("InvalidConfiguration", "InvalidConfiguration", "Timeout"), [f"m{i}" for i in range(9)])


# ====================================================================== start_message_id_inclusive


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_start_message_id_inclusive(clients: dict[str, Any], topic: str, batched: bool) -> None:
    """After ``seek(id)``, a consumer subscribed with ``start_message_id_inclusive=True`` gets the
    message sought again; by default it resumes after it (batched entries too)."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        earliest = _mod(side).InitialPosition.Earliest
        consumers = {inc: c.subscribe(t, f"s-{inc}", initial_position=earliest, start_message_id_inclusive=inc)
                     for inc in (True, False)}
        # Never acks: the seeks re-read what both "s-*" acked, which retention none may delete.
        clients["pulsar"].subscribe(t, "keep", initial_position=pulsar.InitialPosition.Earliest)
        ids = _produce(c, t, 5, batched=batched)
        out = {}
        for inc, consumer in consumers.items():
            first = _drain(consumer, 200)
            consumer.seek(ids[2])
            out[inc] = (first, _drain(consumer, 300))
            consumer.close()
        return out

    assert _same(_each(topic, scenario)) == {
        True: (["m0", "m1", "m2", "m3", "m4"], ["m2", "m3", "m4"]),
        False: (["m0", "m1", "m2", "m3", "m4"], ["m3", "m4"]),
    }
    with pytest.raises(ValueError):
        clients["txn"].subscribe(topic, "s", start_message_id_inclusive="yes")


# ====================================================================== is_read_compacted


def _compact(broker: Any, topic: str) -> None:
    path = f"/admin/v2/{topic_path(topic)}/compaction"
    status, body = admin_request("PUT", broker.admin_url, path)
    assert status in (200, 204), body
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, body = admin_request("GET", broker.admin_url, path)
        if status == 200 and body.get("status") == "SUCCESS":
            return
        assert body.get("status") != "ERROR", body
        time.sleep(0.1)
    raise AssertionError(f"compaction of {topic} did not finish")


def test_is_read_compacted(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """``is_read_compacted=True`` reads the compacted view (the last value of each key up to the
    compaction horizon, then the rest); a reader too. On a Shared subscription or a non-persistent
    topic it is ``InvalidConfiguration``."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        mod = _mod(side)
        earliest = mod.InitialPosition.Earliest
        _produce(c, t, ["k1=a", "k2=b", "k1=c", "k3=d", "k3=e"])
        _compact(broker, t)
        _produce(c, t, ["k2=f"])
        compacted = _drain(c.subscribe(t, "compacted", initial_position=earliest, is_read_compacted=True))
        full = _drain(c.subscribe(t, "full", initial_position=earliest))
        reader = c.create_reader(t, mod.MessageId.earliest, is_read_compacted=True)
        by_reader = []
        while reader.has_message_available():
            by_reader.append(reader.read_next(timeout_millis=30000).data().decode())
        reader.close()
        errors = (
            _error(lambda: c.subscribe(t, "x", consumer_type=mod.ConsumerType.Shared, is_read_compacted=True)),
            _error(lambda: c.subscribe(t.replace("persistent://", "non-persistent://"), "x", is_read_compacted=True)),
        )
        return compacted, full, by_reader, errors

    assert _same(_each(topic, scenario)) == (
        ["k2=b", "k1=c", "k3=e", "k2=f"],
        ["k1=a", "k2=b", "k1=c", "k3=d", "k3=e", "k2=f"],
        ["k2=b", "k1=c", "k3=e", "k2=f"],
        ("InvalidConfiguration", "InvalidConfiguration"),
    )


# ====================================================================== Key_Shared policy


def test_key_shared_policy_object() -> None:
    """``ConsumerKeySharedPolicy``: the same defaults, getters and argument errors (type and message)."""

    def build(side: str, *args: Any) -> Any:
        mod = _mod(side)
        try:
            p = mod.ConsumerKeySharedPolicy(*args)
        except Exception as exc:
            return type(exc).__name__, str(exc)
        return p.key_shared_mode.name, p.allow_out_of_order_delivery, p.sticky_ranges

    cases = [
        (), ("AutoSplit", True), ("Sticky", False, [(0, 100), (200, 300)]), ("AutoSplit", False, [(0, 10)]),
        ("Sticky",), ("Sticky", False, []), ("Sticky", False, [(0, 65536)]), ("Sticky", False, [(-1, 3)]),
        ("Sticky", False, [(0, 10), (10, 20)]), ("Sticky", False, [(10, 20), (0, 100)]),
        ("Sticky", False, [(0, 65535)]), ("Sticky", False, [(5, 0), (1, 2)]),
    ]
    for case in cases:
        got = {side: build(side, *((getattr(_mod(side).KeySharedMode, case[0]),) + case[1:] if case else ()))
               for side in BOTH}
        assert got["txn"] == got["pulsar"], case
    assert [(m.name, int(m)) for m in txn.KeySharedMode] == [(m, int(v)) for m, v in
                                                             pulsar.KeySharedMode.__members__.items()]


def test_key_shared_sticky_ranges(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """Sticky ranges reach the broker (its stats) and each consumer gets exactly the keys whose hash
    falls in its ranges, in order; ``allow_out_of_order_delivery`` reaches it too."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        mod = _mod(side)
        ks = mod.ConsumerType.KeyShared

        def policy(*ranges: tuple[int, int]) -> Any:
            return mod.ConsumerKeySharedPolicy(mod.KeySharedMode.Sticky, sticky_ranges=list(ranges))

        low = c.subscribe(t, "sticky", consumer_type=ks, consumer_name="low",
                          key_shared_policy=policy((0, 20000), (40001, 50000)))
        high = c.subscribe(t, "sticky", consumer_type=ks, consumer_name="high",
                           key_shared_policy=policy((20001, 40000), (50001, 65535)))
        loose = c.subscribe(t, "loose", consumer_type=ks, key_shared_policy=mod.ConsumerKeySharedPolicy(
            allow_out_of_order_delivery=True))
        _produce(c, t, [f"key{i % 7}=v{i}" for i in range(28)])
        got = {"low": _drain(low), "high": _drain(high), "loose": len(_drain(loose))}
        subs = _stats(broker, t)["subscriptions"]
        meta = {name: (subs[name].get("keySharedMode"), subs[name].get("allowOutOfOrderDelivery", False))
                for name in ("sticky", "loose")}
        ranges = sorted((x["consumerName"], [list(r) for r in x.get("keyHashRangeArrays") or ()])
                        for x in subs["sticky"]["consumers"])
        for x in (low, high, loose):
            x.close()
        return got, meta, ranges

    got, meta, ranges = _same(_each(topic, scenario))
    assert len(got["low"]) + len(got["high"]) == 28 and got["loose"] == 28
    assert got["low"] and got["high"]
    assert meta == {"sticky": ("STICKY", False), "loose": ("AUTO_SPLIT", True)}
    assert ranges == [("high", [[20001, 40000], [50001, 65535]]), ("low", [[0, 20000], [40001, 50000]])]
    with pytest.raises(ValueError):
        clients["txn"].subscribe(topic, "s", key_shared_policy="sticky")


# ====================================================================== reader names


def test_reader_subscription_and_name(clients: dict[str, Any], broker: Any, topic: str) -> None:
    """A reader's ``reader_name`` is its consumer's name (none without one); its subscription is
    ``reader-<10 hex>``, after ``<subscription_role_prefix>-`` if one is given."""

    def scenario(side: str, t: str) -> Any:
        c = clients[side]
        earliest = _mod(side).MessageId.earliest
        _produce(c, t, 1)
        named = c.create_reader(t, earliest, reader_name="my-reader", subscription_role_prefix="role")
        plain = c.create_reader(t, earliest)
        named.read_next(timeout_millis=30000)
        plain.read_next(timeout_millis=30000)
        subs = _stats(broker, t)["subscriptions"]
        out = sorted(
            (re.sub(r"[0-9a-f]{10}$", "<hex>", name), [x.get("consumerName", "") != "" for x in s["consumers"]],
             [x.get("consumerName") for x in s["consumers"] if x.get("consumerName") == "my-reader"])
            for name, s in subs.items()
        )
        named.close()
        plain.close()
        return out

    assert _same(_each(topic, scenario)) == [
        ("reader-<hex>", [False], []), ("role-reader-<hex>", [True], ["my-reader"])]


# ====================================================================== client calls


_LOGGED = """
import logging, sys
import {mod}
records = []
handler = logging.Handler()
handler.emit = records.append
log = logging.getLogger("feat3")
log.setLevel(logging.INFO)
log.propagate = False
log.addHandler(handler)
client = {mod}.Client(sys.argv[1], logger=log)
client.create_producer(sys.argv[2]).close()
parts = client.get_topic_partitions(sys.argv[2] + "-parted")
client.close()
print(len(parts), bool(records), all(r.levelno >= logging.INFO for r in records))
"""


def test_client_partitions_shutdown_logger(broker: Any, topic: str) -> None:
    """``get_topic_partitions`` names the same partitions; ``shutdown()`` closes everything at once
    (then sends and subscribes raise ``AlreadyClosed``, ``close()`` and ``shutdown()`` again are
    no-ops); ``logger=`` takes a ``logging.Logger``, which gets the client's records at its level,
    and refuses anything else with ``ValueError``."""
    status, _ = admin_request("PUT", broker.admin_url, f"/admin/v2/{topic_path(topic)}-parted/partitions", 3)
    assert status in (200, 204)
    short = topic.rsplit("/", 1)[1]
    # Each logger= client in a process of its own: the official client's Python logger stays
    # installed in its C++ core after close(), and then its shutdown() waits 5 s on the GIL.
    logged = {side: subprocess.Popen([sys.executable, "-c", _LOGGED.format(mod=_mod(side).__name__),
                                      broker.service_url, topic], stdout=subprocess.PIPE, text=True)
              for side in BOTH}

    def scenario(side: str, t: str) -> Any:
        c = _mod(side).Client(broker.service_url)
        parts = (c.get_topic_partitions(f"{topic}-parted"), c.get_topic_partitions(short + "-parted"),
                 [p.replace(f"-{side}", "") for p in c.get_topic_partitions(t)])
        c.close()
        c = _mod(side).Client(broker.service_url)  # after a lookup, the official shutdown() waits 5 s
        producer = c.create_producer(t)
        c.shutdown()
        after = (_error(lambda: producer.send(b"x")), _error(lambda: c.subscribe(t, "s2")),
                 producer.is_connected(), _error(c.close), _error(c.shutdown))
        out, _ = logged[side].communicate(timeout=30)
        return parts, after, out.split()[-3:]

    parted = [f"{topic}-parted-partition-{i}" for i in range(3)]
    assert _same(_each(topic, scenario)) == (
        (parted, parted, [topic]), ("AlreadyClosed", "AlreadyClosed", False, "-", "-"), ["3", "True", "True"])
    for side in BOTH:
        with pytest.raises(ValueError):
            _mod(side).Client(broker.service_url, logger="pulsar")
    # Ours leaves the txn logger as it found it once the last client with logger= is closed.
    txn_log = logging.getLogger("txn")
    before = (txn_log.level, txn_log.propagate, list(txn_log.handlers))
    clients = [txn.Client(broker.service_url, logger=logging.getLogger(f"feat3-{i}")) for i in range(2)]
    assert txn_log.propagate is False
    for c in clients:
        c.close()
    assert (txn_log.level, txn_log.propagate, list(txn_log.handlers)) == before
