"""Run the chaos harness in a loop over input shapes on a broker of its own.

    .venv/bin/python tests/chaos_loop.py --runs 20              # all 16 shapes, then again from the first
    .venv/bin/python tests/chaos_loop.py --runs 1 --shapes batched-p1-mod3-dedup-off --broker-kills 0
    # a fleet of 3 on paced live traffic, a zombie paused 5 s that runs on beside its replacement for 60 s
    .venv/bin/python tests/chaos_loop.py --runs 16 --instances 3 --backlog 0 --n 20000 --kills 10 \
        --zombie-pause 5 --zombie-linger 60 --txn-timeout-ms 15000
    # the fleet behind the real Pulsar Proxy with a broken network in between (tests/netfault.py)
    .venv/bin/python tests/chaos_loop.py --runs 4 --shapes batched-p4-mod3-dedup-off --instances 3 --kills 0 \
        --broker-restarts 0 --broker-kills 0 --zombies 0 --net-stalls 2 --net-resets 3 --net-blackholes 1 \
        --net-blackhole-s 75 --txn-timeout-ms 15000

Each run uses fresh namespaces on one LocalBroker (free ports, its own data dir) that the runs
restart cleanly and with SIGKILL. One line per run, a summary table at the end (shape, instances,
faults, confirmed inputs, outputs, lost, duplicated, stranded, seconds to drain); the exit status
is 1 if any run lost, duplicated, stranded or could not account for an output (or did not finish
in time). ``--code-dir`` runs the processors from another checkout (e.g. an older commit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from chaos import ALL_SHAPES, ChaosResult, Shape, run_chaos  # noqa: E402

COLUMNS = ("run", "shape", "instances", "in", "max_entry", "expected", "out", "lost", "dup", "unexp", "stranded",
           "drain_s", "kills", "restarts", "b_kills", "zombies", "skipped", "ledger_ok", "secs", "ok")


@dataclass(frozen=True)
class _Broker:
    service_url: str
    admin_url: str
    local: LocalBroker


def _row(run: int, res: ChaosResult) -> tuple:
    ledger_ok = (res.committed_outputs == res.out and res.committed_inputs == res.sent
                 and res.inputs_committed_twice == 0)
    drain = "-" if res.drain_s is None else f"{res.drain_s:.0f}"
    return (run, res.shape, res.instances, res.sent, res.max_entry, res.expected, res.out, res.lost, res.duplicated,
            res.unexpected, res.stranded, drain, res.kills, res.broker_restarts, res.broker_kills, res.zombies,
            res.guard_skipped, ledger_ok, round(res.seconds), res.ok)


def _table(rows: list[tuple]) -> str:
    cells = [COLUMNS, *[tuple(str(c) for c in r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells)


def _shapes(spec: str) -> list[Shape]:
    if spec == "all":
        return list(ALL_SHAPES)
    by_name = {s.name: s for s in ALL_SHAPES}
    unknown = [n for n in spec.split(",") if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {sorted(by_name)}")
    return [by_name[n] for n in spec.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--shapes", default="all", help="comma-separated shape names, or 'all'")
    ap.add_argument("--n", type=int, default=400_000, help="inputs per run (a cap with --backlog)")
    ap.add_argument("--rate", type=float, default=0, help="inputs/s (0: spread over the chaos plan)")
    ap.add_argument("--backlog", type=int, default=3000,
                    help="keep about this many inputs unprocessed until the plan is done (0: pace by --rate)")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--broker-restarts", type=int, default=2, help="clean restarts per run")
    ap.add_argument("--broker-kills", type=int, default=1, help="SIGKILL restarts per run")
    ap.add_argument("--zombies", type=int, default=1)
    ap.add_argument("--instances", type=int, default=1, help="processors of the job running side by side")
    ap.add_argument("--zombie-pause", type=float, default=None,
                    help="seconds a zombie stays paused (default: the transaction timeout + 3)")
    ap.add_argument("--zombie-linger", type=float, default=None,
                    help="seconds the resumed zombie runs beside its replacement before SIGTERM "
                         "(default: SIGKILL 3 s after resuming)")
    ap.add_argument("--fault-gap", type=float, nargs=2, default=(2.0, 5.0), metavar=("MIN", "MAX"),
                    help="seconds between two faults (uniform)")
    ap.add_argument("--drain-limit", type=float, default=120,
                    help="seconds the fleet, restarted by nothing, has to drain after the last fault")
    ap.add_argument("--net-stalls", type=int, default=0,
                    help="network stalls per run (the processors then connect through a fault relay and the "
                         "Pulsar Proxy)")
    ap.add_argument("--net-resets", type=int, default=0, help="resets (RST) of every processor connection per run")
    ap.add_argument("--net-blackholes", type=int, default=0, help="network black holes per run")
    ap.add_argument("--net-slows", type=int, default=0, help="slow spells (small fragments) per run")
    ap.add_argument("--net-scope", choices=("all", "one", "mixed"), default="all",
                    help="a network fault hits every instance, one, or alternately all and one")
    ap.add_argument("--net-stall-s", type=float, default=10.0)
    ap.add_argument("--net-blackhole-s", type=float, default=75.0)
    ap.add_argument("--net-slow-s", type=float, default=15.0)
    ap.add_argument("--batch-max-messages", type=int, default=100)
    ap.add_argument("--txn-timeout-ms", type=int, default=60000)
    ap.add_argument("--time-limit", type=float, default=1800, help="seconds per run")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--workdir", default=None, help="logs and broker data (default: a new dir in /tmp)")
    ap.add_argument("--code-dir", default=None,
                    help="run processors from a copy of txn and txn_shell (a git archive or clone of an older commit)")
    ap.add_argument("--json", default=None, help="write every run's counts to this file")
    args = ap.parse_args(argv)
    shapes = _shapes(args.shapes)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-loop-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    broker_port, web_port, bookie_port = ports
    local = LocalBroker(workdir / "broker", broker_port=broker_port, web_port=web_port, bookie_port=bookie_port,
                        transaction_coordinators=2, progress=lambda m: print(f"  [broker] {m}", flush=True))
    print(f"chaos loop: {args.runs} run(s) over {len(shapes)} shape(s), workdir {workdir}", flush=True)
    local.start(timeout=300)
    broker = _Broker(local.service_url, local.admin_url, local)
    rows: list[tuple] = []
    results: list[dict] = []
    failed = 0
    try:
        for run in range(args.runs):
            shape = shapes[run % len(shapes)]
            t0 = time.monotonic()
            try:
                if local.pid is None:
                    local.start(timeout=300)
                res = run_chaos(broker, workdir / f"run-{run:02d}", shape=shape, n=args.n, rate=args.rate,
                                backlog=args.backlog, kills=args.kills, broker_restarts=args.broker_restarts,
                                broker_kills=args.broker_kills, zombies=args.zombies, seed=args.seed + run,
                                batch_max_messages=args.batch_max_messages, txn_timeout_ms=args.txn_timeout_ms,
                                time_limit_s=args.time_limit, instances=args.instances,
                                zombie_pause_s=args.zombie_pause, zombie_linger_s=args.zombie_linger,
                                drain_limit_s=args.drain_limit, fault_gap_s=tuple(args.fault_gap),
                                net_stalls=args.net_stalls, net_resets=args.net_resets,
                                net_blackholes=args.net_blackholes, net_slows=args.net_slows,
                                net_stall_s=args.net_stall_s, net_blackhole_s=args.net_blackhole_s,
                                net_slow_s=args.net_slow_s, net_scope=args.net_scope,
                                code_dir=Path(args.code_dir) if args.code_dir else None,
                                log=lambda m: print(f"  {m}", flush=True))
            except Exception as exc:  # a run that cannot finish is a failed run, the loop goes on
                traceback.print_exc()
                res = ChaosResult(shape=shape.name, instances=args.instances, seconds=time.monotonic() - t0,
                                  events=[repr(exc)])
            failed += not res.ok
            rows.append(_row(run, res))
            results.append({**asdict(res), "run": run, "ok": res.ok, "events": res.events[-50:]})
            print(f"RUN {run:02d} {'OK' if res.ok else 'FAIL'} {res.summary()}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    finally:
        local.stop()
    print("\n" + _table(rows))
    total = {k: sum(r[i] for r in rows) for i, k in enumerate(COLUMNS) if k in
             ("in", "expected", "out", "lost", "dup", "unexp", "stranded", "kills", "restarts", "b_kills", "zombies",
              "skipped")}
    print(f"\n{len(rows)} run(s), {failed} failed; totals: {total}")
    if failed == 0:
        shutil.rmtree(workdir / "broker", ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
