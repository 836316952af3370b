#!/usr/bin/env python
"""How each cost grows with its input: three sizes per dimension, one table (issue 16, section 4).

Run from the repository root::

    .venv/bin/python bench/bench_cost_growth.py                 # own broker; full run, about 15-20 min
    .venv/bin/python bench/bench_cost_growth.py --quick         # smoke run, about 2-3 min
    .venv/bin/python bench/bench_cost_growth.py --only batch,partitions --runs 5
    .venv/bin/python bench/bench_cost_growth.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

A broker given by ``--service-url``/``--admin-url`` (or ``PULSAR_SERVICE_URL``/``PULSAR_ADMIN_URL``)
needs transactions on; without one, a throw-away :class:`txn_shell.localbroker.LocalBroker` is
started and stopped at the end. The other benchmarks' code does the work (nothing is measured
twice in two ways):

- **batch** -- messages per batch (10, 100, 1000): one input topic of ``--messages`` messages is
  read by the in-process :class:`AsyncProcessor` (``bench_pipeline.exactly_once``: new
  subscription, output and ledger per run; batches closed by count, ``batch_max_delay_ms`` 10 s).
  Metrics: msg/s, the commit stage per batch (ms: from the outputs' receipts to the commit's
  answer: transactional acks, COMMITTED record, END_TXN; ``ProcessorStats.commit_ms_total`` /
  batches) and CPU per message (user+sys of this process over the run, as ``time.process_time``).
- **partitions** -- input partitions (1, 4, 16): the same processor (batches of 100 or 100 ms, the
  CLI's defaults) on a partitioned input of ``--messages`` keyed messages
  (``bench_instances.prefill``). Metrics: msg/s, CPU per message.
- **instances** -- instances (1, 2, 4) of ``pulsar-txn process`` as subprocesses on one
  4-partition input (``bench_instances.run_once``: Failover, partition fences). Metrics: total
  msg/s from spawning the instances to the last output seen (start-up included), client CPU per
  1000 messages summed over the instances (after their start-up lines), and the spread: the busiest
  instance's committed inputs over its fair share (1.00 is even), with the partitions per instance.
- **ledger** -- ledger length (10k, 100k, 1M COMMITTED records, written in transactions of 1000
  with batching on by ``bench_startup.fill``): a processor with guard checkpoints on
  (``guard_checkpoint_s=30``) runs once (reading the whole ledger, writing a checkpoint), then is
  started ``--runs`` times in a fresh process each (``bench_startup.start_once``). Metrics: start-up
  from ``start()`` to the first committed batch (the guard is ready: a batch waits for it), peak
  RSS of that process, ledger records the guard read.
- **parked** -- parked batches (10, 100, 1000 PARKED batches beside ``--parked-background``
  committed ones on one ledger topic): the control plane's projection of the ledger, run in this
  process (``coordinator_api.core.Core.open``, the API's own set-up; SQLite in a temp dir) from
  the first record to the last, then ``GET /batches?status=PARKED`` (a page of 50 with the total)
  served by the API as a uvicorn child process (``bench_api.ApiProcess``, projection off) on that
  database. Metrics: projection seconds, p50 of ``--queries`` sequential requests.
- **jobs** -- the control plane's number of batches and jobs (1k batches of 10 jobs, 10k of 100,
  100k of 1000: 100 batches a job): projection records/s and CPU per 1000 records, and the p50 of
  ``GET /batches`` (newest 50 of all), ``GET /batches/{id}`` (random ids) and ``GET /jobs`` (every
  job's stats).

The table gives for each metric its value at each size, the ratio to the smallest size's, and the
growth it implies: the exponent k of cost ~ size^k between the smallest and that size (flat when
|k| < 0.1, linear near 1). Medians over ``--runs`` where a run is cheap (processor runs, starts);
the projection is measured once per size. No figure here is checked against a bound: only the
answers are (the processor's committed outputs, the instances' exactness as ``bench_instances``
checks it, starts from a checkpoint, the totals of the API's pages); a wrong one is printed as a
PROBLEM line and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import bench_api  # noqa: E402
import bench_instances  # noqa: E402
import bench_pipeline  # noqa: E402
import bench_startup  # noqa: E402
import httpx  # noqa: E402

import txn  # noqa: E402
from coordinator_api.core import Core  # noqa: E402
from coordinator_api.settings import Settings  # noqa: E402
from txn.admin import admin_request, topic_path  # noqa: E402
from txn.delivery.ledger import LedgerRecord, ensure_ledger_retained, now_ms  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from machine import machine_load  # noqa: E402

T0 = time.monotonic()
NS = "persistent://public/default"
#: Runs whose answers were wrong (reported at the end; the exit status is then 1).
PROBLEMS: list[str] = []
DIMENSIONS = ("batch", "partitions", "instances", "ledger", "parked", "jobs")
FULL = {"messages": 20_000, "batch_sizes": "10,100,1000", "partitions": "1,4,16", "instances": "1,2,4",
        "instance_messages": 20_000, "ledger_sizes": "10000,100000,1000000", "parked": "10,100,1000",
        "parked_background": 1000, "control_plane": "1000:10,10000:100,100000:1000", "queries": 50}
QUICK = {"messages": 2000, "batch_sizes": "10,100,1000", "partitions": "1,4,16", "instances": "1,2,4",
         "instance_messages": 2000, "ledger_sizes": "1000,3000,10000", "parked": "10,100,1000",
         "parked_background": 200, "control_plane": "500:5,2000:20,8000:80", "queries": 20, "runs": 1}


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def uniq(prefix: str) -> str:
    return f"{NS}/cost-{prefix}-{uuid.uuid4().hex[:10]}"


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def ints(spec: str) -> list[int]:
    return [int(x) for x in spec.split(",") if x.strip()]


def rotated(xs: list[Any], run: int) -> list[Any]:
    k = run % len(xs)
    return xs[k:] + xs[:k]


# --------------------------------------------------------------------------- the table


@dataclass
class Row:
    """One metric at one size of one dimension."""

    dimension: str
    size: float  # the dimension's quantity (what the ratio of sizes is taken of)
    size_label: str
    metric: str
    value: float
    digits: int = 1
    note: str = ""  # shown after the value (e.g. the partitions per instance)


def growth(s0: float, s: float, v0: float, v: float) -> str:
    """``x10 size -> x1.1: flat (~size^0.04)``, from the smallest size's value to this one's."""
    if s == s0:
        return "(smallest size)"
    if not all(math.isfinite(x) and x > 0 for x in (s0, s, v0, v)):
        return "n/a"
    k = math.log(v / v0) / math.log(s / s0)
    if abs(k) < 0.1:
        word = "flat"
    elif k < 0:
        word = "falls"
    elif k < 0.8:
        word = "sublinear"
    elif k <= 1.2:
        word = "linear"
    else:
        word = "superlinear"
    return f"x{s / s0:,.3g} size -> x{v / v0:.3g}: {word} (~size^{k:.2f})"


def table(rows: list[Row]) -> list[str]:
    out = ["| dimension | size | metric | value | ratio to smallest | growth |", "|---|---|---|---:|---:|---|"]
    first: dict[tuple[str, str], Row] = {}
    for r in rows:
        base = first.setdefault((r.dimension, r.metric), r)
        value = "n/a" if r.value != r.value else f"{r.value:,.{r.digits}f}"
        if r.note:
            value += f" ({r.note})"
        ratio = (f"{r.value / base.value:.2f}x" if base.value and base.value == base.value and r.value == r.value
                 else "n/a")
        out.append(f"| {r.dimension} | {r.size_label} | {r.metric} | {value} | {ratio} | "
                   f"{growth(base.size, r.size, base.value, r.value)} |")
    return out


# --------------------------------------------------------------------------- helpers


class Ticker:
    """Prints ``what`` with the topic's stored message count every ``every_s`` while a long step runs."""

    def __init__(self, what: str, admin: str, topic: str, every_s: float = 15.0) -> None:
        self.what, self.admin, self.topic, self.every_s = what, admin, topic, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            status, st = admin_request("GET", self.admin, f"/admin/v2/{topic_path(self.topic)}/stats")
            n = st.get("msgInCounter") if status == 200 and isinstance(st, dict) else "?"
            progress(f"  {self.what}: {n:,} messages stored after {time.monotonic() - self.t0:.0f} s"
                     if isinstance(n, int) else f"  {self.what}: still running")

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# --------------------------------------------------------------------------- processor dimensions


def dim_batch(args: argparse.Namespace, url: str, admin: str) -> list[Row]:
    n = args.messages
    topic = uniq("batch-in")
    dt = bench_pipeline.prefill(url, admin, topic, n, args.size)
    progress(f"batch: {n:,} x {args.size} B in {topic} ({dt:.1f} s)")
    sizes = ints(args.batch_sizes)
    per: dict[int, list[bench_pipeline.EOResult]] = {b: [] for b in sizes}
    for run in range(args.runs):
        for b in rotated(sizes, run):
            r = bench_pipeline.exactly_once(url, topic, n, {"batch_max_messages": b, "batch_max_delay_ms": 10_000})
            per[b].append(r)
            progress(f"batch run {run + 1}/{args.runs}, {b} msgs/batch: {n / r.seconds:,.0f} msg/s, "
                     f"{r.batches} batches, commit {r.avg_commit_ms:.1f} ms, CPU {r.cpu / n * 1e6:.0f} us/msg, "
                     f"{r.aborts} aborts")
    rows = []
    for b in sizes:
        rs, label = per[b], f"{b:,} msgs/batch"
        rows += [Row("messages per batch", b, label, "msg/s", median([n / r.seconds for r in rs]), 0),
                 Row("messages per batch", b, label, "commit stage per batch (ms)",
                     median([r.avg_commit_ms for r in rs]), 1),
                 Row("messages per batch", b, label, "CPU per message (us)", median([r.cpu / n * 1e6 for r in rs]), 1)]
    return rows


def dim_partitions(args: argparse.Namespace, url: str, admin: str) -> list[Row]:
    n = args.messages
    sizes = ints(args.partitions)
    topics = {}
    for p in sizes:
        topics[p] = uniq(f"parts{p}-in")
        dt, per = bench_instances.prefill(url, admin, topics[p], n, args.size, p)
        progress(f"partitions: {n:,} x {args.size} B in {p} partition(s) ({dt:.1f} s; min/max per partition "
                 f"{min(per):,}/{max(per):,})")
    res: dict[int, list[bench_pipeline.EOResult]] = {p: [] for p in sizes}
    for run in range(args.runs):
        for p in rotated(sizes, run):
            r = bench_pipeline.exactly_once(url, topics[p], n, {"batch_max_messages": 100, "batch_max_delay_ms": 100})
            res[p].append(r)
            progress(f"partitions run {run + 1}/{args.runs}, {p} partition(s): {n / r.seconds:,.0f} msg/s, "
                     f"{r.batches} batches, commit {r.avg_commit_ms:.1f} ms, CPU {r.cpu / n * 1e6:.0f} us/msg")
    rows = []
    for p in sizes:
        rs, label = res[p], f"{p} partition{'s' if p > 1 else ''}"
        rows += [Row("input partitions", p, label, "msg/s", median([n / r.seconds for r in rs]), 0),
                 Row("input partitions", p, label, "commit stage per batch (ms)",
                     median([r.avg_commit_ms for r in rs]), 1),
                 Row("input partitions", p, label, "CPU per message (us)", median([r.cpu / n * 1e6 for r in rs]), 1)]
    return rows


def dim_instances(args: argparse.Namespace, url: str, admin: str, broker_pid: int | None, tmp: Path) -> list[Row]:
    n, parts = args.instance_messages, args.instance_partitions
    topic = uniq("inst-in")
    dt, per = bench_instances.prefill(url, admin, topic, n, args.size, parts)
    progress(f"instances: {n:,} x {args.size} B in {parts} partitions ({dt:.1f} s; per partition {per})")
    iargs = SimpleNamespace(plain_cli=False, batch_max_messages=100, batch_max_delay_ms=100, max_inflight_commits=2,
                            receiver_queue_size=1000, progress_interval=5.0, run_timeout=300.0, stop_grace=30.0)
    log_dir = tmp / "instance-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    sizes = ints(args.instances)
    res: dict[int, list[bench_instances.RunResult]] = {k: [] for k in sizes}
    for run in range(args.runs):
        for k in rotated(sizes, run):
            r = bench_instances.run_once(iargs, url, admin, topic, n, k, True, log_dir, f"r{run}-k{k}", broker_pid)
            res[k].append(r)
            spread = ", ".join(f"{'+'.join(p)} {sum(p.values()):,}" for _, p in sorted(r.per_instance.items()))
            exact = r.ok and r.out_distinct == n and r.out_total == n
            if not exact:
                PROBLEMS.append(f"instances run {run + 1}, {k} instance(s): {r.error or 'output not exact'} "
                                f"({r.out_distinct:,} distinct of {r.out_total:,} outputs, {n:,} inputs)")
            progress(f"instances run {run + 1}/{args.runs}, {k} instance(s): "
                     + (f"{n / r.seconds:,.0f} msg/s, CPU {r.cpu_after_startup_s / n * 1e6:,.0f} ms/1000 after "
                        f"start-up" if r.error is None else f"ERROR {r.error}")
                     + f"; committed per instance: {spread}" + ("" if exact else "; NOT EXACT"))
    rows = []
    for k in sizes:
        rs = [r for r in res[k] if r.error is None]
        label = f"{k} instance{'s' if k > 1 else ''}"
        evenness, patterns = [], set()
        for r in rs:
            counts = [sum(p.values()) for p in r.per_instance.values()] + [0] * max(k - len(r.per_instance), 0)
            evenness.append(max(counts) / (n / k) if counts else float("nan"))
            patterns.add("/".join(str(x) for x in sorted((len(p) for p in r.per_instance.values()), reverse=True)))
        rows += [Row("instances (4-partition input)", k, label, "total msg/s, start-up included",
                     median([n / r.seconds for r in rs]), 0),
                 Row("instances (4-partition input)", k, label, "CPU per 1000 msgs, all instances (ms)",
                     median([r.cpu_after_startup_s / n * 1e6 for r in rs]), 0),
                 Row("instances (4-partition input)", k, label, "busiest instance's inputs / fair share",
                     median(evenness), 2, "partitions " + ", ".join(sorted(patterns)) if patterns else "")]
    return rows


def dim_ledger(args: argparse.Namespace, url: str, admin: str) -> list[Row]:
    rows = []
    for n in ints(args.ledger_sizes):
        inp, out, ledger = uniq("start-in"), uniq("start-out"), uniq("start-ledger")
        progress(f"ledger: writing {n:,} COMMITTED records (transactions of 1000, batching on)")
        t0 = time.perf_counter()
        with Ticker(f"ledger of {n:,}", admin, ledger):
            bench_startup.fill(url, ledger, inp, n)
        progress(f"ledger: {n:,} records written in {time.perf_counter() - t0:.1f} s; first start (reads it all, "
                 "writes a checkpoint)")
        first = bench_startup.start_once(url, inp, out, ledger, 30)
        progress(f"ledger: first start {first['seconds']:.1f} s, {first['records_read']:,} records read")
        starts = []
        for run in range(args.runs):
            s = bench_startup.start_once(url, inp, out, ledger, 30)
            starts.append(s)
            if not s["from_checkpoint"]:
                PROBLEMS.append(f"ledger {n:,}, start {run + 1}: did not start from a checkpoint")
            progress(f"ledger {n:,} start {run + 1}/{args.runs}: {s['seconds']:.2f} s, {s['records_read']:,} records "
                     f"read, peak RSS {s['maxrss_mb']:.0f} MB" + ("" if s["from_checkpoint"] else
                                                                  ", NOT FROM A CHECKPOINT"))
        label = f"{n:,} records"
        rows += [Row("ledger length", n, label, "start-up to first commit (s)", median([s["seconds"] for s in starts]),
                     2),
                 Row("ledger length", n, label, "peak RSS (MB)", median([s["maxrss_mb"] for s in starts]), 0),
                 Row("ledger length", n, label, "ledger records read at start",
                     median([s["records_read"] for s in starts]), 0)]
    return rows


# --------------------------------------------------------------------------- control plane dimensions


@dataclass
class Ledger:
    """What a synthetic ledger holds, for the checks of the API's answers."""

    topic: str
    jobs: list[str]
    batches: int = 0
    parked: int = 0
    records: int = 0
    sample: list[str] = field(default_factory=list)  # batch ids to look up


def ledger_records(led: Ledger, committed: int, parked: int, seed: int = 1) -> Iterator[LedgerRecord]:
    """``committed`` batches (STARTED, COMMITTED) and ``parked`` ones (two failed attempts, then
    PARKED), round-robin over the jobs, the parked ones spread evenly, over the last hour."""
    rng = random.Random(seed)
    total = committed + parked
    end = now_ms() - 2000
    step = 3_600_000 / max(total, 1)
    every = max(1, total // 1000)
    for i in range(total):
        job = led.jobs[i % len(led.jobs)]
        src, out = f"{NS}/{job}-in", f"{NS}/{job}-out"
        config = {"handler": f"handlers:{job}", "output": out, "inputs": [src], "subscription": job,
                  "parking_suffix": "-parked", "ledger_topic": led.topic}
        batch_id = f"{job}:{seed:x}{i % len(led.jobs):06x}:{i + 1}"
        inputs = {src: [f"(9,{i * 10 + k},-1,-1)" for k in range(10)]}
        t = int(end - 3_600_000 + i * step)
        is_parked = (i * parked) // total != ((i + 1) * parked) // total
        txn = f"(0,{10**12 + 4 * i})"
        if is_parked:
            for attempt in (1, 2):
                tid = f"(0,{10**12 + 4 * i + attempt})"
                yield LedgerRecord(kind="STARTED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempt,
                                   inputs=inputs, started_at_ms=t, config=config)
                yield LedgerRecord(kind="ABORTED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempt,
                                   inputs=inputs, started_at_ms=t, ended_at_ms=t + 30,
                                   error="ValueError: bad record")
            yield LedgerRecord(kind="PARKED", job=job, batch_id=batch_id, txn_id=txn, attempt=2,
                               inputs={src: inputs[src][:1]}, outputs={src + "-parked": 1}, started_at_ms=t + 40,
                               ended_at_ms=t + 48, error="ValueError: bad record", parked_topic=src + "-parked",
                               config=config)
            led.parked += 1
        else:
            yield LedgerRecord(kind="STARTED", job=job, batch_id=batch_id, txn_id=txn, attempt=1, inputs=inputs,
                               started_at_ms=t, config=config)
            yield LedgerRecord(kind="COMMITTED", job=job, batch_id=batch_id, txn_id=txn, attempt=1, inputs=inputs,
                               outputs={out: 10}, started_at_ms=t, ended_at_ms=t + int(rng.lognormvariate(3.4, 0.5)))
        led.batches += 1
        if i % every == 0:
            led.sample.append(batch_id)


def write_ledger(url: str, admin: str, jobs: int, committed: int, parked: int) -> Ledger:
    """A new ledger topic of ``committed`` + ``parked`` batches of ``jobs`` jobs, keyed by batch id."""
    tag = uuid.uuid4().hex[:6]
    led = Ledger(uniq("ledger"), [f"job{j:04d}-{tag}" for j in range(jobs)])

    async def go() -> None:
        async with txn.AsyncClient(url) as client:
            await ensure_ledger_retained(client, led.topic)
            p = await client.create_producer(led.topic, block_if_queue_full=True, batching_max_publish_delay_ms=5)
            futs: list[asyncio.Future[Any]] = []
            for rec in ledger_records(led, committed, parked):
                futs.append(await p.send_async(rec.to_json(), partition_key=rec.batch_id))
                led.records += 1
                if len(futs) >= 5000:
                    await asyncio.wait_for(asyncio.gather(*futs), 300)
                    futs.clear()
            p.flush_now()
            await asyncio.wait_for(asyncio.gather(*futs), 300)
            await p.close()

    t0 = time.perf_counter()
    with Ticker(f"writing {led.topic}", admin, led.topic):
        asyncio.run(go())
    progress(f"  ledger {led.topic}: {led.records:,} records, {led.batches:,} batches ({led.parked:,} parked) "
             f"of {jobs} job(s), written in {time.perf_counter() - t0:.1f} s")
    return led


def project(url: str, admin: str, db_url: str, led: Ledger, timeout_s: float = 1800) -> tuple[float, float]:
    """Project ``led`` into ``db_url`` with the control plane's own projector, in this process;
    returns (seconds from following the topic to its last record, CPU seconds of this process)."""

    async def go() -> tuple[float, float]:
        settings = Settings(service_url=url, admin_url=admin, database_url=db_url, ledger_topics=led.topic,
                            resolve_after_ms=bench_api.RESOLVE_AFTER_MS)
        core = Core.open(settings)
        assert core.projector is not None
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            core.projector.follow(led.topic)
            st = core.projector.status[led.topic]
            last = t0
            while st.records + st.quarantined < led.records:
                now = time.perf_counter()
                if now - t0 > timeout_s:
                    raise RuntimeError(f"projection: {st.records:,} of {led.records:,} records after {timeout_s} s")
                if now - last >= 10:
                    progress(f"  projection: {st.records:,}/{led.records:,} records")
                    last = now
                await asyncio.sleep(0.02)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            if st.quarantined:
                raise RuntimeError(f"projection quarantined {st.quarantined} records: {st.error}")
            return dt, cpu
        finally:
            await core.close()

    return asyncio.run(go())


def p50_ms(client: httpx.Client, paths: Callable[[int], str], n: int,
           check: Callable[[Any], str | None] = lambda _: None) -> float:
    """Median latency (ms) of ``n`` sequential GETs (after one unmeasured), each answer 200 and checked."""
    times = []
    for i in range(n + 1):
        path = paths(i)
        t0 = time.perf_counter()
        resp = client.get(path)
        dt = time.perf_counter() - t0
        if resp.status_code != 200:
            raise RuntimeError(f"GET {path}: {resp.status_code} {resp.text[:300]}")
        bad = check(resp.json())
        if bad:
            raise RuntimeError(f"GET {path}: {bad}")
        if i:
            times.append(dt * 1000)
    return statistics.median(times)


def total_is(want: int) -> Callable[[Any], str | None]:
    return lambda doc: None if doc.get("total") == want else f"total {doc.get('total')}, expected {want}"


def serve(url: str, admin: str, db_url: str, led: Ledger, tmp: Path,
          measure: Callable[[httpx.Client], list[tuple[str, float]]]) -> list[tuple[str, float]]:
    """The API (uvicorn child process, projection off) on the projected database, while ``measure`` runs."""
    api = bench_api.ApiProcess(url, admin, db_url, led.topic, tmp / "api.log")
    api.env["PULSAR_TXN_PROJECT"] = "false"
    api.start()
    try:
        with httpx.Client(base_url=api.url, timeout=60) as client:
            return measure(client)
    finally:
        api.stop()


def dim_parked(args: argparse.Namespace, url: str, admin: str, tmp: Path) -> list[Row]:
    rows = []
    for p in ints(args.parked):
        progress(f"parked: {p:,} parked batches beside {args.parked_background:,} committed ones")
        led = write_ledger(url, admin, 10, args.parked_background, p)
        d = tmp / f"parked-{p}"
        d.mkdir()
        db_url = f"sqlite:///{d}/api.db"
        secs, cpu = project(url, admin, db_url, led)
        progress(f"  projected {led.records:,} records in {secs:.2f} s ({led.records / secs:,.0f} records/s)")

        def measure(client: httpx.Client, led: Ledger = led) -> list[tuple[str, float]]:
            return [("GET /batches?status=PARKED p50 (ms)",
                     p50_ms(client, lambda _: "/batches?status=PARKED", args.queries, total_is(led.parked)))]

        got = serve(url, admin, db_url, led, d, measure)
        progress(f"  {', '.join(f'{m} {v:.2f}' for m, v in got)}")
        label = f"{p:,} parked"
        rows.append(Row("parked batches", p, label, f"projection of the ledger (s; {args.parked_background:,} "
                        "committed batches beside)", secs, 2, f"{led.records:,} records"))
        rows += [Row("parked batches", p, label, m, v, 2) for m, v in got]
    return rows


def dim_jobs(args: argparse.Namespace, url: str, admin: str, tmp: Path) -> list[Row]:
    rows = []
    for spec in args.control_plane.split(","):
        batches, jobs = (int(x) for x in spec.split(":"))
        progress(f"control plane: {batches:,} batches of {jobs:,} jobs")
        led = write_ledger(url, admin, jobs, batches, 0)
        d = tmp / f"jobs-{batches}-{jobs}"
        d.mkdir()
        db_url = f"sqlite:///{d}/api.db"
        secs, cpu = project(url, admin, db_url, led)
        progress(f"  projected {led.records:,} records in {secs:.2f} s ({led.records / secs:,.0f} records/s, "
                 f"CPU {cpu / led.records * 1e6:.0f} ms/1000)")
        rng = random.Random(3)

        def measure(client: httpx.Client, led: Ledger = led, rng: random.Random = rng) -> list[tuple[str, float]]:
            def jobs_ok(doc: Any) -> str | None:
                return None if len(doc) == len(led.jobs) else f"{len(doc)} jobs, expected {len(led.jobs)}"

            def one_ok(doc: Any) -> str | None:
                return None if doc.get("status") == "COMMITTED" else f"status {doc.get('status')}"

            return [("GET /batches (newest 50) p50 (ms)", p50_ms(client, lambda _: "/batches", args.queries,
                                                                 total_is(led.batches))),
                    ("GET /batches/{id} p50 (ms)", p50_ms(client, lambda _: f"/batches/{rng.choice(led.sample)}",
                                                          args.queries, one_ok)),
                    ("GET /jobs p50 (ms)", p50_ms(client, lambda _: "/jobs", args.queries, jobs_ok))]

        got = serve(url, admin, db_url, led, d, measure)
        progress(f"  {', '.join(f'{m} {v:.2f}' for m, v in got)}")
        label = f"{batches:,} batches / {jobs:,} jobs"
        rows += [Row("control plane: batches and jobs", batches, label, "projection (records/s)",
                     led.records / secs, 0),
                 Row("control plane: batches and jobs", batches, label, "projection CPU per 1000 records (ms)",
                     cpu / led.records * 1e6, 0)]
        rows += [Row("control plane: batches and jobs", batches, label, m, v, 2) for m, v in got]
    return rows


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 run: a smoke run of about 2-3 minutes")
    ap.add_argument("--only", default=",".join(DIMENSIONS), help=f"comma-separated subset of {','.join(DIMENSIONS)}")
    ap.add_argument("--runs", type=int, default=None, help="runs per size where cheap (median; default 3, quick 1)")
    ap.add_argument("--messages", type=int, help=f"backlog of the batch and partition runs ({FULL['messages']:,})")
    ap.add_argument("--size", type=int, default=100, help="input payload bytes (at least 10)")
    ap.add_argument("--batch-sizes", help=f"messages per batch ({FULL['batch_sizes']})")
    ap.add_argument("--partitions", help=f"input partitions ({FULL['partitions']})")
    ap.add_argument("--instances", help=f"instance counts ({FULL['instances']})")
    ap.add_argument("--instance-messages", type=int,
                    help=f"backlog of the instance runs ({FULL['instance_messages']:,})")
    ap.add_argument("--instance-partitions", type=int, default=4, help="partitions of the instances' input")
    ap.add_argument("--ledger-sizes", help=f"ledger records ({FULL['ledger_sizes']})")
    ap.add_argument("--parked", help=f"parked batches ({FULL['parked']})")
    ap.add_argument("--parked-background", type=int,
                    help=f"committed batches beside them ({FULL['parked_background']})")
    ap.add_argument("--control-plane", help=f"batches:jobs ({FULL['control_plane']})")
    ap.add_argument("--queries", type=int, help=f"sequential requests per query for its p50 ({FULL['queries']})")
    ap.add_argument("--service-url", default=os.environ.get("PULSAR_SERVICE_URL"),
                    help="use this broker (default: $PULSAR_SERVICE_URL, else start one)")
    ap.add_argument("--admin-url", default=os.environ.get("PULSAR_ADMIN_URL"),
                    help="admin URL of that broker (default: $PULSAR_ADMIN_URL)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = ap.parse_args()
    for k, v in (QUICK if args.quick else FULL).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.runs is None:
        args.runs = 3
    if bool(args.service_url) != bool(args.admin_url):
        ap.error("--service-url and --admin-url go together")
    if args.size < 10:
        ap.error("--size must be at least 10")
    only = [d.strip() for d in args.only.split(",") if d.strip()]
    unknown = set(only) - set(DIMENSIONS)
    if unknown:
        ap.error(f"--only: unknown {sorted(unknown)}; choose from {','.join(DIMENSIONS)}")

    broker: LocalBroker | None = None
    tmp = Path(tempfile.mkdtemp(prefix="txnbench-cost-"))
    url, admin = args.service_url, args.admin_url
    rows: list[Row] = []
    timings: dict[str, float] = {}
    try:
        if url is None:
            broker = LocalBroker(tmp / "broker", broker_port=free_port(), web_port=free_port(),
                                 bookie_port=free_port(), progress=progress)
            progress("starting a local Pulsar broker (about 40 s)...")
            broker.start(timeout=300)
            url, admin = broker.service_url, broker.admin_url
        own_pid = broker.pid if broker is not None else None
        machine_start = machine_load(own_pid)
        progress(f"broker {url} (admin {admin}); {machine_start}")
        steps: dict[str, Callable[[], list[Row]]] = {
            "batch": lambda: dim_batch(args, url, admin),
            "partitions": lambda: dim_partitions(args, url, admin),
            "instances": lambda: dim_instances(args, url, admin, own_pid, tmp),
            "ledger": lambda: dim_ledger(args, url, admin),
            "parked": lambda: dim_parked(args, url, admin, tmp),
            "jobs": lambda: dim_jobs(args, url, admin, tmp),
        }
        if {"batch", "partitions"} & set(only):
            warm = uniq("warm-in")
            bench_pipeline.prefill(url, admin, warm, 1000, args.size)
            bench_pipeline.exactly_once(url, warm, 1000, {"batch_max_messages": 100, "batch_max_delay_ms": 100})
            progress("warm-up run done (1,000 messages, not counted)")
        for d in DIMENSIONS:
            if d in only:
                t0 = time.monotonic()
                progress(f"--- {d}")
                rows += steps[d]()
                timings[d] = time.monotonic() - t0
                progress(f"--- {d} done in {timings[d]:.0f} s")
        machine_end = machine_load(own_pid)
    finally:
        try:
            if broker is not None:
                broker.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"How cost grows ({'--quick, ' if args.quick else ''}runs {args.runs}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine at start: {machine_start}; "
          f"at end: {machine_end})")
    print()
    print("\n".join(table(rows)))
    print()
    print("Time per dimension: " + ", ".join(f"{d} {s:.0f} s" for d, s in timings.items())
          + f"; total {time.monotonic() - T0:.0f} s")
    for p in PROBLEMS:
        print(f"PROBLEM: {p}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": [asdict(r) for r in rows], "seconds": timings,
                                         "problems": PROBLEMS}, indent=1))
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main())
