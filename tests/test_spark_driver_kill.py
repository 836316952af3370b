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
with the official client from the earliest message, up to a sentinel. (That one is random and behind
``--run-slow``.)

``test_driver_killed_at_sink_commit_exactly_once`` (default suite) is the deterministic short
version: the sink's test hook (``PULSAR_TXN_FAULT``, see :func:`spark_jobs.sink._fault_hook`)
SIGKILLs the driver's process group at two fixed points, once before the sink commits a
micro-batch (its rows are in the open transaction) and once right after the sink committed one
but before Spark logged it, and each restart must end up with every (window, key) exactly once.
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

from spark_jobs.sink_runtime import stream_marker_topic  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402
from txn.client import AsyncClient  # noqa: E402
from txn.delivery.ledger import default_ledger_topic  # noqa: E402
from txn.delivery.replay import read_ledger  # noqa: E402

from peer import SENTINEL_PROP, read_until_sentinel  # noqa: E402

#: Saturates the machine (or starts brokers of its own): `make test` runs it after the parallel part, alone.
pytestmark = pytest.mark.solo

FAULT_ENV = "PULSAR_TXN_FAULT"  # spark_jobs.sink's test hook
HERE = Path(__file__).resolve().parent
CHILD = HERE / "spark_stream_child.py"
WINDOWS = 6
PER_WINDOW = 4  # events per window per input topic
KEYS = ("k0", "k1", "k2")
KILLS = 1


class Child:
    """The query in a child process (own process group), its stdout lines in a queue."""

    def __init__(self, cfg: dict, log: Path, fault: str | None = None) -> None:
        self.log = log.open("ab")
        env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
        if fault:
            env[FAULT_ENV] = fault
        self.log.write(f"=== {time.strftime('%H:%M:%S')} run: {FAULT_ENV}={fault or ''}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, cwd=str(HERE.parent), start_new_session=True, text=True, env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
            if not self.log.closed:  # the child's stdout lines in its log too, timed
                try:
                    self.log.write(f"=== {time.strftime('%H:%M:%S')} stdout: {line.strip()}\n".encode())
                    self.log.flush()
                except ValueError:  # closed meanwhile
                    pass
        self.lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child silent for {timeout}s") from None

    def wait_killed(self, timeout: float) -> int:
        """Wait for the child to die by itself (a fault hook); its exit status."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            raise AssertionError(f"the child did not die within {timeout}s") from None
        finally:
            self.log.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything the hook left of the group
        except ProcessLookupError:
            pass
        return rc

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


def _prepare(broker, unique_name, peer: pulsar.Client, tmp_path: Path) -> tuple[dict, Counter]:  # noqa: ANN001
    """A namespace with deduplication on, the two input topics filled with the events, the
    output kept (a subscription); the child's config and the expected aggregates."""
    ns = f"public/spark-kill-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    inputs = [f"persistent://{ns}/{unique_name('in-a')}", f"persistent://{ns}/{unique_name('in-b')}"]
    output = f"persistent://{ns}/{unique_name('out')}"
    base_ms = (int(time.time()) // 10 - 360) * 10_000  # an hour ago, on a window boundary
    per_topic, expected = _events(base_ms)
    for t, topic in enumerate(inputs):
        p = peer.create_producer(topic, batching_enabled=False)
        for key, amount, ts in per_topic[t]:
            p.send(f"{key},{amount}".encode(), partition_key=key, event_timestamp=ts)
        if t == 0:  # far past every window: the watermark closes them all
            p.send(b"close,0", partition_key="close", event_timestamp=base_ms + (WINDOWS + 5) * 10_000)
        p.close()
    peer.subscribe(output, "keep-output")  # the output's messages stay until read
    cfg = {
        "service_url": broker.service_url, "admin_url": broker.admin_url, "inputs": inputs, "output": output,
        "checkpoint": str(tmp_path / "ckpt"), "trigger_ms": 300, "max_messages_per_trigger": 16,
        "txn_timeout_ms": 20_000, "job": unique_name("job"),
    }
    return cfg, expected


def _check_rows(msgs: list[pulsar.Message], expected: Counter) -> None:
    """Every (window, key) exactly once, with its exact count and sum."""
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


def _ledger(service_url: str, topic: str, job: str | None = None) -> list:
    """The ledger records on ``topic`` (a ledger or a stream's marker topic), of ``job`` if given."""

    async def read() -> list:  # noqa: ANN202
        async with AsyncClient(service_url) as c:
            return [r for r in await read_ledger(c, topic) if job is None or r.job == job]

    return asyncio.run(read())


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
    peer = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        cfg, expected = _prepare(broker, unique_name, peer, tmp_path)
        output, job = cfg["output"], cfg["job"]
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

    _check_rows(msgs, expected)
    recs = _ledger(broker.service_url, default_ledger_topic(output), job)
    committed = [r.config["spark_batch_id"] for r in recs if r.kind == "COMMITTED"]
    assert len(committed) == len(set(committed)), f"a micro-batch committed twice: {sorted(committed)}"
    replays = sum(1 for r in recs if r.kind == "ABORTED")
    print(f"\nseed {seed}; {'; '.join(kills)}; {runs} runs; {len(msgs)} output rows = {len(expected)} (window, key) "
          f"exactly once; {len(committed)} micro-batches committed, {replays} aborted (replays/timeouts); "
          f"{time.monotonic() - t0:.1f}s")


def _committed(recs: list) -> dict[int, tuple[str, int]]:
    """``{spark batch id: (transaction, rows)}`` of the COMMITTED records; asserts one per batch."""
    out: dict[int, tuple[str, int]] = {}
    for r in recs:
        if r.kind == "COMMITTED":
            b = int(r.config["spark_batch_id"])
            assert b not in out, f"micro-batch {b} committed twice: {out[b][0]} and {r.txn_id}"
            out[b] = (r.txn_id, int(r.config["rows"]))
    return out


def _until_killed(cfg: dict, log: Path, fault: str, failures: list[str]) -> None:
    """Run the query with ``fault`` until the hook SIGKILLs it. A run that fails by itself first
    (on a busy machine a micro-batch can outlast its transaction's timeout) is restarted, twice at most."""
    for _ in range(3):
        rc = Child(cfg, log, fault=fault).wait_killed(240)
        if rc == -signal.SIGKILL:
            return
        failures.append(f"{fault}: exit {rc}")
    raise AssertionError(f"the query kept failing before {fault}: {failures}; see {log}")


class _SentinelWatch(threading.Thread):
    """Writes a sentinel to ``topic`` now, then (in the background) receives from the earliest
    message up to it: ``before`` is everything the broker delivers from before the sentinel."""

    def __init__(self, peer: pulsar.Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.tag = uuid.uuid4().hex
        p = peer.create_producer(topic, batching_enabled=False)
        p.send(b"sentinel", properties={SENTINEL_PROP: self.tag})
        p.close()
        self.consumer = peer.subscribe(topic, f"watch-{self.tag[:8]}", initial_position=pulsar.InitialPosition.Earliest)
        self.before: list[bytes] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            got: list[bytes] = []
            while True:
                m = self.consumer.receive(timeout_millis=240_000)
                if m.properties().get(SENTINEL_PROP) == self.tag:
                    self.before = got
                    return
                got.append(m.data())
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.consumer.close()


@pytest.mark.timeout(600)
def test_driver_killed_at_sink_commit_exactly_once(broker, unique_name, tmp_path) -> None:  # noqa: ANN001
    """The sink's fault hook (``PULSAR_TXN_FAULT``) SIGKILLs the driver at fixed points:

    * run 1: in micro-batch 2's commit *before* the sink commits (its task has produced the
      batch's 6 rows, windows 0-1, into the transaction): nothing of that attempt ever becomes
      visible (the broker aborts the transaction at its timeout), and Spark has logged the
      batch's offsets but not its commit;
    * run 2 (restart, replays batch 2, writes it once, in a new transaction): in batch 3's commit
      right *after* the sink committed, before Spark logs the batch as done;
    * run 3 (restart): replays batch 3, whose commit finds the batch's marker and aborts (an
      ABORTED ``DuplicateMicroBatch`` record with the replay's 6 rows), then batch 4 (a no-data
      batch: the watermark closes windows 4-5).

    Micro-batches (16 input messages each, 8 per topic): 0 and 1 emit nothing, 2 emits windows
    0-1, 3 windows 2-3 (with the closing event), 4 windows 4-5; 3 keys per window.
    """
    t0 = time.monotonic()
    failures: list[str] = []  # runs that failed by themselves (not by the hook) and were restarted
    peer = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        cfg, expected = _prepare(broker, unique_name, peer, tmp_path)
        # Run 1's open transaction holds back the output until the broker aborts it at this
        # timeout; runs 2 and 3 overlap that wait.
        cfg["txn_timeout_ms"] = 45_000
        output, job, ckpt = cfg["output"], cfg["job"], Path(cfg["checkpoint"])
        ledger_topic = default_ledger_topic(output)
        log = tmp_path / "child.log"
        times: list[str] = []

        def logged(batch: int) -> tuple[bool, bool]:  # Spark's offset log / commit log entry for ``batch``
            return (ckpt / "offsets" / str(batch)).exists(), (ckpt / "commits" / str(batch)).exists()

        # Run 1: killed before the sink commits micro-batch 2.
        t = time.monotonic()
        _until_killed(cfg, log, "kill_before_sink_commit:2", failures)
        times.append(f"run 1 {time.monotonic() - t:.1f}s")
        assert (logged(1), logged(2), logged(3)) == ((True, True), (True, False), (False, False))
        recs = _ledger(broker.service_url, ledger_topic, job)
        assert {b: n for b, (_, n) in _committed(recs).items()} == {0: 0, 1: 0}
        marker_topic = stream_marker_topic(ledger_topic, recs[0].config["stream_key"])
        started = [r.txn_id for r in _ledger(broker.service_url, marker_topic) if r.kind == "STARTED"]
        assert len(started) >= 3, started  # one transaction per micro-batch (attempt)
        killed_txn = started[-1]  # the killed attempt's: batch 2, its rows produced, not committed
        # Nothing of that attempt ever becomes visible: the sentinel, written before run 2 exists,
        # comes after anything the broker would deliver from before it (the open transaction holds
        # it back until the broker aborts that transaction).
        watch = _SentinelWatch(peer, output)

        # Run 2: restarted; killed right after the sink committed micro-batch 3.
        t = time.monotonic()
        _until_killed(cfg, log, "kill_after_sink_commit:3", failures)
        times.append(f"run 2 {time.monotonic() - t:.1f}s")
        assert (logged(2), logged(3), logged(4)) == ((True, True), (True, False), (False, False))
        committed = _committed(_ledger(broker.service_url, ledger_topic, job))
        assert {b: n for b, (_, n) in committed.items()} == {0: 0, 1: 0, 2: 6, 3: 6}
        assert committed[2][0] != killed_txn  # batch 2 was written again, in a new transaction

        # Run 3: restarted without a fault; runs until every (window, key) row is visible and
        # Spark has logged batch 4 (the sink's commit makes the rows visible just before that).
        t = time.monotonic()
        child = Child(cfg, log)
        reader = peer.create_reader(output, pulsar.MessageId.earliest)
        seen, done = 0, False
        deadline = time.monotonic() + 240
        try:
            while seen < len(expected) or not done:
                assert time.monotonic() < deadline, f"{seen} of {len(expected)} rows, batch 4 done: {done}; see {log}"
                if child.proc.poll() is not None:  # failed by itself (see _until_killed)
                    failures.append(f"run 3: exit {child.stop()}")
                    assert sum(f.startswith("run 3") for f in failures) <= 2, f"the query keeps failing: {failures}"
                    child = Child(cfg, log)
                while not child.lines.empty():
                    line = child.lines.get()
                    done = done or (line or "").startswith("BATCH 4 ")
                if seen < len(expected):
                    try:
                        m = reader.read_next(timeout_millis=500)
                    except pulsar.Timeout:
                        continue
                    seen += SENTINEL_PROP not in m.properties()
                else:
                    time.sleep(0.1)
        finally:
            reader.close()
            rc = child.stop()
        times.append(f"run 3 {time.monotonic() - t:.1f}s")
        assert rc == 0, f"run 3 exited with {rc}; see {log}"
        assert logged(3) == (True, True) and logged(4) == (True, True)
        watch.join(240)
        assert watch.error is None and watch.before == [], f"before the sentinel: {watch.before} {watch.error!r}"

        msgs = _read_all(peer, output)
    finally:
        peer.close()

    _check_rows(msgs, expected)
    recs = _ledger(broker.service_url, ledger_topic, job)
    committed = _committed(recs)
    assert {b: n for b, (_, n) in committed.items()} == {0: 0, 1: 0, 2: 6, 3: 6, 4: 6}
    assert killed_txn not in {txn for txn, _ in committed.values()}
    aborted = [r for r in recs if r.kind == "ABORTED"]
    replays = [r for r in aborted if r.error.startswith("DuplicateMicroBatch")]
    assert [(int(r.config["spark_batch_id"]), r.config["rows"]) for r in replays] == [(3, 6)], replays
    assert replays[0].txn_id != committed[3][0]
    # other aborts only from runs that failed by themselves (a transaction timed out)
    assert len(aborted) == len(replays) or failures, [(r.batch_id, r.error) for r in aborted]
    print(f"\n{'; '.join(times)}; {len(msgs)} output rows = {len(expected)} (window, key) exactly once; batch 2 "
          f"killed before its commit ({killed_txn} never committed), batch 3 killed after it and its replay "
          f"aborted; runs restarted after failing by themselves: {failures or 'none'}; {time.monotonic() - t0:.1f}s")
