"""Start-up time and peak memory of a processor as its ledger grows: before and after guard checkpoints.

Run from the repository root::

    .venv/bin/python bench/bench_startup.py [--sizes 10000,100000,1000000] [--service-url ... --admin-url ...]

For each size N, on one broker: a ledger topic is filled with N COMMITTED records of the measured
job (10 input ids each, written inside transactions, so the guard trusts them, 1000 per
transaction), then 50 new inputs are published before each start, and a processor is started in a
fresh Python process (so its peak RSS is its own) and timed from ``start()`` to its first committed
batch:

- *before*: ``guard_checkpoint_s=0``, the guard reads the whole ledger (what every start did);
- *after*: a processor with checkpoints ran once (it read the whole ledger and wrote a checkpoint
  with its first commit); the next start is timed: its guard reads from the checkpoint on.

The peer is the official ``pulsar-client`` Reader reading the whole ledger, doing nothing with the
payloads (the floor for any design that reads it all). The 10M row, if asked for with
``--simulate 10000000``, is not written: the *before* time and memory are extrapolated linearly
from the largest measured size (reading is linear in records; the guard's state is bounded by
``guard_max_ids``, so memory is capped), and the *after* time is the largest size's (it reads a
constant tail).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulsar  # noqa: E402

import txn  # noqa: E402
from txn.delivery.ledger import LedgerRecord  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from machine import machine_load  # noqa: E402

JOB = "measured"
NEW_INPUTS = 50


def fill(url: str, ledger: str, inp: str, n: int) -> None:
    """``n`` trusted COMMITTED records of JOB naming 10 (old) input ids each."""

    async def main() -> None:
        async with txn.AsyncClient(url) as client:
            p = await client.create_producer(ledger, block_if_queue_full=True, batching_max_publish_delay_ms=5)
            done = 0
            while done < n:
                t = await client.new_transaction(timeout_millis=120000)
                futs = []
                for b in range(done, min(n, done + 1000)):
                    ids = [f"(1,{b},-1,{i})" for i in range(10)]
                    rec = LedgerRecord(kind="COMMITTED", job=JOB, batch_id=f"{JOB}:fill:{b}", txn_id=str(t.id),
                                       attempt=1, inputs={inp: ids}, outputs={"o": 10})
                    futs.append(await p.send_async(rec.to_json(), partition_key=rec.batch_id, txn=t))
                await asyncio.gather(*futs)
                await t.commit()
                done = min(n, done + 1000)
            await p.close()

    asyncio.run(main())


def publish(url: str, inp: str, n: int) -> None:
    c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    p = c.create_producer(inp, batching_enabled=False)
    for i in range(n):
        p.send(b"x%d" % i)
    p.close()
    c.close()


def official_read(url: str, topic: str, n: int) -> float:
    c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    t0 = time.perf_counter()
    r = c.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
    for _ in range(n):
        r.read_next(60000)
    el = time.perf_counter() - t0
    r.close()
    c.close()
    return el


def child(args: argparse.Namespace) -> int:
    """One processor start in this process: prints seconds to the first commit, records read, peak RSS."""
    from txn.delivery.processor import AsyncProcessor, ProcessorConfig

    async def main() -> dict:
        async with txn.AsyncClient(args.service_url) as client:
            conf = ProcessorConfig(inputs=[args.input], output=args.output, subscription="s", job=JOB,
                                   ledger_topic=args.ledger, guard_checkpoint_s=args.checkpoint_s,
                                   batch_max_messages=NEW_INPUTS, batch_max_delay_ms=200)
            proc = AsyncProcessor(client, lambda m: m.data(), conf)
            first = asyncio.get_running_loop().create_future()
            proc.on_commit = lambda *_: first.done() or first.set_result(time.perf_counter())
            t0 = time.perf_counter()
            await proc.start()
            running = asyncio.ensure_future(proc.run())
            t1 = await asyncio.wait_for(first, 3600)
            proc.stop()
            await running
            await proc.close()
            return {"seconds": t1 - t0, "records_read": proc.guard.records_read if proc.guard else 0,
                    "from_checkpoint": bool(proc.guard and proc.guard.start_rung),
                    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    print(json.dumps(asyncio.run(main())), flush=True)
    return 0


def start_once(url: str, inp: str, out: str, ledger: str, checkpoint_s: float) -> dict:
    publish(url, inp, NEW_INPUTS)
    res = subprocess.run([sys.executable, __file__, "--child", "--service-url", url, "--input", inp, "--output", out,
                          "--ledger", ledger, "--checkpoint-s", str(checkpoint_s)],
                         capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"child failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--simulate", type=int, default=10_000_000, help="a size extrapolated, not written (0: none)")
    ap.add_argument("--service-url", default=None)
    ap.add_argument("--admin-url", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--input", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--output", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ledger", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint-s", type=float, default=30.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    local = None
    if args.service_url:
        url = args.service_url
    else:
        local = LocalBroker(tempfile.mkdtemp(prefix="bench-startup-"), broker_port=free_port(), web_port=free_port(),
                            bookie_port=free_port())
        local.start(timeout=240)
        url = local.service_url
    rows = []
    try:
        print(machine_load(local.pid if local is not None else None), flush=True)
        for n in (int(s) for s in args.sizes.split(",")):
            tag = uuid.uuid4().hex[:8]
            inp, out, ledger = (f"persistent://public/default/bench-start-{k}-{tag}" for k in ("in", "out", "ledger"))
            t0 = time.perf_counter()
            fill(url, ledger, inp, n)
            print(f"{n:,} records written in {time.perf_counter() - t0:.1f}s", flush=True)
            peer = official_read(url, ledger, n)
            before = start_once(url, inp, out, ledger, 0)
            start_once(url, inp, out, ledger, 30)  # reads it all once, writes a checkpoint
            after = start_once(url, inp, out, ledger, 30)
            assert not before["from_checkpoint"] and after["from_checkpoint"], (before, after)
            rows.append((n, peer, before, after, False))
            print(f"{n:,}: official read {peer:.2f}s; before {before}; after {after}", flush=True)
        if args.simulate and rows:
            n0, peer0, b0, a0, _ = rows[-1]
            k = args.simulate / n0
            rows.append((args.simulate, peer0 * k,
                         {"seconds": b0["seconds"] * k, "records_read": int(b0["records_read"] * k),
                          "maxrss_mb": b0["maxrss_mb"]},
                         a0, True))
    finally:
        if local is not None:
            local.stop()
    print()
    print("| ledger records | official reader, whole ledger (s) | start before (s) | start after (s) | "
          "official / after | records read before / after | peak RSS before / after (MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, peer, b, a, sim in rows:
        mark = " (simulated)" if sim else ""
        print(f"| {n:,}{mark} | {peer:.1f} | {b['seconds']:.1f} | {a['seconds']:.2f} | {peer / a['seconds']:.2f}x "
              f"| {b['records_read']:,} / {a['records_read']:,} | {b['maxrss_mb']:.0f} / {a['maxrss_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
