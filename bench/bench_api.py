#!/usr/bin/env python
"""Load test of the control plane (coordinator_api) on loopback, with the broker's admin REST API as peer.

Run from the repository root::

    .venv/bin/python bench/bench_api.py [--rate 200] [--duration 30] [--concurrency 256] [--runs 3]
    .venv/bin/python bench/bench_api.py --quick               # 10 s per target, smaller ledger
    .venv/bin/python bench/bench_api.py --postgres            # PostgreSQL instead of SQLite
    .venv/bin/python bench/bench_api.py --database-url postgresql+psycopg://user@127.0.0.1:5432/db

Steps:

1. start a throw-away :class:`txn_shell.localbroker.LocalBroker` (or use ``--service-url``/``--admin-url``);
2. write a synthetic ledger into a fresh namespace: 3 jobs, 1000 batches each (``--batches``),
   mostly STARTED+COMMITTED, some retried, aborted or parked, the newest few still open,
   spread over the last 10 minutes;
3. start the API as a uvicorn child process (SQLite in a temp dir unless ``--database-url`` or
   ``--postgres``) and wait until its projection holds every record;
4. open-loop load at ``--rate`` for ``--duration`` over a mix of read endpoints (see
   :func:`api_mix`), then the same rate and duration against the broker's own admin REST API
   (Jetty, see :func:`peer_mix`). Each target gets a short unmeasured warm-up first; with
   ``--runs N`` the order alternates and the table shows medians over the runs;
5. a CPU pass: each endpoint alone, 60 requests at 20 req/s, for its server CPU per request.

Latency is measured from each request's *scheduled* send time (a stall is not hidden), service time
from the actual send. Progress goes to stderr every 5 s; the tables go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import httpx  # noqa: E402

from txn.admin import create_namespace  # noqa: E402
from txn.client import AsyncClient  # noqa: E402
from txn.delivery.ledger import LedgerRecord, default_ledger_topic, ensure_ledger_retained, now_ms  # noqa: E402
from txn_shell.localbroker import LocalBroker, free_port  # noqa: E402

from loadgen import Check, LoadResult, Req, run_load, summarize  # noqa: E402
from machine import machine_load, proc_cpu_s  # noqa: E402

T0 = time.monotonic()
JOB_NAMES = ("orders", "payments", "clicks")
#: The resolver would mark the ledger's never-ended (fake) transactions ABORTED after this; a week
#: keeps them OPEN, so every answer stays exact during the run.
RESOLVE_AFTER_MS = 7 * 86400 * 1000


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the ledger


@dataclass
class LedgerInfo:
    """What was written to the ledger, and so what the API must answer."""

    ledger: str
    jobs: list[str]
    records: int = 0
    #: batch id -> (job, status, number of records)
    batches: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: txn id -> (job, state, started_at_ms)
    txns: dict[str, tuple[str, str, int]] = field(default_factory=dict)

    def batch_total(self, job: str | None = None, status: str | None = None) -> int:
        return sum(1 for j, s, _ in self.batches.values()
                   if (job is None or j == job) and (status is None or s == status))

    def txn_total(self, job: str | None = None, state: str | None = None, since: int | None = None) -> int:
        return sum(1 for j, s, t in self.txns.values()
                   if (job is None or j == job) and (state is None or s == state) and (since is None or t >= since))


def make_ledger(ledger: str, jobs: list[str], batches_per_job: int, *, seed: int = 1,
                span_ms: int = 600_000, open_per_job: int = 5) -> tuple[list[LedgerRecord], LedgerInfo]:
    """Records of ``batches_per_job`` batches per job, as the processor writes them, over the last ``span_ms``.

    Per batch: 94 % commit at once (STARTED, COMMITTED), 3 % abort once and commit on attempt 2,
    1 % abort twice and are parked, 2 % end ABORTED (a stopped processor); the newest
    ``open_per_job`` batches of each job are still open (STARTED only).
    """
    rng = random.Random(seed)
    info = LedgerInfo(ledger, list(jobs))
    recs: list[LedgerRecord] = []
    end = now_ms() - 2000
    start = end - span_ms
    step = span_ms / max(batches_per_job, 1)
    next_txn = [10**12 + rng.randrange(10**6), 10**12 + rng.randrange(10**6)]  # no clash with real ones

    def txn_id(seq: int) -> str:
        c = seq % 2  # two coordinators, like a LocalBroker started with transaction_coordinators=2
        next_txn[c] += 1
        return f"({c},{next_txn[c]})"

    seq = 0
    for ji, job in enumerate(jobs):
        instance = f"{seed:x}{ji:x}{rng.randrange(16**6):06x}"
        src = f"persistent://public/default/{job}-in"
        out = f"persistent://public/default/{job}-out"
        config = {"handler": f"handlers:{job}", "output": out, "inputs": [src], "subscription": job,
                  "parking_suffix": "-parked", "ledger_topic": ledger}
        entry = rng.randrange(1000)
        for i in range(batches_per_job):
            batch_id = f"{job}:{instance}:{i + 1}"
            t = int(start + i * step + rng.randrange(int(step) or 1))
            n_in = rng.randrange(20, 101)
            inputs = {src: [f"({ji + 10},{entry + k},-1,-1)" for k in range(n_in)]}
            entry += n_in
            is_open = i >= batches_per_job - open_per_job
            roll = rng.random()
            kind = "open" if is_open else ("commit" if roll < 0.94 else "retry" if roll < 0.97
                                           else "park" if roll < 0.98 else "abort")
            brecs: list[LedgerRecord] = []
            attempts = {"open": 1, "commit": 1, "retry": 2, "park": 2, "abort": 1}[kind]
            for attempt in range(1, attempts + 1):
                tid = txn_id(seq)
                seq += 1
                brecs.append(LedgerRecord(kind="STARTED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempt,
                                          inputs=inputs, started_at_ms=t, config=config))
                if kind == "open":
                    info.txns[tid] = (job, "OPEN", t)
                    break
                dur = int(rng.lognormvariate(3.4, 0.5))  # ~30 ms, a tail to a few hundred
                last = attempt == attempts
                if (kind == "commit" or kind == "retry") and last:
                    brecs.append(LedgerRecord(kind="COMMITTED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempt,
                                              inputs=inputs, outputs={out: n_in}, started_at_ms=t, ended_at_ms=t + dur))
                    info.txns[tid] = (job, "COMMITTED", t)
                else:
                    brecs.append(LedgerRecord(kind="ABORTED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempt,
                                              inputs=inputs, started_at_ms=t, ended_at_ms=t + dur,
                                              error="TimeoutError: handler took too long"))
                    info.txns[tid] = (job, "ABORTED", t)
                t += dur + 5
            status = {"open": "STARTED", "commit": "COMMITTED", "retry": "COMMITTED", "park": "PARKED",
                      "abort": "ABORTED"}[kind]
            if kind == "park":
                tid = txn_id(seq)
                seq += 1
                msg = inputs[src][0]
                brecs.append(LedgerRecord(kind="PARKED", job=job, batch_id=batch_id, txn_id=tid, attempt=attempts,
                                          inputs={src: [msg]}, outputs={src + "-parked": 1}, started_at_ms=t,
                                          ended_at_ms=t + 8, error="ValueError: bad record",
                                          parked_topic=src + "-parked", config=config))
                info.txns[tid] = (job, "COMMITTED", t)
            info.batches[batch_id] = (job, status, len(brecs))
            recs.extend(brecs)
    info.records = len(recs)
    return recs, info


def write_ledger(service_url: str, ledger: str, *, jobs: list[str] | None = None, batches_per_job: int = 1000,
                 seed: int = 1) -> LedgerInfo:
    """Write :func:`make_ledger`'s records to ``ledger`` (keyed by batch id, every receipt awaited)."""
    recs, info = make_ledger(ledger, jobs or list(JOB_NAMES), batches_per_job, seed=seed)

    async def go() -> None:
        async with AsyncClient(service_url) as client:
            await ensure_ledger_retained(client, ledger)
            p = await client.create_producer(ledger, block_if_queue_full=True)
            futs = [await p.send_async(r.to_json(), partition_key=r.batch_id) for r in recs]
            await p.flush()
            await asyncio.wait_for(asyncio.gather(*futs), 120)
            await p.close()

    asyncio.run(go())
    return info


# --------------------------------------------------------------------------- request mixes


def _json_check(fn: Callable[[Any], str | None]) -> Check:
    def check(status: int, body: bytes, ctype: str) -> str | None:
        if "application/json" not in ctype:
            return f"content-type {ctype!r}"
        try:
            doc = json.loads(body)
        except ValueError as exc:
            return f"not JSON: {exc}"
        return fn(doc)
    return check


def _page_check(total: int | None, at_least: int, item_key: str, **equal: str) -> Check:
    """A ``Page``: items with ``item_key``, each matching ``equal``; ``total`` exact (or ``>= at_least``)."""
    def fn(doc: Any) -> str | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list) or not isinstance(doc.get("total"), int):
            return f"not a page: {str(doc)[:200]}"
        if total is not None and doc["total"] != total:
            return f"total {doc['total']}, expected {total}"
        if doc["total"] < at_least:
            return f"total {doc['total']}, expected at least {at_least}"
        for it in doc["items"]:
            if not isinstance(it, dict) or item_key not in it:
                return f"item without {item_key}: {str(it)[:200]}"
            for k, v in equal.items():
                if it.get(k) != v:
                    return f"item {it.get(item_key)} has {k}={it.get(k)!r}, expected {v!r}"
        if len(doc["items"]) != min(doc["limit"], max(0, doc["total"] - doc["offset"])):
            return f"{len(doc['items'])} items on a page of {doc['limit']} from {doc['offset']} of {doc['total']}"
        return None
    return _json_check(fn)


#: Slots per cycle of the control plane's mix (20 requests): endpoint -> weight.
API_WEIGHTS = {
    "GET /transactions": 5, "GET /transactions/{txn_id}": 3, "GET /batches": 3, "GET /batches/{batch_id}": 3,
    "GET /jobs": 1, "GET /jobs/{job}": 2, "GET /transactions/timeseries": 1, "GET /metrics": 1, "GET /health": 1,
}


def _cycle(weights: dict[str, int]) -> list[str]:
    """The weighted endpoints interleaved into one cycle (so each second sees the whole mix)."""
    left = dict(weights)
    out: list[str] = []
    while any(left.values()):
        for name in weights:
            if left[name]:
                out.append(name)
                left[name] -= 1
    return out


def api_mix(info: LedgerInfo, *, seed: int = 7, exclusive: bool = True) -> Callable[[int], Req]:
    """``pick(k)``: the control plane's read mix over ``info``'s ledger, each with a check of the answer.

    ``exclusive``: the database holds only this ledger, so unfiltered totals are exact too (else
    they are checked as lower bounds).
    """
    rng = random.Random(seed)
    jobs = info.jobs
    span = [t for _, _, t in info.txns.values()]
    recent = max(span) - 60_000  # the last minute of the ledger
    any_total = (lambda n: n) if exclusive else (lambda n: None)
    q = urllib.parse.quote

    def txn_list() -> Req:
        j = rng.choice(jobs)
        v = rng.randrange(5)
        if v == 0:
            path, chk = "/transactions?limit=50", _page_check(any_total(len(info.txns)), len(info.txns), "txn_id")
        elif v == 1:
            path = f"/transactions?state=COMMITTED&job={q(j)}&limit=50"
            chk = _page_check(info.txn_total(j, "COMMITTED"), 0, "txn_id", state="COMMITTED", job=j)
        elif v == 2:
            n = info.txn_total(state="ABORTED")
            path, chk = "/transactions?state=ABORTED&limit=20", _page_check(any_total(n), n, "txn_id", state="ABORTED")
        elif v == 3:
            path = f"/transactions?job={q(j)}&since={recent}&limit=100"
            chk = _page_check(info.txn_total(j, since=recent), 0, "txn_id", job=j)
        else:
            off = rng.randrange(0, max(1, info.txn_total(j)))
            path = f"/transactions?job={q(j)}&limit=50&offset={off}"
            chk = _page_check(info.txn_total(j), 0, "txn_id", job=j)
        return Req("GET /transactions", path, chk)

    txn_ids = sorted(info.txns)
    batch_ids = sorted(info.batches)

    def txn_by_id() -> Req:
        tid = rng.choice(txn_ids)
        _, state, _ = info.txns[tid]

        def fn(doc: Any) -> str | None:
            if not isinstance(doc, dict) or doc.get("txn_id") != tid or not isinstance(doc.get("records"), list):
                return f"not transaction {tid}: {str(doc)[:200]}"
            if doc.get("state") != state or not doc["records"]:
                return f"{tid}: state {doc.get('state')} with {len(doc['records'])} records, expected {state}"
            return None
        return Req("GET /transactions/{txn_id}", f"/transactions/{q(tid, safe='(),')}", _json_check(fn))

    def batch_list() -> Req:
        j = rng.choice(jobs)
        v = rng.randrange(3)
        if v == 0:
            path = f"/batches?job={q(j)}&limit=50&offset={rng.randrange(0, max(1, info.batch_total(j) - 50))}"
            chk = _page_check(info.batch_total(j), 0, "batch_id", job=j)
        elif v == 1:
            n = info.batch_total(status="PARKED")
            path, chk = "/batches?status=PARKED&limit=50", _page_check(any_total(n), n, "batch_id", status="PARKED")
        else:
            path = f"/batches?job={q(j)}&status=ABORTED&limit=50"
            chk = _page_check(info.batch_total(j, "ABORTED"), 0, "batch_id", job=j, status="ABORTED")
        return Req("GET /batches", path, chk)

    def batch_by_id() -> Req:
        bid = rng.choice(batch_ids)
        job, status, nrec = info.batches[bid]

        def fn(doc: Any) -> str | None:
            if not isinstance(doc, dict) or doc.get("batch_id") != bid or not isinstance(doc.get("records"), list):
                return f"not batch {bid}: {str(doc)[:200]}"
            if (doc.get("job"), doc.get("status"), len(doc["records"])) != (job, status, nrec):
                return f"{bid}: {doc.get('status')} with {len(doc['records'])} records, expected {status}/{nrec}"
            return None
        return Req("GET /batches/{batch_id}", f"/batches/{q(bid, safe='')}", _json_check(fn))

    def jobs_list() -> Req:
        def fn(doc: Any) -> str | None:
            if not isinstance(doc, list):
                return f"not a list: {str(doc)[:200]}"
            got = {d.get("job"): d.get("total_batches") for d in doc if isinstance(d, dict)}
            want = {j: info.batch_total(j) for j in jobs}
            if (got != want) if exclusive else any(got.get(j) != n for j, n in want.items()):
                return f"jobs {got}, expected {want}"
            return None
        return Req("GET /jobs", "/jobs", _json_check(fn))

    def job_detail() -> Req:
        j = rng.choice(jobs)

        def fn(doc: Any) -> str | None:
            if not isinstance(doc, dict) or doc.get("job") != j or not isinstance(doc.get("recent_batches"), list):
                return f"not job {j}: {str(doc)[:200]}"
            total = info.batch_total(j)
            if doc.get("total_batches") != total or len(doc["recent_batches"]) != min(20, total):
                return f"job {j}: {doc.get('total_batches')} batches, {len(doc['recent_batches'])} recent"
            return None
        return Req("GET /jobs/{job}", f"/jobs/{q(j, safe='')}", _json_check(fn))

    def timeseries() -> Req:
        def fn(doc: Any) -> str | None:
            if not isinstance(doc, dict) or doc.get("bucket_ms") != 10_000 or not isinstance(doc.get("points"), list):
                return f"not a time series: {str(doc)[:200]}"
            keys = {"t_ms", "OPEN", "COMMITTED", "ABORTED"}
            if len(doc["points"]) != 60 or any(set(p) != keys for p in doc["points"]):
                return f"{len(doc['points'])} points, expected 60 with t_ms/OPEN/COMMITTED/ABORTED"
            return None
        return Req("GET /transactions/timeseries", "/transactions/timeseries?window_s=600&bucket_s=10",
                   _json_check(fn))

    def metrics() -> Req:
        def check(status: int, body: bytes, ctype: str) -> str | None:
            text = body.decode(errors="replace")
            if not ctype.startswith("text/plain") or "# TYPE pulsartxn_transactions_total counter" not in text:
                return f"not the metrics text ({ctype}): {text[:200]}"
            return None
        return Req("GET /metrics", "/metrics", check)

    def health() -> Req:
        def fn(doc: Any) -> str | None:
            if not isinstance(doc, dict) or doc.get("status") != "ok":
                return f"not healthy: {str(doc)[:300]}"
            n = sum(p.get("records", 0) for p in doc.get("projection", []) if p.get("topic") == info.ledger)
            return None if n == info.records else f"projection holds {n} records, expected {info.records}"
        return Req("GET /health", "/health", _json_check(fn))

    makers = {"GET /transactions": txn_list, "GET /transactions/{txn_id}": txn_by_id, "GET /batches": batch_list,
              "GET /batches/{batch_id}": batch_by_id, "GET /jobs": jobs_list, "GET /jobs/{job}": job_detail,
              "GET /transactions/timeseries": timeseries, "GET /metrics": metrics, "GET /health": health}
    cycle = _cycle(API_WEIGHTS)
    return lambda k: makers[cycle[k % len(cycle)]]()


#: Slots per cycle of the broker's mix (20 requests): endpoint -> weight.
PEER_WEIGHTS = {
    "GET /admin/v3/transactions/coordinatorStats": 4, "GET /admin/v2/persistent/{ns}": 4,
    "GET /admin/v2/persistent/{ns}/{topic}/stats": 4, "GET /admin/v2/namespaces/public": 3,
    "GET /admin/v2/tenants": 2, "GET /admin/v2/clusters": 2, "GET /admin/v2/namespaces/{ns}": 1,
}


def peer_mix(namespace: str, ledger: str) -> Callable[[int], Req]:
    """``pick(k)``: read endpoints of the broker's admin REST API that answer from its metadata and state."""
    local = ledger.rsplit("/", 1)[-1]

    def kind(t: type, must: Callable[[Any], bool] = lambda _: True) -> Check:
        return _json_check(lambda d: None if isinstance(d, t) and must(d) else f"unexpected answer: {str(d)[:200]}")

    reqs = {
        "GET /admin/v3/transactions/coordinatorStats": Req(
            "GET /admin/v3/transactions/coordinatorStats", "/admin/v3/transactions/coordinatorStats",
            kind(dict, lambda d: len(d) >= 1)),
        "GET /admin/v2/persistent/{ns}": Req(
            "GET /admin/v2/persistent/{ns}", f"/admin/v2/persistent/{namespace}", kind(list, lambda d: ledger in d)),
        "GET /admin/v2/persistent/{ns}/{topic}/stats": Req(
            "GET /admin/v2/persistent/{ns}/{topic}/stats", f"/admin/v2/persistent/{namespace}/{local}/stats",
            kind(dict, lambda d: "subscriptions" in d)),
        "GET /admin/v2/namespaces/public": Req(
            "GET /admin/v2/namespaces/public", "/admin/v2/namespaces/public", kind(list, lambda d: namespace in d)),
        "GET /admin/v2/tenants": Req("GET /admin/v2/tenants", "/admin/v2/tenants", kind(list, lambda d: "public" in d)),
        "GET /admin/v2/clusters": Req("GET /admin/v2/clusters", "/admin/v2/clusters",
                                      kind(list, lambda d: len(d) >= 1)),
        "GET /admin/v2/namespaces/{ns}": Req("GET /admin/v2/namespaces/{ns}", f"/admin/v2/namespaces/{namespace}",
                                             kind(dict)),
    }
    cycle = _cycle(PEER_WEIGHTS)
    return lambda k: reqs[cycle[k % len(cycle)]]


# --------------------------------------------------------------------------- processes and the machine


class ApiProcess:
    """``uvicorn coordinator_api.app:app`` as a child process on a free loopback port."""

    def __init__(self, service_url: str, admin_url: str, db_url: str, ledger: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = dict(os.environ)
        self.env.update({
            "PULSAR_TXN_SERVICE_URL": service_url, "PULSAR_TXN_ADMIN_URL": admin_url,
            "PULSAR_TXN_DATABASE_URL": db_url, "PULSAR_TXN_LEDGER_TOPICS": ledger,
            "PULSAR_TXN_RESOLVE_AFTER_MS": str(RESOLVE_AFTER_MS), "PULSAR_TXN_API_TOKEN": uuid.uuid4().hex,
        })
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "coordinator_api.app:app", "--host", "127.0.0.1",
                 "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code in (200, 503):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"API not up after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def wait_caught_up(self, info: LedgerInfo, timeout: float = 600) -> float:
        """Wait until the projection holds every record of ``info``; returns the seconds it took."""
        t0 = time.monotonic()
        last_log = t0
        n = 0
        while time.monotonic() - t0 < timeout:
            try:
                doc = httpx.get(self.url + "/health", timeout=30).json()
                n = sum(p["records"] for p in doc.get("projection", []) if p["topic"] == info.ledger)
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if n >= info.records:
                return time.monotonic() - t0
            if time.monotonic() - last_log >= 5:
                progress(f"projection: {n:,}/{info.records:,} records")
                last_log = time.monotonic()
            time.sleep(0.5)
        raise RuntimeError(f"projection holds {n} of {info.records} records after {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)



@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throw-away PostgreSQL database (tests/postgres.py) as an SQLAlchemy psycopg URL."""
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import postgres_cluster

    with postgres_cluster() as url:
        yield url.replace("postgresql://", "postgresql+psycopg://", 1)


# --------------------------------------------------------------------------- measuring and reporting


@dataclass
class Measured:
    """One measured run against one target, with the CPU its server used and how busy the machine was."""

    result: LoadResult
    server_cpu_s: float | None
    machine_busy: float  # fraction of all CPUs busy during the run
    loadavg: float  # 1-minute load average at the end


def measure(name: str, url: str, pick: Callable[[int], Req], server_pid: int | None, args: argparse.Namespace,
            rate: float, *, warmup: bool = True) -> Measured:
    """One warm-up (unless ``warmup`` is False) and one measured run at ``rate`` against ``url``."""
    if warmup and args.warmup > 0:
        progress(f"{name}: warm-up {args.warmup:g} s at {rate:g} req/s (not measured)")
        w = asyncio.run(run_load(url, pick, rate=rate, duration=args.warmup, concurrency=args.concurrency,
                                 max_requests=args.max_requests, timeout=args.timeout, progress=None))
        if w.errors or w.dropped:
            progress(f"{name}: warm-up had {w.errors} errors, {w.dropped} dropped: {w.first_errors(3)}")
    progress(f"{name}: {rate:g} req/s for {args.duration:g} s, at most {args.concurrency} in flight")
    cpu0, (b0, t0) = proc_cpu_s(server_pid), machine_busy()
    res = asyncio.run(run_load(url, pick, rate=rate, duration=args.duration, concurrency=args.concurrency,
                               max_requests=args.max_requests, timeout=args.timeout, progress=progress,
                               label=name))
    cpu1, (b1, t1) = proc_cpu_s(server_pid), machine_busy()
    s = res.summary()
    progress(f"{name}: {s['answered']}/{s['requests']} answered, {s['errors']} errors, {s['dropped']} dropped; "
             f"p50 {s['latency_p50_ms']:.2f} ms, p99 {s['latency_p99_ms']:.2f} ms, max {s['latency_max_ms']:.1f} ms")
    for e in [e for e in res.first_errors(1000) if "dropped" not in e][:5]:
        progress(f"{name}: error {e}")
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    return Measured(res, cpu, (b1 - b0) / max(t1 - t0, 1), os.getloadavg()[0])


def idle_cpu(api_pid: int, broker_pid: int | None, seconds: float = 3.0) -> tuple[float | None, float | None]:
    """CPU milliseconds per second each server uses with no requests (background work: the
    projection's reader and resolver; the broker's bookie, load manager, ...)."""
    a0, b0 = proc_cpu_s(api_pid), proc_cpu_s(broker_pid)
    time.sleep(seconds)
    a1, b1 = proc_cpu_s(api_pid), proc_cpu_s(broker_pid)
    return (None if a0 is None or a1 is None else (a1 - a0) * 1000 / seconds,
            None if b0 is None or b1 is None else (b1 - b0) * 1000 / seconds)


def cpu_by_endpoint(name: str, url: str, pick: Callable[[int], Req], pid: int | None, idle_ms_per_s: float | None,
                    *, per_endpoint: int = 60, rate: float = 20.0) -> dict[str, float]:
    """Server CPU ms per request of each endpoint alone: ``per_endpoint`` requests of it at ``rate``
    (below saturation), the server's idle CPU over the same time subtracted. /proc counts CPU in
    10 ms ticks, and a JVM's idle CPU wanders, so the broker needs more requests per endpoint."""
    if pid is None:
        return {}
    by: dict[str, list[Req]] = {}
    for k in range(100_000):  # bounded: the mix's cycle brings every endpoint within a few hundred
        r = pick(k)
        by.setdefault(r.endpoint, []).append(r)
        if k >= 20 and all(len(v) >= per_endpoint for v in by.values()):
            break
    out: dict[str, float] = {}
    for ep, reqs in by.items():
        reqs = reqs[:per_endpoint]
        c0, t0 = proc_cpu_s(pid), time.monotonic()
        res = asyncio.run(run_load(url, lambda i, rs=reqs: rs[i], rate=rate, duration=len(reqs) / rate,
                                   max_requests=len(reqs), progress=None))
        c1, t1 = proc_cpu_s(pid), time.monotonic()
        if c0 is None or c1 is None or res.errors or res.dropped:
            progress(f"{name}: CPU pass of {ep} failed: {res.first_errors(2)}")
            continue
        out[ep] = max(0.0, (c1 - c0) * 1000 - (idle_ms_per_s or 0.0) * (t1 - t0)) / len(reqs)
    progress(f"{name}: server CPU ms/request by endpoint: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()))
    return out


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or v != v else f"{v:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    return "n/a" if not (a == a and b == b) or b <= 0 else f"{a / b:.2f}"


def overall_rows(api: list[Measured], peer: list[Measured],
                 idle: tuple[float | None, float | None]) -> list[tuple[str, float, float, bool]]:
    """(label, control plane, broker, lower is better) medians over the runs."""
    def m(ms: list[Measured], key: str) -> float:
        return med([x.result.summary()[key] for x in ms])

    def cpu(ms: list[Measured]) -> float:
        return med([x.server_cpu_s * 1000 / max(x.result.summary()["answered"], 1)
                    for x in ms if x.server_cpu_s is not None])

    rows: list[tuple[str, float, float, bool]] = [("achieved req/s (answers / time to the last answer)",
                                                   m(api, "achieved_rps"), m(peer, "achieved_rps"), False)]
    for p in ("p50", "p90", "p99", "max"):
        rows.append((f"latency {p} (ms, from the scheduled send)", m(api, f"latency_{p}_ms"),
                     m(peer, f"latency_{p}_ms"), True))
    for p in ("p50", "p99"):
        rows.append((f"service time {p} (ms, from the actual send)", m(api, f"service_{p}_ms"),
                     m(peer, f"service_{p}_ms"), True))
    rows.append(("send lag p99 (ms; this generator's own lateness)", m(api, "send_lag_p99_ms"),
                 m(peer, "send_lag_p99_ms"), True))
    rows.append(("server CPU per request (ms; uvicorn process vs broker JVM)", cpu(api), cpu(peer), True))
    rows.append(("server CPU while idle (ms per second, measured before the runs)",
                 float("nan") if idle[0] is None else idle[0], float("nan") if idle[1] is None else idle[1], True))
    rows.append(("load generator CPU per request (ms; this process)",
                 med([x.result.client_cpu_s * 1000 / max(x.result.sent, 1) for x in api]),
                 med([x.result.client_cpu_s * 1000 / max(x.result.sent, 1) for x in peer]), True))
    return rows


@dataclass
class RateResult:
    """Every measured run at one rate."""

    rate: float
    api: list[Measured] = field(default_factory=list)
    peer: list[Measured] = field(default_factory=list)


CPU_PASS = {"control plane": (60, 20.0), "broker admin": (300, 100.0)}  # requests per endpoint, req/s


def print_report(args: argparse.Namespace, db_label: str, rr: RateResult, idle: tuple[float | None, float | None],
                 cpu_eps: tuple[dict[str, float], dict[str, float]], machine_start: str) -> None:
    api, peer = rr.api, rr.peer
    runs = len(api)
    print()
    print(f"## Control plane ({db_label}) vs the broker's admin REST API: open loop at {rr.rate:g} req/s for "
          f"{args.duration:g} s each, at most {args.concurrency} in flight"
          + (f" (median of {runs} runs)" if runs > 1 else ""))
    print()
    print("| metric | control plane | broker admin REST (Jetty) | ratio |")
    print("|---|---:|---:|---:|")
    for label, a, b, _ in overall_rows(api, peer, idle):
        print(f"| {label} | {fmt(a)} | {fmt(b)} | {ratio(a, b)} |")
    counts = []
    for ms in (api, peer):
        planned = sum(x.result.planned for x in ms)
        sent = sum(x.result.sent for x in ms)
        errors = sum(x.result.errors for x in ms)
        dropped = sum(x.result.dropped for x in ms)
        counts.append(f"{sent:,}/{planned:,} sent, {errors} errors, {dropped:,} dropped")
    print(f"| requests{' (all runs)' if runs > 1 else ''}: sent/planned, wrong or failed answers, dropped by the cap "
          f"| {counts[0]} | {counts[1]} | |")
    busy_api, busy_peer = med([x.machine_busy * 100 for x in api]), med([x.machine_busy * 100 for x in peer])
    print(f"| machine CPU busy during the run (all {os.cpu_count()} CPUs, every process) | {fmt(busy_api, 0)} % | "
          f"{fmt(busy_peer, 0)} % | |")
    print()
    for name, ms, cpu, key in (("Control plane", api, cpu_eps[0], "control plane"),
                               ("Broker admin REST", peer, cpu_eps[1], "broker admin")):
        n, r = CPU_PASS[key]
        print(f"### {name} at {rr.rate:g} req/s, per endpoint" + (f" (all {runs} runs pooled)" if runs > 1 else ""))
        print()
        print("| endpoint | requests | errors | dropped | p50 ms | p90 ms | p99 ms | max ms | service p50 ms "
              f"| server CPU ms/request (alone, {r:g} req/s) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        samples = [s for x in ms for s in x.result.samples]
        start = min(x.result.start for x in ms)
        for ep in ms[0].result.endpoints():
            s = summarize([x for x in samples if x.endpoint == ep], start, start + 1)
            print(f"| `{ep}` | {s['requests']} | {s['errors']} | {s['dropped']} | {fmt(s['latency_p50_ms'])} | "
                  f"{fmt(s['latency_p90_ms'])} | {fmt(s['latency_p99_ms'])} | {fmt(s['latency_max_ms'], 1)} | "
                  f"{fmt(s['service_p50_ms'])} | {fmt(cpu.get(ep))} |")
        print()
    print(f"machine at the start: {machine_start}; now: {machine_load(None)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="200", help="requests per second (open loop); a comma-separated list runs "
                                               "each rate in turn on the same broker and API, one table each")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of measured load per target and run")
    ap.add_argument("--concurrency", type=int, default=256, help="cap on requests in flight (beyond it: dropped)")
    ap.add_argument("--max-requests", type=int, default=100_000, help="refuse runs planning more requests")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-request timeout (s)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="unmeasured seconds at the rate before each target (the JVM's JIT needs some)")
    ap.add_argument("--runs", type=int, default=1, help="measured runs per target (order alternates; medians)")
    ap.add_argument("--batches", type=int, default=1000, help="ledger batches per job (3 jobs)")
    ap.add_argument("--quick", action="store_true",
                    help="10 s per target, 200 batches per job, 1 s warm-up, no CPU pass")
    ap.add_argument("--no-cpu-pass", dest="cpu_pass", action="store_false",
                    help="skip the pass that measures each endpoint's server CPU alone (about 50 s)")
    ap.add_argument("--service-url", help="use this broker instead of starting one")
    ap.add_argument("--admin-url", help="admin URL of --service-url's broker")
    ap.add_argument("--database-url", help="SQLAlchemy URL of the API's database (default: SQLite in a temp dir); "
                                           "postgresql:// is read as postgresql+psycopg://")
    ap.add_argument("--postgres", action="store_true", help="start a throw-away PostgreSQL (tests/postgres.py)")
    ap.add_argument("--json", type=Path, help="write every figure to this JSON file")
    args = ap.parse_args()
    if bool(args.service_url) != bool(args.admin_url):
        ap.error("--service-url and --admin-url go together")
    if args.database_url and args.postgres:
        ap.error("--database-url and --postgres exclude each other")
    if args.quick:
        args.duration, args.batches, args.warmup, args.cpu_pass = 10.0, 200, 1.0, False
    try:
        rates = [float(r) for r in str(args.rate).split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rate: not a number or list of numbers: {args.rate!r}")
    if not rates or min(rates) <= 0:
        ap.error("--rate must be positive")
    if round(max(rates) * args.duration) > args.max_requests:
        ap.error(f"{max(rates):g} req/s for {args.duration:g} s is more than --max-requests {args.max_requests}")

    broker: LocalBroker | None = None
    api: ApiProcess | None = None
    tmp = Path(tempfile.mkdtemp(prefix="txnbench-api-"))
    url, admin = args.service_url, args.admin_url
    with contextlib.ExitStack() as stack:
        try:
            if url is None:
                ports: set[int] = set()
                while len(ports) < 3:
                    ports.add(free_port())
                bp, wp, kp = ports
                broker = LocalBroker(tmp / "broker", broker_port=bp, web_port=wp, bookie_port=kp,
                                     transaction_coordinators=2, progress=progress)
                progress("starting a local Pulsar broker (about 40 s)...")
                broker.start(timeout=300)
                url, admin = broker.service_url, broker.admin_url
            db_url = args.database_url
            if args.postgres:
                progress("starting a throw-away PostgreSQL cluster")
                db_url = stack.enter_context(postgres())
            if db_url is None:
                db_url = f"sqlite:///{tmp}/api.db"
            db_url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
            db_label = "PostgreSQL" if db_url.startswith("postgresql") else "SQLite" if db_url.startswith(
                "sqlite") else db_url.split(":", 1)[0]
            machine_start = machine_load(broker.pid if broker else None)
            progress(f"broker {url} (admin {admin}); database {db_label}; machine: {machine_start}")

            ns = f"public/bench-api-{uuid.uuid4().hex[:8]}"
            create_namespace(admin, ns)
            ledger = default_ledger_topic(f"persistent://{ns}/out")
            tag = uuid.uuid4().hex[:4]
            jobs = [f"{j}-{tag}" for j in JOB_NAMES]
            t = time.monotonic()
            info = write_ledger(url, ledger, jobs=jobs, batches_per_job=args.batches)
            kinds = Counter(s for _, s, _ in info.batches.values())
            progress(f"ledger {ledger}: {info.records:,} records, {len(info.batches):,} batches "
                     f"({dict(kinds)}), {len(info.txns):,} transactions, written in {time.monotonic() - t:.1f} s")

            api = ApiProcess(url, admin, db_url, ledger, tmp / "api.log")
            progress(f"starting the API at {api.url} (uvicorn, 1 process)")
            api.start()
            took = api.wait_caught_up(info)
            progress(f"projection caught up: {info.records:,} records in {took:.1f} s")
            assert api.proc is not None

            # Exclusive unless the database was given (it may hold other ledgers).
            api_pick = api_mix(info, exclusive=args.database_url is None)
            peer_pick = peer_mix(ns, ledger)
            idle = idle_cpu(api.proc.pid, broker.pid if broker else None)
            progress(f"idle CPU: control plane {fmt(idle[0])} ms/s, broker {fmt(idle[1])} ms/s")
            broker_pid = broker.pid if broker else None
            results: list[RateResult] = []
            for rate in rates:
                rr = RateResult(rate)
                results.append(rr)
                targets = [("control plane", api.url, api_pick, api.proc.pid, rr.api),
                           ("broker admin", admin, peer_pick, broker_pid, rr.peer)]
                for run in range(args.runs):
                    order = targets if run % 2 == 0 else targets[::-1]
                    for name, base, pick, pid, out in order:
                        label = f"{name} run {run + 1}/{args.runs}" if args.runs > 1 else name
                        out.append(measure(label, base, pick, pid, args, rate, warmup=run == 0))
            cpu_eps: tuple[dict[str, float], dict[str, float]] = ({}, {})
            if args.cpu_pass:
                progress("CPU pass: each endpoint alone (control plane: 60 requests at 20 req/s; broker: "
                         "300 at 100 req/s)")
                cpu_eps = (cpu_by_endpoint("control plane", api.url, api_pick, api.proc.pid, idle[0],
                                           per_endpoint=CPU_PASS["control plane"][0],
                                           rate=CPU_PASS["control plane"][1]),
                           cpu_by_endpoint("broker admin", admin, peer_pick, broker_pid, idle[1],
                                           per_endpoint=CPU_PASS["broker admin"][0],
                                           rate=CPU_PASS["broker admin"][1]))
            for rr in results:
                print_report(args, db_label, rr, idle, cpu_eps, machine_start)
            if args.json:
                write_json(args, db_label, info, results, idle, cpu_eps, machine_start)
                progress(f"figures written to {args.json}")
            every = [x for rr in results for x in rr.api + rr.peer]
            # Wrong answers (an HTTP status other than 200, or a failed check) fail the run; timeouts
            # and drops are what an overloaded server does, and are in the tables.
            bad = sum(1 for x in every for s in x.result.samples if s.status != 0 and s.error is not None)
            dropped = sum(x.result.dropped for x in every)
            if dropped:
                progress(f"{dropped} requests dropped by the in-flight cap: a server did not keep up, and its "
                         "percentiles cover only the requests sent")
            failed = sum(x.result.errors for x in every) - bad
            if failed:
                progress(f"{failed} requests got no answer in {args.timeout:g} s (timeouts or connection errors)")
            progress("done" + (f"; {bad} WRONG answers" if bad else ""))
            return 1 if bad else 0
        finally:
            if api is not None:
                api.stop()
            if broker is not None:
                broker.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(args: argparse.Namespace, db_label: str, info: LedgerInfo, results: list[RateResult],
               idle: tuple[float | None, float | None], cpu_eps: tuple[dict[str, float], dict[str, float]],
               machine_start: str) -> None:
    def one(x: Measured) -> dict[str, Any]:
        r = x.result
        return {"overall": r.summary(), "endpoints": {ep: r.summary(ep) for ep in r.endpoints()},
                "server_cpu_s": x.server_cpu_s, "client_cpu_s": r.client_cpu_s, "machine_busy": x.machine_busy,
                "loadavg_1m": x.loadavg, "max_inflight_seen": r.max_inflight_seen, "connections": r.connections,
                "first_errors": r.first_errors(10)}

    doc = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "database": db_label, "ledger": {"records": info.records, "batches": len(info.batches),
                                         "transactions": len(info.txns)},
        "machine_start": machine_start, "machine_end": machine_load(None),
        "idle_cpu_ms_per_s": {"control_plane": idle[0], "broker_admin": idle[1]},
        "cpu_ms_per_request_alone": {"control_plane": cpu_eps[0], "broker_admin": cpu_eps[1]},
        "rates": [{"rate": rr.rate,
                   "medians": [{"metric": label, "control_plane": a, "broker_admin": b}
                               for label, a, b, _ in overall_rows(rr.api, rr.peer, idle)],
                   "control_plane": [one(x) for x in rr.api], "broker_admin": [one(x) for x in rr.peer]}
                  for rr in results],
    }
    args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
