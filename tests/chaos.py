"""Chaos harness for the exactly-once processor.

A generator (the official client) writes uniquely numbered messages; ``pulsar-txn process``
subprocesses transform them. Meanwhile the harness SIGKILLs the processor at random instants
and restarts it, restarts the broker (cleanly or with SIGKILL), and pauses one instance with
SIGSTOP while a replacement runs on the same subscription, then resumes it (a zombie).

A :class:`Shape` says how the inputs look: a batched or unbatched producer, a partitioned input
or not, a 1:1 handler or one emitting ``id % 3`` outputs, deduplication on or off on the
output namespace. The check cannot be fooled by its own tools: the generator counts only the
ids the broker confirmed (``send_async`` callbacks, blocking when the queue is full), and a
durable audit subscription on the output exists before the first output is written. At the end
every expected output (input id, output index) must be stored exactly once, nothing else may be
stored, and the ledger's COMMITTED records must account for every output and every input once.
All traffic stays on loopback; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from txn.admin import create_namespace, create_partitioned_topic, enable_namespace_dedup
from txn.delivery.replay import read_ledger
from txn_shell.localbroker import BrokerError

#: Handlers by shape name: payload ``%08d`` in, outputs ``<id>`` (one) or ``<id>:<k>`` (mod3).
HANDLERS = {"one": "txn_shell.examples.handlers:upper", "mod3": "txn_shell.examples.handlers:mod3"}


@dataclass(frozen=True)
class Shape:
    """How the inputs and outputs of a run look."""

    batched: bool = False
    partitions: int = 1
    handler: str = "one"
    out_dedup: bool = True

    @property
    def name(self) -> str:
        return (f"{'batched' if self.batched else 'unbatched'}-p{self.partitions}-{self.handler}-"
                f"dedup-{'on' if self.out_dedup else 'off'}")

    def outputs_of(self, i: int) -> int:
        """How many outputs input ``i`` yields."""
        return i % 3 if self.handler == "mod3" else 1


#: Every combination of the four dimensions.
ALL_SHAPES = [Shape(b, p, h, d) for b in (True, False) for p in (1, 4) for h in ("mod3", "one") for d in (False, True)]


def _key(data: bytes) -> tuple[int, int]:
    """Output payload -> (input id, output index)."""
    i, _, k = data.partition(b":")
    return int(i), int(k or 0)


@dataclass
class ChaosResult:
    """Counts of a chaos run."""

    shape: str = ""
    produced: int = 0
    sent: int = 0
    send_failed: int = 0
    max_entry: int = 0
    expected: int = 0
    out: int = 0
    distinct: int = 0
    lost: int = 0
    duplicated: int = 0
    extra_copies: int = 0
    unexpected: int = 0
    kills: int = 0
    broker_restarts: int = 0
    broker_kills: int = 0
    zombies: int = 0
    proc_exits: int = 0
    committed_outputs: int = 0
    committed_inputs: int = 0
    inputs_committed_twice: int = 0
    guard_skipped: int = 0
    #: Broker-confirmed inputs that the input topic does not hold (read through a durable audit
    #: subscription that never acknowledges): a lost output whose input is also gone from the
    #: input topic was lost by the broker, not by the processor.
    inputs_missing: int = 0
    #: Lost outputs whose input's message id a COMMITTED ledger record lists (id reused or ack kept).
    lost_inputs_in_ledger: int = 0
    #: Lost outputs whose input IS on the input topic: lost by the processor (must be 0).
    lost_with_input_stored: int = 0
    timed_out: bool = False
    seconds: float = 0.0
    duplicated_ids: list[tuple[int, int]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"chaos[{self.shape}]: in={self.sent} (send_failed={self.send_failed} max_entry={self.max_entry}) "
                f"expected={self.expected} out={self.out} distinct={self.distinct} lost={self.lost} "
                f"duplicated={self.duplicated} unexpected={self.unexpected} kills={self.kills} "
                f"broker_restarts={self.broker_restarts} broker_kills={self.broker_kills} zombies={self.zombies} "
                f"proc_exits={self.proc_exits} ledger_committed_outputs={self.committed_outputs} "
                f"ledger_committed_inputs={self.committed_inputs} inputs_committed_twice={self.inputs_committed_twice} "
                f"guard_skipped={self.guard_skipped} inputs_missing={self.inputs_missing} "
                f"lost_inputs_in_ledger={self.lost_inputs_in_ledger} "
                f"lost_with_input_stored={self.lost_with_input_stored} timed_out={self.timed_out} "
                f"seconds={self.seconds:.0f}")

    @property
    def ok(self) -> bool:
        """Exactly once, fully accounted for by the ledger."""
        return (self.sent > 0 and self.send_failed == 0 and not self.timed_out and self.lost == 0
                and self.duplicated == 0 and self.unexpected == 0 and self.out == self.expected
                and self.distinct == self.expected and self.committed_outputs == self.out
                and self.committed_inputs == self.sent and self.inputs_committed_twice == 0)


class _Proc:
    """One ``pulsar-txn process`` subprocess."""

    def __init__(self, name: str, args: list[str], logdir: Path, code_dir: Path | None = None) -> None:
        self.name = name
        self.log = open(logdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        env = None if code_dir is None else dict(os.environ, PYTHONPATH=str(code_dir))
        self.p = subprocess.Popen([sys.executable, "-m", "txn_shell.cli", "process", *args], cwd=code_dir, env=env,
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


class _Generator:
    """Official-client producer of ids ``0..n-1``; only broker-confirmed ids count.

    Batched: bursts of 1..1000 ``send_async`` calls, so entries hold up to 1000 messages.
    ``send_timeout_millis=0`` retries until the broker confirms, and ``block_if_queue_full``
    makes a full queue block the caller instead of failing the send.

    Paced by ``rate``, or with ``backlog > 0`` by the processor: it keeps about that many inputs
    unprocessed (a consumer that lags, as users' consumers do, so a restart finds it in the
    middle of an entry), up to ``n`` inputs or until :attr:`stop` is set.
    """

    def __init__(self, client: pulsar.Client, topic: str, shape: Shape, n: int, rate: float, seed: int) -> None:
        self.client, self.topic, self.shape, self.n, self.rate = client, topic, shape, n, rate
        self.rnd = random.Random(seed)
        self.confirmed: set[int] = set()
        self.failed: set[int] = set()
        self.entries: Counter[tuple[int, int, int]] = Counter()
        self.msg_ids: dict[int, str] = {}  # confirmed id -> its message id as the broker reported it
        self.produced = 0
        self.processed = -1  # the highest input id seen in an output (set by the verifier)
        self.backlog = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def _callback(self, i: int):  # noqa: ANN202
        def done(result: pulsar.Result, msg_id: pulsar.MessageId) -> None:
            with self._lock:
                if result == pulsar.Result.Ok:
                    self.confirmed.add(i)
                    self.entries[(msg_id.ledger_id(), msg_id.entry_id(), msg_id.partition())] += 1
                    self.msg_ids[i] = str(msg_id)
                else:
                    self.failed.add(i)
        return done

    def run(self, deadline: float) -> None:
        batched = self.shape.batched
        p = self.client.create_producer(
            self.topic, producer_name=f"gen-{uuid.uuid4().hex[:6]}", batching_enabled=batched,
            batching_max_messages=1000, batching_max_allowed_size_in_bytes=1 << 20, batching_max_publish_delay_ms=50,
            send_timeout_millis=0, block_if_queue_full=True, max_pending_messages=2000)
        i = 0
        while i < self.n and time.monotonic() < deadline and not self.stop.is_set():
            if self.backlog and i - self.processed > self.backlog:
                time.sleep(0.05)
                continue
            burst = min(self.n - i, self.rnd.randint(1, 1000) if batched else self.rnd.randint(1, 40))
            t0 = time.monotonic()
            for _ in range(burst):
                p.send_async(b"%08d" % i, self._callback(i))
                i += 1
            self.produced = i
            if not self.backlog:
                time.sleep(max(0.0, burst / self.rate - (time.monotonic() - t0)))
        with contextlib.suppress(Exception):
            p.flush()
        while len(self.confirmed) + len(self.failed) < i and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(Exception):
            p.close()


def _restart_broker(broker, kill: bool) -> None:  # noqa: ANN001
    """Stop (SIGTERM) or SIGKILL the broker, then start it again (ports may linger briefly)."""
    if kill:
        broker.local.kill()
    else:
        broker.local.stop()
    for attempt in range(10):
        try:
            broker.local.start(timeout=300)
            return
        except BrokerError as exc:
            if "already in use" not in str(exc) or attempt == 9:
                raise
            time.sleep(3)


def run_chaos(
    broker,  # noqa: ANN001 - an object with service_url, admin_url and local (a LocalBroker or None)
    workdir: Path,
    *,
    shape: Shape | None = None,
    n: int = 3000,
    rate: float = 150.0,
    backlog: int = 0,
    kills: int = 4,
    broker_restarts: int = 1,
    broker_kills: int = 0,
    zombies: int = 1,
    seed: int = 7,
    batch_max_messages: int = 100,
    txn_timeout_ms: int = 60000,
    extra_args: tuple[str, ...] = (),
    settle_s: float | None = None,
    code_dir: Path | None = None,
    time_limit_s: float = 600.0,
    log=print,  # noqa: ANN001
) -> ChaosResult:
    """Run the scenario and return the counts (the caller asserts on them).

    ``shape=None`` is the original scenario: unbatched, one partition, 1:1, deduplication on.
    ``backlog > 0``: instead of ``rate``, keep about that many inputs unprocessed until the chaos
    plan is done (``n`` is then a cap).
    ``code_dir``: run the processors from this copy of the ``txn`` package (e.g. an older commit).
    """
    shape = shape or Shape()
    rnd = random.Random(seed)
    res = ChaosResult(shape=shape.name)
    t_start = time.monotonic()
    deadline = t_start + time_limit_s
    tag = uuid.uuid4().hex[:8]
    ns_in, ns_out = f"public/chaos-{tag}-in", f"public/chaos-{tag}-out"
    create_namespace(broker.admin_url, ns_in)
    create_namespace(broker.admin_url, ns_out)
    enable_namespace_dedup(broker.admin_url, ns_in)  # the generator's own resends after a reconnect are harmless
    if shape.out_dedup:
        enable_namespace_dedup(broker.admin_url, ns_out)
    inp = f"persistent://{ns_in}/in"
    out, ledger = (f"persistent://{ns_out}/{x}" for x in ("out", "ledger"))
    if shape.partitions > 1:
        create_partitioned_topic(broker.admin_url, inp, shape.partitions)
    args = ["--service-url", broker.service_url, "--input", inp, "--output", out, "--subscription", "chaos",
            "--handler", HANDLERS[shape.handler], "--job", "chaos", "--ledger-topic", ledger,
            "--batch-max-messages", str(batch_max_messages), "--txn-timeout-ms", str(txn_timeout_ms),
            "--progress-interval", "5", *extra_args]
    logdir = workdir
    logdir.mkdir(parents=True, exist_ok=True)
    official = pulsar.Client(broker.service_url, operation_timeout_seconds=120,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    # The verifier's durable subscriptions exist before the first output: the audit one never
    # acknowledges, so the broker keeps every output for the final count; the live one only
    # tracks progress (a redelivery to it is not a duplicate).
    official.subscribe(out, "chaos-audit", initial_position=pulsar.InitialPosition.Earliest).close()
    official.subscribe(inp, "chaos-input-audit", initial_position=pulsar.InitialPosition.Earliest).close()
    live = official.subscribe(out, "chaos-check", initial_position=pulsar.InitialPosition.Earliest)
    seen: set[tuple[int, int]] = set()
    stop_reader = threading.Event()

    def read_loop() -> None:
        while not stop_reader.is_set():
            try:
                m = live.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            except Exception:  # reconnecting during a broker restart
                time.sleep(0.2)
                continue
            key = _key(m.data())
            seen.add(key)
            generator.processed = max(generator.processed, key[0])
            with contextlib.suppress(Exception):
                live.acknowledge(m)

    if rate <= 0:  # spread the inputs over the chaos plan's expected length
        rate = n / max(30.0, 3.5 * (kills + broker_restarts + broker_kills + zombies)
                       + 45 * (broker_restarts + broker_kills) + (txn_timeout_ms / 1000 + 6) * zombies)
    generator = _Generator(official, inp, shape, n, rate, seed)
    generator.backlog = backlog
    procs: list[_Proc] = []
    gen = threading.Thread(target=generator.run, args=(deadline,), daemon=True)
    rd = threading.Thread(target=read_loop, daemon=True)
    rd.start()
    counter = 0

    def start_proc() -> _Proc:
        nonlocal counter
        counter += 1
        pr = _Proc(f"proc-{counter}", args, logdir, code_dir)
        procs.append(pr)
        return pr

    def event(msg: str) -> None:
        res.events.append(f"{time.monotonic() - t_start:6.1f}s {msg}")
        log(res.events[-1])

    def check_alive(current: _Proc) -> _Proc:
        if current.p.poll() is None:
            return current
        res.proc_exits += 1
        event(f"{current.name} exited by itself (code {current.p.returncode}); restarting")
        current.log.close()
        return start_proc()

    try:
        current = start_proc()
        gen.start()
        plan = (["kill"] * kills + ["broker"] * broker_restarts + ["broker-kill"] * broker_kills
                + ["zombie"] * zombies)
        rnd.shuffle(plan)
        for action in plan:
            time.sleep(rnd.uniform(2.0, 5.0))
            if time.monotonic() > deadline:
                break
            current = check_alive(current)
            if action == "kill":
                current.send_signal(signal.SIGKILL)
                current.p.wait(10)
                current.log.close()
                res.kills += 1
                event(f"SIGKILL {current.name} (pid {current.p.pid}); restarting "
                      f"[confirmed {len(generator.confirmed)}, outputs seen {len(seen)}]")
                current = start_proc()
            elif action in ("broker", "broker-kill"):
                if broker.local is None:
                    event("broker restart skipped: not our broker")
                    continue
                hard = action == "broker-kill"
                event(f"broker {'SIGKILL' if hard else 'stop'} [confirmed {len(generator.confirmed)}, "
                      f"outputs seen {len(seen)}]")
                _restart_broker(broker, hard)
                if hard:
                    res.broker_kills += 1
                else:
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
        if backlog:
            generator.stop.set()
        gen.join(max(0.0, deadline - time.monotonic()))
        confirmed = set(generator.confirmed)
        expected = {(i, k) for i in confirmed for k in range(shape.outputs_of(i))}
        event(f"generator done: {generator.produced} produced, {len(confirmed)} confirmed, "
              f"{len(generator.failed)} failed; {len(expected)} outputs expected")
        # Let the survivor finish (restarting it if it died), then give a late commit time to show.
        while not expected <= seen and time.monotonic() < deadline:
            current = check_alive(current)
            time.sleep(0.5)
        res.timed_out = not expected <= seen
        time.sleep(settle_s if settle_s is not None else min(txn_timeout_ms / 1000 + 2, 20))
        event(f"output complete: {len(seen.copy() & expected)} of {len(expected)} expected seen")
    finally:
        for pr in procs:
            if pr.p.poll() is None:
                pr.stop()
            elif not pr.log.closed:
                pr.log.close()
        stop_reader.set()
        rd.join(10)

    # The audit: everything stored on the output topic, read from the start by the official
    # client. A duplicate is one expected output stored under two different message ids.
    stored: dict[tuple[int, int], set[str]] = {}
    audit_reader = official.create_reader(out, pulsar.MessageId.earliest)
    while audit_reader.has_message_available():
        m = audit_reader.read_next(timeout_millis=10000)
        stored.setdefault(_key(m.data()), set()).add(str(m.message_id()))
    audit_reader.close()
    stored_inputs: set[int] = set()
    for part in ([f"{inp}-partition-{k}" for k in range(shape.partitions)] if shape.partitions > 1 else [inp]):
        in_reader = official.create_reader(part, pulsar.MessageId.earliest)
        while in_reader.has_message_available():
            stored_inputs.add(int(in_reader.read_next(timeout_millis=10000).data()))
        in_reader.close()
    live.close()
    official.close()

    async def ledger_records():  # noqa: ANN202
        async with txn.AsyncClient(broker.service_url) as c:
            return await read_ledger(c, ledger)

    records = asyncio.run(ledger_records())
    committed = [r for r in records if r.kind == "COMMITTED"]
    res.committed_outputs = sum(r.outputs.get(out, 0) for r in committed)
    inputs = Counter((t, i) for r in committed for t, ids in r.inputs.items() for i in ids)
    res.committed_inputs = sum(inputs.values())
    res.inputs_committed_twice = sum(1 for c in inputs.values() if c > 1)
    res.inputs_missing = len(confirmed - stored_inputs)
    committed_ids = {i for _, i in inputs}
    lost_inputs = {i for i, _ in expected - stored.keys()}
    res.lost_inputs_in_ledger = sum(1 for i in lost_inputs if generator.msg_ids.get(i) in committed_ids)
    res.lost_with_input_stored = len(lost_inputs & stored_inputs)
    if lost_inputs:
        sample = sorted(lost_inputs)[:10]
        log(f"  lost inputs (id: message id): {[(i, generator.msg_ids.get(i)) for i in sample]}; "
            f"{len(lost_inputs & stored_inputs)} of {len(lost_inputs)} still on the input topic")
    # Inputs a ledger guard found already committed: acknowledged again, nothing produced.
    res.guard_skipped = sum(len(ids) for r in committed for ids in (getattr(r, "duplicates", None) or {}).values())
    res.produced = generator.produced
    res.sent = len(confirmed)
    res.send_failed = len(generator.failed)
    res.max_entry = max(generator.entries.values(), default=0)
    res.expected = len(expected)
    res.out = sum(len(ids) for ids in stored.values())
    res.distinct = len(stored)
    res.lost = len(expected - stored.keys())
    res.unexpected = len(stored.keys() - expected)
    dups = sorted(k for k, ids in stored.items() if len(ids) > 1)
    res.duplicated = len(dups)
    res.extra_copies = sum(len(stored[k]) - 1 for k in dups)
    res.duplicated_ids = dups
    res.seconds = time.monotonic() - t_start
    log(res.summary())
    if dups:
        log(f"  duplicated outputs (id, index): {_ranges(dups)}")
    return res


def _ranges(keys: list[tuple[int, int]]) -> str:
    """Compact listing of duplicated input ids: ``10075-10099, 11000-11074``."""
    ids = sorted({i for i, _ in keys})
    parts: list[str] = []
    start = prev = ids[0]
    for i in ids[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


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
