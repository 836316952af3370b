"""Chaos harness for the exactly-once processor.

A generator (the official client) writes uniquely numbered messages; ``pulsar-txn process``
subprocesses transform them, one or a fleet of several instances of the job on one subscription.
Meanwhile the harness SIGKILLs instances at random instants and restarts them, restarts the
broker (cleanly or with SIGKILL), and pauses one instance with SIGSTOP while a replacement runs on
the same subscription, then resumes it (a zombie): after the transaction timeout, then killed (the
friendly default), or after a few seconds, left running beside its replacement to the end.

After the last fault nothing is restarted: the fleet must drain by itself (every output seen, the
subscription's backlog 0 in the broker's admin stats) within a limit, or the run reports the
stranded inputs (processed by no one while every instance is up: an abort whose inputs the broker
keeps assigned to a consumer that stays connected).

With ``network=True`` the processors reach the broker the way Kubernetes users do, through the
real Apache Pulsar Proxy (``bin/pulsar proxy``, :mod:`txn_shell.localproxy`), and between each
instance and the proxy sits a fault-injecting TCP relay (:mod:`netfault`): the plan then also
stalls the network (sockets open, nothing moves), resets every connection (RST), black-holes it
for longer than the keep-alive and the transaction timeout (silence both ways, then the broken
connections reset), and slows it to small fragments, for every instance at once or for one. The
generator and the verifier talk to the broker directly.

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
from netfault import NetFault

import txn
from txn.admin import admin_request, create_namespace, create_partitioned_topic, enable_namespace_dedup, topic_path
from txn.delivery.commit_audit import REDO_SUFFIX
from txn.delivery.replay import read_ledger
from txn_shell.localbroker import HOST, BrokerError
from txn_shell.localproxy import LocalProxy

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
    #: Outputs the commit audit sent again because the broker had aborted them under a COMMITTED
    #: record (``+redo`` records naming no input): they replace that record's outputs, so they are
    #: not counted twice in ``committed_outputs``.
    outputs_redone: int = 0
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
    #: Processors of the job running side by side (the fleet).
    instances: int = 1
    #: Liveness, judged after the last fault with nothing restarted: seconds until every expected
    #: output was seen and the subscription's backlog was 0 (None: not within ``drain_limit_s``).
    drain_s: float | None = None
    drain_limit_s: float = 0.0
    #: Expected outputs not seen when the drain limit passed (the inputs stayed stranded while the
    #: fleet was up); the final audit's ``lost`` is what is still missing after every instance was
    #: restarted.
    stranded: int = 0
    #: The subscription's backlog when the drain was judged (None: the broker did not answer).
    backlog_left: int | None = None
    #: Instances that exited by themselves during the drain (a failure: nothing restarts them).
    drain_exits: int = 0
    #: Resumed zombies that exited by themselves (reported, not a failure: a fenced zombie may).
    zombie_exits: int = 0
    #: Network mode: the processors connect through a fault relay and the Pulsar Proxy.
    network: bool = False
    net_stalls: int = 0
    net_resets: int = 0
    net_blackholes: int = 0
    net_slows: int = 0
    #: Connections the relay reset (``net-reset`` and at the end of each black hole), bytes it dropped.
    net_conns_reset: int = 0
    net_dropped_bytes: int = 0
    seconds: float = 0.0
    duplicated_ids: list[tuple[int, int]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"chaos[{self.shape}]: in={self.sent} (send_failed={self.send_failed} max_entry={self.max_entry}) "
                f"expected={self.expected} out={self.out} distinct={self.distinct} lost={self.lost} "
                f"duplicated={self.duplicated} unexpected={self.unexpected} kills={self.kills} "
                f"broker_restarts={self.broker_restarts} broker_kills={self.broker_kills} zombies={self.zombies} "
                f"proc_exits={self.proc_exits} ledger_committed_outputs={self.committed_outputs} "
                f"outputs_redone={self.outputs_redone} "
                f"ledger_committed_inputs={self.committed_inputs} inputs_committed_twice={self.inputs_committed_twice} "
                f"guard_skipped={self.guard_skipped} inputs_missing={self.inputs_missing} "
                f"lost_inputs_in_ledger={self.lost_inputs_in_ledger} "
                f"lost_with_input_stored={self.lost_with_input_stored} timed_out={self.timed_out} "
                f"instances={self.instances} stranded={self.stranded} "
                f"drain_s={'none' if self.drain_s is None else f'{self.drain_s:.1f}'} "
                f"(limit {self.drain_limit_s:.0f}) backlog_left={self.backlog_left} drain_exits={self.drain_exits} "
                f"zombie_exits={self.zombie_exits} "
                + (f"net_stalls={self.net_stalls} net_resets={self.net_resets} net_blackholes={self.net_blackholes} "
                   f"net_slows={self.net_slows} net_conns_reset={self.net_conns_reset} "
                   f"net_dropped_bytes={self.net_dropped_bytes} " if self.network else "")
                + f"seconds={self.seconds:.0f}")

    @property
    def ok(self) -> bool:
        """Exactly once, fully accounted for by the ledger, and drained by the fleet as it was."""
        return (self.sent > 0 and self.send_failed == 0 and not self.timed_out and self.lost == 0
                and self.duplicated == 0 and self.unexpected == 0 and self.out == self.expected
                and self.distinct == self.expected and self.committed_outputs == self.out
                and self.committed_inputs == self.sent and self.inputs_committed_twice == 0
                and self.stranded == 0 and self.drain_s is not None and self.drain_exits == 0)


class _Proc:
    """One ``pulsar-txn process`` subprocess."""

    def __init__(self, name: str, args: list[str], logdir: Path, code_dir: Path | None = None) -> None:
        self.name = name
        self.started_ms = time.time() * 1000
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
            send_timeout_millis=0, block_if_queue_full=True, max_pending_messages=2000,
            # Never adopt the broker's lastSequenceId: pulsar-client 3.13.0 resets its counter when it
            # reconnects before its first receipt, and deduplication then drops the next messages
            # while confirming them with (-1,-1) (tests/test_sequence_ids.py, docs/cluster.md).
            initial_sequence_id=1)
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


def _sub_stats(admin_url: str, topic: str, partitioned: bool, sub: str) -> dict | None:
    """Subscription ``sub``'s stats on ``topic`` (its partitions aggregated) from the broker's admin
    REST API, or None if the broker did not answer (restarting, topic loading)."""
    path = f"/admin/v2/{topic_path(topic)}/{'partitioned-stats' if partitioned else 'stats'}"
    try:
        status, body = admin_request("GET", admin_url, path, timeout=10)
    except OSError:
        return None
    if status != 200 or not isinstance(body, dict):
        return None
    return (body.get("subscriptions") or {}).get(sub)


def _backlog(stats: dict | None) -> int | None:
    return None if stats is None else int(stats.get("msgBacklog", 0))


def _consumers(stats: dict | None) -> str:
    """The subscription's consumers as ``name: unacked=N permits=N`` (what the broker thinks each holds)."""
    if not stats:
        return "no stats"
    cs = stats.get("consumers") or []
    return "; ".join(f"{c.get('consumerName')}: unacked={c.get('unackedMessages')} "
                     f"permits={c.get('availablePermits')}" for c in cs) or "no consumers"


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
    instances: int = 1,
    zombie_pause_s: float | None = None,
    zombie_linger_s: float | None = None,
    drain_limit_s: float = 120.0,
    fault_gap_s: tuple[float, float] = (2.0, 5.0),
    network: bool = False,
    net_stalls: int = 0,
    net_resets: int = 0,
    net_blackholes: int = 0,
    net_slows: int = 0,
    net_stall_s: float = 10.0,
    net_blackhole_s: float = 75.0,
    net_slow_s: float = 15.0,
    net_slow_chunk: int = 256,
    net_slow_delay_s: float = 0.01,
    net_scope: str = "all",
    log=print,  # noqa: ANN001
) -> ChaosResult:
    """Run the scenario and return the counts (the caller asserts on them).

    ``shape=None`` is the original scenario: unbatched, one partition, 1:1, deduplication on.
    ``backlog > 0``: instead of ``rate``, keep about that many inputs unprocessed until the chaos
    plan is done (``n`` is then a cap). ``rate <= 0``: spread the ``n`` inputs over the plan's
    expected length, so they are published during the faults.
    ``code_dir``: run the processors from this copy of the ``txn`` package (e.g. an older commit).

    ``instances``: that many processors of the job run on the subscription from the start (a fleet).
    A kill SIGKILLs one of them, picked at random, and starts its replacement; one that exits by
    itself while the faults go on is restarted.

    A zombie: one instance of the fleet, picked at random, is paused (SIGSTOP) and a replacement
    takes its place at once; after ``zombie_pause_s`` (None: the transaction timeout + 3 s, longer
    than the broker's 30 s keep-alive, so its connection is dropped; a few seconds: the broker still
    counts it as connected) it is resumed (SIGCONT). ``zombie_linger_s`` None: it is SIGKILLed 3 s
    later. A number: the resumed zombie is never stopped by the harness: it keeps running beside its
    replacement to the end of the run, through the drain (whatever it holds it must process or give
    back by itself; a SIGTERM would close its consumer and make the broker redeliver for it), and
    the drain does not start before it has run that long beside its replacement (the plan's other
    faults go on meanwhile; kills never pick a zombie). A zombie that exits by itself is reported
    (``zombie_exits``) and not restarted; it is not one of the ``instances``.

    Liveness: once the plan, the zombies' linger and the generator are done, the drain phase
    restarts nothing: ``drain_s`` is how long it took until every expected output of the inputs the
    input topic holds was seen and the subscription's backlog (admin REST stats, ``msgBacklog`` of
    ``chaos``) was 0; None if that did not happen within ``drain_limit_s``. ``stranded`` counts
    those expected outputs not seen by then, ``drain_exits`` the instances that exited by themselves
    during the drain. After a failed drain every process is stopped and the fleet restarted (as an
    operator would), and the run waits for the rest of the outputs until ``time_limit_s``: ``lost``
    is what the final audit still misses (with ``inputs_missing``: inputs the broker confirmed
    but does not hold, which no processor can produce outputs for).

    The faults come ``fault_gap_s`` (a uniform range) apart, in random order; with a linger the
    zombies are spread over the plan from its first action on, so the other faults hit the fleet
    while a resumed zombie runs beside its replacement.

    Network faults (``network=True``, implied by any ``net_*`` count): a LocalProxy in front of the
    broker (its log under ``workdir/proxy``) and, in front of the proxy, a
    :class:`~netfault.NetFault` relay per fleet slot: the processors' ``--service-url`` is their
    slot's relay (a replacement takes over its predecessor's). ``net_scope``: each network fault
    hits every instance (``all``), one instance picked at random (``one``: a single pod cut off
    while the others go on), or alternately all and one (``mixed``: the first fault of each kind
    hits all, the second one, ...). ``net_stalls`` stalls of ``net_stall_s`` (nothing forwarded,
    sockets open, everything delivered after), ``net_resets`` resets (every connection closed with
    an RST), ``net_blackholes`` black holes of ``net_blackhole_s`` (everything dropped both ways,
    new connections accepted but silent; at the end the connections with a gap are reset) and
    ``net_slows`` slow spells of ``net_slow_s`` (``net_slow_chunk`` bytes every
    ``net_slow_delay_s``). Each lasts its full length before the next fault's gap starts. The plan
    starts once the fleet wrote its first outputs (at most 120 s later). The generator, the verifier
    and the admin calls go to the broker.
    """
    if instances < 1:
        raise ValueError("instances must be at least 1")
    if net_scope not in ("all", "one", "mixed"):
        raise ValueError("net_scope must be 'all', 'one' or 'mixed'")
    network = network or bool(net_stalls or net_resets or net_blackholes or net_slows)
    shape = shape or Shape()
    rnd = random.Random(seed)
    pick = random.Random(seed + 1)  # which instance a fault hits (rnd's sequence stays that of one instance)
    pause_s = txn_timeout_ms / 1000 + 3 if zombie_pause_s is None else zombie_pause_s
    res = ChaosResult(shape=shape.name, instances=instances, drain_limit_s=drain_limit_s, network=network)
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
        plan_s = (sum(fault_gap_s) / 2 * (kills + broker_restarts + broker_kills + zombies)
                  + 45 * (broker_restarts + broker_kills)
                  + (pause_s + (3 if zombie_linger_s is None else 0)) * zombies
                  + (zombie_linger_s or 0) * min(zombies, 1)
                  + net_stall_s * net_stalls + net_blackhole_s * net_blackholes + net_slow_s * net_slows)
        rate = n / max(30.0, plan_s)
    generator = _Generator(official, inp, shape, n, rate, seed)
    generator.backlog = backlog
    procs: list[_Proc] = []  # every process started (for the clean-up and the logs)
    fleet: list[_Proc] = []  # the live instances of the job, ``instances`` of them
    zombies_up: list[tuple[float, _Proc]] = []  # resumed zombies (never stopped) and when they resumed
    last_broker_back = 0.0  # when the broker last came back from a restart (time.monotonic())
    gen = threading.Thread(target=generator.run, args=(deadline,), daemon=True)
    rd = threading.Thread(target=read_loop, daemon=True)
    rd.start()
    counter = 0

    relays: list[NetFault] = []  # network mode: one relay per fleet slot, in front of the proxy

    def start_proc(slot: int) -> _Proc:
        """A processor for fleet slot ``slot`` (in network mode it connects through that slot's relay)."""
        nonlocal counter
        counter += 1
        a = list(args)
        if relays:
            a[a.index("--service-url") + 1] = relays[slot].url
        pr = _Proc(f"proc-{counter}", a, logdir, code_dir)
        procs.append(pr)
        return pr

    def event(msg: str) -> None:
        res.events.append(f"{time.monotonic() - t_start:6.1f}s {msg}")
        log(res.events[-1])

    def progress() -> str:
        return f"[confirmed {len(generator.confirmed)}, outputs seen {len(seen)}]"

    def check_fleet() -> None:
        for k, pr in enumerate(fleet):
            if pr.p.poll() is None:
                continue
            res.proc_exits += 1
            pr.log.close()
            fleet[k] = start_proc(k)
            event(f"{pr.name} exited by itself (code {pr.p.returncode}); restarted as {fleet[k].name}")

    def check_zombies() -> None:
        for item in list(zombies_up):
            z = item[1]
            if z.p.poll() is not None:
                zombies_up.remove(item)
                res.proc_exits += 1
                res.zombie_exits += 1
                z.log.close()
                event(f"zombie {z.name} exited by itself (code {z.p.returncode}); not restarted {progress()}")

    def read_inputs() -> set[int] | None:
        """The ids the input topic holds (None if they could not be read)."""
        held: set[int] = set()
        parts = [f"{inp}-partition-{k}" for k in range(shape.partitions)] if shape.partitions > 1 else [inp]
        try:
            for part in parts:
                r = official.create_reader(part, pulsar.MessageId.earliest)
                try:
                    while r.has_message_available():
                        held.add(int(r.read_next(timeout_millis=10000).data()))
                finally:
                    r.close()
        except Exception as exc:  # the final audit reads them again
            event(f"input topic not readable for the drain ({exc!r}); waiting for every confirmed input")
            return None
        return held

    proxy: LocalProxy | None = None
    net_faults: Counter[str] = Counter()  # network faults so far, by kind (for net_scope="mixed")
    try:
        if network:
            proxy = LocalProxy(broker.service_url, broker.admin_url, data_dir=logdir / "proxy", progress=log)
            proxy.start(timeout=180)
            for k in range(instances):
                relays.append(NetFault((HOST, proxy.service_port), lifetime_s=time_limit_s + 600,
                                       log=lambda m, k=k: event(f"[slot {k}] {m}")).start())
            event(f"processors connect through relays {', '.join(r.url for r in relays)} (one per instance) "
                  f"-> proxy {proxy.service_url} -> broker {broker.service_url}")
        for k in range(instances):
            fleet.append(start_proc(k))
        if instances > 1:
            event(f"fleet of {instances}: {', '.join(p.name for p in fleet)}")
        gen.start()
        if network:  # the faults are for a fleet at work, not for processes still starting
            warm_end = min(deadline, time.monotonic() + 120)
            while not seen and time.monotonic() < warm_end:
                check_fleet()
                time.sleep(0.5)
            event(f"the fleet is at work {progress()}")
        plan = (["kill"] * kills + ["broker"] * broker_restarts + ["broker-kill"] * broker_kills
                + ["zombie"] * zombies + ["net-stall"] * net_stalls + ["net-reset"] * net_resets
                + ["net-blackhole"] * net_blackholes + ["net-slow"] * net_slows)
        rnd.shuffle(plan)
        if zombie_linger_s is not None and zombies:
            others = [a for a in plan if a != "zombie"]
            for j in range(zombies):
                others.insert(j * (len(others) + j + 1) // zombies, "zombie")
            plan = others
        for action in plan:
            time.sleep(rnd.uniform(*fault_gap_s))
            if time.monotonic() > deadline:
                break
            check_zombies()
            check_fleet()
            if action == "kill":
                k = pick.randrange(len(fleet))
                victim = fleet[k]
                victim.send_signal(signal.SIGKILL)
                victim.p.wait(10)
                victim.log.close()
                res.kills += 1
                fleet[k] = start_proc(k)
                event(f"SIGKILL {victim.name} (pid {victim.p.pid}); restarted as {fleet[k].name} {progress()}")
            elif action.startswith("net-"):
                one = net_scope == "one" or (net_scope == "mixed" and net_faults[action] % 2 == 1)
                net_faults[action] += 1
                slots = [pick.randrange(len(relays))] if one else list(range(len(relays)))
                whom = (f"instance slot {slots[0]} ({fleet[slots[0]].name})" if one
                        else f"every instance ({len(slots)})")
                if action == "net-reset":
                    n_reset = sum(relays[k].reset() for k in slots)
                    res.net_resets += 1
                    event(f"network reset of {whom}: {n_reset} connection(s) closed with an RST {progress()}")
                    continue
                kind, secs = {"net-stall": ("stall", net_stall_s), "net-blackhole": ("black hole", net_blackhole_s),
                              "net-slow": ("slow", net_slow_s)}[action]
                event(f"network {kind} for {secs:.0f}s on {whom} {progress()}")
                for k in slots:
                    if action == "net-stall":
                        relays[k].stall(secs)
                    elif action == "net-blackhole":
                        relays[k].blackhole(secs)
                    else:
                        relays[k].slow(secs, chunk=net_slow_chunk, delay=net_slow_delay_s)
                res.net_stalls += action == "net-stall"
                res.net_blackholes += action == "net-blackhole"
                res.net_slows += action == "net-slow"
                time.sleep(max(0.0, min(secs, deadline - time.monotonic())) + 0.2)
                sts = [r.stats() for r in relays]
                event(f"network {kind} over (relays: {sum(st.open for st in sts)} open, "
                      f"{sum(st.resets for st in sts)} reset, {sum(st.dropped_bytes for st in sts)} bytes dropped "
                      f"so far) {progress()}")
            elif action in ("broker", "broker-kill"):
                if broker.local is None:
                    event("broker restart skipped: not our broker")
                    continue
                hard = action == "broker-kill"
                event(f"broker {'SIGKILL' if hard else 'stop'} {progress()}")
                _restart_broker(broker, hard)
                if hard:
                    res.broker_kills += 1
                else:
                    res.broker_restarts += 1
                event("broker back")
                last_broker_back = time.monotonic()
            else:
                k = pick.randrange(len(fleet))
                zombie = fleet[k]
                zombie.send_signal(signal.SIGSTOP)
                fleet[k] = start_proc(k)
                event(f"SIGSTOP {zombie.name}; replacement {fleet[k].name} started {progress()}")
                time.sleep(pause_s)  # with the default, the zombie's open transaction times out meanwhile
                zombie.send_signal(signal.SIGCONT)
                res.zombies += 1
                event(f"SIGCONT {zombie.name} after {pause_s:.0f}s (zombie resumed next to {fleet[k].name}) "
                      f"{progress()}")
                if zombie_linger_s is None:
                    time.sleep(3)
                    zombie.stop(signal.SIGKILL)
                    event(f"SIGKILL zombie {zombie.name}")
                else:
                    zombies_up.append((time.monotonic(), zombie))
        # The last fault may be a zombie: it runs beside its replacement at least zombie_linger_s.
        linger_end = max((t + (zombie_linger_s or 0) for t, _ in zombies_up), default=0.0)
        while time.monotonic() < min(linger_end, deadline):
            check_zombies()
            check_fleet()
            time.sleep(0.5)
        if zombies_up:
            event(f"zombies {', '.join(z.name for _, z in zombies_up)} still running beside the fleet "
                  f"{', '.join(p.name for p in fleet)} {progress()}")
        if backlog:
            generator.stop.set()
        gen.join(max(0.0, deadline - time.monotonic()))
        confirmed = set(generator.confirmed)
        expected = {(i, k) for i in confirmed for k in range(shape.outputs_of(i))}
        dedup_receipts = sum(1 for i in confirmed if generator.msg_ids.get(i, "").startswith("(-1,-1"))
        event(f"generator done: {generator.produced} produced, {len(confirmed)} confirmed "
              f"({dedup_receipts} with a (-1,-1) receipt), {len(generator.failed)} failed; "
              f"{len(expected)} outputs expected")
        check_fleet()  # the faults are over: from here on nothing is restarted until the drain is judged
        check_zombies()

        # Drain: the fleet as it is must finish every input the topic holds and leave the backlog at 0.
        t_drain = time.monotonic()
        drain_end = min(deadline, t_drain + drain_limit_s)
        held = read_inputs()
        want = expected if held is None else {(i, k) for i, k in expected if i in held}
        if held is not None and len(want) < len(expected):
            event(f"the input topic does not hold {len(confirmed - held)} confirmed inputs; "
                  f"the drain waits for the {len(want)} outputs of the inputs it holds")
        exited: set[str] = set()
        stats: dict | None = None

        def note_exits() -> None:
            for pr in fleet:
                if pr.p.poll() is not None and pr.name not in exited:
                    exited.add(pr.name)
                    res.drain_exits += 1
                    event(f"{pr.name} exited by itself during the drain (code {pr.p.returncode}); not restarted")
            check_zombies()

        while True:
            note_exits()
            if want <= seen:
                stats = _sub_stats(broker.admin_url, inp, shape.partitions > 1, "chaos")
                if _backlog(stats) == 0:
                    res.drain_s = time.monotonic() - t_drain
                    break
            if time.monotonic() >= drain_end:
                break
            time.sleep(0.5)
        res.stranded = len(want - seen)
        if res.drain_s is not None:
            res.backlog_left = 0
            event(f"drained in {res.drain_s:.1f}s: all {len(want)} outputs seen, backlog 0")
        else:
            stats = _sub_stats(broker.admin_url, inp, shape.partitions > 1, "chaos")
            res.backlog_left = _backlog(stats)
            missing = sorted({i for i, _ in want - seen})
            event(f"NOT drained after {time.monotonic() - t_drain:.0f}s: {res.stranded} expected outputs not seen "
                  f"(inputs {_ranges([(i, 0) for i in missing], 12) if missing else '-'}), subscription backlog "
                  f"{res.backlog_left}; consumers: {_consumers(stats)}")
            # Where each live processor waits (its log gets every asyncio task's stack), for the post-mortem.
            for pr in [*fleet, *(z for _, z in zombies_up)]:
                if pr.p.poll() is None:
                    with contextlib.suppress(OSError):
                        os.kill(pr.p.pid, signal.SIGUSR1)
            time.sleep(1.0)
            # Recover as an operator would: stop everything, start the fleet again, wait for the rest.
            for _, z in zombies_up:
                z.stop()
            zombies_up.clear()
            for k, pr in enumerate(fleet):
                if pr.p.poll() is None:
                    pr.stop()
                else:
                    pr.log.close()
                fleet[k] = start_proc(k)
            event(f"stopped every process and restarted the fleet: {', '.join(p.name for p in fleet)} "
                  f"{progress()}")
            while not want <= seen and time.monotonic() < deadline:
                check_fleet()
                time.sleep(0.5)
            event(f"after the restart: {len(want - seen)} of the {res.stranded} stranded outputs still not seen")
        res.timed_out = not want <= seen
        if settle_s is not None:
            time.sleep(settle_s)
        else:
            # The instances run on as in a deployment: long enough after the last broker restart for
            # their commit audit (the transaction timeout, its grace and a check) to find and redo a
            # batch the broker rolled back after its commit (apache/pulsar#20150).
            audit_done = last_broker_back + txn_timeout_ms / 1000 + 30 if last_broker_back else 0.0
            time.sleep(max(min(txn_timeout_ms / 1000 + 2, 20), min(audit_done, deadline) - time.monotonic()))
        if res.drain_s is not None:
            note_exits()
        event(f"output complete: {len(seen.copy() & expected)} of {len(expected)} expected seen")
    finally:
        for pr in procs:
            if pr.p.poll() is None:
                pr.stop()
            elif not pr.log.closed:
                pr.log.close()
        stop_reader.set()
        rd.join(10)
        for r in relays:
            st = r.stats()
            res.net_conns_reset += st.resets
            res.net_dropped_bytes += st.dropped_bytes
            r.close()
        if proxy is not None:
            proxy.stop()

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
    # A ``+redo`` record that names no input re-commits outputs the broker aborted under the batch's
    # own COMMITTED record (which stays, outputs and all): count those outputs once.
    res.outputs_redone = sum(r.outputs.get(out, 0) for r in committed if r.batch_id.endswith(REDO_SUFFIX)
                             and not r.inputs)
    res.committed_outputs = sum(r.outputs.get(out, 0) for r in committed) - res.outputs_redone
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
        for line in _who_committed(dups, generator.msg_ids, records, procs):
            log(f"  {line}")
    return res


def _who_committed(dups: list[tuple[int, int]], msg_ids: dict[int, str], records: list,
                   procs: list[_Proc]) -> list[str]:
    """Which COMMITTED batches list the duplicated inputs, and which process ran them.

    A batch id is ``<job>:<instance>:<seq>``. The process is the one whose log names the instance
    (a warning names its batch), else the ones started before the instance's first ledger record
    (the latest first: a guess, marked with ``?``)."""
    by_msg: dict[str, list[str]] = {}
    first_ms: dict[str, int] = {}
    for r in records:
        inst = r.batch_id.split(":")[1] if r.batch_id.count(":") >= 2 else "?"
        if r.started_at_ms:
            first_ms[inst] = min(first_ms.get(inst, r.started_at_ms), r.started_at_ms)
        if r.kind != "COMMITTED":
            continue
        for ids in r.inputs.values():
            for mid in ids:
                by_msg.setdefault(mid, []).append(r.batch_id)
    logs = {}
    for pr in procs:
        with contextlib.suppress(OSError):
            logs[pr.name] = Path(pr.log.name).read_text(errors="replace")
    batches: Counter[str] = Counter()
    listed = 0
    for i in sorted({i for i, _ in dups}):
        bids = by_msg.get(msg_ids.get(i, "?"), [])
        listed += bool(bids)
        batches.update(bids)
    lines = [f"duplicated inputs listed by COMMITTED ledger records: {listed} of {len({i for i, _ in dups})}"]
    for bid, cnt in batches.most_common(12):
        inst = bid.split(":")[1] if bid.count(":") >= 2 else "?"
        names = [n for n, text in logs.items() if inst in text]
        if not names and inst in first_ms:
            before = sorted((p for p in procs if p.started_ms <= first_ms[inst]), key=lambda p: -p.started_ms)
            names = [f"{p.name}?" for p in before[:2]]
        lines.append(f"  batch {bid}: {cnt} duplicated inputs; instance {inst} ({', '.join(names) or 'unknown'})")
    return lines


def _ranges(keys: list[tuple[int, int]], limit: int | None = None) -> str:
    """Compact listing of input ids: ``10075-10099, 11000-11074`` (the first ``limit`` ranges)."""
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
    if limit is not None and len(parts) > limit:
        return ", ".join(parts[:limit]) + f", ... ({len(parts)} ranges, {len(ids)} ids)"
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
