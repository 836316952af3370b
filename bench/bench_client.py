#!/usr/bin/env python
"""Benchmark txn against the official ``pulsar-client`` (and the Java client) on one broker.

Run from the repository root::

    .venv/bin/python bench/bench_client.py [--messages N] [--size 1024] [--runs 3]

By default a throw-away :class:`txn_shell.localbroker.LocalBroker` (temp data dir, free
ports) is started and stopped at the end; pass ``--service-url``/``--admin-url`` to
use a running broker instead (it needs transactions enabled).

Measured, all on the same broker in one run:

1. Producer throughput: ``send_async(payload, callback)`` N times with
   ``block_if_queue_full=True`` and batching on with the default batching settings,
   then ``flush()``; fresh topic per run; median of ``--runs``.
2. Consumer throughput: ``receive()`` + ``acknowledge()`` of N messages pre-filled
   by the official client (batched); fresh subscription (Earliest) per run.
3. Transaction round trip (txn sync API): open, send 1 message in it, receive+ack
   1 message in it, commit; p50/p99/mean and per-phase p50s. Java figure: the Java
   client running the same loop (``bench/TxnRoundTrip.java``). ``bin/pulsar-perf
   transaction`` (1 thread, 1 produced + 1 consumed per transaction) never waits
   for its commits, so it gives transactions/s after its first 10 s, compared with
   txn's AsyncClient running the same loop after an unmeasured run of the same length.

Throughput rows also report the client process's CPU per message, which a busy
machine skews less than msg/s, and the broker's limit on this machine from the same run:
``bin/pulsar-perf produce`` (Java, 4 producers, unthrottled, batching on, same message size) for
``--limit-seconds``, and ``bin/pulsar-perf consume`` reading back everything that wrote; each
throughput row gives txn's figure as a percentage of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402  (official client)

import txn  # noqa: E402
from txn_shell.localbroker import LocalBroker, ensure_distribution, free_port  # noqa: E402

from machine import machine_load  # noqa: E402
from official import official_client  # noqa: E402

T0 = time.monotonic()
NS = "persistent://public/default"


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def uniq(prefix: str) -> str:
    return f"{NS}/bench-{prefix}-{uuid.uuid4().hex[:10]}"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, int(round(p / 100.0 * len(sorted_xs) + 0.5)) - 1))
    return sorted_xs[k]


class Clock:
    """Wall time and this process's CPU time (all threads, incl. the official client's C++ ones)."""

    def __init__(self) -> None:
        self.cpu0 = self._cpu()
        self.t0 = time.perf_counter()

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def stop(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds) since construction."""
        return time.perf_counter() - self.t0, self._cpu() - self.cpu0


@dataclass
class Row:
    """One measured quantity: per-run values for txn and the reference client."""

    metric: str
    unit: str
    txn: list[float] = field(default_factory=list)
    ref: list[float] = field(default_factory=list)
    higher_is_better: bool = True
    note: str = ""
    #: The broker's limit on this machine for this kind of throughput (msg/s, pulsar-perf), if measured.
    limit: float = float("nan")


class CallbackCounter:
    """Send callback shared by both clients: counts results, notes failures."""

    __slots__ = ("ok", "failed", "first_error", "_lock")

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.first_error: object = None
        self._lock = threading.Lock()

    def __call__(self, res, msg_id) -> None:  # noqa: ANN001
        # Both clients call this on one internal thread, but be safe.
        if res == pulsar.Result.Ok or res == txn.Result.Ok:
            self.ok += 1
        else:
            with self._lock:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = res



def _produce_sync(client, label: str, n: int, payload: bytes) -> tuple[float, float]:  # noqa: ANN001
    """The same send_async loop for both clients (their sync APIs match), so the comparison is fair."""
    try:
        prod = client.create_producer(uniq(f"p-{label}"), block_if_queue_full=True, batching_enabled=True)
        cb = CallbackCounter()
        send = prod.send_async
        clock = Clock()
        for _ in range(n):
            send(payload, cb)
        prod.flush()
        dt = clock.stop()
        _check_counts(f"{label} producer", cb, n)
        prod.close()
        return dt
    finally:
        client.close()


def produce_official(url: str, n: int, payload: bytes) -> tuple[float, float]:
    return _produce_sync(official_client(url), "official", n, payload)


def produce_txn_sync(url: str, n: int, payload: bytes) -> tuple[float, float]:
    return _produce_sync(txn.Client(url), "txn", n, payload)


def produce_txn_async(url: str, n: int, payload: bytes) -> tuple[float, float]:
    async def go() -> tuple[float, float]:
        async with txn.AsyncClient(url) as client:
            prod = await client.create_producer(uniq("p-txnasync"), block_if_queue_full=True,
                                                batching_enabled=True)
            cb = CallbackCounter()
            send = prod.send_async
            clock = Clock()
            for _ in range(n):
                await send(payload, cb)
            await prod.flush()
            dt = clock.stop()
            _check_counts("txn async producer", cb, n)
            await prod.close()
            return dt

    return asyncio.run(go())


def _check_counts(what: str, cb: CallbackCounter, n: int) -> None:
    if cb.failed or cb.ok != n:
        raise RuntimeError(f"{what}: {cb.ok} ok, {cb.failed} failed (first error {cb.first_error}) of {n}")


# --------------------------------------------------------------------------- consumer


def prefill(url: str, topic: str, n: int, payload: bytes) -> None:
    """Write ``n`` messages with the official client, batched."""
    client = official_client(url)
    try:
        prod = client.create_producer(topic, block_if_queue_full=True, batching_enabled=True)
        cb = CallbackCounter()
        for _ in range(n):
            prod.send_async(payload, cb)
        prod.flush()
        _check_counts("prefill", cb, n)
        prod.close()
    finally:
        client.close()


def consume_official(url: str, topic: str, n: int, size: int) -> tuple[float, float]:
    client = official_client(url)
    try:
        cons = client.subscribe(topic, f"sub-{uuid.uuid4().hex[:8]}",
                                initial_position=pulsar.InitialPosition.Earliest)
        receive, ack = cons.receive, cons.acknowledge
        clock = Clock()
        for _ in range(n):
            ack(receive())
        dt = clock.stop()
        cons.close()
        return dt
    finally:
        client.close()


def consume_txn_sync(url: str, topic: str, n: int, size: int) -> tuple[float, float]:
    client = txn.Client(url)
    try:
        cons = client.subscribe(topic, f"sub-{uuid.uuid4().hex[:8]}",
                                initial_position=txn.InitialPosition.Earliest)
        receive, ack = cons.receive, cons.acknowledge
        clock = Clock()
        for _ in range(n):
            ack(receive())
        dt = clock.stop()
        cons.close()
        return dt
    finally:
        client.close()


def consume_txn_async(url: str, topic: str, n: int, size: int) -> tuple[float, float]:
    async def go() -> tuple[float, float]:
        async with txn.AsyncClient(url) as client:
            cons = await client.subscribe(topic, f"sub-{uuid.uuid4().hex[:8]}",
                                          initial_position=txn.InitialPosition.Earliest)
            receive, ack = cons.receive, cons.acknowledge
            clock = Clock()
            for _ in range(n):
                await ack(await receive())
            dt = clock.stop()
            await cons.close()
            return dt

    return asyncio.run(go())


# --------------------------------------------------------------------------- transactions


def txn_round_trips(url: str, in_topic: str, iterations: int, warmup: int, payload: bytes) -> dict[str, list[float]]:
    """Sequential open/send/receive+ack/commit loops; returns per-phase latencies in ms."""
    client = txn.Client(url)
    out: dict[str, list[float]] = {"total": [], "open": [], "send": [], "ack": [], "commit": []}
    try:
        cons = client.subscribe(in_topic, "txn-bench", consumer_type=txn.ConsumerType.Shared,
                                initial_position=txn.InitialPosition.Earliest)
        prod = client.create_producer(uniq("txn-out"))
        clock = time.perf_counter
        for i in range(warmup + iterations):
            t0 = clock()
            t = client.new_transaction()
            t1 = clock()
            prod.send(payload, txn=t)
            t2 = clock()
            cons.acknowledge(cons.receive(), txn=t)
            t3 = clock()
            t.commit()
            t4 = clock()
            if i >= warmup:
                for k, v in (("total", t4 - t0), ("open", t1 - t0), ("send", t2 - t1), ("ack", t3 - t2),
                             ("commit", t4 - t3)):
                    out[k].append(v * 1e3)
        prod.close()
        cons.close()
    finally:
        client.close()
    return out


def txn_pipelined(url: str, in_topic: str, seconds: float, payload: bytes) -> tuple[int, float]:
    """The loop shape of ``pulsar-perf transaction`` (1 thread) with txn's async API.

    Per transaction: receive, ack in txn (not awaited), send in txn (not awaited),
    commit (not awaited; it waits for the txn's ops), then await the next NEW_TXN.
    Like the Java client's commit, ours is issued once the send is queued in the txn
    (``send_async`` returns after ADD_PARTITION_TO_TXN), but the loop does not wait for it.
    Returns (committed transactions, elapsed seconds); raises if any commit failed.
    """

    async def go() -> tuple[int, float]:
        async with txn.AsyncClient(url) as client:
            cons = await client.subscribe(in_topic, "txn-bench-pipe", consumer_type=txn.ConsumerType.Shared,
                                          initial_position=txn.InitialPosition.Earliest)
            # pulsar-perf's producer uses the Java defaults: batching on, 1 ms max publish delay.
            prod = await client.create_producer(uniq("txn-pipe-out"), batching_max_publish_delay_ms=1)
            commits: set[asyncio.Task] = set()
            done = [0]
            errors: list[BaseException] = []

            def finished(task: asyncio.Task) -> None:
                commits.discard(task)
                if task.cancelled():
                    errors.append(asyncio.CancelledError())
                elif task.exception() is not None:
                    errors.append(task.exception())
                else:
                    done[0] += 1

            async def send_then_commit(t: txn.AsyncTransaction) -> None:
                await prod.send_async(payload, None, txn=t)
                await t.commit()

            t = await client.new_transaction()
            t0 = time.perf_counter()
            end = t0 + seconds
            while time.perf_counter() < end:
                msg = await cons.receive(timeout_millis=30_000)
                # Tasks start in FIFO order, so the ack is registered in t before the commit gathers ops.
                asyncio.ensure_future(cons.acknowledge(msg, t))
                task = asyncio.ensure_future(send_then_commit(t))
                commits.add(task)
                task.add_done_callback(finished)
                t = await client.new_transaction()
            if commits:
                await asyncio.gather(*commits, return_exceptions=True)
            dt = time.perf_counter() - t0
            if errors:
                raise RuntimeError(f"{len(errors)} pipelined transactions failed; first: {errors[0]!r}")
            await t.abort()
            await prod.close()
            await cons.close()
            return done[0], dt

    return asyncio.run(go())


_PERF_AGG = re.compile(r"Aggregated throughput stats --- (\d+) transaction executed --- +([\d.]+) transaction/s")
_PERF_LAT = re.compile(
    r"Messages (ack|send) aggregated latency stats --- Latency: mean: +([\d.]+) ms - med: +([\d.]+)"
    r" - 95pct: +([\d.]+) - 99pct: +([\d.]+)"
)
_PERF_INTERVAL = re.compile(r"Throughput transaction: +(\d+) transaction executes --- +([\d.]+) transaction/s")
_PERF_FAIL = re.compile(r"(\d+) transaction end failed --- (\d+) message ack failed --- (\d+) message send failed")


def java_perf(pulsar_home: Path, url: str, admin_url: str, in_topic: str, seconds: int) -> dict[str, float]:
    """Run ``bin/pulsar-perf transaction`` (1 thread) and parse its aggregated stats."""
    out_topic = uniq("java-out")
    cmd = [
        str(pulsar_home / "bin" / "pulsar-perf"), "transaction",
        "--service-url", url, "--admin-url", admin_url,
        "--topics-c", in_topic, "--topics-p", out_topic,
        "-ss", "java-bench", "-st", "Shared", "-sp", "Earliest",
        "-threads", "1", "-nmp", "1", "-nmc", "1",
        "-tto", "60", "-time", str(seconds),
    ]
    workdir = tempfile.mkdtemp(prefix="txnbench-perf-")  # it writes an .hgrm file into its cwd
    env = dict(os.environ)
    env.setdefault("PULSAR_LOG_LEVEL", "info")
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=seconds + 90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            raise RuntimeError("pulsar-perf transaction did not finish in time:\n" + text[-3000:]) from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    agg = _PERF_AGG.search(text)
    lats = {m.group(1): m for m in _PERF_LAT.finditer(text)}
    if agg is None or "ack" not in lats or "send" not in lats:
        raise RuntimeError(f"could not parse pulsar-perf output (exit {proc.returncode}):\n{text[-3000:]}")
    res = {"txns": float(agg.group(1)), "rate": float(agg.group(2))}
    # It prints a cumulative count every 10 s; the rate after the first report leaves out JVM warm-up.
    res["steady_rate"] = res["rate"]
    marks = [int(m.group(1)) for m in _PERF_INTERVAL.finditer(text)]
    if marks and res["rate"] > 0:
        elapsed = res["txns"] / res["rate"]
        rest = elapsed - 10.0 * len(marks)
        if rest >= 3.0:
            res["steady_rate"] = (res["txns"] - marks[-1]) / rest
    fails = _PERF_FAIL.search(text)
    if fails:
        res["failed"] = float(sum(int(x) for x in fails.groups()))
    for kind, m in lats.items():
        res[f"{kind}_mean"], res[f"{kind}_p50"], res[f"{kind}_p95"], res[f"{kind}_p99"] = (
            float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
    return res


#: pulsar-perf produce's ``-r`` for "as fast as it goes": 4.0.8 refuses 0 ("rate must be positive").
UNTHROTTLED = 10_000_000

_PERF_THROUGHPUT = re.compile(r"Aggregated throughput stats --- (\d+) records (?:sent|received) --- +([\d.]+) msg/s")


def perf_limit(pulsar_home: Path, url: str, kind: str, topic: str, seconds: int, size: int,
               n: int = 0) -> tuple[float, int]:
    """The broker's limit on this machine: ``bin/pulsar-perf produce`` (4 producers, unthrottled, batching
    on, ``size``-byte messages, for ``seconds``) or ``consume`` (a new subscription reading the ``n``
    messages of ``topic`` from the earliest one, e.g. what the produce run wrote); its aggregated
    msg/s and message count."""
    exe = str(pulsar_home / "bin" / "pulsar-perf")
    if kind == "produce":
        cmd = [exe, "produce", "-u", url, "-r", str(UNTHROTTLED), "-s", str(size), "-n", "4", "-time", str(seconds),
               topic]
    else:
        cmd = [exe, "consume", "-u", url, "-ss", uniq("perf-sub"), "-sp", "Earliest", "-m", str(n),
               "-time", str(seconds), topic]
    workdir = tempfile.mkdtemp(prefix="txnbench-perf-")
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    m = _PERF_THROUGHPUT.search(text or "")
    if m is None or int(m.group(1)) == 0:
        raise RuntimeError(f"pulsar-perf {kind} measured nothing:\n{(text or '')[-2000:]}")
    return float(m.group(2)), int(m.group(1))


def pipeline_limit(url: str, size: int, seconds: int, pulsar_home: str | None,
                   progress: Callable[[str], None]) -> tuple[float, str]:
    """The broker's limit for a consume-and-produce pipeline on this machine: the lower of
    ``pulsar-perf produce`` (4 producers, unthrottled, ``size``-byte messages, ``seconds``) and
    ``pulsar-perf consume`` of what that wrote; and a sentence for the table. NaN if ``seconds`` is
    0 or the measurement failed (the sentence says why). A pipeline consumes and produces every
    message, so it cannot reach 100 % of it."""
    if seconds <= 0:
        return float("nan"), "The broker's limit was not measured (--limit-seconds 0)."
    try:
        home = Path(pulsar_home) if pulsar_home else ensure_distribution(progress)
        topic = uniq("perf-p")
        produce, n = perf_limit(home, url, "produce", topic, seconds, size)
        progress(f"limit: pulsar-perf produce, 4 producers: {produce:,.0f} msg/s ({n:,} messages)")
        consume, _ = perf_limit(home, url, "consume", topic, seconds + 120, size, n)
        progress(f"limit: pulsar-perf consume of those: {consume:,.0f} msg/s")
    except Exception as exc:  # noqa: BLE001 - reported; the rest of the table stands
        progress(f"limit: not measured ({exc})")
        return float("nan"), f"The broker's limit could not be measured: {exc}"
    limit = min(produce, consume)
    return limit, (f"The broker's limit, on the same broker after the runs: pulsar-perf produce (4 producers, "
                   f"unthrottled, batching on, {size} B, {seconds} s) {produce:,.0f} msg/s, and pulsar-perf "
                   f"consume of the {n:,} messages it wrote {consume:,.0f} msg/s. The % column divides by the "
                   f"lower, {limit:,.0f} msg/s; a pipeline consumes and produces every message, so it cannot "
                   f"reach 100 %.")


_JAVA_OPENS = [
    "-Djava.net.preferIPv4Stack=true",
    "--add-opens", "java.base/sun.net=ALL-UNNAMED", "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.zip=ALL-UNNAMED", "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
]


def java_round_trips(pulsar_home: Path, url: str, in_topic: str, iterations: int, warmup: int,
                     size: int) -> dict[str, list[float]]:
    """Run bench/TxnRoundTrip.java (the txn loop, with the Java client); per-phase latencies in ms."""
    jhome = os.environ.get("JAVA_HOME")
    java = str(Path(jhome) / "bin/java") if jhome else shutil.which("java")
    javac = str(Path(jhome) / "bin/javac") if jhome else shutil.which("javac")
    if not java:
        raise RuntimeError("java not found")
    src = Path(__file__).resolve().parent / "TxnRoundTrip.java"
    lib = pulsar_home / "lib"
    workdir = tempfile.mkdtemp(prefix="txnbench-java-")
    try:
        api = sorted(lib.glob("org.apache.pulsar-pulsar-client-api-*.jar"))
        if javac and Path(javac).exists() and api:
            subprocess.run([javac, "-d", workdir, "-cp", str(api[0]), str(src)], check=True,
                           capture_output=True, text=True, timeout=120)
            cmd = [java, *_JAVA_OPENS, "-cp", f"{workdir}:{lib}/*", "TxnRoundTrip"]
        else:  # single-file source launcher (slower: compiles against every jar)
            cmd = [java, *_JAVA_OPENS, "-cp", f"{lib}/*", str(src)]
        cmd += [url, in_topic, uniq("java-rt-out"), str(warmup), str(iterations), str(size)]
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=120 + iterations * 0.5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            raise RuntimeError("TxnRoundTrip.java did not finish in time:\n" + text[-3000:]) from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out: dict[str, list[float]] = {"total": [], "open": [], "send": [], "ack": [], "commit": []}
    for line in text.splitlines():
        if line.startswith("rt "):
            for k, v in zip(("total", "open", "send", "ack", "commit"), line.split()[1:], strict=True):
                out[k].append(int(v) / 1e3)
    if len(out["total"]) != iterations:
        raise RuntimeError(f"TxnRoundTrip.java gave {len(out['total'])} of {iterations} results "
                           f"(exit {proc.returncode}):\n{text[-3000:]}")
    return out


def _phase_summary(lat: dict[str, list[float]]) -> str:
    tot = sorted(lat["total"])
    ph = {k: pct(sorted(lat[k]), 50) for k in ("open", "send", "ack", "commit")}
    return (f"p50 {pct(tot, 50):.2f} ms, p99 {pct(tot, 99):.2f} ms, mean {statistics.mean(tot):.2f} ms; "
            f"phase p50s: open {ph['open']:.2f}, send {ph['send']:.2f}, receive+ack {ph['ack']:.2f}, "
            f"commit {ph['commit']:.2f} ms")


# --------------------------------------------------------------------------- report


def fmt(v: float, unit: str) -> str:
    if v != v:  # nan
        return "n/a"
    if unit in ("msg/s", "txn/s") and v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.2f}" if v < 100 else f"{v:,.1f}"


def print_table(rows: list[Row], runs_label: str) -> None:
    print()
    print(f"## Results ({runs_label})")
    print()
    print("| metric | txn | official / Java | ratio (txn / official) | txn, % of the broker's limit |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        tv = median(r.txn)
        rv = median(r.ref) if r.ref else float("nan")
        ratio = tv / rv if r.ref and rv else float("nan")
        hint = "" if ratio != ratio else ("" if r.higher_is_better else " (lower is better)")
        ratio_s = "n/a" if ratio != ratio else f"{ratio:.2f}x{hint}"
        lim = "n/a" if r.limit != r.limit else f"{100 * tv / r.limit:.0f}% of {fmt(r.limit, r.unit)}"
        print(f"| {r.metric} ({r.unit}) | {fmt(tv, r.unit)} | {fmt(rv, r.unit) if r.ref else 'n/a'} | {ratio_s} "
              f"| {lim} |")
    notes = [f"- {r.metric}: {r.note}" for r in rows if r.note]
    if notes:
        print()
        print("\n".join(notes))
    print()
    print("### Per-run values")
    print()
    for r in rows:
        t = ", ".join(fmt(v, r.unit) for v in r.txn)
        o = ", ".join(fmt(v, r.unit) for v in r.ref) if r.ref else "-"
        print(f"- {r.metric} ({r.unit}): txn [{t}]; official/Java [{o}]")


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000, help="messages per producer/consumer run")
    ap.add_argument("--size", type=int, default=1024, help="payload size in bytes")
    ap.add_argument("--runs", type=int, default=3, help="runs per throughput measurement (median reported)")
    ap.add_argument("--txn-iterations", type=int, default=300, help="measured transaction round trips")
    ap.add_argument("--txn-warmup", type=int, default=20, help="unmeasured round trips first")
    ap.add_argument("--pipelined-seconds", type=float, default=10.0,
                    help="duration of txn's pulsar-perf-shaped transaction loop (0 = skip)")
    ap.add_argument("--perf-seconds", type=int, default=20, help="pulsar-perf transaction -time (0 = skip it)")
    ap.add_argument("--limit-seconds", type=int, default=20,
                    help="pulsar-perf produce/consume -time for the broker's limit (0 = skip it)")
    ap.add_argument("--no-java", action="store_true", help="skip both Java measurements")
    ap.add_argument("--service-url", help="use this broker instead of starting one")
    ap.add_argument("--admin-url", help="admin URL of --service-url's broker")
    ap.add_argument("--pulsar-home", help="Pulsar distribution for bin/pulsar-perf (default: txn's cache)")
    ap.add_argument("--only", default="producer,consumer,txn",
                    help="comma-separated subset of producer,consumer,txn")
    args = ap.parse_args()
    if bool(args.service_url) != bool(args.admin_url):
        ap.error("--service-url and --admin-url go together")
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    payload = os.urandom(args.size)
    n = args.messages

    broker: LocalBroker | None = None
    data_dir: str | None = None
    url, admin = args.service_url, args.admin_url
    pulsar_home = Path(args.pulsar_home) if args.pulsar_home else None
    try:
        if url is None:
            data_dir = tempfile.mkdtemp(prefix="txnbench-broker-")
            broker = LocalBroker(data_dir, broker_port=free_port(), web_port=free_port(),
                                 bookie_port=free_port(), progress=progress)
            progress("starting a local Pulsar broker (about 40 s)...")
            broker.start()
            url, admin = broker.service_url, broker.admin_url
        progress(f"broker: {url} (admin {admin}); {n:,} messages of {args.size} B, {args.runs} runs")
        progress("machine: " + machine_load(broker.pid if broker else None))
        rows: list[Row] = []
        limit_topic: str | None = None  # what pulsar-perf produce wrote (the consumer limit reads it)
        limit_n = 0

        # ---------------------------------------------------------------- 1. producer
        if "producer" in parts:
            mps_sync = Row("producer send_async, sync API", "msg/s")
            mbs_sync = Row("producer send_async, sync API", "MB/s")
            cpu_sync = Row("producer client CPU per message, sync API", "us/msg", higher_is_better=False,
                           note="user+sys CPU of the benchmark process (all threads, including the official "
                                "client's C++ threads) during the timed region, divided by N; less sensitive "
                                "to a busy machine than msg/s")
            mps_async = Row("producer send_async, txn AsyncClient (extra)", "msg/s")
            mbs_async = Row("producer send_async, txn AsyncClient (extra)", "MB/s")
            cpu_async = Row("producer client CPU per message, txn AsyncClient (extra)", "us/msg",
                            higher_is_better=False)
            # Warm-up: connection set-up in each client, and the broker's JIT.
            progress("producer: warm-up")
            warm_n = min(n, 30_000)
            produce_official(url, warm_n, payload)
            produce_txn_sync(url, warm_n, payload)
            produce_txn_async(url, warm_n, payload)
            jobs = [("official", produce_official), ("txn", produce_txn_sync), ("txn-async", produce_txn_async)]
            for run in range(args.runs):
                order = jobs[run % 3:] + jobs[:run % 3]  # rotate to spread drift/warm-up evenly
                for name, fn in order:
                    dt, cpu = fn(url, n, payload)
                    mps, mbs, us = n / dt, n * args.size / dt / 1e6, cpu / n * 1e6
                    progress(f"producer run {run + 1}/{args.runs} {name:9s}: {mps:10,.0f} msg/s {mbs:7.1f} MB/s "
                             f"({dt:.2f} s; client CPU {us:.1f} us/msg)")
                    if name == "official":
                        for r, v in ((mps_sync, mps), (mbs_sync, mbs), (cpu_sync, us), (mps_async, mps),
                                     (mbs_async, mbs), (cpu_async, us)):
                            r.ref.append(v)
                    elif name == "txn":
                        for r, v in ((mps_sync, mps), (mbs_sync, mbs), (cpu_sync, us)):
                            r.txn.append(v)
                    else:
                        for r, v in ((mps_async, mps), (mbs_async, mbs), (cpu_async, us)):
                            r.txn.append(v)
            if args.limit_seconds > 0:
                try:
                    home = pulsar_home or ensure_distribution(progress)
                    limit_topic = uniq("perf-p")
                    lim, limit_n = perf_limit(home, url, "produce", limit_topic, args.limit_seconds, args.size)
                    progress(f"producer: broker limit (pulsar-perf produce, 4 producers): {lim:,.0f} msg/s")
                    mps_sync.limit = mps_async.limit = lim
                except Exception as exc:  # noqa: BLE001 - reported, the rest of the table stands
                    progress(f"producer: pulsar-perf produce failed: {exc}")
            rows += [mps_sync, mbs_sync, cpu_sync, mps_async, mbs_async, cpu_async]

        # ---------------------------------------------------------------- 2. consumer
        if "consumer" in parts:
            c_sync = Row("consumer receive+acknowledge, sync API", "msg/s")
            c_async = Row("consumer receive+acknowledge, txn AsyncClient (extra)", "msg/s")
            ccpu_sync = Row("consumer client CPU per message, sync API", "us/msg", higher_is_better=False)
            ccpu_async = Row("consumer client CPU per message, txn AsyncClient (extra)", "us/msg",
                             higher_is_better=False)
            topic = uniq("c-in")
            progress(f"consumer: pre-filling {topic} with {n:,} messages (official client, batched)")
            t0 = time.perf_counter()
            prefill(url, topic, n, payload)
            progress(f"consumer: pre-filled in {time.perf_counter() - t0:.1f} s; each run uses a new "
                     "subscription at Earliest")
            jobs = [("official", consume_official), ("txn", consume_txn_sync), ("txn-async", consume_txn_async)]
            # Unmeasured warm-up: takes the first reader's hot broker cache away from run 1 and
            # warms each client's code paths.
            progress("consumer: warm-up")
            for _, fn in jobs:
                fn(url, topic, min(n, 5_000), args.size)
            for run in range(args.runs):
                order = jobs[run % 3:] + jobs[:run % 3]
                for name, fn in order:
                    dt, cpu = fn(url, topic, n, args.size)
                    mps, us = n / dt, cpu / n * 1e6
                    progress(f"consumer run {run + 1}/{args.runs} {name:9s}: {mps:10,.0f} msg/s ({dt:.2f} s; "
                             f"client CPU {us:.1f} us/msg)")
                    if name == "official":
                        for r, v in ((c_sync, mps), (ccpu_sync, us), (c_async, mps), (ccpu_async, us)):
                            r.ref.append(v)
                    elif name == "txn":
                        c_sync.txn.append(mps)
                        ccpu_sync.txn.append(us)
                    else:
                        c_async.txn.append(mps)
                        ccpu_async.txn.append(us)
            if args.limit_seconds > 0:
                try:
                    home = pulsar_home or ensure_distribution(progress)
                    if limit_topic is None:  # the producer part did not run: fill one the same way
                        limit_topic = uniq("perf-p")
                        _, limit_n = perf_limit(home, url, "produce", limit_topic, args.limit_seconds, args.size)
                    lim, _ = perf_limit(home, url, "consume", limit_topic, args.limit_seconds + 120, args.size,
                                        limit_n)
                    progress(f"consumer: broker limit (pulsar-perf consume of {limit_n:,} messages): "
                             f"{lim:,.0f} msg/s")
                    c_sync.limit = c_async.limit = lim
                except Exception as exc:  # noqa: BLE001
                    progress(f"consumer: pulsar-perf consume failed: {exc}")
            rows += [c_sync, ccpu_sync, c_async, ccpu_async]

        # ---------------------------------------------------------------- 3. transactions
        if "txn" in parts:
            iters, warm = args.txn_iterations, args.txn_warmup
            pipe_s = args.pipelined_seconds
            java_s = args.perf_seconds
            # Enough input for every consumer of it (pulsar-perf can run ~100s of txn/s).
            in_topic = uniq("txn-in")
            need = iters + warm + 50
            java_warm = max(warm, 100)  # the JVM needs more iterations before the JIT settles
            pipe_topic = uniq("txn-pipe-in")
            java_topic = uniq("java-in")
            progress(f"transactions: pre-filling input topics (official client, batched, {args.size} B)")
            prefill(url, in_topic, need, payload)
            if pipe_s > 0:
                prefill(url, pipe_topic, int(2000 * pipe_s) + 1000, payload)  # a warm-up run, then the measured one
            if java_s > 0 and not args.no_java:
                prefill(url, java_topic, int(1000 * java_s) + 1000, payload)
            java_rt_topic = uniq("java-rt-in")
            if not args.no_java:
                prefill(url, java_rt_topic, iters + java_warm + 50, payload)

            progress(f"transactions: txn sync round trips ({warm} warm-up + {iters} measured)")
            lat = txn_round_trips(url, in_topic, iters, warm, payload)
            progress("transactions: txn  round trip " + _phase_summary(lat))

            home = None
            jlat = None
            if not args.no_java:
                home = pulsar_home or ensure_distribution(progress)
                progress(f"transactions: Java client round trips, same loop (bench/TxnRoundTrip.java; "
                         f"{java_warm} warm-up for the JIT + {iters} measured)")
                try:
                    jlat = java_round_trips(home, url, java_rt_topic, iters, java_warm, args.size)
                    progress("transactions: Java round trip " + _phase_summary(jlat))
                except Exception as exc:  # report, keep the rest of the table
                    progress(f"transactions: Java round trips failed: {exc}")

            pipe = None
            if pipe_s > 0:
                # pulsar-perf's figure leaves out its first 10 s (the JVM's and the broker's warm-up):
                # the same loop first runs unmeasured for as long as it is then measured.
                progress(f"transactions: txn AsyncClient loop shaped like pulsar-perf ({pipe_s:.0f} s unmeasured, "
                         f"then {pipe_s:.0f} s)")
                txn_pipelined(url, pipe_topic, pipe_s, payload)
                done, dt = txn_pipelined(url, pipe_topic, pipe_s, payload)
                pipe = done / dt
                progress(f"transactions: txn pipelined {done} txns in {dt:.1f} s = {pipe:.1f} txn/s")

            java = None
            if java_s > 0 and not args.no_java:
                home = home or pulsar_home or ensure_distribution(progress)
                progress(f"transactions: Java bin/pulsar-perf transaction, 1 thread, {java_s} s (+ JVM start)")
                try:
                    java = java_perf(home, url, admin, java_topic, java_s)
                    progress(f"transactions: pulsar-perf {java['txns']:.0f} txns, {java['rate']:.1f} txn/s overall, "
                             f"{java['steady_rate']:.1f} txn/s after its first 10 s report; send p50 "
                             f"{java['send_p50']:.2f} p99 {java['send_p99']:.2f} ms; ack p50 {java['ack_p50']:.2f} "
                             f"p99 {java['ack_p99']:.2f} ms")
                    if java.get("failed"):
                        progress(f"transactions: WARNING pulsar-perf reported {java['failed']:.0f} failures")
                except Exception as exc:  # report, keep the rest of the table
                    progress(f"transactions: pulsar-perf failed: {exc}")

            def stat(d: dict[str, list[float]] | None, k: str, p: float | None) -> list[float]:
                if not d:
                    return []
                xs = sorted(d[k])
                return [statistics.mean(xs) if p is None else pct(xs, p)]

            rt = "txn round trip (open, send 1, receive+ack 1, commit)"
            rows += [
                Row(f"{rt} p50", "ms", stat(lat, "total", 50), stat(jlat, "total", 50), False,
                    "sequential, each step awaited; txn: sync Client; Java: the Java client running the same "
                    "loop (bench/TxnRoundTrip.java, same broker, same run; it gets more warm-up iterations "
                    "for the JIT)"),
                Row(f"{rt} p99", "ms", stat(lat, "total", 99), stat(jlat, "total", 99), False),
                Row(f"{rt} mean", "ms", stat(lat, "total", None), stat(jlat, "total", None), False),
            ]
            for k, label in (("open", "NEW_TXN"), ("send", "send in txn"), ("ack", "receive+ack in txn"),
                             ("commit", "commit")):
                rows.append(Row(f"phase: {label} p50", "ms", stat(lat, k, 50), stat(jlat, k, 50), False))
            if pipe is not None or java is not None:
                note = ("pulsar-perf transaction -threads 1 -nmp 1 -nmc 1: receive, ack and send in the txn and "
                        "commit without waiting, then block on the next NEW_TXN; txn: AsyncClient running that "
                        "same loop, measured after an unmeasured run of the same length. pulsar-perf does not time "
                        "commits, so it has no round-trip latency")
                if java is not None:
                    note += (f"; its own latencies: send p50 {java['send_p50']:.2f} / p99 {java['send_p99']:.2f} ms, "
                             f"ack p50 {java['ack_p50']:.2f} / p99 {java['ack_p99']:.2f} ms")
                    note += (f"; Java figure excludes its first 10 s (JVM warm-up); overall it did "
                             f"{java['rate']:.1f} txn/s")
                rows.append(Row("transactions/s, pulsar-perf loop, 1 thread", "txn/s",
                                [pipe] if pipe is not None else [], [java["steady_rate"]] if java else [], True,
                                note))

        print_table(rows, f"median of {args.runs} runs, {n:,} x {args.size} B messages" if parts - {"txn"}
                    else "transactions")
        print()
        print(f"machine at the end: {machine_load(broker.pid if broker else None)}")
        print()
        progress("done")
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
