"""The streaming windowed-counts query (``pulsar`` -> event-time windows -> ``pulsar-txn``) survives
SIGKILLs of its driver: every (window, key) aggregate is in the output topic exactly once, with the
exact count and sum.

Two input topics get 6 windows x 4 events each (keys k0..k2, event times set by the official
client), then one far-later event that moves the watermark past every window. The query runs in
a child process (tests/spark_stream_child.py, its own local[2] SparkSession) with 16 messages per
micro-batch, so windows close two per micro-batch. The child's whole process group (Python
driver, JVM, workers) is SIGKILLed after its first or second completed micro-batch, at a random
moment (0.2-10 s later) or, if sooner, as soon as new output rows become visible (a sink commit,
most likely before Spark logs the batch: the restart then replays it and the sink's marker
aborts the replay), and restarted from the same checkpoint; the second run completes. The output is then read
with the official client from the earliest message, up to a sentinel.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")

from txn.client import AsyncClient  # noqa: E402
from txn.delivery.ledger import default_ledger_topic  # noqa: E402
from txn.delivery.replay import read_ledger  # noqa: E402
from txn.localbroker import create_namespace, enable_namespace_dedup  # noqa: E402

from peer import SENTINEL_PROP, read_until_sentinel  # noqa: E402

HERE = Path(__file__).resolve().parent
CHILD = HERE / "spark_stream_child.py"
WINDOWS = 6
PER_WINDOW = 4  # events per window per input topic
KEYS = ("k0", "k1", "k2")
KILLS = 1


class Child:
    """The query in a child process (own process group), its stdout lines in a queue."""

    def __init__(self, cfg: dict, log: Path) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, cwd=str(HERE.parent), start_new_session=True, text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child silent for {timeout}s") from None

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # driver, its JVM and the JVM's children
        self.proc.wait(30)
        self.log.close()

    def stop(self) -> int:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return -9
        finally:
            self.log.close()


def _events(base_ms: int) -> tuple[dict[int, list[tuple[str, int, int]]], Counter]:
    """Per input index: [(key, amount, event time ms)], in event-time order; and the expected
    ``{(window start ms, key): (count, sum)}``."""
    per_topic: dict[int, list[tuple[str, int, int]]] = {0: [], 1: []}
    expected: dict[tuple[int, str], list[int]] = {}
    for w in range(WINDOWS):
        for t in (0, 1):
            for j in range(PER_WINDOW):
                key = KEYS[(j + w + t) % len(KEYS)]
                amount = (w * 7 + j * 3 + t * 5) % 11 + 1
                ts = base_ms + w * 10_000 + j * 1_500 + t * 750
                per_topic[t].append((key, amount, ts))
                acc = expected.setdefault((base_ms + w * 10_000, key), [0, 0])
                acc[0] += 1
                acc[1] += amount
    return per_topic, Counter({k: tuple(v) for k, v in expected.items()})


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000))


def _read_all(peer: pulsar.Client, topic: str) -> list[pulsar.Message]:
    c = peer.subscribe(topic, f"check-{uuid.uuid4().hex[:8]}", initial_position=pulsar.InitialPosition.Earliest)
    try:
        return [m for m in read_until_sentinel(peer, c, topic, timeout_s=120) if SENTINEL_PROP not in m.properties()]
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_driver_sigkill_mid_stream_exactly_once(broker, unique_name, tmp_path) -> None:  # noqa: ANN001
    t0 = time.monotonic()
    ns = f"public/spark-kill-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    inputs = [f"persistent://{ns}/{unique_name('in-a')}", f"persistent://{ns}/{unique_name('in-b')}"]
    output = f"persistent://{ns}/{unique_name('out')}"
    job = unique_name("job")

    base_ms = (int(time.time()) // 10 - 360) * 10_000  # an hour ago, on a window boundary
    per_topic, expected = _events(base_ms)
    peer = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        for t, topic in enumerate(inputs):
            p = peer.create_producer(topic, batching_enabled=False)
            for key, amount, ts in per_topic[t]:
                p.send(f"{key},{amount}".encode(), partition_key=key, event_timestamp=ts)
            if t == 0:  # far past every window: the watermark closes them all
                p.send(b"close,0", partition_key="close", event_timestamp=base_ms + (WINDOWS + 5) * 10_000)
            p.close()
        peer.subscribe(output, "keep-output")  # the output's messages stay until read below

        cfg = {
            "service_url": broker.service_url, "admin_url": broker.admin_url, "inputs": inputs, "output": output,
            "checkpoint": str(tmp_path / "ckpt"), "trigger_ms": 300, "max_messages_per_trigger": 16,
            "txn_timeout_ms": 20_000, "job": job,
        }
        seed = random.randrange(1 << 30)
        rnd = random.Random(seed)
        log = tmp_path / "child.log"
        kills: list[str] = []
        runs = 0
        watch = peer.create_reader(output, pulsar.MessageId.latest)
        for k in range(KILLS):
            child = Child(cfg, log)
            runs += 1
            after, batches = 1 + rnd.randrange(2), 0
            while batches < after:
                line = child.next_line(120)
                if line is None or line.startswith("FAILED"):
                    child.stop()
                    raise AssertionError(f"child ended before the kill: {line}; see {log}")
                if line.startswith("BATCH") and int(line.split()[2]) > 0:
                    batches += 1
            # Kill at a random moment, or at once when a sink commit makes output rows visible
            # (then Spark has most likely not logged the batch yet: the restart replays it).
            delay, t_batch, why = rnd.uniform(0.2, 10.0), time.monotonic(), "random"
            while time.monotonic() - t_batch < delay:
                try:
                    watch.read_next(timeout_millis=10)
                except pulsar.Timeout:
                    continue
                why = "on output"
                break
            child.kill()
            kills.append(f"kill {k + 1}: {why} {time.monotonic() - t_batch:.2f}s after batch {line.split()[1]}")

        watch.close()
        # The last run: until every expected (window, key) row is visible, then stop it.
        got: dict[tuple[int, str], tuple[int, int]] = {}
        reader = peer.create_reader(output, pulsar.MessageId.earliest)
        failures = 0
        child = Child(cfg, log)
        runs += 1
        deadline = time.monotonic() + 180
        try:
            while len(got) < len(expected):
                assert time.monotonic() < deadline, f"only {len(got)} of {len(expected)} rows; see {log}"
                if child.proc.poll() is not None:  # e.g. a batch held back by a killed driver's open
                    failures += 1                  # transaction fails the query: restart once more
                    assert failures <= 2, f"the query keeps failing; see {log}"
                    child.stop()
                    child = Child(cfg, log)
                    runs += 1
                try:
                    m = reader.read_next(timeout_millis=1000)
                except pulsar.Timeout:
                    continue
                v = json.loads(m.data())
                start = calendar.timegm(time.strptime(v["window_start"], "%Y-%m-%dT%H:%M:%S"))
                got[(start * 1000, v["key"])] = (v["count"], v["sum"])
        finally:
            reader.close()
            rc = child.stop()
        assert rc == 0, f"the last run exited with {rc}; see {log}"

        msgs = _read_all(peer, output)
    finally:
        peer.close()

    rows = Counter()
    for m in msgs:
        v = json.loads(m.data())
        assert m.partition_key() == v["key"]
        rows[(v["window_start"], v["key"], v["count"], v["sum"])] += 1
    want = Counter({(_iso(ws), key, c, s): 1 for (ws, key), (c, s) in expected.items()})
    dup = {r: n for r, n in rows.items() if n > 1}
    assert not dup, f"rows written more than once: {dup}"
    assert rows == want, f"missing {want - rows}, unexpected {rows - want}"
    assert sum(c for c, _ in expected.values()) == 2 * WINDOWS * PER_WINDOW

    async def ledger() -> list:  # noqa: ANN202
        async with AsyncClient(broker.service_url) as c:
            return [r for r in await read_ledger(c, default_ledger_topic(output)) if r.job == job]

    recs = asyncio.run(ledger())
    committed = [r.config["spark_batch_id"] for r in recs if r.kind == "COMMITTED"]
    assert len(committed) == len(set(committed)), f"a micro-batch committed twice: {sorted(committed)}"
    replays = sum(1 for r in recs if r.kind == "ABORTED")
    print(f"\nseed {seed}; {'; '.join(kills)}; {runs} runs; {len(msgs)} output rows = {len(want)} (window, key) "
          f"exactly once; {len(committed)} micro-batches committed, {replays} aborted (replays/timeouts); "
          f"{time.monotonic() - t0:.1f}s")
