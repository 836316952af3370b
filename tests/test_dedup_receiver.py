"""DedupReceiver on a real broker, against real SQLite and a real PostgreSQL cluster.

Duplicates come from where they come in production: a receiver killed (SIGKILL) between the
database commit and the ack, whose messages the broker redelivers; and a sender re-sending
the same (producer name, sequence id) on a namespace without broker deduplication, so the
broker stores the repeats. The side-effect table must hold every unique message exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
from txn.admin import admin_request, create_namespace
from txn.delivery.dedup import DedupReceiver, Outcome
from txn.delivery.dedup_store import DedupStore, PostgresDedupStore, SqliteDedupStore, open_store

from peer import read_until_sentinel

# ------------------------------------------------------------------ fixtures


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "dedup.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def client(broker: Any) -> Iterator[txn.Client]:
    c = txn.Client(broker.service_url)
    yield c
    c.close()


@pytest.fixture(scope="session")
def nodedup_ns(broker: Any) -> str:
    """A namespace with broker deduplication explicitly off: re-sent sequence ids are stored."""
    ns = f"public/nodd-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    path = f"/admin/v2/namespaces/{ns}/deduplication"
    status, body = admin_request("POST", broker.admin_url, path, False)
    assert status in (200, 204), body
    return ns


# ------------------------------------------------------------------- helpers


def make_table(target: str) -> str:
    """Create a fresh side-effect table; returns its name."""
    name = f"effects_{uuid.uuid4().hex[:10]}"
    st = open_store(target)
    st.begin()
    st.connection.execute(f"CREATE TABLE {name} (producer TEXT NOT NULL, seq BIGINT NOT NULL, payload TEXT NOT NULL)")
    st.commit()
    st.close()
    return name


def effect_handler(table: str, ph: str, delay_s: float = 0.0) -> Callable[[txn.Message, Any], None]:
    """The side effect: one row per processed message, no unique key (a double shows up)."""
    sql = f"INSERT INTO {table} (producer, seq, payload) VALUES ({ph}, {ph}, {ph})"

    def handler(msg: txn.Message, db: Any) -> None:
        db.execute(sql, (msg.producer_name(), msg.sequence_id(), msg.data().decode()))
        if delay_s:
            time.sleep(delay_s)

    return handler


def placeholder(target: str) -> str:
    return "%s" if target.startswith("postgresql://") else "?"


def rows(target: str, table: str) -> list[tuple[str, int, str]]:
    st = open_store(target)
    try:
        st.begin()
        out = [tuple(r) for r in st.connection.execute(f"SELECT producer, seq, payload FROM {table}").fetchall()]
        st.rollback()
        return out  # type: ignore[return-value]
    finally:
        st.close()


def subscribe(client: txn.Client, topic: str, sub: str, timeout_s: float = 30.0) -> txn.Consumer:
    """Subscribe (Exclusive, earliest), retrying while a killed predecessor is still attached."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
        except txn.ConsumerBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def assert_all_acked(broker: Any, topic: str, sub: str) -> None:
    """A new consumer on the subscription gets nothing before a fresh sentinel."""
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        c = oc.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
        left = read_until_sentinel(oc, c, topic)
        assert [m.data() for m in left] == []
    finally:
        oc.close()


def mid_key(mid: txn.MessageId) -> tuple[int, int]:
    return (mid.ledger_id(), mid.entry_id())


# ---------------------------------------------------------- the crashing child


def _child(service_url: str, topic: str, sub: str, target: str, table: str, crash_after: int) -> None:
    """Run a receiver; SIGKILL itself right after the ``crash_after``-th commit, before its ack.

    Prints one JSON line per processed (after commit) and per dropped message.
    """
    client = txn.Client(service_url)
    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    committed = 0

    def emit(event: str, msg: txn.Message) -> None:
        print(json.dumps({"event": event, "mid": list(mid_key(msg.message_id()))}), flush=True)

    def after_commit(msg: txn.Message) -> None:
        nonlocal committed
        committed += 1
        emit("processed", msg)
        if committed == crash_after:
            os.kill(os.getpid(), signal.SIGKILL)

    rx = DedupReceiver(consumer, target, effect_handler(table, placeholder(target)),
                       after_commit=after_commit, on_duplicate=lambda m: emit("duplicate", m))
    rx.run(timeout_millis=30000)
    sys.exit(3)  # not reached: the receiver kills itself first


# --------------------------------------------------------------------- tests


def test_open_store_targets(tmp_path: Any) -> None:
    st = open_store(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(st, SqliteDedupStore) and (tmp_path / "a.db").exists()
    st.close()
    st = open_store(tmp_path / "b.db")
    assert isinstance(st, SqliteDedupStore) and (tmp_path / "b.db").exists()
    st.close()
    st = open_store(":memory:")
    assert st.senders("s") == []
    st.close()


def test_postgres_store_is_postgres(pg_url: str) -> None:
    st = open_store(pg_url)
    assert isinstance(st, PostgresDedupStore)
    (version,) = st.connection.execute("SELECT version()").fetchone()
    st.rollback()
    st.close()
    assert version.startswith("PostgreSQL ")


def test_crash_between_commit_and_ack_and_resent_sequence_ids(
    store_target: str, broker: Any, client: txn.Client, nodedup_ns: str, unique_name: Callable[[str], str]
) -> None:
    topic = f"persistent://{nodedup_ns}/{unique_name('t')}"
    sub = unique_name("sub")
    table = make_table(store_target)
    a = client.create_producer(topic, producer_name=unique_name("A"), batching_enabled=False)
    b = client.create_producer(topic, producer_name=unique_name("B"), batching_enabled=False)
    # 45 stored messages, 40 unique (producer, seq): A re-sends 3, 7, 7, 15, 29; B shares A's seq numbers.
    plan = ([(a, s) for s in range(15)] + [(a, 3), (a, 7)] + [(b, s) for s in range(10)]
            + [(a, s) for s in range(15, 30)] + [(a, 7), (a, 15), (a, 29)])
    sent: list[tuple[str, int, tuple[int, int]]] = []
    for p, s in plan:
        mid = p.send(f"{p.producer_name()}:{s}".encode(), sequence_id=s)
        sent.append((p.producer_name(), s, mid_key(mid)))
    a.close()
    b.close()
    all_mids = {m for _, _, m in sent}
    assert len(all_mids) == 45  # the broker stored every repeat
    first: dict[tuple[str, int], tuple[int, int]] = {}
    for name, s, m in sent:
        first.setdefault((name, s), m)
    repeats = all_mids - set(first.values())
    assert len(first) == 40 and len(repeats) == 5
    crash_mid = first[(b.producer_name(), 4)]  # the 20th to be processed: A0..14, then B0..4

    # Run 1: a receiver process killed with SIGKILL right after its 20th commit, before that ack.
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, "child", broker.service_url, topic, sub, store_target, table, "20"],
        capture_output=True, text=True, timeout=180, cwd=os.path.dirname(__file__),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    p1 = [tuple(e["mid"]) for e in events if e["event"] == "processed"]
    d1 = [tuple(e["mid"]) for e in events if e["event"] == "duplicate"]
    assert len(p1) == 20 and p1[-1] == crash_mid
    assert p1 == [first[(a.producer_name(), s)] for s in range(15)] + [first[(b.producer_name(), s)] for s in range(5)]
    assert set(d1) == {sent[15][2], sent[16][2]}  # A's early re-sends of 3 and 7
    assert sorted(rows(store_target, table)) == sorted(
        [(a.producer_name(), s, f"{a.producer_name()}:{s}") for s in range(15)]
        + [(b.producer_name(), s, f"{b.producer_name()}:{s}") for s in range(5)]
    )

    # Run 2: a new receiver on the same subscription and store.
    p2: list[tuple[int, int]] = []
    d2: list[tuple[int, int]] = []
    consumer = subscribe(client, topic, sub)
    rx = DedupReceiver(consumer, store_target, effect_handler(table, placeholder(store_target)),
                       after_commit=lambda m: p2.append(mid_key(m.message_id())),
                       on_duplicate=lambda m: d2.append(mid_key(m.message_id())))
    stats = rx.run(timeout_millis=3000)
    elapsed = time.monotonic() - t0
    consumer.close()

    assert stats.processed == len(p2) == 20 and stats.duplicates == len(d2)
    assert not set(p1) & set(p2)
    assert crash_mid in d2  # committed, not acked, redelivered: recognised and dropped
    assert set(d2) - set(p1) - set(d1) == repeats - set(d1)  # the 3 later re-sends
    assert set(d2) <= set(p1) | repeats  # every other drop is a redelivery of a committed message
    assert set(p1) | set(d1) | set(p2) | set(d2) == all_mids
    got = rows(store_target, table)
    assert len(got) == 40
    assert Counter((p, s) for p, s, _ in got) == Counter(first.keys())
    assert {(p, s, d) for p, s, d in got} == {(n, s, f"{n}:{s}") for n, s in first}
    state = rx.store.sender_state(rx.scope, f"{a.producer_name()}@{topic}")
    assert state is not None and state.ids == 30 and state.low is None
    rx.close()
    assert_all_acked(broker, topic, sub)
    print(f"\ncrash/redelivery: run1 processed {len(p1)} dropped {len(d1)}; run2 processed {len(p2)} "
          f"dropped {len(d2)} (redelivered-after-commit {len(set(d2) & set(p1))}); {elapsed:.1f}s")


def test_window_bounds_ids_per_sender(
    store_target: str, broker: Any, client: txn.Client, topic: str, unique_name: Callable[[str], str]
) -> None:
    table = make_table(store_target)
    sub = unique_name("sub")
    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    p = client.create_producer(topic, producer_name=unique_name("W"), batching_max_publish_delay_ms=5,
                               block_if_queue_full=True)
    for i in range(5000):
        p.send_async(f"w{i}".encode(), None)
    p.flush()
    assert p.last_sequence_id() == 4999
    rx = DedupReceiver(consumer, store_target, effect_handler(table, placeholder(store_target)), window=100)
    sender = f"{p.producer_name()}@{topic}"
    t0 = time.monotonic()
    stats = rx.run(max_messages=5000, timeout_millis=30000)
    elapsed = time.monotonic() - t0
    assert (stats.processed, stats.duplicates) == (5000, 0)
    assert rx.store.ids(rx.scope, sender) == [(s, 0, 0) for s in range(4900, 5000)]
    state = rx.store.sender_state(rx.scope, sender)
    assert state is not None and state.ids == 100 and state.low == (4899, 0, 0)

    # Below the low-water mark and inside the window: both seen; a new id moves the window.
    p.send(b"old-again", sequence_id=10)
    p.send(b"recent-again", sequence_id=4950)
    p.send(b"w5000")
    p.close()
    assert [rx.process_one(10000) for _ in range(3)] == [Outcome.DUPLICATE, Outcome.DUPLICATE, Outcome.PROCESSED]
    assert rx.store.ids(rx.scope, sender) == [(s, 0, 0) for s in range(4901, 5001)]
    assert rx.store.sender_state(rx.scope, sender).low == (4900, 0, 0)  # type: ignore[union-attr]
    got = rows(store_target, table)
    assert len(got) == 5001 and {s for _, s, _ in got} == set(range(5001))
    consumer.close()
    rx.close()
    assert_all_acked(broker, topic, sub)
    print(f"\nwindow: 5000 messages through the receiver in {elapsed:.1f}s ({5000 / elapsed:.0f}/s)")


def test_idle_senders_are_purged(
    store_target: str, client: txn.Client, topic: str, unique_name: Callable[[str], str]
) -> None:
    table = make_table(store_target)
    consumer = client.subscribe(topic, unique_name("sub"), initial_position=txn.InitialPosition.Earliest)
    a = client.create_producer(topic, producer_name=unique_name("A"), batching_enabled=False)
    b = client.create_producer(topic, producer_name=unique_name("B"), batching_enabled=False)
    sa, sb = f"{a.producer_name()}@{topic}", f"{b.producer_name()}@{topic}"
    rx = DedupReceiver(consumer, store_target, effect_handler(table, placeholder(store_target)),
                       idle_purge_seconds=1)
    for i in range(3):
        a.send(f"a{i}".encode())
    assert rx.run(max_messages=3).processed == 3
    assert rx.store.senders(rx.scope) == [sa] and len(rx.store.ids(rx.scope, sa)) == 3

    time.sleep(1.5)  # A goes idle; the next process_one purges it before receiving B's message
    b.send(b"b0")
    assert rx.process_one(10000) == Outcome.PROCESSED
    assert rx.store.senders(rx.scope) == [sb]
    assert rx.store.ids(rx.scope, sa) == [] and rx.store.sender_state(rx.scope, sa) is None
    assert rx.stats.purged_senders == 1

    time.sleep(1.5)  # now B is idle too: the run loop's periodic purge forgets it with no message
    assert rx.run(timeout_millis=300).processed == 4
    assert rx.store.senders(rx.scope) == [] and rx.store.ids(rx.scope, sb) == []
    assert rx.stats.purged_senders == 2
    assert len(rows(store_target, table)) == 4
    consumer.close()
    rx.close()


def test_two_receivers_on_one_sender_apply_each_effect_once(
    store_target: str, client: txn.Client, topic: str, unique_name: Callable[[str], str]
) -> None:
    """Two receivers (two subscriptions, so each gets every message) share one scope: each
    message's effect is applied by exactly one of them; the other sees a duplicate."""
    n = 200
    table = make_table(store_target)
    scope = unique_name("shared")
    consumers = [client.subscribe(topic, unique_name(f"s{i}"), initial_position=txn.InitialPosition.Earliest)
                 for i in range(2)]
    p = client.create_producer(topic, producer_name=unique_name("C"), batching_max_publish_delay_ms=5)
    for i in range(n):
        p.send_async(f"c{i}".encode(), None)
    p.flush()
    p.close()
    stores: list[DedupStore] = [open_store(store_target) for _ in range(2)]

    def stall(i: int) -> Callable[[txn.Message], None]:
        # Each receiver pauses now and then after a commit, so the lead changes hands and
        # the two also meet on the same message (one waits on the other's lock).
        return lambda m: time.sleep(0.05) if m.sequence_id() % 20 == 10 * i else None

    rxs = [DedupReceiver(c, st, effect_handler(table, placeholder(store_target), delay_s=0.001), scope=scope,
                         after_commit=stall(i))
           for i, (c, st) in enumerate(zip(consumers, stores, strict=True))]
    errors: list[BaseException] = []

    def go(rx: DedupReceiver) -> None:
        try:
            rx.run(max_messages=n, timeout_millis=30000)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(rx,)) for rx in rxs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    s1, s2 = (rx.stats for rx in rxs)
    assert s1.processed + s1.duplicates == n and s2.processed + s2.duplicates == n
    assert s1.processed + s2.processed == n and s1.duplicates + s2.duplicates == n
    assert s1.processed > 0 and s2.processed > 0  # both applied effects: they really competed
    got = rows(store_target, table)
    assert sorted(s for _, s, _ in got) == list(range(n))
    for c in consumers:
        c.close()
    for st in stores:
        st.close()
    print(f"\ntwo receivers: processed {s1.processed} + {s2.processed}, dropped {s1.duplicates} + {s2.duplicates}")


class _Crash(Exception):
    pass


def test_message_id_key_catches_redelivery_not_resends(
    store_target: str, broker: Any, client: txn.Client, nodedup_ns: str, unique_name: Callable[[str], str]
) -> None:
    topic = f"persistent://{nodedup_ns}/{unique_name('t')}"
    sub = unique_name("sub")
    table = make_table(store_target)
    p = client.create_producer(topic, producer_name=unique_name("M"), batching_enabled=False)
    seqs = list(range(10)) + [3, 5]
    for s in seqs:
        p.send(f"m{s}".encode(), sequence_id=s)
    p.close()
    handler = effect_handler(table, placeholder(store_target))
    n = 0

    def crash_on_sixth(msg: txn.Message) -> None:
        nonlocal n
        n += 1
        if n == 6:
            raise _Crash  # after the commit, before the ack: as if the process died here

    consumer = client.subscribe(topic, sub, initial_position=txn.InitialPosition.Earliest)
    rx = DedupReceiver(consumer, store_target, handler, key_by="message_id", after_commit=crash_on_sixth)
    with pytest.raises(_Crash):
        rx.run()
    assert rx.stats.processed == 5  # the sixth is committed but was never acked
    consumer.close()  # flushes the five acks; the sixth and the prefetched rest are redelivered
    rx.close()

    consumer = subscribe(client, topic, sub)
    rx = DedupReceiver(consumer, store_target, handler, key_by="message_id")
    stats = rx.run(timeout_millis=3000)
    consumer.close()
    assert (stats.processed, stats.duplicates) == (6, 1)
    got = rows(store_target, table)
    # Message ids do not see a sender's re-sends: seq 3 and 5 are applied twice, as stored.
    assert Counter(s for _, s, _ in got) == Counter(seqs)
    held = rx.store.ids(rx.scope, topic)
    assert len(held) == 12 and all(k[2] == -1 for k in held)
    rx.close()
    assert_all_acked(broker, topic, sub)


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "child":
    _child(*sys.argv[2:7], crash_after=int(sys.argv[7]))
