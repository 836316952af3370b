"""``pulsar-txn api | txns | batches | jobs`` against the real control plane, on ledger data from real processor runs.

One module-wide data set: two jobs processed by ``pulsar-txn process`` in a fresh namespace, each
with a poison message, so each has one PARKED batch. ``poisonjob`` uses ``poison_aware`` (its replay
fails again); ``flagjob`` uses ``txn_shell.examples.handlers:poison_while_flagged``, which fails only while a flag
file exists, so its replay fails, then succeeds once the file is gone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

import txn
from txn.admin import create_namespace
from txn.delivery.ledger import LedgerRecord, now_ms
from txn_shell import cli
from txn_shell.examples.handlers import POISON_FLAG_ENV as FLAG_ENV
from txn_shell.localbroker import free_port

from api_server import TOKEN, ApiServer
from peer import read_n, read_until_sentinel

TESTS = Path(__file__).resolve().parent
STOPPED = re.compile(r"stopped: (\d+) batches, (\d+) messages, (\d+) aborts, (\d+) parked")
POISON_JOB, FLAG_JOB = "poisonjob", "flagjob"
POISON_INPUT = [b"a0", b"a1", b"a2", b"a3", b"a4", b"poison-a5", b"a6", b"a7", b"a8", b"a9", b"a10", b"a11"]
FLAG_INPUT = [b"b0", b"b1", b"poison-b2", b"b3", b"b4"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PULSAR_TXN_API_URL", "PULSAR_TXN_API_TOKEN")}
    env.update(extra)
    return env


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The console script in a child process (the real thing, but ~1 s of imports on a busy machine)."""
    return subprocess.run([sys.executable, "-m", "txn_shell.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or _env())


def _call(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``txn_shell.cli.main(args)`` in this process, with stdout and stderr captured and ``env`` set (and no
    ``PULSAR_TXN_API_URL`` / ``PULSAR_TXN_API_TOKEN`` unless given): the same code path, without the start-up."""
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in ("PULSAR_TXN_API_URL", "PULSAR_TXN_API_TOKEN", *env)}
    for k in saved:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@dataclass
class Run:
    """What one ``pulsar-txn process`` run reported."""

    batches: int
    messages: int
    aborts: int
    parked: int


@dataclass
class World:
    api: ApiServer
    official: pulsar.Client
    service_url: str
    admin_url: str
    ns: str
    ledger: str
    flag: Path
    runs: dict[str, Run]
    parked: dict[str, str]  # job -> parked batch id (from the parking topic)
    outputs: dict[str, str]  # job -> output topic

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """``pulsar-txn ARGS --api-url <the API>`` (``--token`` if given); no token from the environment."""
        extra = ["--api-url", self.api.url] + (["--token", token] if token else [])
        return _call(*args, *extra)

    def json(self, *args: str, **kw: Any) -> Any:
        r = self.cli(*args, "--json", **kw)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        assert r.stderr == ""
        return json.loads(r.stdout)


def _process(broker: Any, job: str, inp: str, out: str, ledger: str, handler: str,
             env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "txn_shell.cli", "process", "--service-url", broker.service_url, "--input", inp,
         "--output", out, "--subscription", f"{job}-sub", "--handler", handler, "--job", job,
         "--ledger-topic", ledger, "--batch-max-messages", "20", "--batch-max-delay-ms", "300",
         "--max-attempts", "2", "--exit-when-idle-ms", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ledger_size(official: pulsar.Client, ledger: str) -> int:
    reader = official.create_reader(ledger, pulsar.MessageId.earliest)
    n = 0
    try:
        while reader.has_message_available():
            reader.read_next(timeout_millis=10000)
            n += 1
    finally:
        reader.close()
    return n


def _parked_batch(official: pulsar.Client, inp: str) -> str:
    # Not acked: once every subscription acked it, the broker (retention none) may delete the ledger replays read.
    c = official.subscribe(inp + "-parked", "peek", initial_position=pulsar.InitialPosition.Earliest)
    try:
        m = c.receive(timeout_millis=60000)
        return m.properties()["pulsar-txn.batch_id"]
    finally:
        c.close()


@pytest.fixture(scope="module")
def world(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("cli-api")
    ns = f"public/cliapi-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    p = f"persistent://{ns}/"
    ledger = p + "ledger"
    flag = tmp / "fail.flag"
    flag.touch()
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    api = None
    try:
        jobs = {POISON_JOB: (POISON_INPUT, "txn_shell.examples.handlers:poison_aware"),
                FLAG_JOB: (FLAG_INPUT, "txn_shell.examples.handlers:poison_while_flagged")}
        procs = {}
        outputs = {}
        for job, (payloads, handler) in jobs.items():
            inp, out = p + f"{job}-in", p + f"{job}-out"
            outputs[job] = out
            prod = official.create_producer(inp, batching_enabled=False)
            for d in payloads:
                prod.send(d)
            prod.close()
            procs[job] = (inp, _process(broker, job, inp, out, ledger, handler,
                                        _env(PYTHONPATH=_pythonpath(), **{FLAG_ENV: str(flag)})))
        runs, parked = {}, {}
        for job, (inp, proc) in procs.items():
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            m = STOPPED.search(err)
            assert m is not None, err
            runs[job] = Run(*map(int, m.groups()))
            parked[job] = _parked_batch(official, inp)
        records = _ledger_size(official, ledger)
        registry = {job: {"handler": handler, "output": outputs[job], "parked_topics": [p + f"{job}-in-parked"]}
                    for job, (_, handler) in jobs.items()}
        api = ApiServer(broker, f"sqlite:///{tmp}/api.db", tmp / "api.log", ledger_topics=[ledger], jobs=registry,
                        extra_env={"PYTHONPATH": _pythonpath(), FLAG_ENV: str(flag),
                                   "PULSAR_TXN_RESOLVE_AFTER_MS": "2000"}).start()

        def projected() -> bool:
            proj = api.get("/health")["projection"]
            return bool(proj) and proj[0]["records"] + proj[0]["skipped"] == records
        api.wait_for(projected, timeout=120)
        yield World(api, official, broker.service_url, broker.admin_url, ns, ledger, flag, runs, parked, outputs)
    finally:
        if api is not None:
            api.stop()
        official.close()


# --------------------------------------------------------------------------- helpers over the outputs


def _cols(line: str) -> list[str]:
    """A table row's cells (columns are at least two spaces apart; cells never contain two spaces)."""
    return re.split(r" {2,}", line.strip())


def _fields(text: str) -> dict[str, str]:
    """The ``key  value`` block at the top of a ``show`` output."""
    out = {}
    for line in text.split("\n\n")[0].splitlines():
        k, v = re.split(r" {2,}", line, maxsplit=1)
        out[k] = v
    return out


def _records_kinds(text: str) -> list[str]:
    """The KIND column of the ``ledger records:`` table of a ``show`` output."""
    table = text.split("\nledger records:\n", 1)[1].splitlines()
    assert _cols(table[0]) == ["KIND", "TXN ID", "ATTEMPT", "IN", "OUT", "PUBLISHED", "DURATION", "ERROR"]
    return [_cols(r)[0] for r in table[1:]]


# --------------------------------------------------------------------------- tests without a server


def test_usage_and_connection_errors() -> None:
    r = _run("txns", "list", "--limit", "0", "--api-url", "http://127.0.0.1:9")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == "pulsar-txn txns list: error: argument --limit: must be between 1 and 1000"
    r = _call("batches", "list", "--status", "DONE")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == ("pulsar-txn batches list: error: argument --status: 'DONE': one of "
                                         "STARTED, COMMITTED, ABORTED, PARKED, REPLAYED")
    r = _call("txns")
    assert r.returncode == 2 and "required: txns_command" in r.stderr
    port = free_port()
    r = _run("jobs", "--api-url", f"http://127.0.0.1:{port}")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"error: cannot reach the control plane at http://127.0.0.1:{port}: connection refused\n"
    # The URL defaults to $PULSAR_TXN_API_URL.
    r = _call("batches", "show", "x", PULSAR_TXN_API_URL=f"http://127.0.0.1:{port}/")
    assert r.returncode == 1
    assert r.stderr == f"error: cannot reach the control plane at http://127.0.0.1:{port}: connection refused\n"


def test_api_command_flags_override_the_environment(broker: Any, tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    db, wrong_db = tmp_path / "flag.db", tmp_path / "env.db"
    ledger = f"persistent://public/default/cliapi-empty-{uuid.uuid4().hex[:8]}"
    env = _env(PULSAR_TXN_ADMIN_URL=f"http://127.0.0.1:{dead}", PULSAR_TXN_DATABASE_URL=f"sqlite:///{wrong_db}",
               PULSAR_TXN_SERVICE_URL="pulsar://127.0.0.1:9")
    proc = subprocess.Popen(
        [sys.executable, "-m", "txn_shell.cli", "api", "--port", str(port), "--service-url", broker.service_url,
         "--admin-url", broker.admin_url, "--database-url", f"sqlite:///{db}", "--ledger-topics", ledger,
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        health = None
        while health is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the API did not answer /health in 90s"
            r = _call("jobs", "--api-url", url)
            if r.returncode == 0:
                assert r.stdout == "no jobs in the ledger yet\n"
                health = json.loads(urllib_get(url + "/health"))
            else:
                assert "connection refused" in r.stderr, r.stderr
                time.sleep(0.3)
        assert health["status"] == "ok" and health["broker"]["ok"] is True  # --admin-url, not the env's dead one
        assert health["database"] == {"ok": True, "detail": "sqlite"}
        assert db.exists() and not wrong_db.exists()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert (f"control plane on {url}: broker {broker.service_url} (admin {broker.admin_url}), "
                f"database sqlite:///{db}\n") in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    r = _call("api", "--service-url", "http://127.0.0.1:6650")
    assert r.returncode == 2
    assert r.stderr == ("error: invalid settings: service_url: Value error, service_url must start with pulsar:// "
                        "or pulsar+ssl://\n")


def urllib_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


# --------------------------------------------------------------------------- against the module's data set
# (in file order: the replay tests come last, as they change the batches' state)


def test_jobs_counts_equal_the_processor_runs(world: World) -> None:
    jobs = world.json("jobs")
    assert [j["job"] for j in jobs] == [FLAG_JOB, POISON_JOB]
    for j, payloads in zip(jobs, (FLAG_INPUT, POISON_INPUT), strict=True):
        run = world.runs[j["job"]]
        assert run.parked == 1 and run.messages == len(payloads) - 1
        by = j["batches"]
        assert set(by) == {"COMMITTED", "ABORTED", "PARKED"}
        assert (by["COMMITTED"], by["PARKED"]) == (run.batches, run.parked)
        assert j["total_batches"] == sum(by.values())
        assert (j["inputs_committed"], j["outputs_committed"]) == (run.messages, run.messages)
        # Every abort the processor counted is one ABORTED transaction; every batch and park one COMMITTED.
        txns = {s: world.json("txns", "list", "--job", j["job"], "--state", s, "--limit", "1")["total"]
                for s in ("OPEN", "COMMITTED", "ABORTED")}
        assert txns == {"OPEN": 0, "COMMITTED": run.batches + run.parked, "ABORTED": run.aborts}
        single = world.json("jobs", j["job"], "--recent", "1000")
        assert {k: v for k, v in single.items() if k != "recent_batches"} == j
        assert len(single["recent_batches"]) == j["total_batches"]
    r = world.cli("jobs")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert _cols(header) == ["JOB", "BATCHES", "COMMITTED", "ABORTED", "PARKED", "REPLAYED", "STARTED", "INPUTS",
                             "OUTPUTS", "MSG/S", "P50 MS", "P99 MS", "LAST COMMIT"]
    assert [_cols(row)[0] for row in rows] == [FLAG_JOB, POISON_JOB]
    poison = jobs[1]
    cells = _cols(rows[1])
    assert cells[:9] == [POISON_JOB, str(poison["total_batches"]), str(poison["batches"]["COMMITTED"]),
                         str(poison["batches"]["ABORTED"]), "1", "0", "0", "11", "11"]
    assert cells[9:12] == [str(poison["throughput_per_s"]), f"{poison['commit_p50_ms']:.0f}",
                           f"{poison['commit_p99_ms']:.0f}"]
    assert re.fullmatch(r"\d+(s|m\d\ds|h\d\dm) ago", cells[12]), cells


def test_batches_list_shows_exactly_the_parked_batch(world: World) -> None:
    batch = world.parked[POISON_JOB]
    page = world.json("batches", "list", "--job", POISON_JOB, "--status", "PARKED")
    assert (page["total"], [b["batch_id"] for b in page["items"]]) == (1, [batch])
    (b,) = page["items"]
    inp = f"persistent://{world.ns}/{POISON_JOB}-in"
    assert (b["status"], b["inputs"], b["outputs"], b["attempts"]) == ("PARKED", 1, 1, 2)
    assert b["parked_topic"] == inp + "-parked"
    assert b["error"] == "ValueError: cannot process b'poison-a5'"
    r = world.cli("batches", "list", "--job", POISON_JOB, "--status", "parked")
    assert r.returncode == 0, r.stderr
    header, row, footer = r.stdout.splitlines()
    assert _cols(header) == ["BATCH ID", "JOB", "STATUS", "ATTEMPTS", "IN", "OUT", "TXN ID", "STARTED", "DURATION",
                             "REPLAY"]
    assert _cols(row)[:7] == [batch, POISON_JOB, "PARKED", "2", "1", "1", b["txn_id"]]
    assert _cols(row)[8] == f"{b['duration_ms']} ms"
    assert footer == "batches 1-1 of 1"
    # Both jobs' parked batches, and nothing else.
    page = world.json("batches", "list", "--status", "PARKED")
    assert sorted(b["batch_id"] for b in page["items"]) == sorted(world.parked.values())
    # Paging: a window of the full list, and the hint for the next page.
    full = world.json("batches", "list", "--job", POISON_JOB)["items"]
    assert len(full) == world.json("jobs", POISON_JOB)["total_batches"]
    window = world.json("batches", "list", "--job", POISON_JOB, "--limit", "2", "--offset", "1")
    assert [b["batch_id"] for b in window["items"]] == [b["batch_id"] for b in full[1:3]]
    r = world.cli("batches", "list", "--job", POISON_JOB, "--limit", "2", "--offset", "1")
    assert r.stdout.splitlines()[-1] == f"batches 2-3 of {len(full)}; --offset 3 for more"
    assert [_cols(line)[0] for line in r.stdout.splitlines()[1:3]] == [b["batch_id"] for b in full[1:3]]
    # The detail view.
    r = world.cli("batches", "show", batch)
    assert r.returncode == 0, r.stderr
    f = _fields(r.stdout)
    assert (f["batch"], f["job"], f["status"], f["attempts"], f["inputs"], f["outputs"]) == (
        batch, POISON_JOB, "PARKED", "2", "1", "1")
    assert (f["parked topic"], f["ledger topic"]) == (inp + "-parked", world.ledger)
    assert _records_kinds(r.stdout) == ["STARTED", "ABORTED", "STARTED", "ABORTED", "PARKED"]


def test_txns_show_a_committed_transaction(world: World) -> None:
    committed = world.json("batches", "list", "--job", POISON_JOB, "--status", "COMMITTED")["items"]
    b = max(committed, key=lambda b: b["inputs"])
    r = world.cli("txns", "show", b["txn_id"])
    assert r.returncode == 0, r.stderr
    f = _fields(r.stdout)
    assert (f["transaction"], f["state"], f["job"], f["batch"], f["attempt"]) == (
        b["txn_id"], "COMMITTED", POISON_JOB, b["batch_id"], "1")
    assert f["error"] == "-" and f["ledger topic"] == world.ledger
    assert "coordinator" not in f  # it ended: the coordinator has nothing to say
    assert _records_kinds(r.stdout) == ["STARTED", "COMMITTED"]
    most, least = b["txn_id"].strip("()").split(",")
    assert world.json("txns", "show", f"{most}:{least}")["txn_id"] == b["txn_id"]
    # Filters: --state is case-insensitive, --since takes a span or epoch ms.
    recent = world.json("txns", "list", "--job", POISON_JOB, "--state", "committed", "--since", "1h")
    assert recent["total"] == world.runs[POISON_JOB].batches + world.runs[POISON_JOB].parked
    assert b["txn_id"] in {t["txn_id"] for t in recent["items"]}
    later = str(now_ms() + 3_600_000)
    assert world.json("txns", "list", "--since", later) == {"items": [], "total": 0, "limit": 50, "offset": 0}
    r = world.cli("txns", "list", "--since", later)
    assert (r.returncode, r.stdout) == (0, "no transactions\n")


def test_bad_ids_give_the_apis_message(world: World) -> None:
    # A malformed or out-of-range transaction id: the API refuses it (400, or 422 from its path
    # validation) and the CLI prints exactly the API's status and detail.
    for cmd, bad, token in (("show", "nonsense", None), ("abort", "(1,2", TOKEN), ("show", f"(0,{2**63})", None)):
        method, suffix = ("GET", "") if cmd == "show" else ("POST", "/abort")
        status, body = world.api.request(method, f"/transactions/{urllib.parse.quote(bad, safe='')}{suffix}",
                                         token=token)
        assert status in (400, 422) and isinstance(body["detail"], str) and body["detail"], (status, body)
        r = world.cli("txns", cmd, bad, token=token)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: HTTP {status}: {body['detail']}\n")
    r = world.cli("batches", "show", "nojob:x:1")
    assert r.returncode == 1
    assert r.stderr == "error: HTTP 404: batch 'nojob:x:1' is not in the ledger\n"
    r = world.cli("jobs", "nojob")
    assert r.returncode == 1
    assert r.stderr == "error: HTTP 404: no batches of job 'nojob' in the ledger\n"
    committed = world.json("batches", "list", "--job", POISON_JOB, "--status", "COMMITTED", "--limit", "1")
    (b,) = committed["items"]
    r = world.cli("batches", "replay", b["batch_id"], token=TOKEN)
    assert r.returncode == 1
    assert r.stderr == (f"error: HTTP 409: batch {b['batch_id']} is COMMITTED: only PARKED batches are replayed (an "
                        "ABORTED batch's inputs go back to its subscription and are processed again automatically)\n")


def test_replay_needs_a_token(world: World) -> None:
    batch = world.parked[POISON_JOB]
    r = world.cli("batches", "replay", batch)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "error: HTTP 401: this endpoint needs 'Authorization: Bearer <token>'\n"
    r = world.cli("batches", "replay", batch, "--wait", token="not-the-token")
    assert (r.returncode, r.stderr) == (1, "error: HTTP 403: invalid API token\n")
    # The token defaults to $PULSAR_TXN_API_TOKEN (the first, if it lists several as the server's does).
    r = _call("batches", "replay", batch, "--api-url", world.api.url, PULSAR_TXN_API_TOKEN=" nope,other")
    assert (r.returncode, r.stderr) == (1, "error: HTTP 403: invalid API token\n")
    assert world.json("batches", "show", batch)["replay"] is None  # nothing was started


def _replay_lines(stdout: str, rid: str, batch: str) -> tuple[str, list[str], str]:
    first, *middle, last = stdout.splitlines()
    assert first == f"replay {rid} of batch {batch}: accepted"
    for line in middle:
        assert re.fullmatch(rf"replay {rid}: running \(run \d\)", line), stdout
    return first, middle, last


def test_replay_of_the_poison_batch_fails_again(world: World) -> None:
    batch = world.parked[POISON_JOB]
    r = world.cli("batches", "replay", batch, "--wait", "--interval", "0.1", token=TOKEN)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == ""
    rid = r.stdout.split()[1]
    _, _, last = _replay_lines(r.stdout, rid, batch)
    assert re.fullmatch(rf"replay {rid}: failed: ValueError: cannot process b'poison-a5' \(run 1, \d+ ms\)", last)
    rep = world.json("batches", "show", batch)["replay"]
    assert (rep["replay_id"], rep["status"], rep["runs"]) == (rid, "failed", 1)
    assert world.json("batches", "show", batch)["status"] == "PARKED"
    f = _fields(world.cli("batches", "show", batch).stdout)
    assert f["status"] == "PARKED"
    assert re.fullmatch(rf"{rid} failed: ValueError: cannot process b'poison-a5' \(run 1, \d+ ms\)", f["replay"])


def test_replay_succeeds_once_the_handler_is_fixed_and_only_once(world: World) -> None:
    batch = world.parked[FLAG_JOB]
    assert world.flag.exists()
    r = world.cli("batches", "replay", batch, "--wait", "--interval", "0.1", token=TOKEN)
    assert r.returncode == 1, r.stdout + r.stderr
    rid = r.stdout.split()[1]
    _, _, last = _replay_lines(r.stdout, rid, batch)
    assert re.fullmatch(rf"replay {rid}: failed: ValueError: cannot process b'poison-b2' \(flag \S+ is set\) "
                        rf"\(run 1, \d+ ms\)", last)

    world.flag.unlink()  # the "fix"; the API process's handler sees it too
    r = world.cli("batches", "replay", batch, "--wait", "--interval", "0.1", token=TOKEN)
    assert r.returncode == 0, r.stdout + r.stderr
    _, _, last = _replay_lines(r.stdout, rid, batch)  # the same replay, run again
    m = re.fullmatch(rf"replay {rid}: succeeded: replayed 1 message\(s\) of batch {re.escape(batch)} in transaction "
                     r"(\(\d+,\d+\)) \(run 2, \d+ ms\)", last)
    assert m is not None, last
    replay_txn = m.group(1)

    # Asked again: the same replay, not run again.
    rep = world.json("batches", "replay", batch, token=TOKEN)
    assert (rep["replay_id"], rep["status"], rep["runs"], rep["txn_id"], rep["messages"]) == (
        rid, "succeeded", 2, replay_txn, 1)
    r = world.cli("batches", "replay", batch, "--wait", token=TOKEN)
    assert r.returncode == 0
    assert re.fullmatch(rf"replay {rid} of batch {re.escape(batch)}: succeeded: replayed 1 message\(s\) of batch "
                        rf"{re.escape(batch)} in transaction {re.escape(replay_txn)} \(run 2, \d+ ms\)\n", r.stdout)

    # The output topic has the replayed message exactly once.
    c = world.official.subscribe(world.outputs[FLAG_JOB], "check", initial_position=pulsar.InitialPosition.Earliest)
    try:
        got = sorted(m.data() for m in read_n(c, len(FLAG_INPUT), timeout_s=60))
        assert got == sorted(d.upper() for d in FLAG_INPUT)
        assert read_until_sentinel(world.official, c, world.outputs[FLAG_JOB]) == []
    finally:
        c.close()

    # The ledger says REPLAYED, in the replay's (committed) transaction.
    world.api.wait_for(lambda: world.api.get(f"/batches/{batch}")["status"] == "REPLAYED", timeout=60)
    r = world.cli("batches", "show", batch)
    f = _fields(r.stdout)
    assert (f["status"], f["transaction"]) == ("REPLAYED", replay_txn)
    assert _records_kinds(r.stdout)[-1] == "REPLAYED"
    f = _fields(world.cli("txns", "show", replay_txn).stdout)
    assert (f["state"], f["batch"], f["job"]) == ("COMMITTED", batch, FLAG_JOB)
    j = world.json("jobs", FLAG_JOB)
    assert j["batches"].get("PARKED", 0) == 0 and j["batches"]["REPLAYED"] == 1
    assert j["inputs_committed"] == len(FLAG_INPUT)


def test_abort_an_open_transaction(world: World) -> None:
    topic = f"persistent://{world.ns}/stuck-out"
    client = txn.Client(world.service_url)
    try:
        t = client.new_transaction(timeout_millis=600_000)
        tid = str(t.id)
        client.create_producer(topic).send(b"never visible", txn=t)
        batch = f"stuckjob:{uuid.uuid4().hex[:8]}:1"
        rec = LedgerRecord(kind="STARTED", job="stuckjob", batch_id=batch, txn_id=tid, attempt=1, inputs={},
                           started_at_ms=now_ms())
        client.create_producer(world.ledger).send(rec.to_json(), partition_key=batch)
        # Until the projection has applied the STARTED record, the API already answers 200 from the
        # coordinator alone, without the ledger fields checked below: wait for those.
        world.api.wait_for(lambda: (lambda r: r[0] == 200 and r[1]["ledger"] is not None)(
            world.api.request("GET", f"/transactions/{tid}")), timeout=60)

        r = world.cli("txns", "show", tid)
        assert r.returncode == 0, r.stderr
        f = _fields(r.stdout)
        assert (f["transaction"], f["state"], f["coordinator"], f["job"], f["batch"]) == (
            tid, "OPEN", "OPEN", "stuckjob", batch)
        assert f["produced to"] == topic
        assert f["ended"] == "-"

        r = world.cli("txns", "abort", tid)
        assert (r.returncode, r.stderr) == (1, "error: HTTP 401: this endpoint needs 'Authorization: Bearer <token>'\n")
        r = world.cli("txns", "abort", tid, token=TOKEN)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"transaction {tid} aborted\n", "")

        # The coordinator forgets it; the control plane then resolves the ledger's OPEN as ABORTED.
        world.api.wait_for(lambda: world.api.get(f"/transactions/{tid}")["state"] == "ABORTED", timeout=60)
        r = world.cli("txns", "show", tid)
        f = _fields(r.stdout)
        assert (f["state"], f["batch"]) == ("ABORTED", batch)
        assert "coordinator" not in f and f["ended"] != "-"
        assert f["error"].startswith("the coordinator no longer knows this transaction")
        r = world.cli("txns", "abort", tid, token=TOKEN)
        assert (r.returncode, r.stderr) == (1, f"error: HTTP 409: transaction {tid} has already ended (ABORTED in "
                                               "the ledger)\n")
        # Its message never becomes visible.
        c = world.official.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
        try:
            assert read_until_sentinel(world.official, c, topic) == []
        finally:
            c.close()
    finally:
        client.close()
