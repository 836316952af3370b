"""One owner per input partition: partition fences, a paused instance beside its replacement, a fleet.

Everything on a real broker. What these prove:
- a new owner fences the old one: the old owner's open transaction never commits (it is
  aborted while the new owner claims the partition), and its next marker fails with
  ``OwnershipLost``; a reconnect of the old owner's fence producer does not knock out the new one;
- two live processors of one job, one of them stalled in the middle of a batch with its
  transaction open while the other takes its partition over, commit every input exactly once;
- three processors on a 4-partition input split the partitions and process each input once.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pulsar
import pytest

import txn
from txn.admin import create_partitioned_topic
from txn.delivery.fencing import PartitionFences, fence_topic
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.replay import read_ledger


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _names(unique_name):
    return tuple(f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))


def _read_all(official, topic: str, partitions: int = 0) -> list[bytes]:
    """Everything stored (and committed) on ``topic``, read from the start with the official client."""
    out: list[bytes] = []
    for part in [f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]:
        r = official.create_reader(part, pulsar.MessageId.earliest)
        while r.has_message_available():
            out.append(r.read_next(timeout_millis=10000).data())
        r.close()
    return out


def test_fence_topic_names_are_per_partition_and_subscription():
    a = fence_topic("persistent://public/default/led", "persistent://public/default/in-partition-0", "s")
    b = fence_topic("persistent://public/default/led", "persistent://public/default/in-partition-1", "s")
    c = fence_topic("persistent://public/default/led", "persistent://public/default/in-partition-0", "t")
    d = fence_topic("persistent://public/default/led", "persistent://other/ns/in-partition-0", "s")
    assert len({a, b, c, d}) == 4
    assert a.startswith("persistent://public/default/led-fence-in-partition-0-")
    assert a == fence_topic("persistent://public/default/led", "persistent://public/default/in-partition-0", "s")


def test_new_owner_aborts_the_old_owners_open_transaction_and_fences_it(broker, official, unique_name):
    """A owns the partition and acknowledges an input in an open transaction; B takes over. B's claim
    aborts A's transaction (A's commit fails, the input stays unacknowledged); A's next marker fails
    with OwnershipLost; A reconnecting its fence producer does not disturb B."""
    inp, _, ledger = _names(unique_name)
    p = official.create_producer(inp)
    for i in range(3):
        p.send(f"m{i}".encode())
    p.close()

    async def main():
        async with txn.AsyncClient(broker.service_url) as ca, txn.AsyncClient(broker.service_url) as cb:
            fa = PartitionFences(ca, ledger, "s", "A", 30000)
            fb = PartitionFences(cb, ledger, "s", "B", 30000)
            cons = await ca.subscribe(inp, "s", consumer_type=txn.ConsumerType.Failover,
                                      initial_position=txn.InitialPosition.Earliest)
            got = await fa.acquire(inp)
            assert got.aborted == [] and fa.holds(inp)
            m = await cons.receive(timeout_millis=10000)
            t = await ca.new_transaction(timeout_millis=30000)
            await fa.mark(t, [inp])
            await cons.acknowledge(m, t)
            # B takes over while A's transaction is open: it must abort it (not wait 30 s for the timeout).
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            got_b = await fb.acquire(inp)
            took = loop.time() - t0
            assert got_b.aborted == [str(t.id)], got_b
            assert took < 20, took
            with pytest.raises(txn.PulsarError):
                await t.commit()
            t2 = await ca.new_transaction(timeout_millis=30000)
            with pytest.raises(txn.OwnershipLost) as lost:
                await fa.mark(t2, [inp])
            assert lost.value.topic == inp
            assert not fa.holds(inp)
            await t2.abort()
            # B still holds the fence and can mark and commit.
            t3 = await cb.new_transaction(timeout_millis=30000)
            await fb.mark(t3, [inp])
            await t3.commit()
            assert fb.holds(inp)
            await cons.close()
            await fa.close()
            await fb.close()

    asyncio.run(main())
    # A's acknowledgement was aborted: all three inputs are still there for the subscription.
    c = official.subscribe(inp, "s", consumer_type=pulsar.ConsumerType.Failover)
    seen = []
    for _ in range(3):
        seen.append(c.receive(timeout_millis=10000).data())
    c.close()
    assert sorted(seen) == [b"m0", b"m1", b"m2"]
    # The fence topic holds: A's claim, A's intent (its marker was aborted), B's claim, B's intent and marker.
    kinds = [json.loads(d)["kind"] for d in _read_all(official, fence_topic(ledger, inp, "s"))]
    assert kinds == ["claim", "intent", "claim", "intent", "marker"], kinds


def test_paused_processor_beside_its_replacement_commits_nothing_twice(broker, official, unique_name):
    """Processor A stalls inside a batch (its handler blocks, its transaction open, its connection
    alive: a pause far shorter than the keep-alive). B starts on the same subscription and gets one of
    the two partitions, takes it over (aborting A's transaction), and processes. Then A resumes.
    Every input is stored exactly once on the output, and the ledger's COMMITTED records name each
    input once."""
    inp, out, ledger = _names(unique_name)
    create_partitioned_topic(broker.admin_url, inp, 2)
    n = 200
    p = official.create_producer(inp, batching_enabled=True, batching_max_publish_delay_ms=20)
    for i in range(n):
        p.send_async(b"%05d" % i, None, partition_key=str(i))
    p.flush()
    p.close()

    async def main():
        gate = asyncio.Event()
        first_batch = asyncio.Event()

        async def handler_a(m):
            first_batch.set()
            await gate.wait()  # A stalls here with its first batch's transaction open
            return m.data()

        async with txn.AsyncClient(broker.service_url) as ca, txn.AsyncClient(broker.service_url) as cb:
            conf = dict(inputs=[inp], output=out, subscription="proc", job="fence", ledger_topic=ledger,
                        batch_max_messages=50, txn_timeout_ms=60000)
            a = AsyncProcessor(ca, handler_a, ProcessorConfig(**conf))
            await a.start()
            run_a = asyncio.ensure_future(a.run())
            await asyncio.wait_for(first_batch.wait(), 30)
            b = AsyncProcessor(cb, lambda m: m.data(), ProcessorConfig(**conf))
            await b.start()
            run_b = asyncio.ensure_future(b.run())
            # Wait until B has committed something (it took a partition over from the stalled A).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while b.stats.messages == 0 and loop.time() < deadline:
                await asyncio.sleep(0.2)
            assert b.stats.messages > 0, b.stats.line("b", 0)
            assert b.stats.takeovers >= 1
            gate.set()  # A resumes next to B
            deadline = loop.time() + 90
            while a.stats.messages + b.stats.messages < n and loop.time() < deadline:
                await asyncio.sleep(0.3)
            await asyncio.sleep(2)
            a.stop()
            b.stop()
            await asyncio.gather(run_a, run_b)
            await a.close()
            await b.close()
            records = await read_ledger(ca, ledger)
            return a.stats, b.stats, records

    sa, sb, records = asyncio.run(main())
    got = Counter(_read_all(official, out))
    assert sorted(got) == [b"%05d" % i for i in range(n)], f"missing {n - len(got)}"
    assert max(got.values()) == 1, [k for k, v in got.items() if v > 1][:20]
    committed = Counter(i for r in records if r.kind == "COMMITTED" for ids in r.inputs.values() for i in ids)
    assert sum(committed.values()) == n and max(committed.values()) == 1

    assert sa.messages + sb.messages == n, (sa, sb)
    assert sa.partitions_lost + sa.aborts >= 1  # A's stalled batch did not commit


def test_three_instances_share_four_partitions_exactly_once(broker, official, unique_name):
    """Three processors of one job on a 4-partition input, inputs published while they run: each
    input is committed once, and every instance owns at least one partition."""
    inp, out, ledger = _names(unique_name)
    create_partitioned_topic(broker.admin_url, inp, 4)
    n = 1200

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = dict(inputs=[inp], output=out, subscription="proc", job="fleet", ledger_topic=ledger,
                        batch_max_messages=40, txn_timeout_ms=30000)
            procs = [AsyncProcessor(client, lambda m: m.data(), ProcessorConfig(**conf)) for _ in range(3)]
            for pr in procs:
                await pr.start()
            runs = [asyncio.ensure_future(pr.run()) for pr in procs]
            prod = await client.create_producer(inp, block_if_queue_full=True)
            for i in range(n):
                await prod.send_async(b"%05d" % i, partition_key=str(i))
                if i % 100 == 99:
                    await prod.flush()
                    await asyncio.sleep(0.1)
            await prod.flush()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while sum(pr.stats.messages for pr in procs) < n and loop.time() < deadline:
                await asyncio.sleep(0.3)
            await asyncio.sleep(1.5)
            for pr in procs:
                pr.stop()
            await asyncio.gather(*runs)
            owned = [pr.fences.held for pr in procs]
            for pr in procs:
                await pr.close()
            return [pr.stats for pr in procs], owned

    stats, owned = asyncio.run(main())
    got = Counter(_read_all(official, out))
    assert sorted(got) == [b"%05d" % i for i in range(n)]
    assert max(got.values()) == 1
    assert sum(s.messages for s in stats) == n
    assert all(s.messages > 0 for s in stats), [s.messages for s in stats]
    held = [p for o in owned for p in o]
    assert sorted(held) == sorted(set(held)), owned  # no partition held by two instances at the end


@pytest.mark.parametrize("redeliver_idle_s", [2.0, 0.0])
def test_inputs_lost_before_a_batch_come_back_within_the_idle_bound(broker, official, unique_name, redeliver_idle_s):
    """Inputs the broker dispatched that never reach a batch (here: taken out of the receive queue,
    as a reconnect or a stale-epoch drop does) come back within ``redeliver_idle_s`` with the
    consumer still connected; with the bound off they stay stranded (the broker does not redeliver
    to a connected consumer), which shows the test can fail."""
    inp, out, ledger = _names(unique_name)
    p = official.create_producer(inp, batching_enabled=False)
    for i in range(5):
        p.send(b"%d" % i)
    p.close()

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="idle", ledger_topic=ledger,
                                   redeliver_idle_s=redeliver_idle_s)
            proc = AsyncProcessor(client, lambda m: m.data(), conf)
            await proc.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while len(proc.consumer.receive_queue) < 5 and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert proc.consumer.receive_queue.remove_where(lambda m: True) == 5
            try:
                await proc.run(idle_exit_ms=8000)
            finally:
                await proc.close()
            return proc.stats

    stats = asyncio.run(main())
    if redeliver_idle_s:
        assert (stats.messages, stats.outputs) == (5, 5), stats.line("idle", 0)
        assert sorted(_read_all(official, out)) == [b"%d" % i for i in range(5)]
    else:
        assert (stats.messages, stats.outputs) == (0, 0), stats.line("idle", 0)
