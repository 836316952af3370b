#!/usr/bin/env python
"""Throughput of the reliable producer: in memory vs with the durable outbox.

Run from the repository root::

    .venv/bin/python bench/bench_outbox.py [--messages 20000] [--size 256] [--window 1000]

Starts a throw-away local broker unless ``--service-url``/``--admin-url`` are given.
Each case sends ``--messages`` messages to a fresh topic in a deduplicated namespace
and waits for every confirm:

- ``memory sync``: ``ReliableProducer.send_async`` from one thread (no outbox);
- ``outbox sync``: the same with an outbox: one fsynced SQLite commit per message;
- ``outbox async xK``: ``AsyncReliableProducer.send_async`` from K concurrent tasks, so
  the outbox writer group-commits many rows per fsync.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import txn  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402
from txn.delivery.reliable_producer import AsyncReliableProducer, ReliableProducer  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402


def run_sync(url: str, topic: str, n: int, payload: bytes, window: int, outbox: Path | None) -> float:
    client = txn.Client(url)
    kw = {"outbox_path": outbox, "producer_name": "bench"} if outbox else {}
    p = ReliableProducer(client, topic, window=window, **kw)
    t0 = time.perf_counter()
    for _ in range(n):
        p.send_async(payload)
    p.flush()
    dt = time.perf_counter() - t0
    p.close()
    client.close()
    return dt


def run_async(url: str, topic: str, n: int, payload: bytes, window: int, outbox: Path, tasks: int) -> float:
    async def main() -> float:
        async with txn.AsyncClient(url) as client:
            async with AsyncReliableProducer(client, topic, window=window, outbox_path=outbox,
                                             producer_name="bench") as p:
                async def sender(k: int) -> None:
                    for _ in range(k, n, tasks):
                        await p.send_async(payload)

                t0 = time.perf_counter()
                await asyncio.gather(*(sender(k) for k in range(tasks)))
                await p.flush()
                return time.perf_counter() - t0

    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=64, help="concurrent senders in the async case")
    ap.add_argument("--service-url")
    ap.add_argument("--admin-url")
    args = ap.parse_args()
    broker = None
    data_dir = None
    url, admin = args.service_url, args.admin_url
    if not (url and admin):
        data_dir = tempfile.mkdtemp(prefix="txnbench-outbox-")
        broker = LocalBroker(data_dir, broker_port=free_port(), web_port=free_port(), bookie_port=free_port())
        broker.start(timeout=240)
        url, admin = broker.service_url, broker.admin_url
    work = Path(tempfile.mkdtemp(prefix="txnbench-outbox-db-"))
    try:
        ns = f"public/bench-{uuid.uuid4().hex[:8]}"
        create_namespace(admin, ns)
        enable_namespace_dedup(admin, ns)
        n, payload = args.messages, b"x" * args.size
        cases = [
            ("memory sync", lambda t: run_sync(url, t, n, payload, args.window, None)),
            ("outbox sync", lambda t: run_sync(url, t, n, payload, args.window, work / f"{uuid.uuid4().hex}.db")),
            (f"outbox async x{args.tasks}",
             lambda t: run_async(url, t, n, payload, args.window, work / f"{uuid.uuid4().hex}.db", args.tasks)),
        ]
        print(f"{n} messages of {args.size} B, window {args.window}")
        for name, fn in cases:
            dt = fn(f"persistent://{ns}/bench-{uuid.uuid4().hex[:8]}")
            print(f"  {name:<18} {n / dt:>9,.0f} msg/s  ({dt:.2f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if broker is not None:
            broker.stop()
            shutil.rmtree(data_dir, ignore_errors=True)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
