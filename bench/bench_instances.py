#!/usr/bin/env python
"""Scale-out of ``pulsar-txn process``: 1, 2 and 4 instances of one job on a 4-partition input.

Run from the repository root::

    .venv/bin/python bench/bench_instances.py [--messages 40000] [--runs 3] [--instances 1,2,4]

By default a throw-away :class:`txn_shell.localbroker.LocalBroker` (temp data dir, free ports) is
started and stopped at the end; pass ``--service-url``/``--admin-url`` to use a running broker
instead (it needs transactions enabled).

Set-up: one input topic with ``--partitions`` (4) partitions, created with
``txn.admin.create_partitioned_topic`` and pre-filled once with ``--messages`` distinct messages of
``--size`` bytes by the official client (batching on, ``initial_sequence_id=1``, a distinct key per
message so every partition gets a share; the broker's ``msgInCounter`` of each partition is
checked). Every run reads it from a new subscription (Earliest), with a new output topic and a new
ledger topic (so new partition fences).

A run of K instances: K subprocesses ``python -m txn_shell.cli process`` with the same
``--subscription``, ``--job`` and ``--ledger-topic`` and the handler
``txn_shell.examples.handlers:upper``, all started at once (Failover subscription and partition
fences: the processor's defaults). The clock starts just before the first process is spawned and
stops when an official-client reader of the output topic (read-committed, started before the
instances) has seen N distinct outputs. Then the instances get SIGTERM. Reported per run:

- msg/s = N / that time (start-up included: every instance imports Python and the client);
- client CPU: user+sys of the instance processes (``/proc/<pid>/stat``), summed, read just before
  the SIGTERM, per 1000 messages; also the part after each instance's start-up line (its imports
  done), and the broker JVM's CPU over the run when the broker is this script's;
- the spread: each instance's COMMITTED ledger records (``txn.delivery.replay.read_ledger``; the
  batch id is ``job:<instance>:<seq>``), how many inputs it committed and on which partitions (the
  keys of a record's ``inputs``), and which instance committed each partition's last batch;
- the instance logs: the processor's last stats line (takeovers, partitions lost, redeliveries,
  aborts), warnings, and the partition takeovers with their claim waits. The instances run the CLI
  through ``python -c`` with the ``txn.fencing`` logger at INFO, so the "took over ... in N s" lines
  are logged (``--plain-cli``: exactly ``python -m txn_shell.cli process``, warnings only);
- correctness: the reader goes on until the output stays idle for 2 s after the instances exited;
  the output must hold exactly N messages, the N distinct upper-cased inputs; the input
  subscription's backlog must be 0, and the ledger's COMMITTED inputs must number N, no input twice.

The configurations run in rotated order in each of ``--runs`` rounds; medians are reported.
The single instance also runs with ``--no-fencing`` when ``pulsar-txn process`` has that flag (it
is looked up in the CLI's parser; without it only fencing on is measured). That flag also makes
the subscription Shared instead of Failover: no fence intents or markers, no takeover claims.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402  (official client)

import txn  # noqa: E402
from txn.admin import admin_request, create_partitioned_topic, topic_path  # noqa: E402
from txn.delivery.batch_ids import parse_processor_batch_id  # noqa: E402
from txn.delivery.ledger import Kind  # noqa: E402
from txn.delivery.replay import read_ledger  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from machine import machine_load, proc_cpu_s  # noqa: E402
from official import official_client  # noqa: E402

T0 = time.monotonic()
NS = "persistent://public/default"
HANDLER = "txn_shell.examples.handlers:upper"
JOB = "bench"
# The CLI with the fencing logger at INFO (``cmd_process`` sets up WARNING logging; a logger's own
# level still lets its INFO records through to the root handler): takeovers and claim waits.
BOOT = ("import logging, sys; logging.getLogger('txn.fencing').setLevel(logging.INFO); "
        "from txn_shell.cli import main; sys.exit(main(sys.argv[1:]))")
STATS_RE = re.compile(r"\[\S+\] batches=(\d+) messages=(\d+) outputs=(\d+) .*?aborts=(\d+) parked=(\d+) "
                      r"duplicates_skipped=(\d+) takeovers=(\d+) partitions_lost=(\d+) redeliveries=(\d+)")
TOOK_RE = re.compile(r"\[(\S+)\] took over (\S+) in ([\d.]+)s \(fence \S+; aborted (\d+)")


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def uniq(prefix: str) -> str:
    return f"{NS}/inst-{prefix}-{uuid.uuid4().hex[:10]}"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt(v: float, digits: int = 0) -> str:
    return "n/a" if v != v else f"{v:,.{digits}f}"


def short_partition(topic: str) -> str:
    m = re.search(r"-partition-(\d+)$", topic)
    return f"p{m.group(1)}" if m else topic


def cli_has_no_fencing() -> bool:
    """Whether ``pulsar-txn process`` takes ``--no-fencing`` (looked up in the CLI's own parser)."""
    from txn_shell.cli import build_parser

    p = build_parser()
    for action in p._subparsers._group_actions if p._subparsers else ():  # noqa: SLF001
        sub = getattr(action, "choices", {}).get("process")
        if sub is not None:
            return any("--no-fencing" in a.option_strings for a in sub._actions)  # noqa: SLF001
    return False


# --------------------------------------------------------------------------- input


def payload(i: int, size: int) -> bytes:
    return (b"m%09d" % i).ljust(size, b"x")


def prefill(url: str, admin: str, topic: str, n: int, size: int, partitions: int) -> tuple[float, list[int]]:
    """Create the partitioned topic and write ``n`` keyed messages (official client, batched)."""
    create_partitioned_topic(admin, topic, partitions)
    client = official_client(url)
    try:
        prod = client.create_producer(topic, block_if_queue_full=True, batching_enabled=True,
                                      batching_max_messages=1000, max_pending_messages=10000,
                                      initial_sequence_id=1)
        t0 = time.perf_counter()
        send = prod.send_async
        for i in range(n):
            send(payload(i, size), None, partition_key=str(i))
        prod.flush()
        dt = time.perf_counter() - t0
        prod.close()
    finally:
        client.close()
    per = []
    for p in range(partitions):
        status, st = admin_request("GET", admin, f"/admin/v2/{topic_path(f'{topic}-partition-{p}')}/stats")
        per.append(int(st.get("msgInCounter", -1)) if status == 200 and isinstance(st, dict) else -1)
    if sum(per) != n:
        raise RuntimeError(f"prefill: the broker counts {per} messages on {topic}'s partitions, expected {n} in all")
    return dt, per


def subscription_backlog(admin: str, topic: str, sub: str) -> dict[str, int | None]:
    """msgBacklog of ``sub`` on each partition (None where the subscription does not exist)."""
    status, body = admin_request("GET", admin, f"/admin/v2/{topic_path(topic)}/partitioned-stats?perPartition=true")
    out: dict[str, int | None] = {}
    if status != 200 or not isinstance(body, dict):
        return out
    for name, st in sorted((body.get("partitions") or {}).items()):
        s = (st.get("subscriptions") or {}).get(sub)
        out[short_partition(name)] = None if s is None else int(s.get("msgBacklog", -1))
    return out


# --------------------------------------------------------------------------- output reader


class OutputReader(threading.Thread):
    """Reads the output topic (official client, read-committed) from the start, in the background.

    ``full`` is set when N distinct outputs were seen (``full_at``: perf_counter then); after
    :meth:`finish` it reads on until the topic stays idle for ``idle_s``, so extra copies count."""

    def __init__(self, url: str, topic: str, n: int, idle_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.n, self.idle_s = n, idle_s
        self.client = official_client(url)
        self.reader = self.client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
        self.full = threading.Event()
        self.full_at = 0.0
        self.total = 0
        self.bad = 0  # payloads that are not an upper-cased input
        self.seen: Counter[int] = Counter()
        self._finish = threading.Event()
        self.error: BaseException | None = None

    def finish(self) -> None:
        self._finish.set()

    def run(self) -> None:
        idle_since: float | None = None
        try:
            while True:
                try:
                    m = self.reader.read_next(timeout_millis=200)
                except pulsar.Timeout:
                    if self._finish.is_set():
                        now = time.monotonic()
                        idle_since = idle_since or now
                        if now - idle_since >= self.idle_s:
                            return
                    continue
                idle_since = None
                d = m.data()
                self.total += 1
                if len(d) >= 10 and d[:1] == b"M" and d[1:10].isdigit() and not any(97 <= c <= 122 for c in d):
                    i = int(d[1:10])
                    self.seen[i] += 1
                    if self.seen[i] == 1 and len(self.seen) == self.n and not self.full.is_set():
                        self.full_at = time.perf_counter()
                        self.full.set()
                else:
                    self.bad += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc
            self.full.set()
        finally:
            try:
                self.reader.close()
            finally:
                self.client.close()


# --------------------------------------------------------------------------- one run


@dataclass
class Instance:
    proc: subprocess.Popen
    log: Path
    ready_at: float | None = None  # perf_counter when it printed its start-up line
    cpu_ready: float | None = None
    cpu_end: float | None = None


@dataclass
class RunResult:
    k: int
    fencing: bool
    seconds: float = float("nan")
    startup_s: float = float("nan")  # spawn -> the last instance's start-up line
    startup_first_s: float = float("nan")  # spawn -> the first instance's start-up line
    cpu_s: float = float("nan")  # instances, whole lifetime up to the stop
    cpu_after_startup_s: float = float("nan")
    broker_cpu_s: float = float("nan")
    # correctness
    out_total: int = 0
    out_distinct: int = 0
    out_bad: int = 0
    backlog_left: dict[str, int | None] = field(default_factory=dict)
    ledger_inputs: int = 0
    ledger_distinct: int = 0
    # spread
    per_instance: dict[str, dict[str, int]] = field(default_factory=dict)  # instance -> partition -> inputs
    last_owner: dict[str, str] = field(default_factory=dict)  # partition -> instance of its last commit
    # logs
    stats: dict[str, int] = field(default_factory=dict)  # summed final stats lines
    takeovers: list[tuple[str, str, float, int]] = field(default_factory=list)  # owner, partition, s, aborted
    warnings: Counter[str] = field(default_factory=Counter)
    exit_codes: list[int | None] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (self.error is None and self.out_total == self.out_distinct and self.out_bad == 0
                and self.ledger_inputs == self.ledger_distinct)


def instance_cmd(args: argparse.Namespace, url: str, topic: str, out: str, sub: str, ledger: str,
                 fencing: bool) -> list[str]:
    head = [sys.executable, "-m", "txn_shell.cli"] if args.plain_cli else [sys.executable, "-c", BOOT]
    cmd = head + ["process", "--service-url", url, "--input", topic, "--output", out, "--subscription", sub,
                  "--job", JOB, "--ledger-topic", ledger, "--handler", HANDLER,
                  "--batch-max-messages", str(args.batch_max_messages),
                  "--batch-max-delay-ms", str(args.batch_max_delay_ms),
                  "--max-inflight-commits", str(args.max_inflight_commits),
                  "--receiver-queue-size", str(args.receiver_queue_size),
                  "--progress-interval", str(args.progress_interval)]
    if not fencing:
        cmd.append("--no-fencing")
    return cmd


def child_env() -> dict[str, str]:
    """This environment without ``PULSAR_TXN_*`` (the broker comes from the flags alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_instances(insts: list[Instance], grace_s: float) -> None:
    for inst in insts:
        if inst.proc.poll() is None:
            inst.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for inst in insts:
        try:
            inst.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            inst.proc.kill()
            inst.proc.wait()


def run_once(args: argparse.Namespace, url: str, admin: str, topic: str, n: int, k: int, fencing: bool,
             log_dir: Path, tag: str, broker_pid: int | None) -> RunResult:
    res = RunResult(k, fencing)
    out, ledger, sub = uniq("out"), uniq("ledger"), f"inst-{uuid.uuid4().hex[:8]}"
    reader = OutputReader(url, out, n)
    reader.start()
    cmd = instance_cmd(args, url, topic, out, sub, ledger, fencing)
    env = child_env()
    insts: list[Instance] = []
    b0 = proc_cpu_s(broker_pid) if broker_pid else None
    t0 = time.perf_counter()
    try:
        for i in range(k):
            path = log_dir / f"{tag}-i{i}.log"
            with open(path, "wb") as f:
                insts.append(Instance(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                                       env=env), path))
        deadline = t0 + args.run_timeout
        while not reader.full.is_set():
            now = time.perf_counter()
            for inst in insts:
                if inst.ready_at is None and b"processing " in inst.log.read_bytes()[:4096]:
                    inst.ready_at, inst.cpu_ready = now, proc_cpu_s(inst.proc.pid)
                if inst.proc.poll() is not None:
                    raise RuntimeError(f"instance {inst.log.name} exited with {inst.proc.returncode} "
                                       f"after {now - t0:.1f} s")
            if now > deadline:
                raise RuntimeError(f"timed out after {args.run_timeout:.0f} s with {len(reader.seen):,} of {n:,} "
                                   "distinct outputs")
            reader.full.wait(0.05)
        if reader.error is not None:
            raise RuntimeError(f"output reader failed: {reader.error!r}")
        res.seconds = reader.full_at - t0
        for inst in insts:
            inst.cpu_end = proc_cpu_s(inst.proc.pid)
        b1 = proc_cpu_s(broker_pid) if broker_pid else None
        if b0 is not None and b1 is not None:
            res.broker_cpu_s = b1 - b0
        ends = [x.cpu_end for x in insts]
        if all(c is not None for c in ends):
            res.cpu_s = sum(ends)  # type: ignore[arg-type]
            if all(x.cpu_ready is not None for x in insts):
                res.cpu_after_startup_s = sum(x.cpu_end - x.cpu_ready for x in insts)  # type: ignore[operator]
        if all(x.ready_at is not None for x in insts):
            res.startup_s = max(x.ready_at for x in insts) - t0  # type: ignore[type-var]
            res.startup_first_s = min(x.ready_at for x in insts) - t0  # type: ignore[type-var]
    except RuntimeError as exc:
        res.error = str(exc)
        progress(f"run {tag}: ERROR {exc}")
    finally:
        stop_instances(insts, args.stop_grace)
        reader.finish()
        reader.join(timeout=60)
    res.exit_codes = [x.proc.returncode for x in insts]
    res.out_total, res.out_distinct, res.out_bad = reader.total, len(reader.seen), reader.bad
    res.backlog_left = subscription_backlog(admin, topic, sub)
    analyse_ledger(res, url, ledger)
    analyse_logs(res, insts)
    return res


def analyse_ledger(res: RunResult, url: str, ledger: str) -> None:
    async def go() -> list:
        async with txn.AsyncClient(url) as client:
            return await read_ledger(client, ledger)

    try:
        records = asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - reported, the run goes on
        res.error = (res.error + "; " if res.error else "") + f"ledger read failed: {exc!r}"
        return
    per: dict[str, Counter[str]] = defaultdict(Counter)
    ids: set[tuple[str, str]] = set()
    for r in records:
        if r.kind != Kind.COMMITTED:
            continue
        b = parse_processor_batch_id(r.batch_id)
        inst = b.instance if b is not None else r.batch_id
        for part, mids in r.inputs.items():
            p = short_partition(part)
            per[inst][p] += len(mids)
            res.ledger_inputs += len(mids)
            ids.update((part, m) for m in mids)
            if mids:
                res.last_owner[p] = inst
    res.ledger_distinct = len(ids)
    res.per_instance = {i: dict(sorted(c.items())) for i, c in per.items()}


def analyse_logs(res: RunResult, insts: list[Instance]) -> None:
    keys = ("batches", "messages", "outputs", "aborts", "parked", "duplicates_skipped", "takeovers",
            "partitions_lost", "redeliveries")
    total = dict.fromkeys(keys, 0)
    for inst in insts:
        text = inst.log.read_text(errors="replace")
        last = None
        for line in text.splitlines():
            m = STATS_RE.search(line)
            if m:
                last = m
            t = TOOK_RE.search(line)
            if t:
                res.takeovers.append((t.group(1).rsplit("-", 1)[-1], short_partition(t.group(2)),
                                      float(t.group(3)), int(t.group(4))))
            if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                # one key per kind of message: strip ids and numbers
                msg = line.split(": ", 1)[-1] if " WARNING " in line or " ERROR " in line else line
                msg = re.sub(r"persistent://\S+", "<topic>", msg)
                msg = re.sub(r"\b[0-9a-f]{8}\b|\(\d+,\d+\)|\d+", "#", msg)
                res.warnings[msg[:160]] += 1
        if last is not None:
            for key, v in zip(keys, last.groups(), strict=True):
                total[key] += int(v)
    res.stats = total


# --------------------------------------------------------------------------- report


def spread_cells(rs: list[RunResult], k: int) -> tuple[str, str]:
    """Per-instance committed inputs (min-max over all runs' instances) and the partitions-per-
    instance pattern of each run (e.g. ``1/1/1/1``; instances that committed nothing count 0)."""
    counts: list[int] = []
    patterns: list[str] = []
    for r in rs:
        insts = sorted(r.per_instance.values(), key=lambda c: -sum(c.values()))
        vals = [sum(c.values()) for c in insts] + [0] * max(k - len(insts), 0)
        counts += vals
        pats = sorted((len(c) for c in insts), reverse=True) + [0] * max(k - len(insts), 0)
        patterns.append("/".join(map(str, pats)))
    if not counts:
        return "n/a", "n/a"
    pat = Counter(patterns)
    return (f"{min(counts):,} / {max(counts):,}",
            ", ".join(f"{p} (x{c})" if c > 1 else p for p, c in sorted(pat.items(), key=lambda x: -x[1])))


def report(args: argparse.Namespace, n: int, configs: list[tuple[int, bool]], results: dict, has_no_fencing: bool,
           per_partition: list[int], own_broker: bool) -> list[str]:
    base = [r for r in results[(1, True)] if r.error is None] if (1, True) in results else []
    ref = median([n / r.seconds for r in base])
    out = ["", f"## pulsar-txn process, instances of one job ({n:,} x {args.size} B messages, "
               f"{args.partitions}-partition input, handler {HANDLER.split(':')[1]}, median of {args.runs} runs)", "",
           "| instances | fencing | runs ok | msg/s | ratio vs 1 instance | start-up s | client CPU ms / 1000 msgs "
           "(after start-up) | broker CPU ms / 1000 msgs | inputs per instance (min / max) | partitions per "
           "instance | takeovers / lost / redeliveries / aborts | output exact |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for k, fencing in configs:
        rs = results[(k, fencing)]
        good = [r for r in rs if r.error is None]
        mps = median([n / r.seconds for r in good])
        cpu = median([r.cpu_s / n * 1e6 for r in good])
        cpu2 = median([r.cpu_after_startup_s / n * 1e6 for r in good])
        bcpu = median([r.broker_cpu_s / n * 1e6 for r in good]) if own_broker else float("nan")
        ins, pats = spread_cells(good, k)
        ev = [sum(r.stats.get(x, 0) for r in rs) for x in ("takeovers", "partitions_lost", "redeliveries", "aborts")]
        exact = sum(1 for r in rs if r.ok and r.out_distinct == n)
        out.append(f"| {k} | {'on (Failover)' if fencing else 'off (Shared)'} | {len(good)}/{len(rs)} | {fmt(mps)} | "
                   f"{mps / ref:.2f}x | {fmt(median([r.startup_s for r in good]), 1)} | {fmt(cpu)} ({fmt(cpu2)}) | "
                   f"{fmt(bcpu)} | {ins} | {pats} | {' / '.join(map(str, ev))} | {exact}/{len(rs)} |")
    out += ["", f"Input: {', '.join(f'p{i} {c:,}' for i, c in enumerate(per_partition))} messages per partition. "
                "msg/s = N / (time from spawning the instances to N distinct committed outputs read back); "
                "start-up = spawn to the last instance's start-up line (Python and client imports done). "
                "Client CPU = user+sys of the instance processes summed (in brackets: after their start-up "
                "lines); broker CPU = the broker JVM over the same span. Inputs per instance = inputs in each "
                "instance's COMMITTED ledger records, min and max over every instance of every run; "
                "partitions per instance = how many partitions each instance committed inputs of, per run. "
                "Takeovers etc. = the instances' last stats lines, summed over the runs.",
            f"Settings: CLI defaults except --batch-max-messages {args.batch_max_messages}, --batch-max-delay-ms "
            f"{args.batch_max_delay_ms}, --max-inflight-commits {args.max_inflight_commits}, --receiver-queue-size "
            f"{args.receiver_queue_size}; Failover subscription and partition fences (the processor's defaults)."]
    if has_no_fencing:
        out.append("Fencing off = `pulsar-txn process --no-fencing`: no partition fences (no intent and marker "
                   "per partition in each transaction, no takeover claims) and a Shared subscription.")
    else:
        out.append("Fencing off: not measured; `pulsar-txn process` has no `--no-fencing` flag.")
    out += ["", "Per run (msg/s; committed inputs per instance and partition; the instance of each partition's "
                "last commit; claim waits):", ""]
    for k, fencing in configs:
        for j, r in enumerate(results[(k, fencing)]):
            head = f"- {k} instance(s), fencing {'on' if fencing else 'off'}, run {j + 1}: "
            if r.error:
                head += f"ERROR {r.error}; "
            else:
                head += (f"{n / r.seconds:,.0f} msg/s ({r.seconds:.1f} s, start-up "
                         f"{r.startup_first_s:.1f}-{r.startup_s:.1f} s), "
                         f"CPU {r.cpu_s / n * 1e6:,.0f} ms/1000; ")
            spread = "; ".join(f"{i}: " + ", ".join(f"{p} {c:,}" for p, c in parts.items())
                               for i, parts in sorted(r.per_instance.items()))
            head += f"[{spread}]; last owner {' '.join(f'{p}={i}' for p, i in sorted(r.last_owner.items()))}"
            if r.takeovers:
                waits = sorted(w for _, _, w, _ in r.takeovers)
                head += (f"; {len(r.takeovers)} takeovers, claim wait median {median(waits):.2f} s, "
                         f"max {waits[-1]:.2f} s, {sum(a for *_, a in r.takeovers)} open txns aborted")
            out.append(head)
            check = (f"output {r.out_total:,} messages, {r.out_distinct:,} distinct of {n:,}"
                     + (f", {r.out_bad} not an upper-cased input" if r.out_bad else "")
                     + f"; ledger COMMITTED inputs {r.ledger_inputs:,} ({r.ledger_distinct:,} distinct); "
                     f"input backlog left {r.backlog_left}; exit codes {r.exit_codes}")
            out.append(f"  - {'OK' if r.ok and r.out_distinct == n else 'NOT EXACT'}: {check}")
            for msg, c in r.warnings.most_common(5):
                out.append(f"  - log x{c}: `{msg}`")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40_000, help="input backlog (N) per run")
    ap.add_argument("--size", type=int, default=100, help="payload size in bytes (at least 10)")
    ap.add_argument("--partitions", type=int, default=4, help="input partitions")
    ap.add_argument("--instances", default="1,2,4", help="instance counts to run")
    ap.add_argument("--runs", type=int, default=3, help="rounds over the instance counts (median reported)")
    ap.add_argument("--warmup", type=int, default=4000, help="messages of one untimed 1-instance run first (0: none)")
    ap.add_argument("--batch-max-messages", type=int, default=100, help="pulsar-txn process (its default: 100)")
    ap.add_argument("--batch-max-delay-ms", type=int, default=100, help="pulsar-txn process (its default: 100)")
    ap.add_argument("--max-inflight-commits", type=int, default=2, help="pulsar-txn process (its default: 2)")
    ap.add_argument("--receiver-queue-size", type=int, default=1000, help="pulsar-txn process (its default: 1000)")
    ap.add_argument("--progress-interval", type=float, default=5.0, help="instances' stats lines (s)")
    ap.add_argument("--run-timeout", type=float, default=240, help="a run fails after this many seconds")
    ap.add_argument("--stop-grace", type=float, default=30, help="seconds after SIGTERM before SIGKILL")
    ap.add_argument("--plain-cli", action="store_true",
                    help="run exactly `python -m txn_shell.cli process` (no INFO log of takeovers)")
    ap.add_argument("--keep-logs", default=None, metavar="DIR", help="write the instance logs here (kept)")
    ap.add_argument("--service-url", help="use this broker instead of starting one")
    ap.add_argument("--admin-url", help="admin URL of --service-url's broker")
    args = ap.parse_args()
    if bool(args.service_url) != bool(args.admin_url):
        ap.error("--service-url and --admin-url go together")
    if args.size < 10:
        ap.error("--size must be at least 10")
    counts = [int(x) for x in args.instances.split(",") if x.strip()]
    if 1 not in counts:
        counts.insert(0, 1)  # the reference
    has_no_fencing = cli_has_no_fencing()
    configs = [(k, True) for k in counts] + ([(1, False)] if has_no_fencing else [])

    broker: LocalBroker | None = None
    data_dir: str | None = None
    log_dir = Path(args.keep_logs) if args.keep_logs else Path(tempfile.mkdtemp(prefix="txnbench-instances-"))
    log_dir.mkdir(parents=True, exist_ok=True)
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
        progress(f"broker: {url} (admin {admin}); {machine_load(own_pid)}")
        progress(f"pulsar-txn process {'has' if has_no_fencing else 'has no'} --no-fencing flag")
        n = args.messages
        if args.warmup:
            wt = uniq("warm")
            prefill(url, admin, wt, args.warmup, args.size, args.partitions)
            r = run_once(args, url, admin, wt, args.warmup, 1, True, log_dir, "warmup", own_pid)
            progress(f"warm-up: {args.warmup:,} messages, 1 instance, {args.warmup / r.seconds:,.0f} msg/s"
                     + (f" (ERROR {r.error})" if r.error else ""))
        topic = uniq("in")
        dt, per_partition = prefill(url, admin, topic, n, args.size, args.partitions)
        progress(f"pre-filled {topic} with {n:,} x {args.size} B in {dt:.1f} s (per partition {per_partition})")
        results: dict[tuple[int, bool], list[RunResult]] = {c: [] for c in configs}
        for run in range(args.runs):
            order = configs[run % len(configs):] + configs[:run % len(configs)]
            for k, fencing in order:
                tag = f"r{run + 1}-k{k}{'' if fencing else '-nofence'}"
                r = run_once(args, url, admin, topic, n, k, fencing, log_dir, tag, own_pid)
                results[(k, fencing)].append(r)
                spread = ", ".join(f"{i}: {'+'.join(parts)} {sum(parts.values()):,}"
                                   for i, parts in sorted(r.per_instance.items()))
                progress(f"run {run + 1}/{args.runs} {k} instance(s) fencing {'on' if fencing else 'off'}: "
                         + (f"{n / r.seconds:,.0f} msg/s ({r.seconds:.1f} s), CPU {r.cpu_s / n * 1e6:,.0f} ms/1000"
                            if r.error is None else f"ERROR {r.error}")
                         + f"; output {r.out_distinct:,}/{r.out_total:,} distinct/total; {spread}; "
                         f"takeovers {r.stats.get('takeovers', 0)}, lost {r.stats.get('partitions_lost', 0)}"
                         + ("" if r.ok and r.out_distinct == n else "; NOT EXACT"))
        lines = report(args, n, configs, results, has_no_fencing, per_partition, own_pid is not None)
        lines += ["", f"Machine: {machine_load(own_pid)}."]
        print("\n".join(lines))
        print()
        progress(f"done; instance logs in {log_dir}; {machine_load(own_pid)}")
        return 0 if all(r.ok and r.out_distinct == n for rs in results.values() for r in rs) else 1
    finally:
        if broker is not None:
            try:
                broker.stop()
            finally:
                if data_dir:
                    shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
