"""The ordering guard (must-follow) in the dedup receiver and the processor, on a real broker.

Messages carry ``pulsar-txn.id`` (their business id) and ``pulsar-txn.must-follow`` (the id
they must follow). Followers are published to one partition before their predecessor on the
other, so a consumer of both partitions gets them out of order; the side effects (database rows,
output messages) must come out in order, each exactly once, across a SIGKILL of the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
from txn.delivery.dedup import DedupReceiver, Outcome
from txn.delivery.dedup_store import open_store
from txn.delivery.ordering import BUSINESS_ID, MUST_FOLLOW, OrderingGuard
from txn.localbroker import create_partitioned_topic

from peer import read_until_sentinel

# ------------------------------------------------------------------- helpers


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "order.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def client(broker: Any) -> Iterator[txn.Client]:
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def official(broker: Any) -> Iterator[pulsar.Client]:
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def two_partitions(broker: Any, unique_name: Callable[[str], str], prefix: str = "t") -> str:
    topic = f"persistent://public/default/{unique_name(prefix)}"
    create_partitioned_topic(broker.admin_url, topic, 2)
    return topic


def props(bid: str, after: str | None = None) -> dict[str, str]:
    return {BUSINESS_ID: bid, **({MUST_FOLLOW: after} if after else {})}


def publish(client: txn.Client, topic: str, plan: list[tuple[str, str | None]]) -> None:
    """Send ``(business id, must-follow)`` pairs to one topic (or partition), in order."""
    p = client.create_producer(topic, batching_enabled=False)
    for bid, after in plan:
        p.send(bid.encode(), properties=props(bid, after))
    p.close()


def make_table(target: str) -> str:
    name = f"eff_{os.urandom(5).hex()}"
    st = open_store(target)
    st.begin()
    st.connection.execute(f"CREATE TABLE {name} (pos BIGINT NOT NULL, bid TEXT NOT NULL)")
    st.commit()
    st.close()
    return name


def effect(table: str, target: str) -> Callable[[txn.Message, Any], None]:
    """One row per processed message, numbered in processing order (no unique key)."""
    ph = "%s" if target.startswith("postgresql://") else "?"
    sql = f"INSERT INTO {table} (pos, bid) SELECT COUNT(*) + 1, {ph} FROM {table}"

    def handler(msg: txn.Message, db: Any) -> None:
        db.execute(sql, (msg.properties()[BUSINESS_ID],))

    return handler


def effects(target: str, table: str) -> list[str]:
    st = open_store(target)
    try:
        st.begin()
        out = [r[1] for r in st.connection.execute(f"SELECT pos, bid FROM {table} ORDER BY pos").fetchall()]
        st.rollback()
        return out
    finally:
        st.close()


def subscribe(client: txn.Client, topic: str, sub: str, timeout_s: float = 30.0) -> txn.Consumer:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
        except txn.ConsumerBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def assert_all_acked(official: pulsar.Client, topic: str, sub: str) -> None:
    c = official.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in read_until_sentinel(official, c, topic)] == []


# ------------------------------------------------------------- the dedup receiver


def test_receiver_delivers_in_order_across_partitions(
    store_target: str, broker: Any, client: txn.Client, official: pulsar.Client, unique_name: Callable[[str], str]
) -> None:
    topic = two_partitions(broker, unique_name)
    sub = unique_name("sub")
    table = make_table(store_target)
    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    # Partition 1 gets d (after c) and b (after a); partition 0 gets c (after b). Nobody has a yet.
    publish(client, f"{topic}-partition-1", [("d", "c"), ("b", "a"), ("x1", None)])
    publish(client, f"{topic}-partition-0", [("c", "b"), ("x0", None)])
    rx = DedupReceiver(consumer, store_target, effect(table, store_target), key_by="message_id",
                       ordering=OrderingGuard(max_hold_ms=600_000))
    outcomes = [rx.process_one(10000) for _ in range(5)]
    assert sorted(o.value for o in outcomes if o) == ["held", "held", "held", "processed", "processed"]
    assert sorted(effects(store_target, table)) == ["x0", "x1"]
    assert sorted(rx.ordering.held_ids()) == ["b", "c", "d"]  # type: ignore[union-attr]

    publish(client, f"{topic}-partition-0", [("a", None)])  # the predecessor of them all, last
    stats = rx.run(max_messages=4, timeout_millis=10000)
    assert (stats.processed, stats.held, stats.parked, stats.duplicates) == (6, 3, 0, 0)
    got = effects(store_target, table)
    assert sorted(got[:2]) == ["x0", "x1"] and got[2:] == ["a", "b", "c", "d"]
    assert rx.store.order_counts(rx.scope) == {"done": 6}
    assert rx.ordering.holding == 0  # type: ignore[union-attr]
    consumer.close()
    rx.close()
    assert_all_acked(official, topic, sub)


def test_receiver_parks_followers_of_a_predecessor_that_never_comes(
    broker: Any, client: txn.Client, official: pulsar.Client, topic: str, unique_name: Callable[[str], str],
    tmp_path: Any,
) -> None:
    target = str(tmp_path / "order.db")
    sub = unique_name("sub")
    table = make_table(target)
    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    publish(client, topic, [("f1", "ghost"), ("f2", "f1"), ("f3", "ghost"), ("f4", "ghost"), ("x", None)])
    parked_cb: list[tuple[str, str]] = []
    rx = DedupReceiver(consumer, target, effect(table, target), ordering=OrderingGuard(max_held=3, max_hold_ms=1500),
                       on_park=lambda m, e: parked_cb.append((m.properties()[BUSINESS_ID], e.reason)))
    mids: dict[str, str] = {}
    outcomes = []
    for _ in range(7):
        out = rx.process_one(10000)
        outcomes.append(out)
    for m in rx.store.parked_messages(rx.scope):
        mids[m.business_id or ""] = m.message_id
    # f1..f3 held; f4 overflows the limit of 3: the oldest (f1) is parked, then its follower f2.
    assert outcomes == [Outcome.HELD] * 4 + [Outcome.PARKED, Outcome.PARKED, Outcome.PROCESSED]
    stats = rx.run(max_messages=2, timeout_millis=5000)  # f3 and f4 run out of time
    assert (stats.processed, stats.parked, stats.held) == (1, 4, 4)
    assert effects(target, table) == ["x"]
    parked = rx.store.parked_messages(rx.scope)
    mids = {m.business_id or "": m.message_id for m in parked}
    assert [(m.business_id, m.reason) for m in parked] == [
        ("f1", f"message f1 must follow ghost: held-message limit 3 reached (topic {topic}, message {mids['f1']})"),
        ("f2", f"message f2 must follow f1, which was parked (topic {topic}, message {mids['f2']})"),
        ("f3", f"message f3 must follow ghost, which was not committed within 1500 ms "
               f"(topic {topic}, message {mids['f3']})"),
        ("f4", f"message f4 must follow ghost, which was not committed within 1500 ms "
               f"(topic {topic}, message {mids['f4']})"),
    ]
    assert [(m.payload, m.properties) for m in parked] == [
        (b"f1", props("f1", "ghost")), (b"f2", props("f2", "f1")), (b"f3", props("f3", "ghost")),
        (b"f4", props("f4", "ghost"))]
    assert [b for b, _ in parked_cb] == ["f1", "f2", "f3", "f4"]
    assert rx.store.order_counts(rx.scope) == {"done": 1, "parked": 4}

    # The parked state is durable: a late follower of f1 is parked at once, by a new receiver.
    consumer.close()
    rx.close()
    publish(client, topic, [("f5", "f1")])
    consumer = subscribe(client, topic, sub)
    rx = DedupReceiver(consumer, target, effect(table, target), ordering=OrderingGuard(max_hold_ms=600_000))
    assert rx.process_one(10000) == Outcome.PARKED
    last = rx.store.parked_messages(rx.scope)[-1]
    assert (last.business_id, last.reason) == (
        "f5", f"message f5 must follow f1, which was parked (topic {topic}, message {last.message_id})")
    consumer.close()
    rx.close()
    assert_all_acked(official, topic, sub)


CHAIN = [f"c{i}" for i in range(10)]


def _rx_child(service_url: str, topic: str, sub: str, target: str, table: str, crash_after: int) -> None:
    """A receiver with the guard that SIGKILLs itself right after its ``crash_after``-th commit."""
    client = txn.Client(service_url)
    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    committed = 0

    def after_commit(msg: txn.Message) -> None:
        nonlocal committed
        committed += 1
        print(json.dumps({"processed": msg.properties()[BUSINESS_ID]}), flush=True)
        if committed == crash_after:
            os.kill(os.getpid(), signal.SIGKILL)

    rx = DedupReceiver(consumer, target, effect(table, target), key_by="message_id", after_commit=after_commit,
                       ordering=OrderingGuard(max_hold_ms=600_000))
    rx.run(timeout_millis=30000)
    sys.exit(3)


def test_receiver_crash_loses_and_duplicates_nothing(
    broker: Any, client: txn.Client, official: pulsar.Client, unique_name: Callable[[str], str], tmp_path: Any
) -> None:
    target = str(tmp_path / "order.db")
    topic = two_partitions(broker, unique_name)
    sub = unique_name("sub")
    table = make_table(target)
    client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest).close()
    # Odd links on partition 1, published first; even links on partition 0; unordered x's on both.
    publish(client, f"{topic}-partition-1", [(CHAIN[i], CHAIN[i - 1]) for i in range(1, 10, 2)] + [("x1", None)])
    publish(client, f"{topic}-partition-0", [(CHAIN[i], CHAIN[i - 1] if i else None) for i in range(0, 10, 2)]
            + [("x0", None)])
    proc = subprocess.run([sys.executable, __file__, "rx", broker.service_url, topic, sub, target, table, "5"],
                          capture_output=True, text=True, timeout=180, cwd=os.path.dirname(__file__))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run1 = [json.loads(line)["processed"] for line in proc.stdout.splitlines()]
    assert len(run1) == 5 and effects(target, table) == run1  # the 5th committed, never acknowledged
    assert [b for b in run1 if b.startswith("c")] == CHAIN[:len([b for b in run1 if b.startswith("c")])]

    consumer = subscribe(client, topic, sub)
    dups: list[str] = []
    rx = DedupReceiver(consumer, target, effect(table, target), key_by="message_id",
                       on_duplicate=lambda m: dups.append(m.properties()[BUSINESS_ID]),
                       ordering=OrderingGuard(max_hold_ms=600_000))
    stats = rx.run(timeout_millis=3000)
    consumer.close()
    rx.close()
    got = effects(target, table)
    assert sorted(got) == sorted(CHAIN + ["x0", "x1"])  # each once
    assert [b for b in got if b.startswith("c")] == CHAIN  # in order
    assert (stats.processed, stats.parked) == (7, 0)
    assert run1[-1] in dups  # committed before the kill, redelivered, recognised
    assert_all_acked(official, topic, sub)


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "rx":
    _rx_child(*sys.argv[2:7], crash_after=int(sys.argv[7]))
