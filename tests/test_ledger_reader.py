"""The shared ledger reader on a real broker: key-filtered reads of a batch's records, reads after a
known position (what the control plane's replay does), the probe-bounded tail, and quarantine entries."""

from __future__ import annotations

import asyncio
from typing import Any

import txn
from txn.delivery.ledger import Kind, LedgerRecord
from txn.delivery.ledger_reader import LedgerReader, batch_records, read_records, read_tail


def _rec(kind: Kind, batch: str, n: int) -> LedgerRecord:
    return LedgerRecord(kind=kind, job="j", batch_id=batch, txn_id=f"(0,{n})", started_at_ms=n)


def test_batch_records_by_key_after_a_position_and_the_tail(broker: Any, topic: str) -> None:
    async def main() -> None:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(topic, batching_enabled=False)
            ids = []
            plan = [(Kind.STARTED, "a", "a"), (Kind.STARTED, "b", "b"), (Kind.PARKED, "a", "a"),
                    (Kind.PARKED, "a", None),  # no key: parsed and filtered by its batch id
                    (Kind.COMMITTED, "b", "b"), (Kind.REPLAYED, "a", "a")]
            for n, (kind, batch, key) in enumerate(plan):
                ids.append(await p.send(_rec(kind, batch, n).to_json(), partition_key=key))
            await p.send(b"not a record", partition_key="a")
            await p.close()

            got = await batch_records(client, topic, "a")
            assert [(r.kind, r.started_at_ms) for r in got] == [(Kind.STARTED, 0), (Kind.PARKED, 2),
                                                                 (Kind.PARKED, 3), (Kind.REPLAYED, 5)]
            after = await batch_records(client, topic, "a", after=ids[2])
            assert [r.started_at_ms for r in after] == [3, 5]
            assert [r.batch_id for r in await read_records(client, topic)] == ["a", "b", "a", "a", "b", "a"]

            tail = await read_tail(client, topic, 2, idle_ms=5000)  # the last 2 entries before the probe
            assert [r.started_at_ms for r in tail] == [5]  # the other is not a record
            assert len(await read_tail(client, topic, 2, idle_ms=5000, full=True)) == 6

            async with await LedgerReader.open(client, topic) as r:
                entries = await r.chunk(100, wait_ms=5000, more_ms=200)
            bad = [e for e in entries if e.record is None]
            assert len(entries) == 9 and len(bad) == 3  # the garbage and the two probes, with reasons
            assert all(e.reason for e in bad)

    asyncio.run(main())
