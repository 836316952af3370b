#!/usr/bin/env python
"""Cost of the batch-entry safeguards of the exactly-once processor, on batched input.

Run from the repository root (``--service-url``/``--admin-url``: a running broker with
transactions; otherwise a throw-away LocalBroker is started)::

    .venv/bin/python bench/bench_batching.py [--messages 20000] [--size 100] [--runs 3]

One input topic is pre-filled by the official client with batching on (bench_pipeline's
``prefill``: entries of up to 1000 messages and 128 KB, so ``--size 100`` gives entries of 1000).
Each run is bench_pipeline's ``exactly_once`` (fresh subscription at Earliest, fresh output and
ledger topics, clock stops when N outputs are committed) with one of these variants:

- ``one-command``: transactional acks of a batch as one ACK command per partition (the layout
  before one command per entry; ``acknowledge_many(per_entry=False)``), today's batching;
- ``per-entry``: one ACK command per batch entry (the default now), today's batching;
- ``per-entry+boundaries``: the same with ``ProcessorConfig.batch_entry_boundaries``.

for each commit setting (``--batch-sizes``: ``batch_max_messages``, 100 ms delay). The variants run
in rotated order in each of ``--runs`` rounds; medians are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pipeline as bp  # noqa: E402

import txn  # noqa: E402
from txn.consumer import AsyncConsumer  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

VARIANTS = ("one-command", "per-entry", "per-entry+boundaries")
_ACK = AsyncConsumer.acknowledge_many


def set_ack_layout(per_entry: bool) -> None:
    """Switch every consumer's ``acknowledge_many`` default (bench only)."""
    AsyncConsumer.acknowledge_many = functools.partialmethod(_ACK, per_entry=per_entry)  # type: ignore[method-assign]


def entry_sizes(url: str, topic: str, n: int) -> tuple[int, int, float]:
    """(entries, largest, mean messages per entry) of the pre-filled topic."""

    async def go() -> list[int]:
        async with txn.AsyncClient(url) as c:
            r = await c.create_reader(topic, txn.EARLIEST, receiver_queue_size=5000)
            sizes: dict[tuple[int, int], int] = {}
            for _ in range(n):
                mid = (await r.read_next(timeout_millis=30000)).message_id()
                sizes[(mid.ledger_id(), mid.entry_id())] = max(mid.batch_size, 1)
            await r.close()
            return list(sizes.values())

    sizes = asyncio.run(go())
    return len(sizes), max(sizes), statistics.mean(sizes)


def run_variant(url: str, topic: str, n: int, variant: str, batch: int, inflight: int,
                exact: bool = True) -> bp.EOResult:
    set_ack_layout(variant != "one-command")
    settings = {"batch_max_messages": batch, "batch_max_delay_ms": 100, "max_inflight_commits": inflight,
                "batch_entry_boundaries": variant.endswith("boundaries")}
    return bp.exactly_once(url, topic, n, settings, exact=exact)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100, help="payload bytes (100: entries of 1000 messages)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-sizes", default="100,1000", help="batch_max_messages values")
    ap.add_argument("--max-inflight-commits", type=int, default=2)
    ap.add_argument("--service-url")
    ap.add_argument("--admin-url")
    args = ap.parse_args()
    broker, data_dir = None, None
    url, admin = args.service_url, args.admin_url
    try:
        if url is None:
            data_dir = tempfile.mkdtemp(prefix="txnbench-broker-")
            broker = LocalBroker(data_dir, broker_port=free_port(), web_port=free_port(), bookie_port=free_port(),
                                 progress=bp.progress)
            broker.start()
            url, admin = broker.service_url, broker.admin_url
        n = args.messages
        topic = bp.uniq("in")
        bp.progress(f"pre-filling {topic} with {n:,} x {args.size} B (official client, batched)")
        bp.prefill(url, admin, topic, n, args.size)
        entries, largest, mean = entry_sizes(url, topic, n)
        bp.progress(f"input: {entries} entries, up to {largest} messages, mean {mean:.0f}")
        bp.progress(f"load: {bp.machine_load(broker.pid if broker else None)}")
        batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        results: dict[tuple[int, str], list[bp.EOResult]] = {(b, v): [] for b in batches for v in VARIANTS}
        for b in batches:
            run_variant(url, topic, max(n // 10, 1), "per-entry", b, args.max_inflight_commits, exact=False)
        for r in range(args.runs):
            for b in batches:
                for v in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                    res = run_variant(url, topic, n, v, b, args.max_inflight_commits)
                    results[(b, v)].append(res)
                    bp.progress(f"run {r + 1} batch {b} {v:22s}: {n / res.seconds:8,.0f} msg/s, "
                                f"{res.batches} txns, avg commit {res.avg_commit_ms:.0f} ms, "
                                f"CPU {res.cpu / n * 1e6:.0f} us/msg")
        print(f"\n| batch_max_messages | variant | msg/s (median of {args.runs}) | ratio vs one-command | "
              "txns | avg commit ms | client CPU us/msg |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for b in batches:
            ref = statistics.median(n / x.seconds for x in results[(b, "one-command")])
            for v in VARIANTS:
                xs = results[(b, v)]
                mps = statistics.median(n / x.seconds for x in xs)
                print(f"| {b} | {v} | {mps:,.0f} | {mps / ref:.2f}x | "
                      f"{statistics.median(x.batches for x in xs):.0f} | "
                      f"{statistics.median(x.avg_commit_ms for x in xs):.0f} | "
                      f"{statistics.median(x.cpu / n * 1e6 for x in xs):.0f} |")
        print("\nper-run msg/s: " + "; ".join(
            f"{b}/{v}: [{', '.join(f'{n / x.seconds:,.0f}' for x in results[(b, v)])}]"
            for b in batches for v in VARIANTS))
        bp.progress(f"done; load: {bp.machine_load(broker.pid if broker else None)}")
        return 0
    finally:
        if broker is not None:
            broker.stop()
        if data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
