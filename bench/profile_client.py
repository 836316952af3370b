#!/usr/bin/env python
"""Profile txn's producer or consumer hot path against a running broker.

    .venv/bin/python bench/profile_client.py --service-url pulsar://127.0.0.1:6650 \\
        {producer,producer-async,consumer,consumer-async,official-producer,official-consumer} \\
        [--messages 100000] [--size 1024] [--profiler none|yappi|cprofile|pyinstrument] [--top 35]

Prints wall time, msg/s, and the process's CPU seconds (user+sys, all threads,
including the official client's C++ threads) so you can see whether the client
is CPU-bound. ``yappi`` profiles every Python thread (the sync facade runs the
asyncio core on its own thread); ``cprofile``/``pyinstrument`` only see the
calling thread, so use them with the ``*-async`` scenarios. Needs
``pip install yappi pyinstrument`` for those profilers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.dont_write_bytecode = True  # keep bench/ free of __pycache__
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pulsar  # noqa: E402
from bench_client import CallbackCounter, official_client, prefill  # noqa: E402

import txn  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """user+sys CPU seconds of another process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread of this process, from /proc (Linux only)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            out[f"{name}[{tid}]"] = (int(fields[11]) + int(fields[12])) / tick
    except OSError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["producer", "producer-async", "consumer", "consumer-async",
                                         "official-producer", "official-consumer"])
    ap.add_argument("--service-url", required=True)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--profiler", default="none", choices=["none", "yappi", "cprofile", "pyinstrument"])
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--topic", help="consumer: read this pre-filled topic instead of filling a new one")
    ap.add_argument("--broker-pid", type=int, help="also report this process's CPU seconds (e.g. the broker JVM)")
    args = ap.parse_args()
    url, n = args.service_url, args.messages
    payload = os.urandom(args.size)
    topic = f"persistent://public/default/prof-{uuid.uuid4().hex[:10]}"
    if "consumer" in args.scenario:
        if args.topic:
            topic = args.topic
        else:
            print(f"pre-filling {topic} with {n:,} messages...", flush=True)
            prefill(url, topic, n, payload)

    # set up clients outside the measured region
    loop = None
    if args.scenario in ("producer", "consumer"):
        client = txn.Client(url)
    elif args.scenario.startswith("official"):
        client = official_client(url)
    else:
        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(_make_async(url))

    if args.scenario in ("producer", "official-producer"):
        kw = {"batching_enabled": True, "block_if_queue_full": True}
        prod = client.create_producer(topic, **kw)
        cb = CallbackCounter()

        def work() -> None:
            send = prod.send_async
            for _ in range(n):
                send(payload, cb)
            prod.flush()
    elif args.scenario in ("consumer", "official-consumer"):
        init = (txn.InitialPosition.Earliest if args.scenario == "consumer"
                else pulsar.InitialPosition.Earliest)
        cons = client.subscribe(topic, f"prof-{uuid.uuid4().hex[:6]}", initial_position=init)

        def work() -> None:
            receive, ack = cons.receive, cons.acknowledge
            for _ in range(n):
                ack(receive())
    elif args.scenario == "producer-async":
        prod = loop.run_until_complete(client.create_producer(topic, block_if_queue_full=True))
        cb = CallbackCounter()

        async def body() -> None:
            send = prod.send_async
            for _ in range(n):
                await send(payload, cb)
            await prod.flush()

        def work() -> None:
            loop.run_until_complete(body())
    else:
        cons = loop.run_until_complete(
            client.subscribe(topic, f"prof-{uuid.uuid4().hex[:6]}", initial_position=txn.InitialPosition.Earliest))

        async def body() -> None:
            receive, ack = cons.receive, cons.acknowledge
            for _ in range(n):
                await ack(await receive())

        def work() -> None:
            loop.run_until_complete(body())

    prof = None
    if args.profiler == "yappi":
        import yappi

        yappi.set_clock_type("cpu")
        yappi.start(builtins=True, profile_threads=True)
    elif args.profiler == "cprofile":
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    elif args.profiler == "pyinstrument":
        import pyinstrument

        prof = pyinstrument.Profiler(interval=0.0005)
        prof.start()

    th0 = thread_cpu()
    b0 = proc_cpu(args.broker_pid) if args.broker_pid else 0.0
    c0, t0 = cpu(), time.perf_counter()
    work()
    dt, dc = time.perf_counter() - t0, cpu() - c0
    th1 = thread_cpu()
    b1 = proc_cpu(args.broker_pid) if args.broker_pid else 0.0

    if args.profiler == "yappi":
        import yappi

        yappi.stop()
    elif args.profiler == "cprofile":
        prof.disable()
    elif args.profiler == "pyinstrument":
        prof.stop()

    print(f"{args.scenario}: {n:,} msgs in {dt:.2f} s = {n / dt:,.0f} msg/s; process CPU {dc:.2f} s "
          f"({100 * dc / dt:.0f}% of one core)")
    busy = sorted(((th1[k] - th0.get(k, 0.0), k) for k in th1), reverse=True)
    print("  per-thread CPU s: " + ", ".join(f"{k}={v:.2f}" for v, k in busy if v > 0.05))
    if args.broker_pid:
        print(f"  broker pid {args.broker_pid} CPU {b1 - b0:.2f} s ({100 * (b1 - b0) / dt:.0f}% of one core); "
              f"machine has {os.cpu_count()} CPUs")

    if args.profiler == "yappi":
        import yappi

        stats = yappi.get_func_stats()
        stats.sort("tsub")
        print(f"\n--- yappi, all threads, top {args.top} by own CPU time (tsub) ---")
        _print_yappi(stats, args.top)
        stats.sort("ttot")
        print(f"\n--- yappi, all threads, top {args.top} by inclusive CPU time (ttot) ---")
        _print_yappi(stats, args.top)
    elif args.profiler == "cprofile":
        import pstats

        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(args.top)
        st.sort_stats("cumulative").print_stats(args.top)
    elif args.profiler == "pyinstrument":
        print(prof.output_text(unicode=False, color=False, show_all=False))

    if loop is not None:
        loop.run_until_complete(client.close())
        loop.close()
    else:
        client.close()
    return 0


def _print_yappi(stats, top: int) -> None:  # noqa: ANN001
    print(f"{'ncall':>10} {'tsub':>8} {'ttot':>8}  function")
    for s in list(stats)[:top]:
        where = f"{Path(s.module).name}:{s.lineno}" if s.module else ""
        print(f"{s.ncall:>10} {s.tsub:8.3f} {s.ttot:8.3f}  {s.name} ({where})")


async def _make_async(url: str) -> txn.AsyncClient:
    return txn.AsyncClient(url)


if __name__ == "__main__":
    sys.exit(main())
