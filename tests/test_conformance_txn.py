"""Transaction conformance against a real broker; the official client is the reader."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pulsar
import pytest

import txn
from txn.admin import create_partitioned_topic

from peer import assert_nothing, read_n, read_until_sentinel


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url, operation_timeout_seconds=30)
    yield c
    c.close()


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _sub(official: pulsar.Client, topic: str, name: str = "reader") -> pulsar.Consumer:
    return official.subscribe(topic, name, initial_position=pulsar.InitialPosition.Earliest)


def test_read_committed_commit(client, official, topic):
    reader = _sub(official, topic)
    producer = client.create_producer(topic)
    t = client.new_transaction()
    assert t.state is txn.TxnState.OPEN
    assert txn.TxnID.parse(str(t.id)) == t.id
    for i in range(20):
        producer.send(f"m{i}".encode(), txn=t)
    assert_nothing(reader, 2000)  # open transaction: invisible
    t.commit()
    assert t.state is txn.TxnState.COMMITTED
    got = read_n(reader, 20)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(20)]
    assert read_until_sentinel(official, reader, topic) == []


def test_read_committed_abort(client, official, topic):
    reader = _sub(official, topic)
    producer = client.create_producer(topic)
    t = client.new_transaction()
    for i in range(10):
        producer.send(f"aborted-{i}".encode(), txn=t)
    # Not in the transaction, but written after its first message: the open
    # transaction holds the topic's max read position, so it waits too.
    producer.send(b"outside")
    assert_nothing(reader, 1500)
    t.abort()
    assert t.state is txn.TxnState.ABORTED
    assert [m.data() for m in read_until_sentinel(official, reader, topic)] == [b"outside"]


def test_atomic_multi_topic_produce(client, official, broker, unique_name):
    for commit in (True, False):
        tag = "c" if commit else "a"
        part_topic = f"persistent://public/default/{unique_name('parts')}"
        other = f"persistent://public/default/{unique_name('other')}"
        create_partitioned_topic(broker.admin_url, part_topic, 3)
        r_parts = _sub(official, part_topic, f"r-{tag}")
        r_other = _sub(official, other, f"r-{tag}")
        p_parts = client.create_producer(part_topic)
        p_other = client.create_producer(other)
        t = client.new_transaction()
        for i in range(30):
            p_parts.send(f"{tag}-p{i}".encode(), partition_key=f"k{i}", txn=t)
        for i in range(10):
            p_other.send(f"{tag}-o{i}".encode(), txn=t)
        assert_nothing(r_parts, 1000)
        assert_nothing(r_other, 500)
        if commit:
            t.commit()
            got_parts = read_n(r_parts, 30)
            assert sorted(m.data() for m in got_parts) == sorted(f"c-p{i}".encode() for i in range(30))
            assert len({m.topic_name() for m in got_parts}) == 3  # really spread over the partitions
            assert [m.data() for m in read_n(r_other, 10)] == [f"c-o{i}".encode() for i in range(10)]
        else:
            t.abort()
            assert read_until_sentinel(official, r_other, other) == []
            # The partitioned topic: one sentinel per partition; they must be all it holds.
            for i in range(3):
                sp = official.create_producer(f"{part_topic}-partition-{i}")
                sp.send(b"sentinel", properties={"sentinel": str(i)})
                sp.close()
            got = read_n(r_parts, 3)
            assert sorted(m.properties().get("sentinel") for m in got) == ["0", "1", "2"]
            assert_nothing(r_parts, 1000)
        r_parts.close()
        r_other.close()
        p_parts.close()
        p_other.close()


def _fill(official: pulsar.Client, topic: str, n: int, prefix: str = "in") -> list[bytes]:
    p = official.create_producer(topic)
    payloads = [f"{prefix}-{i}".encode() for i in range(n)]
    for d in payloads:
        p.send(d)
    p.close()
    return payloads


def test_atomic_acks_commit_then_no_redelivery(client, official, topic):
    payloads = _fill(official, topic, 10)
    c = client.subscribe(topic, "work", initial_position=txn.InitialPosition.Earliest)
    msgs = [c.receive(10000) for _ in range(10)]
    assert [m.data() for m in msgs] == payloads
    t = client.new_transaction()
    for m in msgs:
        c.acknowledge(m, txn=t)
    t.commit()
    c.close()
    # A new consumer on the same subscription sees nothing of the acked ten.
    c2 = official.subscribe(topic, "work")
    assert read_until_sentinel(official, c2, topic) == []


def test_atomic_acks_abort_redelivers(client, official, topic):
    payloads = _fill(official, topic, 10)
    c = client.subscribe(topic, "work", consumer_type=txn.ConsumerType.Shared,
                         initial_position=txn.InitialPosition.Earliest)
    msgs = [c.receive(10000) for _ in range(10)]
    t = client.new_transaction()
    for m in msgs:
        c.acknowledge(m, txn=t)
    t.abort()
    # The same consumer gets them back after the abort...
    again = [c.receive(10000) for _ in range(10)]
    assert sorted(m.data() for m in again) == sorted(payloads)
    assert {m.message_id() for m in again} == {m.message_id() for m in msgs}
    c.close()
    # ...and so does a new consumer, since nothing was acknowledged.
    c2 = official.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(m.data() for m in read_n(c2, 10)) == sorted(payloads)


def test_consume_transform_produce_round_trip(client, official, topic, unique_name):
    out_topic = f"persistent://public/default/{unique_name('out')}"
    payloads = _fill(official, topic, 25)
    reader = _sub(official, out_topic)
    c = client.subscribe(topic, "ctp", initial_position=txn.InitialPosition.Earliest)
    p = client.create_producer(out_topic)
    with client.new_transaction() as t:
        for _ in range(25):
            m = c.receive(10000)
            p.send(m.data().upper(), properties={"src": str(m.message_id())}, txn=t)
            c.acknowledge(m, txn=t)
        assert_nothing(reader, 1000)
    assert t.state is txn.TxnState.COMMITTED
    assert [m.data() for m in read_n(reader, 25)] == [d.upper() for d in payloads]
    c.close()
    c2 = official.subscribe(topic, "ctp")
    assert read_until_sentinel(official, c2, topic) == []


def test_context_manager_aborts_and_reraises(client, official, topic):
    reader = _sub(official, topic)
    p = client.create_producer(topic)
    with pytest.raises(RuntimeError, match="boom"):
        with client.new_transaction() as t:
            p.send(b"doomed", txn=t)
            raise RuntimeError("boom")
    assert t.state is txn.TxnState.ABORTED
    assert read_until_sentinel(official, reader, topic) == []


def test_conflicting_acks(client, official, topic):
    _fill(official, topic, 1)
    c = client.subscribe(topic, "conflict", consumer_type=txn.ConsumerType.Shared,
                         initial_position=txn.InitialPosition.Earliest)
    m = c.receive(10000)
    t1 = client.new_transaction()
    t2 = client.new_transaction()
    c.acknowledge(m, txn=t1)
    with pytest.raises(txn.TransactionConflict) as ei:
        c.acknowledge(m, txn=t2)
    assert ei.value.txn_id == t2.id
    assert ei.value.topic == topic
    t2.abort()
    t1.commit()
    assert t1.state is txn.TxnState.COMMITTED


def test_timeout_aborts_on_broker(client, official, topic):
    reader = _sub(official, topic)
    p = client.create_producer(topic)
    t = client.new_transaction(timeout_millis=2000)
    p.send(b"too-slow", txn=t)
    time.sleep(4)
    with pytest.raises(txn.TransactionTimedOut) as ei:
        t.commit()
    assert ei.value.txn_id == t.id
    assert t.state is txn.TxnState.TIMED_OUT
    # Proof from the broker: the coordinator no longer knows the transaction.
    inner = client.async_client

    async def raw_commit():
        await inner.transaction_coordinator.end_txn(t.id, commit=True)

    with pytest.raises(txn.TransactionNotFound):
        client.bridge.run(raw_commit())
    assert read_until_sentinel(official, reader, topic) == []


def test_async_api_transaction(broker, official, topic):
    reader = _sub(official, topic)

    async def main() -> list[str]:
        async with txn.AsyncClient(broker.service_url) as c:
            p = await c.create_producer(topic)
            async with await c.new_transaction() as t:
                futs = [await p.send_async(f"a{i}".encode(), txn=t) for i in range(50)]
            ids = [str(await f) for f in futs]
            assert t.state is txn.TxnState.COMMITTED
            return ids

    ids = asyncio.run(main())
    assert len(set(ids)) == 50
    assert [m.data() for m in read_n(reader, 50)] == [f"a{i}".encode() for i in range(50)]


def test_transaction_adopted_by_id_in_another_client(broker, official, topic):
    """A second client (a Spark executor, say) produces into a transaction the first one opened."""
    reader = _sub(official, topic)
    owner = txn.Client(broker.service_url)
    worker = txn.Client(broker.service_url)
    try:
        t = owner.new_transaction(timeout_millis=30000)
        adopted = worker.transaction_from_id(str(t.id), timeout_millis=30000)
        assert adopted.id == t.id
        p = worker.create_producer(topic)
        for i in range(5):
            p.send(f"w{i}".encode(), txn=adopted)
        assert_nothing(reader, 1000)
        t.commit()
        assert [m.data() for m in read_n(reader, 5)] == [f"w{i}".encode() for i in range(5)]
    finally:
        worker.close()
        owner.close()


def test_large_transactional_ack_is_split_below_the_frame_limit(broker, official, topic):
    """45k batch-index acks in one transaction: one ACK command would carry ~7 MB of ids and
    bitsets, over the broker's 5 MB frame limit (it resets the connection); the consumer splits
    them, the commit takes them all, and nothing is redelivered."""
    n = 45_000
    p = official.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                 batching_max_publish_delay_ms=50, block_if_queue_full=True)
    for i in range(n):
        p.send_async(b"%d" % i, None)
    p.flush()

    async def main() -> tuple[int, int]:
        async with txn.AsyncClient(broker.service_url) as c:
            cons = await c.subscribe(topic, "big", consumer_type=txn.ConsumerType.Shared,
                                     initial_position=txn.InitialPosition.Earliest, receiver_queue_size=5000)
            msgs = [await cons.receive(timeout_millis=30000) for _ in range(n)]
            batched = sum(1 for m in msgs if m.message_id().batch_index() >= 0)
            t = await c.new_transaction(timeout_millis=120000)
            await cons.acknowledge_many(msgs, t)
            await t.commit()
            await cons.close()
            return len({m.message_id() for m in msgs}), batched

    distinct, batched = asyncio.run(main())
    assert distinct == n and batched == n
    again = official.subscribe(topic, "big", consumer_type=pulsar.ConsumerType.Shared)
    assert_nothing(again, wait_ms=3000)


def test_partial_batch_acks_commit_and_abort_per_index(client, official, topic):
    """Acks of several messages of one batch entry travel as one id with a combined ack set;
    the broker must still commit, abort and conflict per batch index."""
    p = official.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                 batching_max_publish_delay_ms=1000, block_if_queue_full=True)
    for i in range(40):
        p.send_async(b"%d" % i, None)
    p.flush()
    cons = client.subscribe(topic, "partial", consumer_type=txn.ConsumerType.Shared,
                            initial_position=txn.InitialPosition.Earliest)
    msgs = [cons.receive(timeout_millis=10000) for _ in range(40)]
    ids = [m.message_id() for m in msgs]
    assert {i.batch_size for i in ids} == {10} and len({(i.ledger_id(), i.entry_id()) for i in ids}) == 4
    by_value = {int(m.data()): m for m in msgs}
    odd = [by_value[i] for i in range(1, 40, 2)]
    even = [by_value[i] for i in range(0, 40, 2)]

    committed = client.new_transaction()
    cons.acknowledge_many(odd, committed)
    # Another transaction acking an index the first one holds: a conflict, whole request refused.
    rival = client.new_transaction()
    with pytest.raises(txn.TransactionConflict):
        cons.acknowledge_many([by_value[1], by_value[2]], rival)
    rival.abort()
    committed.commit()

    aborted = client.new_transaction()
    cons.acknowledge_many(even[:10], aborted)
    aborted.abort()
    cons.close()

    # The odd ones are gone for good; every even one (the aborted acks included) comes back.
    # On the 3-broker cluster, about 1 run in 25, the broker strands the never-acked entries that
    # the closed consumer held: not in its replay set, read position past them, until a consumer
    # subscribes again (seen in the subscription's stats). That is the broker's dispatch, not the
    # per-index outcome asserted here; a second subscriber then gets them.
    values: list[int] = []
    for attempt in range(2):
        again = official.subscribe(topic, "partial", consumer_type=pulsar.ConsumerType.Shared)
        deadline = time.monotonic() + (10 if attempt == 0 else 30)
        while len(set(values)) < 20 and time.monotonic() < deadline:
            try:
                m = again.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            again.acknowledge(m)
            values.append(int(m.data()))
        if len(set(values)) == 20:
            break
        again.close()
    else:
        raise AssertionError(f"the evens never all came back: {sorted(set(values))}")
    assert [v for v in values if v % 2] == [] and sorted(set(values)) == list(range(0, 40, 2))
    if attempt == 0:
        assert len(values) == 20
        assert_nothing(again, 2000)
    else:  # the new subscriber may get evens again (the first one's partial-batch acks), never an odd
        late = []
        with contextlib.suppress(pulsar.Timeout):
            while True:
                late.append(int(again.receive(timeout_millis=2000).data()))
        assert [v for v in late if v % 2] == []
