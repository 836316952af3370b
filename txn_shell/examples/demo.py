"""``pulsar-txn demo``: a Spark exactly-once job, a failure, a poison message, a replay, and the proof.

1. the local broker (or ``--service-url``), a namespace of the run's own (it keeps its topics' data
   for a day, so they can be read after the run);
2. the Spark job (``spark_jobs.jobs.demo_job``: windowed counts and sums per key over two input
   topics, one transaction per micro-batch) and the control plane (uvicorn, SQLite in the work
   dir, an API token made for the run), each a child process logging to the work dir;
3. generated events, in two phases: the first carries a row that fails its batch once (an
   injected transient fault: the retry commits); the second a refund the job has a bug on (a
   poison message: its batch is narrowed down to it, and it is parked);
4. "the bug is fixed" (its flag file is removed) and the parked batch is replayed through the
   control plane's REST API;
5. the output topic read with the official client: merged per window and key, the aggregates
   must equal those computed from the generated events, exactly.

Every step prints one line with its timing; the summary comes from the API (``/jobs``,
``/batches``, ``/transactions``). ``--json FILE`` also writes it as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from txn.admin import AdminError, admin_request, create_namespace, set_namespace_retention
from txn.delivery.batch_ids import is_narrowed_from
from txn.delivery.ledger import default_ledger_topic

from ..localbroker import BrokerError, LocalBroker, cache_dir
from . import demo_data as data
from .demo_services import Child, ControlPlane, DemoError, previous_api, stop_pid, tail, wait_for

JOB = "demo-windowed-counts"
SUBSCRIPTION = "demo"
DEFAULT_API_PORT = 8765
#: The run's namespace keeps its topics' data this long (and up to this many MB per topic), so they
#: can be read after the run whatever was acknowledged.
DEMO_RETENTION_MINUTES = 24 * 60
DEMO_RETENTION_MB = 1024
#: Attempts of a failing batch before the processor narrows it down (the injected fault fails one once).
MAX_ATTEMPTS = 2
#: Runs of the replay before giving up. The control plane opens the replay's transaction before it runs
#: the transform, and on a busy machine its Spark can take longer to start than the transaction's timeout;
#: the next run finds that Spark up.
REPLAY_TRIES = 3


@dataclass
class DemoOptions:
    """What ``pulsar-txn demo`` was asked for."""

    service_url: str | None = None  # an existing broker (else the local one is started)
    admin_url: str | None = None
    work_dir: Path | None = None  # default: <cache>/demo
    keep_running: bool = False
    json_path: Path | None = None
    api_port: int | None = None
    broker_timeout: float = 240
    wait_timeout: float = 300  # bound of each waiting step
    per_topic: int = 200
    batch_max_messages: int = 200
    seed: int = 7


@dataclass
class Step:
    """The line a step prints when it is done."""

    detail: str = ""


class Progress:
    """One line per step: ``[elapsed]  n/N title: detail (step time)``."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total = total
        self.out = out
        self.t0 = time.monotonic()
        self.n = 0

    def _line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[Step]:
        self.n += 1
        s = Step()
        t = time.monotonic()
        try:
            yield s
        except BaseException as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            self._line(f"{self.n:2d}/{self.total} {title}: {why} after {time.monotonic() - t:.1f}s")
            raise
        self._line(f"{self.n:2d}/{self.total} {title}: {s.detail} ({time.monotonic() - t:.1f}s)")


@dataclass
class Run:
    """Names and state of one demo run."""

    id: str
    namespace: str
    inputs: list[str]
    output: str
    ledger: str
    work: Path
    flag: Path
    fault: Path
    events: list[data.Event] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _short(text: str | None, n: int = 110) -> str:
    """The telling line of an error (Spark's carry a JVM stack trace)."""
    text = (text or "").strip()
    for marker in ("injected fault:", "refunds are not supported:"):
        if marker in text:
            text = text[text.rindex(marker):]
            break
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= n else line[: n - 3] + "..."


class Demo:
    """One run of the demo; :meth:`run` returns the process exit code."""

    def __init__(self, opts: DemoOptions, broker: LocalBroker | None, out: TextIO = sys.stdout) -> None:
        self.opts = opts
        self.broker = broker
        self.out = out
        self.progress = Progress(10 if opts.keep_running else 11, out)
        self.started_broker = False
        self.service_url = opts.service_url or (broker.service_url if broker else "")
        self.admin_url = opts.admin_url or (broker.admin_url if broker else "")
        rid = uuid.uuid4().hex[:6]
        ns = f"public/pulsar-txn-demo-{rid}"
        work = (opts.work_dir or cache_dir() / "demo").expanduser().resolve()
        output = f"persistent://{ns}/window-totals"
        self.run_ = Run(rid, ns, [f"persistent://{ns}/web-sales", f"persistent://{ns}/store-sales"], output,
                        default_ledger_topic(output), work, work / "bug.flag", work / "fault.armed")
        self.job: Child | None = None
        self.api: ControlPlane | None = None

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        r = self.run_
        print(f"pulsar-txn demo {r.id}: Spark exactly-once windowed counts, an injected failure, a poison message, "
              f"a replay\nwork dir: {r.work}", file=self.out, flush=True)
        ok = False
        try:
            self._steps()
            ok = bool(r.summary.get("ok"))
        except Exception as exc:  # noqa: BLE001 - any failure ends the run with a clear message and exit code 1
            msg = str(exc) if isinstance(exc, DemoError) else f"{type(exc).__name__}: {exc}"
            r.summary.update(ok=False, error=msg)
            print(f"\nerror: {msg}", file=sys.stderr, flush=True)
        finally:
            self._shutdown(ok)
            if self.opts.json_path is not None:
                self.opts.json_path.parent.mkdir(parents=True, exist_ok=True)
                self.opts.json_path.write_text(json.dumps(r.summary, indent=2, sort_keys=True) + "\n")
        print(f"\nresult: {'OK' if ok else 'FAILED'}", file=self.out, flush=True)
        return 0 if ok else 1

    def _steps(self) -> None:
        from spark_jobs.jobs import demo_job

        r, p, o = self.run_, self.progress, self.opts
        with p.step("broker") as s:
            s.detail = self._broker()
        with p.step("namespace") as s:
            try:
                create_namespace(self.admin_url, r.namespace)
                # The run's topics stay readable after it (the parking topic the replay acknowledged,
                # the output): the default retention keeps nothing every subscription acknowledged.
                set_namespace_retention(self.admin_url, r.namespace, DEMO_RETENTION_MINUTES, DEMO_RETENTION_MB)
            except (AdminError, OSError) as exc:
                raise DemoError(f"cannot create namespace {r.namespace} at {self.admin_url}: {exc}") from exc
            names = [t.rsplit("/", 1)[1] for t in r.inputs]
            s.detail = f"{r.namespace}: {' + '.join(names)} -> {r.output.rsplit('/', 1)[1]}"
        self._prepare_work_dir()
        # Both children see the flags, and run Spark alike: the control plane replays with the job's
        # transform on a Spark of its own, configured by the same spark-defaults.conf.
        conf = r.work / "spark-conf"
        conf.mkdir(exist_ok=True)
        (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in demo_job.SMALL_BATCH_CONF.items()))
        env = dict(os.environ)
        env.update({demo_job.BUG_FLAG_ENV: str(r.flag), demo_job.FAULT_FILE_ENV: str(r.fault), "TZ": "UTC",
                    "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf),
                    "PYTHONUNBUFFERED": "1"})
        r.flag.write_text("the job rejects refunds: remove this file to fix the bug\n")
        r.fault.write_text("armed: the row marked demo.inject=fault fails its batch once\n")
        with p.step("Spark job") as s:
            self.job = Child("Spark job", [
                sys.executable, "-m", "spark_jobs.jobs.demo_job", "--service-url", self.service_url,
                *[a for t in r.inputs for a in ("--input", t)], "--output", r.output, "--subscription", SUBSCRIPTION,
                "--job", JOB, "--master", "local[2]", "--batch-max-messages", str(o.batch_max_messages),
                "--batch-max-delay-ms", "500", "--max-attempts", str(MAX_ATTEMPTS)],
                env, r.work / "spark-job.log", r.work)
            self.job.start()
            s.detail = (f"{demo_job.TRANSFORM} on local[2] starting (pid {self.job.pid}, log {self.job.log}); "
                        f"one transaction per micro-batch of <= {o.batch_max_messages}")
        with p.step("control plane") as s:
            s.detail = self._control_plane(env)
        assert self.api is not None and self.job is not None
        api, job = self.api, self.job

        def check() -> None:
            job.check_alive()
            api.check_alive()

        base = data.base_time_ms()
        r.summary["base_ms"] = base
        first = data.phase_one(o.seed, base, o.per_topic)
        with p.step("phase 1 published") as s:
            data.publish(self.service_url, r.inputs, first)
            r.events.extend(first)
            pairs = len(data.expected_aggregates(first))
            s.detail = (f"{len(first)} sales events ({o.per_topic} per topic, {pairs} window/key pairs over "
                        f"{data.WINDOW_S}s windows); one is marked for the injected fault")
        with p.step("phase 1 committed") as s:
            wait_for(f"{len(first)} committed inputs (the Spark job starts in 10-60s)",
                     lambda: self._committed_inputs(len(first)), o.wait_timeout, interval=1, check=check)
            batches = self._batches()
            retried = [b for b in batches if b["status"] == "COMMITTED" and b["attempts"] > 1]
            if not retried:
                raise DemoError(f"the injected fault did not make a batch retry: {self._brief(batches)}")
            b = retried[0]
            s.detail = (f"{len(first)} events in {len(batches)} batches; batch {b['batch_id']} aborted once "
                        f"({_short(b['error'], 70)}) and committed on attempt {b['attempts']}")
        second = data.phase_two(o.seed, base)
        with p.step("phase 2 (poison)") as s:
            data.publish(self.service_url, r.inputs, second)
            r.events.extend(second)
            want = len(r.events) - 1
            parked = wait_for("the poison to be parked and everything else committed",
                              lambda: self._parked(want), o.wait_timeout, interval=1, check=check)
            subs = [b for b in self._batches() if is_narrowed_from(b["batch_id"], parked["batch_id"])]
            narrowed = f", was narrowed ({len(subs)} sub-batches)" if subs else ""
            s.detail = (f"{len(second)} more events, one a refund the job's bug rejects; its batch "
                        f"{parked['batch_id']} failed {MAX_ATTEMPTS} times{narrowed} and the refund was parked "
                        f"on {(parked['parked_topic'] or '').rsplit('/', 1)[-1]} ({_short(parked['error'], 60)})")
        with p.step("Spark job stopped") as s:
            code = job.stop(timeout=90)
            stats = self._job_stats()
            if code != 0:
                raise DemoError(f"the Spark job exited with status {code}; its log {job.log} ends:\n{tail(job.log)}")
            s.detail = f"exit 0 (SIGTERM); its own count: {stats}"
        with p.step("bug fixed, replay via REST") as s:
            s.detail = self._replay(parked["batch_id"], check=api.check_alive)
        with p.step("exactly-once check") as s:
            s.detail = self._verify()
        self._print_summary()

    # ---------------------------------------------------------------- steps

    def _broker(self) -> str:
        if self.broker is not None:
            b = self.broker
            b.progress = lambda msg: print(f"          broker: {msg}", file=self.out, flush=True)
            try:
                self.started_broker = b.start(timeout=self.opts.broker_timeout)
            except BrokerError as exc:
                raise DemoError(f"the local broker did not start: {exc}") from exc
            how = "started" if self.started_broker else "already running"
            return f"{b.service_url}, admin {b.admin_url} ({how}; log {b.log_file})"
        try:
            status, body = admin_request("GET", self.admin_url, "/admin/v2/clusters")
        except OSError as exc:
            raise DemoError(f"the broker's admin API at {self.admin_url} is not reachable: {exc}") from exc
        if status != 200:
            raise DemoError(f"the broker's admin API at {self.admin_url} answered {status}: {body}")
        return f"using {self.service_url}, admin {self.admin_url} (clusters {body})"

    def _prepare_work_dir(self) -> None:
        w = self.run_.work
        w.mkdir(parents=True, exist_ok=True)
        pid = previous_api(w / "api.pid")
        if pid is not None:
            print(f"          stopping the control plane a previous demo left running (pid {pid})", file=self.out)
            stop_pid(pid)
        for name in ("api.db", "api.db-wal", "api.db-shm", "api.log", "api.pid", "api.token", "spark-job.log",
                     "bug.flag", "fault.armed"):
            (w / name).unlink(missing_ok=True)

    def _control_plane(self, env: dict[str, str]) -> str:
        r = self.run_
        port = self.opts.api_port or (DEFAULT_API_PORT if _port_free(DEFAULT_API_PORT) else _free_port())
        token = secrets.token_urlsafe(18)
        settings = {"service_url": self.service_url, "admin_url": self.admin_url,
                    "database_url": f"sqlite:///{r.work / 'api.db'}", "ledger_topics": r.ledger,
                    "discover_interval_s": "1",
                    # The control plane replays only registered jobs, with the code and topics named here.
                    "jobs": json.dumps({JOB: {"transform": "spark_jobs.jobs.demo_job:transform", "output": r.output,
                                              "parked_topics": [f"{t}-parked" for t in r.inputs]}})}
        self.api = ControlPlane(port, token, settings, env, r.work / "api.log", r.work, sys.executable)
        self.api.start()
        (r.work / "api.pid").write_text(f"{self.api.pid}\n")
        tf = r.work / "api.token"
        tf.write_text(token + "\n")
        tf.chmod(0o600)
        self.api.wait_ready(timeout=120)
        return f"{self.api.url} (pid {self.api.pid}, SQLite {r.work / 'api.db'}); API token for this run: {token}"

    def _job_row(self) -> dict[str, Any] | None:
        assert self.api is not None
        return next((j for j in self.api.get("/jobs") if j["job"] == JOB), None)

    def _committed_inputs(self, want: int) -> bool | None:
        j = self._job_row()
        got = j["inputs_committed"] if j else 0
        if got > want:
            raise DemoError(f"the ledger shows {got} committed inputs, more than the {want} published")
        return True if got == want else None

    def _batches(self) -> list[dict[str, Any]]:
        assert self.api is not None
        page = self.api.get(f"/batches?job={JOB}&limit=1000")
        if page["total"] > len(page["items"]):
            raise DemoError(f"more batches than expected: {page['total']}")
        return page["items"]

    def _brief(self, batches: list[dict[str, Any]]) -> str:
        return ", ".join(f"{b['batch_id']}={b['status']}/{b['attempts']}" for b in batches) or "no batches"

    def _parked(self, want_inputs: int) -> dict[str, Any] | None:
        assert self.api is not None
        page = self.api.get(f"/batches?job={JOB}&status=PARKED")
        if not page["items"] or not self._committed_inputs(want_inputs):
            return None
        if page["total"] != 1:
            raise DemoError(f"{page['total']} batches were parked, expected the poison's only")
        return page["items"][0]

    def _job_stats(self) -> str:
        assert self.job is not None
        try:
            lines = self.job.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        for line in reversed(lines):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    st = json.loads(line)
                    return ", ".join(f"{k} {v}" for k, v in st.items())
        return "(no stats in its log)"

    def _replay(self, batch_id: str, check: Any) -> str:
        import urllib.parse

        assert self.api is not None
        api, r = self.api, self.run_
        r.flag.unlink(missing_ok=True)
        path = f"/batches/{urllib.parse.quote(batch_id, safe='')}"
        failures: list[str] = []
        for _ in range(REPLAY_TRIES):
            # A failed replay may be requested again; a repeated POST of a running or finished one
            # returns that replay and starts nothing.
            status, body = api.request("POST", path + "/replay", auth=True)
            if status != 202:
                raise DemoError(f"POST {path}/replay answered {status}: {body}")
            rid = body["replay_id"]

            def done(rid: str = rid) -> dict[str, Any] | None:
                rep = api.get(f"/replays/{rid}")
                return rep if rep["status"] in ("succeeded", "noop", "failed") else None

            rep = wait_for(f"replay {rid} (the control plane runs the job's transform on a Spark of its own)", done,
                           self.opts.wait_timeout, interval=1, check=check)
            if rep["status"] != "failed":
                break
            failures.append(_short(rep["message"], 90))
        if rep["status"] != "succeeded":
            raise DemoError(f"replay {rid} of batch {batch_id} {rep['status']}: {rep['message']}; "
                            f"the control plane's log {api.log} ends:\n{tail(api.log)}")
        wait_for(f"batch {batch_id} to show REPLAYED", lambda: True if api.get(path)["status"] == "REPLAYED" else None,
                 60, check=check)
        r.summary["replay"] = {**{k: rep[k] for k in ("replay_id", "batch_id", "status", "txn_id", "messages", "runs")},
                               "failed_runs": failures}
        retried = (f"; {len(failures) + 1} runs: the first failed ({_short(failures[0], 60)}), e.g. while the control "
                   "plane's Spark started") if failures else ""
        return (f"flag removed; POST /batches/{batch_id}/replay with the token: {rep['status']}, "
                f"{rep['messages']} message in transaction {rep['txn_id']}{retried}")

    def _verify(self) -> str:
        r = self.run_
        assert self.api is not None
        job = self._job_row()
        if job is None:
            raise DemoError(f"GET /jobs does not list {JOB}")
        batches = self._batches()
        aborted_txns = self.api.get(f"/transactions?job={JOB}&state=ABORTED&limit=1")["total"]
        committed = [b for b in batches if b["status"] == "COMMITTED"]
        counts = {
            "committed": len(committed),
            "committed_after_retry": sum(1 for b in committed if b["attempts"] > 1),
            "aborted": sum(1 for b in batches if b["status"] == "ABORTED"),
            "parked": sum(1 for b in batches if b["parked_topic"]),
            "replayed": sum(1 for b in batches if b["status"] == "REPLAYED"),
            "total": len(batches),
        }
        expected = data.expected_aggregates(r.events)
        raw = data.read_outputs(self.service_url, r.output, job["outputs_committed"], timeout_s=120)
        chk = data.check_outputs(raw, expected, job["outputs_committed"])
        ok = (chk.passed and counts["parked"] == 1 and counts["replayed"] == 1
              and counts["committed_after_retry"] == 1 and job["inputs_committed"] == len(r.events))
        r.summary.update(
            ok=ok, run=r.id, namespace=r.namespace, inputs=r.inputs, output=r.output, ledger_topic=r.ledger, job=JOB,
            seed=self.opts.seed, per_topic=self.opts.per_topic, max_attempts=MAX_ATTEMPTS, events=len(r.events),
            batches=counts, aborted_transactions=aborted_txns, inputs_committed=job["inputs_committed"],
            outputs_committed=job["outputs_committed"], jobs_batches_by_status=job["batches"],
            commit_p50_ms=job["commit_p50_ms"], exactly_once=chk.as_dict(),
            dashboard=f"{self.api.url}/", api_url=self.api.url, api_pid=self.api.pid,
            api_token_file=str(r.work / "api.token"), work_dir=str(r.work), kept_running=self.opts.keep_running,
        )
        if not chk.passed:
            problems = chk.missing[:3] + chk.unexpected[:3] + chk.wrong[:3]
            raise DemoError(f"exactly-once check FAILED: {len(raw)} output messages (ledger: {chk.ledger_outputs}), "
                            f"{chk.events_counted} events counted of {chk.events}, {chk.unreadable} unreadable; "
                            f"{'; '.join(problems)}")
        return (f"the official client read {len(raw)} partial aggregates from {r.output.rsplit('/', 1)[1]} "
                f"(the ledger's committed outputs: {chk.ledger_outputs}); merged, all {chk.windows_keys} window/key "
                f"counts and sums equal the generator's ({chk.events} events, each counted once)")

    def _print_summary(self) -> None:
        s = self.run_.summary
        b = s["batches"]
        lines = [
            "",
            "summary (from the control plane's /jobs, /batches and /transactions)",
            f"  events generated        {s['events']} on 2 topics; {s['inputs_committed']} inputs committed "
            f"(including the replayed refund)",
            f"  batches committed       {b['committed']} ({b['committed_after_retry']} after the injected fault "
            f"aborted its first attempt)",
            f"  batches aborted         {b['aborted']} (sub-batches holding the refund while its batch was narrowed); "
            f"{s['aborted_transactions']} aborted transactions in all",
            f"  batches parked          {b['parked']}",
            f"  batches replayed        {b['replayed']} (via POST /batches/{{id}}/replay)",
            f"  exactly once            {'passed' if s['exactly_once']['passed'] else 'FAILED'}: "
            f"{s['exactly_once']['windows_keys']} window/key aggregates exact, {s['exactly_once']['output_messages']} "
            f"output messages = the ledger's {s['exactly_once']['ledger_outputs']}",
            f"  dashboard               {s['dashboard']}  (API token in {s['api_token_file']})"
            + ("" if self.opts.keep_running else "; stopped at the end, --keep-running keeps it"),
        ]
        print("\n".join(lines), file=self.out, flush=True)

    # ------------------------------------------------------------- shutdown

    def _shutdown(self, ok: bool) -> None:
        """Stop the Spark job; stop the control plane and the broker we started unless --keep-running."""
        if self.job is not None and self.job.alive():
            self.job.stop(timeout=60)
        keep = self.opts.keep_running
        if keep:
            lines = ["", "kept running (--keep-running):"]
            if self.api is not None and self.api.alive():
                lines.append(f"  control plane  {self.api.url}/  pid {self.api.pid}; stop it with: "
                             f"kill {self.api.pid}")
            if self.broker is not None:
                lines.append(f"  broker         {self.service_url}; stop it with: pulsar-txn broker stop")
            print("\n".join(lines), file=self.out, flush=True)
            return
        try:
            with self.progress.step("shut down") as s:
                done = []
                if self.api is not None and self.api.alive():
                    self.api.stop(timeout=30)
                    (self.run_.work / "api.pid").unlink(missing_ok=True)
                    done.append("control plane stopped")
                if self.broker is not None and self.started_broker:
                    self.broker.stop()
                    done.append("broker stopped")
                elif self.broker is not None:
                    done.append("the broker was already running: left as it was")
                s.detail = "; ".join(done) or "nothing to stop"
        except Exception as exc:  # noqa: BLE001 - reported; the run's outcome is already decided
            print(f"error while shutting down: {exc}", file=sys.stderr, flush=True)


def run_demo(opts: DemoOptions, broker: LocalBroker | None = None, out: TextIO = sys.stdout) -> int:
    """Run the demo (``broker``: the local broker to start, unless ``opts.service_url``); the exit code."""
    if opts.service_url and not opts.admin_url:
        raise ValueError("admin_url is required with service_url")
    return Demo(opts, None if opts.service_url else broker, out).run()
