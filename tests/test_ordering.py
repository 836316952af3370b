"""The ordering guard (must-follow) in the dedup receiver and the processor, on a real broker.

Messages carry ``pulsar-txn.id`` (their business id) and ``pulsar-txn.must-follow`` (the id
they must follow). Followers are published to one partition before their predecessor on the
other, so a consumer of both partitions gets them out of order; the side effects (database rows,
output messages) must come out in order, each exactly once, across a SIGKILL of the process.
"""

from __future__ import annotations

import asyncio
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
from txn.admin import create_partitioned_topic
from txn.delivery.dedup import DedupReceiver, Outcome
from txn.delivery.dedup_store import open_store
from txn.delivery.ordering import BUSINESS_ID, MUST_FOLLOW, OrderingGuard
from txn.delivery.processor import PARK_ERROR, PARK_SOURCE_ID, AsyncProcessor, ProcessorConfig

from peer import read_n, read_until_sentinel

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


def _outcomes(rx: DedupReceiver, n: int, limit_s: float = 60.0) -> list[Outcome]:
    """The next ``n`` outcomes of ``process_one``. A None is skipped: while messages are held, a
    receive waits at most the guard's ``poll_interval_ms`` (200 ms), and on a loaded machine another
    partition's messages can come later than that (seen in a CI run: 3 outcomes of 5)."""
    out: list[Outcome] = []
    deadline = time.monotonic() + limit_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {out} after {limit_s} s"
        o = rx.process_one(10000)
        if o is not None:
            out.append(o)
    return out


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
    outcomes = _outcomes(rx, 5)
    assert sorted(o.value for o in outcomes) == ["held", "held", "held", "processed", "processed"]
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
    outcomes = _outcomes(rx, 7)
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


# ------------------------------------------------------------------ the processor


def emit_id(m: txn.Message) -> bytes:
    """The processor's handler: one output, the input's business id."""
    return m.properties()[BUSINESS_ID].encode()


def out_reader(official: pulsar.Client, out: str) -> pulsar.Consumer:
    return official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)


async def run_until(proc: AsyncProcessor, done: Callable[[], bool], limit_s: float = 120.0) -> None:
    """Run ``proc`` until ``done()`` (checked every 50 ms, at most ``limit_s``), then stop it."""
    task = asyncio.ensure_future(proc.run())
    deadline = time.monotonic() + limit_s
    while not done() and not task.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    proc.stop()
    await task
    assert done(), proc.stats.line("test", 0)


def test_processor_processes_in_order_across_partitions(
    broker: Any, official: pulsar.Client, unique_name: Callable[[str], str], tmp_path: Any
) -> None:
    inp = two_partitions(broker, unique_name, "in")
    out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("out", "ledger"))
    verify = out_reader(official, out)
    guard = OrderingGuard(str(tmp_path / "order.db"), max_hold_ms=600_000)

    async def main() -> None:
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job=unique_name("job"),
                                   ledger_topic=ledger, batch_max_messages=10, ordering=guard)
            proc = AsyncProcessor(client, emit_id, conf)
            await proc.start()

            async def send(part: int, plan: list[tuple[str, str | None]]) -> None:
                p = await client.create_producer(f"{inp}-partition-{part}", batching_enabled=False)
                for bid, after in plan:
                    await p.send(bid.encode(), properties=props(bid, after))
                await p.close()

            await send(1, [("d", "c"), ("b", "a")])
            await send(0, [("c", "b"), ("x0", None)])
            task = asyncio.ensure_future(run_until(proc, lambda: proc.stats.messages == 5))
            deadline = time.monotonic() + 60
            while (guard.holding < 3 or proc.stats.messages < 1) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert sorted(guard.held_ids()) == ["b", "c", "d"] and proc.stats.messages == 1
            await send(0, [("a", None)])  # the predecessor of them all, last
            await task
            await proc.close()

    asyncio.run(main())
    assert [m.data() for m in read_n(verify, 5)] == [b"x0", b"a", b"b", b"c", b"d"]
    assert read_until_sentinel(official, verify, out) == []
    assert guard.store.order_counts(guard.scope) == {"done": 5}  # type: ignore[union-attr]
    guard.close()
    assert_all_acked(official, inp, "proc")


def test_processor_parks_a_follower_whose_predecessor_never_comes(
    broker: Any, official: pulsar.Client, unique_name: Callable[[str], str], tmp_path: Any
) -> None:
    inp, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    verify = out_reader(official, out)
    parked_reader = official.subscribe(inp + "-parked", "verify", initial_position=pulsar.InitialPosition.Earliest)
    guard = OrderingGuard(str(tmp_path / "order.db"), max_hold_ms=1500)
    mids: dict[str, str] = {}

    async def main() -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(inp, batching_enabled=False)
            for bid, after in [("f1", "ghost"), ("f2", "f1"), ("x", None)]:
                mids[bid] = str(await p.send(bid.encode(), properties=props(bid, after)))
            await p.close()
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job=unique_name("job"),
                                   ledger_topic=ledger, ordering=guard)
            proc = AsyncProcessor(client, emit_id, conf)
            await proc.start()
            await run_until(proc, lambda: proc.stats.parked == 2 and proc.stats.messages == 1)
            await proc.close()
            return proc

    proc = asyncio.run(main())
    assert [m.data() for m in read_n(verify, 1)] == [b"x"]
    assert read_until_sentinel(official, verify, out) == []
    parked = read_n(parked_reader, 2)
    assert [(m.data(), m.properties()[PARK_SOURCE_ID], m.properties()[PARK_ERROR]) for m in parked] == [
        (b"f1", mids["f1"], f"OutOfOrder: message f1 must follow ghost, which was not committed within 1500 ms "
                            f"(topic {inp}, message {mids['f1']})"),
        (b"f2", mids["f2"], f"OutOfOrder: message f2 must follow f1, which was parked (topic {inp}, "
                            f"message {mids['f2']})"),
    ]
    assert (proc.stats.messages, proc.stats.parked, guard.parked_count) == (1, 2, 2)
    assert guard.store.order_counts(guard.scope) == {"done": 1, "parked": 2}  # type: ignore[union-attr]
    guard.close()
    assert_all_acked(official, inp, "proc")


PCHAIN = [f"p{i}" for i in range(7)]


def _proc_child(service_url: str, inp: str, out: str, ledger: str, target: str, job: str, kill_at: str) -> None:
    """A processor with the guard (one message per batch) that SIGKILLs itself right after the
    transaction of the batch holding ``kill_at`` committed, before the guard marks it done."""
    armed = False

    def handler(m: txn.Message) -> bytes:
        nonlocal armed
        armed = armed or m.properties()[BUSINESS_ID] == kill_at
        return emit_id(m)

    def on_commit(*_: Any) -> None:
        if armed:
            os.kill(os.getpid(), signal.SIGKILL)

    async def main() -> None:
        async with txn.AsyncClient(service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job=job, ledger_topic=ledger,
                                   batch_max_messages=1, txn_timeout_ms=5000,
                                   ordering=OrderingGuard(target, max_hold_ms=600_000))
            proc = AsyncProcessor(client, handler, conf)
            proc.on_commit = on_commit
            await proc.start()
            await proc.run()

    asyncio.run(main())
    sys.exit(3)


def test_processor_crash_after_commit_loses_and_duplicates_nothing(
    broker: Any, official: pulsar.Client, unique_name: Callable[[str], str], tmp_path: Any
) -> None:
    inp = two_partitions(broker, unique_name, "in")
    out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("out", "ledger"))
    target, job = str(tmp_path / "order.db"), unique_name("job")
    verify = out_reader(official, out)
    official.subscribe(inp, "proc", consumer_type=pulsar.ConsumerType.Shared,
                       initial_position=pulsar.InitialPosition.Earliest).close()

    def send(part: int, links: list[int]) -> None:
        p = official.create_producer(f"{inp}-partition-{part}", batching_enabled=False)
        for i in links:
            p.send(PCHAIN[i].encode(), properties=props(PCHAIN[i], PCHAIN[i - 1] if i else None))
        p.close()

    # Run 1 gets p0..p2 (p1 on partition 1 before p0) and p6, which must follow p5 (not sent yet):
    # p6 is held, unacknowledged, when the processor is killed right after p2's batch committed.
    send(1, [6, 1])
    send(0, [0, 2])
    proc = subprocess.run([sys.executable, __file__, "proc", broker.service_url, inp, out, ledger, target, job, "p2"],
                          capture_output=True, text=True, timeout=180, cwd=os.path.dirname(__file__))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    first = [m.data().decode() for m in read_n(verify, 3)]
    assert first == PCHAIN[:3]
    store = open_store(target)
    assert store.run(store.order_states, job, ["p2"])["p2"].state == "pending"  # committed, not marked done

    # Run 2: p3 must follow p2, whose transaction committed but is only marked pending: the guard
    # reads p2's COMMITTED ledger record (once the 5 s transaction timeout is over) and goes on.
    send(1, [4])
    send(0, [3, 5])
    guard = OrderingGuard(target, max_hold_ms=600_000)

    async def main() -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job=job, ledger_topic=ledger,
                                   txn_timeout_ms=5000, ordering=guard)
            p = AsyncProcessor(client, emit_id, conf)
            await p.start()
            await run_until(p, lambda: p.stats.messages == 4)
            await p.close()
            return p

    p2 = asyncio.run(main())
    rest = [m.data().decode() for m in read_n(verify, 4)]
    assert first + rest == PCHAIN  # each once, in order
    assert read_until_sentinel(official, verify, out) == []
    assert (p2.stats.messages, p2.stats.parked) == (4, 0)
    assert store.order_counts(job) == {"done": 7}
    store.close()
    guard.close()
    assert_all_acked(official, inp, "proc")


if __name__ == "__main__" and len(sys.argv) == 9 and sys.argv[1] == "proc":
    _proc_child(*sys.argv[2:9])

if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "rx":
    _rx_child(*sys.argv[2:7], crash_after=int(sys.argv[7]))
