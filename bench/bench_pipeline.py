#!/usr/bin/env python
"""Benchmark the exactly-once ``Processor`` against an at-least-once pipeline built with the
official ``pulsar-client``, and measure the processor's memory on a large backlog.

Run from the repository root::

    .venv/bin/python bench/bench_pipeline.py [--messages 50000] [--runs 3] [--rss-backlog 1000000]

By default a throw-away :class:`txn_shell.localbroker.LocalBroker` (temp data dir, free ports) is
started and stopped at the end; pass ``--service-url``/``--admin-url`` to use a running broker
instead (it needs transactions enabled).

Measured, all on the same broker in one run:

1. Pipeline throughput, consume → transform → produce, ``--size`` (1 KB) messages. One input
   topic is pre-filled with ``--messages`` messages by the official client (batched) before
   anything is timed; every run reads it from a fresh subscription (Earliest) and writes a
   fresh output topic (and, for the processor, a fresh ledger topic). The clock starts once
   the consumer and producer exist and stops when all N outputs are confirmed; the client
   CPU time (user+sys of this process, all threads) over the same span is reported per
   message, which varies less than msg/s on a busy machine:

   - *official, at-least-once*: ``pulsar-client``; ``receive()`` → ``producer.send_async(data,
     callback)`` → the callback acknowledges the input once the broker stored the output; a
     final ``flush()``; done when N callbacks reported ``Ok``. No transactions.
   - *txn exactly-once*: :class:`txn.delivery.AsyncProcessor` with the handler
     ``handler(m) = m.data()``, one transaction per batch (open, STARTED ledger record, produce,
     transactional acks, COMMITTED record, commit), done when ``stats.outputs == N``. Two
     commit settings: every 100 ms (``batch_max_delay_ms=100``, ``batch_max_messages=100000``)
     and every 1000 messages (``batch_max_messages=1000``, ``batch_max_delay_ms=10000``).

   The three pipelines run in rotated order in each of ``--runs`` rounds; medians are
   reported. After them, the broker's limit is measured on the same broker with the
   distribution's ``bin/pulsar-perf produce`` (4 producers, unthrottled, batching on, same size,
   ``--limit-seconds``) and ``pulsar-perf consume`` of what it wrote; each pipeline's "% of the
   broker's limit" divides its msg/s by the lower of the two. Then one run per
   ``max_inflight_commits`` value (``--inflight-sweep``) for both commit settings. The first
   exactly-once run of each setting is verified: the output topic
   holds exactly N messages (read with the official client).

2. Processor memory: a ``--rss-backlog`` topic of ``--rss-size`` (100 B) messages is pre-filled
   (official client, no per-message callback; the broker's ``msgInCounter`` is checked), then
   the processor (commit every 100 ms) runs in a child process (this script, ``--rss-child``)
   until the backlog is done or ``--rss-seconds`` have passed. Every 100 ms the child reports
   its committed outputs with its own VmRSS/VmHWM (``/proc/self/status``); this process also
   polls the child's VmHWM. Reported: RSS after start-up, at 10 %, 50 % and 100 % of the
   processed messages, and the peak (VmHWM). The same is measured first on a ``--rss-compare``
   backlog (default 100k) to show that the peak does not grow with the backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402  (official client)
from bench_client import pipeline_limit  # noqa: E402

import txn  # noqa: E402
from txn.admin import admin_request  # noqa: E402
from txn.delivery import AsyncProcessor, ProcessorConfig  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from machine import machine_load, proc_cpu_s  # noqa: E402
from official import count_topic, official_client  # noqa: E402

T0 = time.monotonic()
NS = "persistent://public/default"
# Every pipeline's clock starts when its consumer has the broker's first message, not at its
# subscription: a Failover subscription's first dispatch waits for the broker's
# ``activeConsumerFailoverDelayTimeMillis`` (1 s by default), the same fixed second in every
# pipeline, which would pull every ratio towards 1.


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def uniq(prefix: str) -> str:
    return f"{NS}/pipe-{prefix}-{uuid.uuid4().hex[:10]}"



def cpu_seconds() -> float:
    """user+sys CPU seconds of this process, all threads (the official client's C++ threads too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


#: The broker's JVM (the one this script started, or ``--broker-pid``): its CPU is measured too.
BROKER_PID: int | None = None


def broker_cpu_seconds() -> float:
    """user+sys CPU seconds of the broker's process (NaN if unknown): on this machine the broker
    shares the 2 cores with the pipeline, so its work per message bounds the pipeline too."""
    cpu = proc_cpu_s(BROKER_PID)
    return float("nan") if cpu is None else cpu


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def handler(m):  # noqa: ANN001, ANN201 - the trivial transform: output = input payload
    return m.data()


# --------------------------------------------------------------------------- pre-fill, counting


class Counter:
    """Send-result counter (thread-safe); ``done`` is set at ``target`` successes or at the first failure."""

    __slots__ = ("ok", "failed", "first_error", "_lock", "done", "target")

    def __init__(self, target: int = 0) -> None:
        self.ok = 0
        self.failed = 0
        self.first_error: object = None
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.target = target

    def hit(self, res) -> None:  # noqa: ANN001
        if res == pulsar.Result.Ok:
            with self._lock:
                self.ok += 1
                if self.ok == self.target:
                    self.done.set()
        else:
            with self._lock:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = res
            self.done.set()

    def __call__(self, res, msg_id) -> None:  # noqa: ANN001
        self.hit(res)


def prefill(url: str, admin: str, topic: str, n: int, size: int) -> float:
    """Write ``n`` distinct messages of ``size`` bytes with the official client (batched); returns seconds.

    No per-message callback (a Python callback per message makes the official producer ~3x slower);
    ``flush()`` waits for every receipt, and the broker's ``msgInCounter`` must then equal ``n``.
    """
    client = official_client(url)
    try:
        prod = client.create_producer(topic, block_if_queue_full=True, batching_enabled=True,
                                      batching_max_messages=1000, max_pending_messages=10000)
        body = os.urandom(max(size - 12, 0))
        t0 = time.perf_counter()
        send = prod.send_async
        for i in range(n):
            send(b"%012d" % i + body if size >= 12 else (b"%012d" % i)[:size], None)
        prod.flush()
        dt = time.perf_counter() - t0
        prod.close()
    finally:
        client.close()
    status, stats = admin_request("GET", admin, f"/admin/v2/{topic.replace('://', '/')}/stats")
    got = stats.get("msgInCounter") if status == 200 and isinstance(stats, dict) else None
    if got != n:
        raise RuntimeError(f"prefill: the broker counts {got} messages on {topic}, expected {n} ({status})")
    return dt


# --------------------------------------------------------------------------- pipelines


def official_alo(url: str, in_topic: str, n: int, receiver_queue: int, flush_every: int,
                 consumer_type: str) -> tuple[float, float, float]:
    """At-least-once with pulsar-client: receive → send_async → ack in the send callback."""
    client = official_client(url)
    try:
        cons = client.subscribe(in_topic, f"alo-{uuid.uuid4().hex[:8]}",
                                consumer_type=getattr(pulsar.ConsumerType, consumer_type),
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=receiver_queue)
        prod = client.create_producer(uniq("alo-out"), block_if_queue_full=True, batching_enabled=True)
        cb = Counter(n)
        ack = cons.acknowledge

        def make_cb(msg):  # noqa: ANN001, ANN202
            def on_sent(res, mid):  # noqa: ANN001, ANN202
                if res == pulsar.Result.Ok:
                    ack(msg)
                cb.hit(res)
            return on_sent

        receive, send = cons.receive, prod.send_async
        first = receive()  # the clock starts with the broker's first delivery (see above T0)
        c0, b0 = cpu_seconds(), broker_cpu_seconds()
        t0 = time.perf_counter()
        for i in range(n):
            m = first if i == 0 else receive()
            send(m.data(), make_cb(m))
            if flush_every and (i + 1) % flush_every == 0:
                prod.flush()
        prod.flush()
        if not cb.done.wait(60):
            raise RuntimeError(f"official pipeline: only {cb.ok} of {n} outputs confirmed")
        dt = time.perf_counter() - t0
        cpu, bcpu = cpu_seconds() - c0, broker_cpu_seconds() - b0
        if cb.failed:
            raise RuntimeError(f"official pipeline: {cb.failed} sends failed ({cb.first_error})")
        prod.close()
        cons.close()
        return dt, cpu, bcpu
    finally:
        client.close()


def txn_alo(url: str, in_topic: str, n: int, receiver_queue: int) -> tuple[float, float, float]:
    """At-least-once with txn's own client, no transactions: receive → send_async → acknowledge
    once the output's receipt came. The same client and transform as the processor, without its
    transactions, ledger and guard: what exactly-once costs on top of the plain pipeline."""

    async def main() -> tuple[float, float, float]:
        async with txn.AsyncClient(url) as client:
            cons = await client.subscribe(in_topic, f"talo-{uuid.uuid4().hex[:8]}",
                                          consumer_type=txn.ConsumerType.Failover,
                                          initial_position=txn.InitialPosition.Earliest,
                                          receiver_queue_size=receiver_queue)
            prod = await client.create_producer(uniq("talo-out"), block_if_queue_full=True,
                                                batching_max_publish_delay_ms=1)
            acked = 0
            all_done = asyncio.get_running_loop().create_future()

            def on_receipt(m: txn.Message, f: asyncio.Future) -> None:
                nonlocal acked
                if f.cancelled() or f.exception() is not None:
                    if not all_done.done():
                        all_done.set_exception(RuntimeError(f"send failed: {f}"))
                    return
                cons.acknowledge(m)
                acked += 1
                if acked == n and not all_done.done():
                    all_done.set_result(None)

            first = await cons.receive()  # the clock starts with the broker's first delivery
            c0, b0 = cpu_seconds(), broker_cpu_seconds()
            t0 = time.perf_counter()
            for i in range(n):
                m = first if i == 0 else await cons.receive()
                f = await prod.send_async(handler(m))
                f.add_done_callback(lambda f, m=m: on_receipt(m, f))
            prod.flush_now()
            await asyncio.wait_for(all_done, 60)
            done = acked
            dt = time.perf_counter() - t0
            cpu, bcpu = cpu_seconds() - c0, broker_cpu_seconds() - b0
            assert done == n
            await prod.close()
            await cons.close()
            return dt, cpu, bcpu

    return asyncio.run(main())


@dataclass
class EOResult:
    seconds: float
    cpu: float
    slot_wait: float  # seconds the loop waited for a free commit slot (max_inflight_commits)
    broker_cpu: float  # the broker's CPU seconds over the timed part
    batches: int
    aborts: int
    avg_commit_ms: float
    output_topic: str


class _TimedSemaphore(asyncio.Semaphore):
    """The processor's commit-slot semaphore, timing how long the run loop waits for a free slot."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.waited = 0.0

    async def acquire(self) -> bool:
        t0 = time.perf_counter()
        try:
            return await super().acquire()
        finally:
            self.waited += time.perf_counter() - t0


async def _stop(proc: AsyncProcessor, task: asyncio.Task) -> None:
    """Stop the processor. ``stop()`` is only seen between two receives, and ``_collect`` waits up
    to ``batch_max_delay_ms`` (10 s in the 1000-message setting) for a batch that will never fill:
    give it 1 s, then cancel the idle receive (the commits in flight are still awaited by ``run``)."""
    proc.stop()
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def exactly_once(url: str, in_topic: str, n: int, settings: dict, exact: bool = True) -> EOResult:
    """The txn AsyncProcessor until N outputs are committed (``exact``: the backlog is N, so exactly N)."""

    async def go() -> EOResult:
        async with txn.AsyncClient(url) as client:
            out = uniq("eo-out")
            cfg = ProcessorConfig(inputs=[in_topic], output=out, subscription=f"eo-{uuid.uuid4().hex[:8]}",
                                  job="bench", ledger_topic=uniq("eo-ledger"), progress_interval_s=3600,
                                  **settings)
            proc = AsyncProcessor(client, handler, cfg)
            # Bench-only instrumentation: time spent waiting for a commit slot.
            slots = proc.commit_slots = _TimedSemaphore(max(1, cfg.max_inflight_commits))
            await proc.start()
            assert proc.consumer is not None
            while not len(proc.consumer.receive_queue):  # the clock starts with the broker's first delivery
                await asyncio.sleep(0.001)
            c0, b0 = cpu_seconds(), broker_cpu_seconds()
            t0 = time.perf_counter()
            task = asyncio.get_running_loop().create_task(proc.run())
            st = proc.stats
            deadline = t0 + 300
            while st.outputs < n:
                if task.done():
                    task.result()
                    raise RuntimeError(f"processor stopped early at {st.outputs} outputs")
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"processor too slow: {st.outputs} of {n} outputs after 300 s")
                await asyncio.sleep(0.002)
            dt = time.perf_counter() - t0
            cpu, bcpu = cpu_seconds() - c0, broker_cpu_seconds() - b0
            await _stop(proc, task)
            await proc.close()
            if exact and st.outputs != n:
                raise RuntimeError(f"processor committed {st.outputs} outputs, expected {n}")
            return EOResult(dt, cpu, slots.waited, bcpu, st.batches, st.aborts,
                            st.commit_ms_total / max(st.batches, 1), out)

    return asyncio.run(go())


# --------------------------------------------------------------------------- RSS


def rss_child(args: argparse.Namespace) -> int:
    """Child mode: run the processor; every 100 ms print ``P <outputs> <seconds> <VmRSS MB> <VmHWM MB>``."""
    settings = eo_settings(args, "100ms")

    def line(kind: str, outputs: int, t: float) -> None:
        rss, hwm = _proc_mem(os.getpid())
        print(f"{kind} {outputs} {t:.3f} {rss:.1f} {hwm:.1f}", flush=True)

    async def go() -> None:
        async with txn.AsyncClient(args.service_url) as client:
            cfg = ProcessorConfig(inputs=[args.rss_input], output=uniq("rss-out"), subscription="rss",
                                  job="rss", ledger_topic=uniq("rss-ledger"), progress_interval_s=3600,
                                  **settings)
            proc = AsyncProcessor(client, handler, cfg)
            await proc.start()
            t0 = time.monotonic()
            line("S", 0, 0.0)
            task = asyncio.get_running_loop().create_task(proc.run())
            st = proc.stats
            end = t0 + args.rss_seconds
            while st.outputs < args.rss_expect and time.monotonic() < end and not task.done():
                await asyncio.sleep(0.1)
                line("P", st.outputs, time.monotonic() - t0)
            elapsed = time.monotonic() - t0
            await _stop(proc, task)
            await proc.close()
            line("D", st.outputs, elapsed)

    asyncio.run(go())
    return 0


def _proc_mem(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    rss = hwm = 0.0
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                rss = int(ln.split()[1]) / 1024
            elif ln.startswith("VmHWM:"):
                hwm = int(ln.split()[1]) / 1024
    return rss, hwm


@dataclass
class RssResult:
    backlog: int
    processed: int = 0
    seconds: float = 0.0
    startup_mb: float = 0.0
    peak_mb: float = 0.0
    at: dict[int, tuple[int, float]] = field(default_factory=dict)  # pct -> (processed, RSS MB)
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # (t, processed, RSS MB)


def measure_rss(args: argparse.Namespace, url: str, topic: str, backlog: int) -> RssResult:
    """Run the processor in a child process over ``topic``; collect its RSS against its progress.

    The child reports its own VmRSS/VmHWM with every progress line (so each RSS value is paired
    with the exact number of committed messages); this process also polls the child's VmHWM
    every 100 ms for the peak, in case the child dies without reporting.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rss-child", "--service-url", url,
           "--rss-input", topic, "--rss-expect", str(backlog), "--rss-seconds", str(args.rss_seconds)]
    for k in ("receiver_queue_size", "max_inflight_commits", "consumer_type"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    res = RssResult(backlog)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))

    def reader() -> None:
        assert proc.stdout is not None
        for ln in proc.stdout:
            parts = ln.split()
            if len(parts) != 5 or parts[0] not in ("S", "P", "D"):
                continue
            done, t, rss, hwm = int(parts[1]), float(parts[2]), float(parts[3]), float(parts[4])
            if parts[0] == "S":
                res.startup_mb = rss
            res.samples.append((t, done, rss))
            res.processed = done
            res.peak_mb = max(res.peak_mb, hwm)
            if parts[0] == "D":
                res.seconds = t

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    last_print = time.monotonic()
    rss = 0.0
    try:
        while proc.poll() is None:
            try:
                rss, hwm = _proc_mem(proc.pid)
                res.peak_mb = max(res.peak_mb, hwm)
            except (OSError, ValueError):
                pass
            now = time.monotonic()
            if now - last_print >= 10:
                progress(f"rss: backlog {backlog:,}: {res.processed:,} processed, RSS {rss:.0f} MB "
                         f"(peak so far {res.peak_mb:.0f} MB)")
                last_print = now
            time.sleep(0.1)
        proc.wait(timeout=60)
        th.join(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the RSS child exited with {proc.returncode}")
    for p in (10, 50, 100):
        goal = max(res.processed * p // 100, 1)
        for _, done, rss in res.samples:
            if done >= goal:
                res.at[p] = (done, rss)
                break
    return res


# --------------------------------------------------------------------------- report


def eo_settings(args: argparse.Namespace, kind: str, inflight: int | None = None) -> dict:
    """ProcessorConfig keyword arguments for the two commit settings."""
    base = {"receiver_queue_size": args.receiver_queue_size,
            "consumer_type": getattr(txn.ConsumerType, args.consumer_type),
            "max_inflight_commits": inflight if inflight is not None else args.max_inflight_commits,
            "ledger_guard": not args.no_ledger_guard,
            # Partition fences need one owner per partition; a Shared run measures the processor without them.
            "fencing": args.consumer_type in ("Failover", "Exclusive")}
    if kind == "100ms":
        return base | {"batch_max_delay_ms": 100, "batch_max_messages": 100_000}
    return base | {"batch_max_messages": 1000, "batch_max_delay_ms": 10_000}


def fmt(v: float) -> str:
    return "n/a" if v != v else f"{v:,.0f}"


LABELS = {
    "official": "official pulsar-client, at-least-once (no txn)",
    "txn-alo": "txn AsyncClient, at-least-once (no txn: ack after the send receipt)",
    "100ms": "txn Processor, exactly-once, commit every 100 ms",
    "1000msg": "txn Processor, exactly-once, commit every 1000 msgs",
}


@dataclass
class Series:
    mps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # client CPU microseconds per message
    broker_us: list[float] = field(default_factory=list)  # the broker's CPU microseconds per message
    eo: list[EOResult] = field(default_factory=list)


def throughput(args: argparse.Namespace, url: str, admin: str) -> list[str]:
    n = args.messages
    topic = uniq("in")
    progress(f"throughput: pre-filling {topic} with {n:,} x {args.size} B (official client, batched)")
    dt = prefill(url, admin, topic, n, args.size)
    progress(f"throughput: pre-filled in {dt:.1f} s; every run: new subscription at Earliest, new output topic")
    settings = {k: eo_settings(args, k) for k in ("100ms", "1000msg")}

    def run_one(kind: str, count: int, exact: bool = True,
                settings_: dict | None = None) -> tuple[float, float, float, EOResult | None]:
        if kind == "official":
            secs, cpu, bcpu = official_alo(url, topic, count, args.official_receiver_queue_size,
                                           args.official_flush_every, args.consumer_type)
            return secs, cpu, bcpu, None
        if kind == "txn-alo":
            secs, cpu, bcpu = txn_alo(url, topic, count, settings["100ms"]["receiver_queue_size"])
            return secs, cpu, bcpu, None
        r = exactly_once(url, topic, count, settings_ or settings[kind], exact=exact)
        return r.seconds, r.cpu, r.broker_cpu, r

    progress(f"throughput: warm-up, {max(n // 10, 1):,} messages through each pipeline")
    for kind in LABELS:
        run_one(kind, max(n // 10, 1), exact=False)

    series = {k: Series() for k in LABELS}
    verified: dict[str, str] = {}
    order = list(LABELS)
    for run in range(args.runs):
        for kind in order[run % len(order):] + order[:run % len(order)]:  # rotate: spread drift and noise
            secs, cpu, bcpu, r = run_one(kind, n)
            s = series[kind]
            s.mps.append(n / secs)
            s.cpu_us.append(cpu / n * 1e6)
            s.broker_us.append(bcpu / n * 1e6)
            extra = ""
            if r is not None:
                s.eo.append(r)
                extra = (f"; {r.batches} txns ({n / max(r.batches, 1):,.0f} msgs/txn), avg commit "
                         f"{r.avg_commit_ms:.0f} ms, slot wait {100 * r.slot_wait / secs:.1f}%, aborts {r.aborts}")
                if kind not in verified:  # exactly N outputs, read back with the official client
                    got = count_topic(url, r.output_topic, n)
                    verified[kind] = f"{got:,} of {n:,}"
                    extra += f"; output topic holds {got:,} messages"
                    if got != n:
                        progress(f"throughput: WARNING {r.output_topic} holds {got} messages, expected {n}")
            progress(f"throughput run {run + 1}/{args.runs} {kind:8s}: {n / secs:9,.0f} msg/s ({secs:.2f} s, "
                     f"client CPU {cpu / n * 1e6:.0f} us/msg, broker CPU {bcpu / n * 1e6:.0f} us/msg){extra}")

    limit, limit_note = pipeline_limit(url, args.size, args.limit_seconds, args.pulsar_home, progress)

    sweep_vals = [int(x) for x in args.inflight_sweep.split(",") if x.strip()]
    sweep: dict[str, dict[int, tuple[float, float]]] = {}  # kind -> k -> (msg/s, % of time waiting for a slot)
    for kind in ("100ms", "1000msg") if sweep_vals else ():
        sweep[kind] = {}
        for k in sweep_vals:
            secs, _, _, r = run_one(kind, n, settings_=eo_settings(args, kind, k))
            assert r is not None
            sweep[kind][k] = (n / secs, 100 * r.slot_wait / secs)
            progress(f"throughput: max_inflight_commits={k} {kind:8s}: {n / secs:9,.0f} msg/s "
                     f"({r.batches} txns, avg commit {r.avg_commit_ms:.0f} ms, waited for a commit slot "
                     f"{100 * r.slot_wait / secs:.1f}% of the time)")

    ref = median(series["official"].mps)
    ref_cpu = median(series["official"].cpu_us)
    out = ["", f"## Pipeline throughput (median of {args.runs} runs, {n:,} x {args.size} B messages, "
               f"{args.consumer_type} subscriptions)", "",
           "| pipeline | msg/s | ratio vs official at-least-once | ratio vs txn at-least-once | "
           "% of the broker's limit | client CPU (us/msg) | broker CPU (us/msg) | client + broker CPU (us/msg) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    same = median(series["txn-alo"].mps)
    for kind, label in LABELS.items():
        v, c, b = median(series[kind].mps), median(series[kind].cpu_us), median(series[kind].broker_us)
        pct = "n/a" if limit != limit else f"{100 * v / limit:.0f}%"
        out.append(f"| {label} | {fmt(v)} | {v / ref:.2f}x | {v / same:.2f}x | {pct} | {c:.0f} ({c / ref_cpu:.1f}x) | "
                   f"{fmt(b)} | {fmt(c + b)} |")
    out += ["", limit_note]
    out += ["", "Per-run values (msg/s; client CPU us/msg):", ""]
    for kind, label in LABELS.items():
        s = series[kind]
        out.append(f"- {label}: [{', '.join(fmt(v) for v in s.mps)}]; CPU [{', '.join(fmt(v) for v in s.cpu_us)}]; "
                   f"broker CPU [{', '.join(fmt(v) for v in s.broker_us)}]")
    for kind in ("100ms", "1000msg"):
        ds = series[kind].eo
        if ds:
            out.append(f"- {LABELS[kind]}: {statistics.median(d.batches for d in ds):.0f} transactions per run "
                       f"(median), avg commit (acks + COMMITTED record + END_TXN) "
                       f"{statistics.median(d.avg_commit_ms for d in ds):.0f} ms, {sum(d.aborts for d in ds)} "
                       f"aborts; output topic verified: {verified.get(kind, '-')}")
    s = settings["100ms"]
    out += ["", f"Settings: processor receiver_queue_size={s['receiver_queue_size']}, "
                f"max_inflight_commits={s['max_inflight_commits']}, {args.consumer_type} subscription, other "
                f"ProcessorConfig defaults; official: receiver_queue_size={args.official_receiver_queue_size}, "
                "producer batching defaults, block_if_queue_full, "
                + (f"flush() every {args.official_flush_every} msgs" if args.official_flush_every
                   else "flush() once at the end (the 10 ms batch timer sends meanwhile)")
                + ". Each clock starts at the pipeline's first delivered input (a Failover subscription's first "
                  "dispatch waits the broker's activeConsumerFailoverDelayTimeMillis, 1 s). "
                  "Client CPU = user+sys of the benchmark process over the timed part (all threads, "
                  "including the official client's C++ threads)."]
    if sweep:
        out += ["", "### max_inflight_commits (one run each: msg/s, and % of the time the loop waited for a "
                    "free commit slot)", "",
                "| setting | " + " | ".join(f"max_inflight_commits={k}" for k in sweep_vals) + " | fastest |",
                "|---|" + "---:|" * (len(sweep_vals) + 1)]
        for kind, vals in sweep.items():
            best = max(vals, key=lambda k: vals[k][0])
            out.append(f"| {LABELS[kind]} | " + " | ".join(f"{fmt(vals[k][0])} ({vals[k][1]:.1f}% wait)"
                                                            for k in sweep_vals) + f" | {best} |")
        out += ["", "A slot wait near 0% means more commits in flight cannot help: the commit is off the "
                    "critical path, and msg/s differences between the columns are noise."]
    return out


def memory(args: argparse.Namespace, url: str, admin: str) -> list[str]:
    rows: list[RssResult] = []
    for backlog in [b for b in (args.rss_compare, args.rss_backlog) if b > 0]:
        topic = uniq(f"rss-{backlog}")
        progress(f"rss: pre-filling {backlog:,} x {args.rss_size} B (official client, batched)")
        dt = prefill(url, admin, topic, backlog, args.rss_size)
        progress(f"rss: pre-filled in {dt:.1f} s ({backlog / dt:,.0f} msg/s); running the processor in a child "
                 f"process (at most {args.rss_seconds:.0f} s)")
        r = measure_rss(args, url, topic, backlog)
        progress(f"rss: backlog {backlog:,}: processed {r.processed:,} in {r.seconds:.1f} s, RSS after start-up "
                 f"{r.startup_mb:.0f} MB, peak {r.peak_mb:.0f} MB")
        rows.append(r)
    out = ["", f"## Processor memory (child process, commit every 100 ms, {args.rss_size} B messages, "
               f"receiver_queue_size={args.receiver_queue_size})", "",
           "| backlog | processed | time (s) | msg/s | RSS after start-up (MB) | RSS at 10% | RSS at 50% "
           "| RSS at 100% | peak RSS, VmHWM (MB) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [f"{r.at[p][1]:.0f} MB ({r.at[p][0]:,})" if p in r.at else "n/a" for p in (10, 50, 100)]
        out.append(f"| {r.backlog:,} | {r.processed:,} | {r.seconds:.1f} | {r.processed / max(r.seconds, 1e-9):,.0f} "
                   f"| {r.startup_mb:.0f} | " + " | ".join(cells) + f" | {r.peak_mb:.0f} |")
    out += ["", "RSS at x% = the child's own VmRSS in the first 100 ms progress report once x% of the messages "
                "processed in that run were committed (the count in brackets). A run stops when the backlog is "
                "done or after --rss-seconds."]
    if len(rows) == 2:
        a_, b_ = rows
        out.append(f"Peak RSS with a {b_.backlog:,} backlog minus peak with {a_.backlog:,}: "
                   f"{b_.peak_mb - a_.peak_mb:+.0f} MB ({b_.processed / max(a_.processed, 1):.0f}x the messages).")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000, help="input backlog per throughput run")
    ap.add_argument("--size", type=int, default=1024, help="payload size in bytes (throughput)")
    ap.add_argument("--runs", type=int, default=3, help="rounds of the three pipelines (median reported)")
    ap.add_argument("--inflight-sweep", default="1,2,4",
                    help="max_inflight_commits values tried once per commit setting ('' = skip)")
    ap.add_argument("--max-inflight-commits", type=int, default=2, help="processor, main runs and RSS runs")
    ap.add_argument("--receiver-queue-size", type=int, default=1000, help="processor's consumer queue")
    ap.add_argument("--consumer-type", default="Failover", choices=["Shared", "Exclusive", "Failover"],
                    help="subscription type of both pipelines")
    ap.add_argument("--official-receiver-queue-size", type=int, default=1000)
    ap.add_argument("--official-flush-every", type=int, default=0,
                    help="official pipeline: flush() every N messages (0: once at the end)")
    ap.add_argument("--rss-backlog", type=int, default=1_000_000, help="backlog for the RSS run (0 = skip)")
    ap.add_argument("--rss-compare", type=int, default=100_000, help="smaller backlog to compare peaks (0 = skip)")
    ap.add_argument("--rss-size", type=int, default=100, help="payload size in bytes (RSS runs)")
    ap.add_argument("--rss-seconds", type=float, default=120, help="max processing time per RSS run")
    ap.add_argument("--only", default="throughput,rss", help="comma-separated subset of throughput,rss")
    ap.add_argument("--no-ledger-guard", action="store_true", help="processor without its ledger guard (to measure it)")
    ap.add_argument("--limit-seconds", type=int, default=20,
                    help="pulsar-perf produce/consume -time for the broker's limit (0 = skip it)")
    ap.add_argument("--pulsar-home", help="Pulsar distribution for bin/pulsar-perf (default: txn's cache)")
    ap.add_argument("--service-url", help="use this broker instead of starting one")
    ap.add_argument("--admin-url", help="admin URL of --service-url's broker")
    ap.add_argument("--broker-pid", type=int,
                    help="pid of --service-url's broker on this machine (its CPU is measured)")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rss-input", help=argparse.SUPPRESS)
    ap.add_argument("--rss-expect", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        return rss_child(args)
    if bool(args.service_url) != bool(args.admin_url):
        ap.error("--service-url and --admin-url go together")
    parts = {p.strip() for p in args.only.split(",") if p.strip()}

    broker: LocalBroker | None = None
    data_dir: str | None = None
    url, admin = args.service_url, args.admin_url
    try:
        if url is None:
            data_dir = tempfile.mkdtemp(prefix="txnbench-broker-")
            broker = LocalBroker(data_dir, broker_port=free_port(), web_port=free_port(),
                                 bookie_port=free_port(), progress=progress)
            progress("starting a local Pulsar broker (about 40 s)...")
            broker.start()
            url, admin = broker.service_url, broker.admin_url
        own_pid = broker.pid if broker is not None else None
        global BROKER_PID
        BROKER_PID = own_pid if own_pid is not None else args.broker_pid
        progress(f"broker: {url} (admin {admin}); {machine_load(own_pid)}")
        lines: list[str] = []
        if "throughput" in parts:
            lines += throughput(args, url, admin)
        if "rss" in parts and (args.rss_backlog > 0 or args.rss_compare > 0):
            lines += memory(args, url, admin)
        print("\n".join(lines))
        print()
        progress(f"done; {machine_load(own_pid)}")
        return 0
    finally:
        if broker is not None:
            try:
                broker.stop()
            finally:
                if data_dir:
                    shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
