"""How long the processor's ledger guard takes to catch up on an existing ledger at start-up.

Run from the repository root::

    .venv/bin/python bench/bench_guard.py [--records 100000] [--runs 3] [--service-url ... --admin-url ...]

A ledger topic is filled with ``--records`` COMMITTED records (half of them of the measured job,
100 input ids each, as the processor writes them with its default batches of 100; half of
another job). Then, in rotated order per round, on the same broker:

- *official reader*: ``pulsar-client`` Reader from the earliest message to the last one, doing
  nothing with the payloads (the floor: what reading the topic costs);
- *LedgerGuard catch-up*: :class:`txn.delivery.ledger_guard.LedgerGuard` started on the topic
  and waited on until it has read the last record (parsing and indexing the job's records).

Medians of ``--runs`` rounds, with the ratio to the official reader.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulsar  # noqa: E402

import txn  # noqa: E402
from txn.delivery.ledger import LedgerRecord  # noqa: E402
from txn.delivery.ledger_guard import LedgerGuard  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

INPUT = "persistent://public/default/bench-guard-in"


def fill(service_url: str, topic: str, n: int) -> txn.MessageId:
    """``n`` COMMITTED records; returns the last one's id."""

    async def main() -> txn.MessageId:
        async with txn.AsyncClient(service_url) as client:
            p = await client.create_producer(topic, block_if_queue_full=True, batching_max_publish_delay_ms=5)
            futs = []
            for b in range(n):
                job = "measured" if b % 2 == 0 else "other"
                ids = [f"(7,{b},-1,{i})" for i in range(100)]
                rec = LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:x:{b}", txn_id=f"(0,{b})", attempt=1,
                                   inputs={INPUT: ids}, outputs={"o": 100})
                futs.append(await p.send_async(rec.to_json(), partition_key=rec.batch_id))
            last = None
            for f in futs:
                last = await f
            await p.close()
            assert last is not None
            return last

    return asyncio.run(main())


def official_read(service_url: str, topic: str, n: int) -> float:
    c = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    t0 = time.perf_counter()
    r = c.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
    for _ in range(n):
        r.read_next(30000)
    el = time.perf_counter() - t0
    r.close()
    c.close()
    return el


def guard_catch_up(service_url: str, topic: str, last: txn.MessageId, n: int) -> tuple[float, int]:
    async def main() -> tuple[float, int]:
        async with txn.AsyncClient(service_url) as client:
            t0 = time.perf_counter()
            g = LedgerGuard(client, topic, "measured", [INPUT])
            await g.start()
            await g.wait_past(last, 600)
            el = time.perf_counter() - t0
            assert g.records_read == n, g.records_read
            entries = len(g.committed)
            await g.close()
            return el, entries

    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--service-url", default=None)
    ap.add_argument("--admin-url", default=None)
    args = ap.parse_args()
    local = None
    if args.service_url:
        url = args.service_url
    else:
        import tempfile

        local = LocalBroker(tempfile.mkdtemp(prefix="bench-guard-"), broker_port=free_port(), web_port=free_port(),
                            bookie_port=free_port())
        local.start(timeout=240)
        url = local.service_url
    try:
        topic = f"persistent://public/default/bench-guard-ledger-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        last = fill(url, topic, args.records)
        print(f"filled {args.records:,} records in {time.perf_counter() - t0:.1f}s", flush=True)
        off: list[float] = []
        grd: list[float] = []
        entries = 0
        for r in range(args.runs):
            order = ["official", "guard"] if r % 2 == 0 else ["guard", "official"]
            for kind in order:
                if kind == "official":
                    off.append(official_read(url, topic, args.records))
                else:
                    el, entries = guard_catch_up(url, topic, last, args.records)
                    grd.append(el)
            print(f"round {r + 1}: official {off[-1]:.2f}s, guard {grd[-1]:.2f}s", flush=True)
        mo, mg = statistics.median(off), statistics.median(grd)
        print()
        print(f"| ledger records read ({args.records:,}, half of the job, 100 ids each) | seconds (median of "
              f"{args.runs}) | records/s | vs official |")
        print("|---|---:|---:|---:|")
        print(f"| official pulsar-client Reader (no parsing) | {mo:.2f} | {args.records / mo:,.0f} | 1.00x |")
        print(f"| LedgerGuard catch-up (parse + index the job's records) | {mg:.2f} | {args.records / mg:,.0f} | "
              f"{mo / mg:.2f}x |")
        print(f"\nguard state after catch-up: {entries:,} ids (bounded by guard_max_ids)")
    finally:
        if local is not None:
            local.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
