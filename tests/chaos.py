"""Chaos harness for the exactly-once processor.

A generator (the official client) writes N uniquely numbered messages; ``pulsar-txn process``
subprocesses transform them. Meanwhile the harness SIGKILLs the processor at random instants
and restarts it, restarts the broker, and pauses one instance with SIGSTOP while a replacement
runs on the same subscription, then resumes it (a zombie). At the end an official-client reader
on the output checks that every input id appears exactly once, and the ledger's COMMITTED
records must account for every output. All traffic stays on loopback; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

import txn
from txn.delivery.replay import read_ledger
from txn.localbroker import create_namespace, enable_namespace_dedup


@dataclass
class ChaosResult:
    """Counts of a chaos run."""

    sent: int = 0
    out: int = 0
    distinct: int = 0
    lost: int = 0
    duplicated: int = 0
    kills: int = 0
    broker_restarts: int = 0
    zombies: int = 0
    committed_outputs: int = 0
    committed_inputs: int = 0
    inputs_committed_twice: int = 0
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"chaos: in={self.sent} out={self.out} distinct={self.distinct} lost={self.lost} "
                f"duplicated={self.duplicated} kills={self.kills} broker_restarts={self.broker_restarts} "
                f"zombies={self.zombies} ledger_committed_outputs={self.committed_outputs} "
                f"ledger_committed_inputs={self.committed_inputs} "
                f"inputs_committed_twice={self.inputs_committed_twice} seconds={self.seconds:.0f}")


class _Proc:
    """One ``pulsar-txn process`` subprocess."""

    def __init__(self, name: str, args: list[str], logdir: Path) -> None:
        self.name = name
        self.log = open(logdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen([sys.executable, "-m", "txn.cli", "process", *args],
                                  stdout=self.log, stderr=subprocess.STDOUT)

    def send_signal(self, sig: int) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        self.send_signal(signal.SIGCONT)
        self.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
        self.log.close()


def run_chaos(
    broker,  # noqa: ANN001 - the tests' Broker fixture object
    workdir: Path,
    *,
    n: int = 3000,
    rate: float = 150.0,
    kills: int = 4,
    broker_restarts: int = 1,
    zombies: int = 1,
    seed: int = 7,
    txn_timeout_ms: int = 8000,
    time_limit_s: float = 600.0,
    log=print,  # noqa: ANN001
) -> ChaosResult:
    """Run the scenario and return the counts (the caller asserts on them)."""
    rnd = random.Random(seed)
    res = ChaosResult()
    t_start = time.monotonic()
    deadline = t_start + time_limit_s
    ns = f"public/chaos-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)  # makes the generator's own retries harmless
    inp, out, ledger = (f"persistent://{ns}/{x}" for x in ("in", "out", "ledger"))
    args = ["--service-url", broker.service_url, "--input", inp, "--output", out, "--subscription", "chaos",
            "--handler", "txn.examples.handlers:upper", "--job", "chaos", "--ledger-topic", ledger,
            "--batch-max-messages", "50", "--batch-max-delay-ms", "100", "--max-attempts", "3",
            "--txn-timeout-ms", str(txn_timeout_ms), "--progress-interval", "5"]
    logdir = workdir
    logdir.mkdir(parents=True, exist_ok=True)
    official = pulsar.Client(broker.service_url, operation_timeout_seconds=120,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    # An audit subscription that never acknowledges keeps every output stored for the final
    # check; the live reader only tracks progress (a redelivery to it is not a duplicate).
    audit = official.subscribe(out, "chaos-audit", initial_position=pulsar.InitialPosition.Earliest)
    audit.close()
    reader = official.subscribe(out, "chaos-check", initial_position=pulsar.InitialPosition.Earliest)
    seen: Counter[int] = Counter()
    live_ids: set[str] = set()
    stop_reader = threading.Event()

    def read_loop() -> None:
        while not stop_reader.is_set():
            try:
                m = reader.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            except Exception:  # reconnecting during a broker restart
                time.sleep(0.2)
                continue
            mid = str(m.message_id())
            if mid not in live_ids:
                live_ids.add(mid)
                seen[int(m.data())] += 1
            reader.acknowledge(m)

    def generate() -> None:
        p = official.create_producer(inp, producer_name=f"gen-{uuid.uuid4().hex[:6]}", batching_enabled=False,
                                     send_timeout_millis=0, block_if_queue_full=True)
        for i in range(n):
            if time.monotonic() > deadline:
                return
            while True:
                try:
                    p.send(f"{i:08d}".encode(), sequence_id=i)
                    break
                except Exception:  # broker restarting: retry the same sequence id (dedup drops repeats)
                    time.sleep(0.5)
            res.sent = i + 1
            time.sleep(1.0 / rate)
        p.flush()

    procs: list[_Proc] = []
    gen = threading.Thread(target=generate, daemon=True)
    rd = threading.Thread(target=read_loop, daemon=True)
    rd.start()
    counter = 0

    def start_proc() -> _Proc:
        nonlocal counter
        counter += 1
        pr = _Proc(f"proc-{counter}", args, logdir)
        procs.append(pr)
        return pr

    def event(msg: str) -> None:
        res.events.append(f"{time.monotonic() - t_start:6.1f}s {msg}")
        log(res.events[-1])

    try:
        current = start_proc()
        gen.start()
        # Chaos plan: kills spread over the run, the broker restart and the zombie in between.
        plan = ["kill"] * kills + ["broker"] * broker_restarts + ["zombie"] * zombies
        rnd.shuffle(plan)
        for action in plan:
            time.sleep(rnd.uniform(2.0, 5.0))
            if time.monotonic() > deadline:
                break
            if action == "kill":
                current.send_signal(signal.SIGKILL)
                current.p.wait(10)
                res.kills += 1
                event(f"SIGKILL {current.name} (pid {current.p.pid}); restarting")
                current = start_proc()
            elif action == "broker":
                if broker.local is None:
                    event("broker restart skipped: not our broker")
                    continue
                event("broker stop")
                broker.local.stop()
                broker.local.start(timeout=240)
                res.broker_restarts += 1
                event("broker back")
            else:
                zombie = current
                zombie.send_signal(signal.SIGSTOP)
                event(f"SIGSTOP {zombie.name}; starting a replacement")
                current = start_proc()
                time.sleep(txn_timeout_ms / 1000 + 3)  # the zombie's open transaction times out meanwhile
                zombie.send_signal(signal.SIGCONT)
                res.zombies += 1
                event(f"SIGCONT {zombie.name} (zombie resumed next to {current.name})")
                time.sleep(3)
                zombie.stop(signal.SIGKILL)
                event(f"SIGKILL zombie {zombie.name}")
        gen.join(max(0.0, deadline - time.monotonic()))
        event(f"generator done: {res.sent} sent")
        # Let the survivor finish; then wait past the transaction timeout so a late commit would show.
        while len(seen) < res.sent and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(txn_timeout_ms / 1000 + 2)
        event(f"output complete: {len(seen)} distinct")
    finally:
        for pr in procs:
            if pr.p.poll() is None:
                pr.stop()
            elif not pr.log.closed:
                pr.log.close()
        stop_reader.set()
        rd.join(10)

    # The audit: everything stored on the output topic, read from the start by the official
    # client. A duplicate is one input id stored under two different message ids.
    stored: dict[int, set[str]] = {}
    audit_reader = official.create_reader(out, pulsar.MessageId.earliest)
    while audit_reader.has_message_available():
        m = audit_reader.read_next(timeout_millis=10000)
        stored.setdefault(int(m.data()), set()).add(str(m.message_id()))
    audit_reader.close()
    reader.close()
    official.close()

    async def ledger_records():
        async with txn.AsyncClient(broker.service_url) as c:
            return await read_ledger(c, ledger)

    records = asyncio.run(ledger_records())
    committed = [r for r in records if r.kind == "COMMITTED"]
    res.committed_outputs = sum(r.outputs.get(out, 0) for r in committed)
    inputs = Counter(i for r in committed for ids in r.inputs.values() for i in ids)
    res.committed_inputs = sum(inputs.values())
    res.inputs_committed_twice = sum(1 for c in inputs.values() if c > 1)
    res.out = sum(len(ids) for ids in stored.values())
    res.distinct = len(stored)
    res.lost = sum(1 for i in range(res.sent) if i not in stored)
    res.duplicated = sum(1 for ids in stored.values() if len(ids) > 1)
    res.seconds = time.monotonic() - t_start
    log(res.summary())
    return res


# ------------------------------------------------------------------ the outbox producer


@dataclass
class OutboxChaosResult:
    """Counts of an outbox kill -9 run."""

    sent: int = 0
    out: int = 0
    lost: int = 0
    duplicated: int = 0
    kills: int = 0
    in_order: bool = False
    seconds: float = 0.0
    kill_details: list[dict[str, int]] = field(default_factory=list)
    recovered: list[dict[str, str]] = field(default_factory=list)
    outbox_final: tuple[int, list, str | None] = (0, [], None)

    def summary(self) -> str:
        return (f"outbox chaos: in={self.sent} out={self.out} lost={self.lost} duplicated={self.duplicated} "
                f"kills={self.kills} in_order={self.in_order} seconds={self.seconds:.1f}")


def _spawn_outbox_child(broker, topic: str, db: Path, n: int) -> subprocess.Popen[str]:  # noqa: ANN001
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, str(here / "outbox_child.py"), broker.service_url, broker.admin_url, topic, str(db),
         "outbox-writer", str(n)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=here.parent,
    )


def _child_line(proc: subprocess.Popen[str], deadline: float) -> str:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        proc.wait(10)
        raise AssertionError(f"child exited ({proc.returncode}) early: {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    if time.monotonic() > deadline:
        proc.kill()
        raise AssertionError("outbox child too slow")
    return line.strip()


def run_outbox_chaos(
    broker,  # noqa: ANN001
    topic: str,
    db: Path,
    *,
    n: int = 2000,
    kill_after: list[int] | None = None,
    time_limit_s: float = 120.0,
    log=print,  # noqa: ANN001
) -> OutboxChaosResult:
    """SIGKILL a producer writing N numbered messages through the SQLite outbox, several times at
    different instants (after so many accepted messages), restart it each time, then count what
    the topic holds with the official client: every id exactly once, in order."""
    from txn.delivery.outbox import Outbox

    kill_after = kill_after or [300, 170, 420]
    res = OutboxChaosResult(sent=n)
    t0 = time.monotonic()
    deadline = t0 + time_limit_s
    starts: list[str] = []
    for target in kill_after:
        proc = _spawn_outbox_child(broker, topic, db, n)
        starts.append(_child_line(proc, deadline))
        seen = last = 0
        while seen < target:
            line = _child_line(proc, deadline)
            if not line.startswith("accepted "):
                raise AssertionError(f"unexpected child output {line!r}")
            last = int(line.split()[1])
            seen += 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        o = Outbox(db, topic, "outbox-writer")
        res.kill_details.append({"last_printed": last, "checkpoint": int(o.checkpoint() or -1),
                                 "rows_left": o.pending_count()})
        o.close()
        if res.kill_details[-1]["checkpoint"] < last:
            raise AssertionError("a message reported accepted is missing from the outbox")
        res.kills += 1
    proc = _spawn_outbox_child(broker, topic, db, n)
    out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 5))
    if proc.returncode != 0:
        raise AssertionError(f"final run failed: {err[-3000:]}")
    starts.append(out.splitlines()[0])
    o = Outbox(db, topic, "outbox-writer")
    res.outbox_final = (o.pending_count(), o.nacked(), o.checkpoint())
    o.close()
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    counts: Counter[int] = Counter()
    order: list[int] = []
    while reader.has_message_available():
        m = reader.read_next(timeout_millis=10000)
        i = int(m.data())
        counts[i] += 1
        order.append(i)
    reader.close()
    official.close()
    res.out = sum(counts.values())
    res.lost = sum(1 for i in range(n) if counts[i] == 0)
    res.duplicated = sum(1 for c in counts.values() if c > 1)
    res.in_order = order == list(range(n))
    res.recovered = [dict(kv.split("=") for kv in s.split()[2:]) for s in starts[1:]]
    res.seconds = time.monotonic() - t0
    log(res.summary())
    for k, r in zip(res.kill_details, res.recovered, strict=True):
        log(f"  killed after accepted id {k['last_printed']} (checkpoint {k['checkpoint']}, "
            f"{k['rows_left']} rows unconfirmed) -> next run: {r}")
    return res
