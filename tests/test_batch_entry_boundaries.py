"""``ProcessorConfig.batch_entry_boundaries``: no batch entry is split across two transactions."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict

import txn
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.replay import read_ledger

ENTRIES, SIZE, ACKED_TAIL = 6, 10, 3  # six entries of ten; the last three of each acked beforehand
ID = re.compile(r"\((-?\d+),(-?\d+),(-?\d+),(-?\d+)\)")


async def _prepare(url: str, topic: str) -> None:
    """Write six batch entries of ten, and acknowledge indexes 7..9 of each (so the processor gets
    entries whose last delivered message is not the last of its entry)."""
    async with txn.AsyncClient(url) as c:
        cons = await c.subscribe(topic, "proc", consumer_type=txn.ConsumerType.Shared,
                                 initial_position=txn.InitialPosition.Earliest)
        p = await c.create_producer(topic, batching_enabled=False)
        for e in range(ENTRIES):
            futs = await p.send_batch_async([(b"%d-%d" % (e, i), None, None) for i in range(SIZE)], e * SIZE)
            await futs[-1]
        msgs = [await cons.receive(timeout_millis=30000) for _ in range(ENTRIES * SIZE)]
        assert {(m.message_id().batch_size) for m in msgs} == {SIZE}
        tails = [m for m in msgs if m.message_id().batch_index() >= SIZE - ACKED_TAIL]
        t = await c.new_transaction()
        await cons.acknowledge_many(tails, t)
        await t.commit()
        await cons.close()


async def _process(url: str, topic: str, out: str, ledger: str, boundaries: bool) -> list[list[tuple[int, int]]]:
    """Run the processor (batches of 10) to idle; the (entry, index) pairs of each committed batch."""
    async with txn.AsyncClient(url) as c:
        conf = ProcessorConfig(inputs=[topic], output=out, subscription="proc", job="b", ledger_topic=ledger,
                               batch_max_messages=10, batch_max_delay_ms=2000, batch_entry_boundaries=boundaries)
        proc = AsyncProcessor(c, lambda m: m.data(), conf)
        await proc.start()
        try:
            await proc.run(idle_exit_ms=3000)
        finally:
            await proc.close()
        records = await read_ledger(c, ledger)
    batches = []
    for r in records:
        if r.kind == "COMMITTED":
            ids = [ID.fullmatch(i) for i in r.inputs.get(topic, [])]
            batches.append(sorted((int(m[2]), int(m[4])) for m in ids if m))
    return batches


def _entries_per_batch(batches: list[list[tuple[int, int]]]) -> dict[int, set[int]]:
    where: dict[int, set[int]] = defaultdict(set)
    for n, b in enumerate(batches):
        for entry, _index in b:
            where[entry].add(n)
    return where


def test_batches_close_at_entry_boundaries(broker, unique_name):
    topic, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    asyncio.run(_prepare(broker.service_url, topic))
    batches = asyncio.run(_process(broker.service_url, topic, out, ledger, boundaries=True))
    per_entry = SIZE - ACKED_TAIL
    # 10 reached inside the second entry: its rest joins the batch (14), and the next entry's first
    # message, received to see that, is held for the next batch.
    assert [len(b) for b in batches] == [2 * per_entry] * (ENTRIES // 2)
    every = [p for b in batches for p in b]
    assert len(every) == len(set(every)) == ENTRIES * per_entry
    where = _entries_per_batch(batches)
    assert len(where) == ENTRIES and all(len(v) == 1 for v in where.values())
    assert sorted(i for b in batches for _e, i in b) == sorted(list(range(per_entry)) * ENTRIES)


def test_default_batching_splits_entries(broker, unique_name):
    """Today's batching (the default) for comparison: batches of exactly 10 split entries."""
    topic, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    asyncio.run(_prepare(broker.service_url, topic))
    batches = asyncio.run(_process(broker.service_url, topic, out, ledger, boundaries=False))
    assert sorted(len(b) for b in batches) == [2, 10, 10, 10, 10]
    assert sum(1 for v in _entries_per_batch(batches).values() if len(v) > 1) == 4
