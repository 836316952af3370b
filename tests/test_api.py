"""The control plane against the real broker and real databases (SQLite and PostgreSQL).

One data set per database: the real processor runs ``poison_while_flagged`` over 120 messages
(one poison) in batches of 20 with 2 attempts, so the poison's batch aborts, is narrowed and
the poison is parked; everything else commits. The job's name contains '/' (so every batch id
does too), and ids are sent percent-encoded as well as literally. The API (a real uvicorn
process) projects the ledger, and every answer is checked against the ledger itself, read with
our Reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pulsar
import pytest

import txn
from txn.admin import create_namespace
from txn.client import AsyncClient
from txn.delivery import Processor
from txn.delivery.ledger import LedgerRecord, default_ledger_topic, now_ms
from txn.delivery.replay import read_ledger
from txn_shell import cli
from txn_shell.examples.handlers import POISON_FLAG_ENV, poison_while_flagged

from api_server import TOKEN, ApiServer
from peer import read_until_sentinel

N = 120
POISON_AT = 57
BEARER = [{"HTTPBearer": []}]
#: Every operation of the spec: (method, path) -> guarded by require_read / a mutation / open.
READS = {("get", p) for p in ("/transactions", "/transactions/timeseries", "/transactions/{txn_id}", "/coordinators",
                              "/jobs", "/jobs/{job}", "/batches", "/batches/{batch_id}", "/replays/{replay_id}",
                              "/metrics", "/health", "/quarantine")}
MUTATIONS = {("post", "/transactions/{txn_id}/abort"), ("post", "/batches/{batch_id}/replay")}
OPEN = {("get", "/livez"), ("get", "/readyz")}  # the probes: a kubelet sends no token


def seg(value: str) -> str:
    """One percent-encoded path segment ('/' included), as the CLI and the dashboard send ids."""
    return quote(value, safe="")


def final_status(kinds: list[str]) -> str:
    """A batch's status from its ledger records' kinds (before any replay)."""
    return "PARKED" if "PARKED" in kinds else "COMMITTED" if "COMMITTED" in kinds else "ABORTED"


def cli_json(*args: str) -> Any:
    """``pulsar-txn ARGS --json`` in this process; its JSON output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([*args, "--json"])
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


def ledger_records(broker: Any, ledger: str) -> list[Any]:
    async def main() -> list[Any]:
        async with AsyncClient(broker.service_url) as c:
            return await read_ledger(c, ledger)
    return asyncio.run(main())


class DataSet:
    """A namespace with the processor's real ledger, and what it should show."""

    def __init__(self, broker: Any, workdir: Path) -> None:
        self.ns = f"public/api-{uuid.uuid4().hex[:8]}"
        create_namespace(broker.admin_url, self.ns)
        self.inp = f"persistent://{self.ns}/in"
        self.out = f"persistent://{self.ns}/out"
        self.ledger = default_ledger_topic(self.out)
        self.job = "team/api-test"  # '/' in the job name, hence in every batch id
        self.flag = workdir / "poison.flag"
        self.flag.write_text("bug present\n")
        os.environ[POISON_FLAG_ENV] = str(self.flag)
        c = txn.Client(broker.service_url)
        p = c.create_producer(self.inp)
        for i in range(N):
            p.send(b"poison" if i == POISON_AT else f"m{i}".encode())
        c.close()
        self.stats = Processor(
            broker.service_url, self.inp, self.out, "s", poison_while_flagged, job=self.job,
            batch_max_messages=20, batch_max_delay_ms=50, max_attempts=2, progress=None,
            handler_spec="txn_shell.examples.handlers:poison_while_flagged",
        ).run(idle_exit_ms=3000, install_signal_handlers=False)
        self.records = ledger_records(broker, self.ledger)
        kinds = Counter(r.kind for r in self.records)
        assert kinds["PARKED"] == 1 and self.stats.parked == 1, kinds
        self.parked = next(r for r in self.records if r.kind == "PARKED")
        self.committed_txns = {r.txn_id for r in self.records if r.kind in ("COMMITTED", "PARKED")}
        self.aborted_txns = {r.txn_id for r in self.records if r.kind == "ABORTED"}


class Env:
    """One data set and one API process on one database."""

    def __init__(self, data: DataSet, api: ApiServer) -> None:
        self.data = data
        self.api = api


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp(f"api-{request.param}")
    data = DataSet(broker, d)
    if request.param == "sqlite":
        url = f"sqlite:///{d}/api.db"
    else:
        url = request.getfixturevalue("pg_url").replace("postgresql://", "postgresql+psycopg://", 1)
    jobs = {data.job: {"handler": "txn_shell.examples.handlers:poison_while_flagged", "output": data.out,
                       "parked_topics": [f"{data.inp}-parked"]}}
    server = ApiServer(broker, url, d / "api.log", ledger_topics=[data.ledger], jobs=jobs,
                       extra_env={POISON_FLAG_ENV: str(data.flag)}).start()
    try:  # stop the server even when the set-up fails
        want = len(data.records)
        server.wait_for(lambda: sum(p["records"] for p in server.get("/health")["projection"]) == want, timeout=90)
        yield Env(data, server)
    finally:
        server.stop()


@pytest.fixture
def api(env: Env) -> ApiServer:
    return env.api


@pytest.fixture
def data(env: Env) -> DataSet:
    return env.data


def test_health(api: Any) -> None:
    h = api.get("/health")
    assert h["status"] == "ok"
    assert h["broker"]["ok"] and h["database"]["ok"]
    assert h["database"]["detail"] in ("sqlite", "postgresql")


def test_jobs_match_the_processor(api: Any, data: DataSet) -> None:
    jobs = api.get("/jobs")
    assert [j["job"] for j in jobs] == [data.job]
    j = jobs[0]
    assert j["inputs_committed"] == N - 1 == data.stats.messages
    assert j["outputs_committed"] == N - 1
    assert j["batches"]["PARKED"] == 1
    committed_batches = {r.batch_id for r in data.records if r.kind == "COMMITTED"}
    assert j["batches"]["COMMITTED"] == len(committed_batches)
    assert j["total_batches"] == len({r.batch_id for r in data.records})
    detail = api.get(f"/jobs/{seg(data.job)}?recent=5")
    assert len(detail["recent_batches"]) == 5
    assert api.request("GET", "/jobs/no-such-job")[0] == 404


def test_batches_and_filters(api: Any, data: DataSet) -> None:
    parked = api.get("/batches?status=PARKED")
    assert [b["batch_id"] for b in parked["items"]] == [data.parked.batch_id]
    b = parked["items"][0]
    assert (b["inputs"], b["parked_topic"], b["txn_id"]) == (1, f"{data.inp}-parked", data.parked.txn_id)
    assert "ValueError" in b["error"]
    detail = api.get(f"/batches/{seg(data.parked.batch_id)}")
    assert [r["kind"] for r in detail["records"]] == [
        r.kind for r in data.records if r.batch_id == data.parked.batch_id]
    all_ids = {r.batch_id for r in data.records}
    seen: list[str] = []
    offset = 0
    while True:
        page = api.get(f"/batches?job={seg(data.job)}&limit=4&offset={offset}")
        assert page["total"] == len(all_ids)
        if not page["items"]:
            break
        seen += [x["batch_id"] for x in page["items"]]
        offset += 4
    assert sorted(seen) == sorted(all_ids)  # pages cover every batch once
    assert api.get("/batches?job=other")["total"] == 0
    assert api.request("GET", "/batches/nope")[0] == 404


def test_slash_in_job_and_batch_ids(api: Any, data: DataSet) -> None:
    """A job name and batch ids with '/' are addressed percent-encoded or literally, with exact answers."""
    by_batch: dict[str, list[Any]] = {}
    for r in data.records:
        by_batch.setdefault(r.batch_id, []).append(r)
    assert "/" in data.job and all(b.startswith(f"{data.job}:") for b in by_batch)
    assert len(by_batch) >= 4, sorted(by_batch)  # batches of 20, the poison's narrowed

    # GET /jobs/{job}: the job, every batch of it, and the same answer from the CLI.
    detail = api.get(f"/jobs/{seg(data.job)}?recent=1000")
    want = Counter(final_status([r.kind for r in recs]) for recs in by_batch.values())
    assert (detail["job"], detail["batches"], detail["total_batches"]) == (data.job, dict(want), len(by_batch))
    assert (detail["inputs_committed"], detail["outputs_committed"]) == (N - 1, N - 1)
    assert sorted(b["batch_id"] for b in detail["recent_batches"]) == sorted(by_batch)
    assert {k: v for k, v in detail.items() if k != "recent_batches"} == api.get("/jobs")[0]
    assert api.get(f"/jobs/{data.job}?recent=1000") == detail  # '/' unencoded: the same job
    assert api.request("GET", f"/jobs/{seg(data.job.split('/')[0])}")[0] == 404  # a prefix is not the job
    assert cli_json("jobs", data.job, "--recent", "1000", "--api-url", api.url) == detail

    # GET /batches/{id}: each batch with exactly its ledger records, in ledger order.
    for bid, recs in by_batch.items():
        b = api.get(f"/batches/{seg(bid)}")
        assert (b["batch_id"], b["job"], b["status"]) == (bid, data.job, final_status([r.kind for r in recs]))
        assert [{k: v for k, v in rec.items() if k not in ("ledger_topic", "publish_ms")} for rec in b["records"]] \
            == [json.loads(r.to_json()) for r in recs]
        assert {rec["ledger_topic"] for rec in b["records"]} == {data.ledger}
        assert api.get(f"/batches/{bid}") == b
    parked = data.parked.batch_id
    assert cli_json("batches", "show", parked, "--api-url", api.url) == api.get(f"/batches/{seg(parked)}")
    assert api.request("GET", f"/batches/{seg(parked)}x")[0] == 404
    assert api.request("GET", f"/batches/{seg(parked)}/replay")[0] == 404  # GET: the whole rest is the id
    assert api.request("POST", f"/batches/{seg(parked)}")[0] == 405  # only GET takes a bare batch id


def test_transactions_match_the_ledger(api: Any, data: DataSet) -> None:
    committed = api.get("/transactions?state=COMMITTED&limit=1000")
    assert {t["txn_id"] for t in committed["items"]} == data.committed_txns
    aborted = api.get("/transactions?state=ABORTED&limit=1000")
    assert {t["txn_id"] for t in aborted["items"]} == data.aborted_txns - data.committed_txns
    assert api.get("/transactions?state=OPEN")["total"] == 0
    t = api.get(f"/transactions/{data.parked.txn_id}")
    assert t["state"] == "COMMITTED" and t["live"] is None
    assert t["ledger"]["batch_id"] == data.parked.batch_id
    assert [r["kind"] for r in t["records"]] == ["PARKED"]
    first = min(r.started_at_ms for r in data.records)
    assert api.get(f"/transactions?since={first}&limit=1")["total"] == len(data.committed_txns | data.aborted_txns)
    assert api.get("/transactions?since=99999999999999")["total"] == 0
    series = api.get("/transactions/timeseries?window_s=3600&bucket_s=60")
    assert sum(p["COMMITTED"] for p in series["points"]) == len(data.committed_txns)


@pytest.mark.parametrize("path,status", [
    ("/transactions/garbage", 422), ("/transactions/(1,x)", 422), ("/transactions/(1;2)", 422),
    ("/transactions/(0,99999999)", 404), ("/transactions/(99999999999,1)", 404),
    ("/transactions?state=DONE", 422), ("/transactions?limit=0", 422), ("/transactions?limit=1001", 422),
    ("/transactions?since=-1", 422), ("/transactions?offset=-3", 422), ("/batches?status=nope", 422),
    ("/transactions/timeseries?bucket_s=0", 422), ("/coordinators?slow_after_ms=-5", 422),
])
def test_bad_requests_get_4xx_with_a_message(api: Any, path: str, status: int) -> None:
    got, body = api.request("GET", path)
    assert got == status, body
    assert isinstance(body["detail"], str) and body["detail"]
    if status == 422 and (path.startswith("/transactions/(") or path == "/transactions/garbage"):
        assert body["detail"].startswith("not a transaction id:"), body


def test_metrics_agree_with_the_ledger(api: Any, data: DataSet) -> None:
    status, text = api.request("GET", "/metrics")
    assert status == 200
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    job = f'pipeline="{data.job}"'
    # names of their own: nothing in the broker's pulsar_txn_* namespace
    assert not [k for k in lines if k.startswith("pulsar_txn_")]
    from coordinator_api.metrics import METRIC_NAMES

    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert set(METRIC_NAMES) <= types, set(METRIC_NAMES) - types  # every documented series is exported
    assert float(lines[f'pulsartxn_transactions_total{{{job},state="COMMITTED"}}']) == len(data.committed_txns)
    assert float(lines[f'pulsartxn_transactions_total{{{job},state="ABORTED"}}']) == len(data.aborted_txns)
    assert float(lines[f"pulsartxn_open_transactions{{{job}}}"]) == 0
    assert float(lines[f'pulsartxn_batches{{{job},status="PARKED"}}']) == 1
    committed_batches = {r.batch_id for r in data.records if r.kind == "COMMITTED"}
    assert float(lines[f'pulsartxn_batches{{{job},status="COMMITTED"}}']) == len(committed_batches)
    assert float(lines[f"pulsartxn_committed_messages_total{{{job}}}"]) == N - 1 == data.stats.messages
    assert float(lines[f"pulsartxn_committed_outputs_total{{{job}}}"]) == N - 1
    assert float(lines[f"pulsartxn_commit_latency_seconds_count{{{job}}}"]) == len(data.committed_txns)
    last = max(r.ended_at_ms for r in data.records if r.kind == "COMMITTED") / 1000
    assert float(lines[f"pulsartxn_last_commit_timestamp_seconds{{{job}}}"]) == last
    assert float(lines[f"pulsartxn_seconds_since_last_commit{{{job}}}"]) > 0
    # the processor's subscription ("s") on its input, read from the broker: everything acknowledged
    assert float(lines[f'pulsartxn_subscription_backlog_messages{{{job},subscription="s",topic="{data.inp}"}}']) == 0


def test_live_transaction_shows_and_aborts(api: Any, broker: Any, data: DataSet) -> None:
    c = txn.Client(broker.service_url)
    topic = f"persistent://{data.ns}/live-{uuid.uuid4().hex[:6]}"
    official = pulsar.Client(broker.service_url)
    consumer = official.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    try:
        t = c.new_transaction(timeout_millis=120000)
        c.create_producer(topic).send(b"never visible", txn=t)
        tid = str(t.id)
        live = api.get(f"/transactions/{tid}")
        assert live["state"] == "OPEN" and live["ledger"] is None
        assert live["live"]["produced_partitions"] == [topic]
        assert live["buffers"][topic]["ongoingTxnSize"] == 1
        slow = api.get("/coordinators?slow_after_ms=0")
        assert tid in [s["txn_id"] for s in slow["slow_transactions"]]
        assert len(slow["coordinators"]) >= 1
        assert api.request("POST", f"/transactions/{tid}/abort")[0] == 401
        assert api.request("POST", f"/transactions/{tid}/abort", token="wrong")[0] == 403
        status, body = api.request("POST", f"/transactions/{tid}/abort", token=TOKEN)
        assert (status, body["state"]) == (200, "ABORTED"), body
        assert api.request("GET", f"/transactions/{tid}")[0] == 404  # ended, and never in a ledger
        status, body = api.request("POST", f"/transactions/{tid}/abort", token=TOKEN)
        assert status == 404, body
        assert read_until_sentinel(official, consumer, topic) == []  # the aborted message never shows
        committed = next(iter(data.committed_txns))
        assert api.request("POST", f"/transactions/{committed}/abort", token=TOKEN)[0] == 409
    finally:
        official.close()
        c.close()


def test_replay_runs_once(api: Any, broker: Any, data: DataSet) -> None:
    """The first replay fails (the bug is still there); the flag is removed and the retried
    replay succeeds; a repeated POST returns the same replay. Output: the replayed message once."""
    bid = data.parked.batch_id
    assert "/" in bid
    assert api.request("POST", f"/batches/{seg(bid)}/replay")[0] == 401
    status, rep = api.request("POST", f"/batches/{seg(bid)}/replay", token=TOKEN)
    assert status == 202 and rep["batch_id"] == bid
    rep = api.wait_for(lambda: (r := api.get(f"/replays/{rep['replay_id']}"))["status"] == "failed" and r)
    assert "cannot process" in rep["message"]
    data.flag.unlink()
    status, rep2 = api.request("POST", f"/batches/{seg(bid)}/replay", token=TOKEN)
    assert status == 202
    done = api.wait_for(lambda: (r := api.get(f"/replays/{rep2['replay_id']}"))["status"] in ("succeeded", "noop")
                        and r, timeout=90)
    assert done["status"] == "succeeded" and done["replay_id"] == rep["replay_id"] and done["runs"] == 2, done
    assert done["messages"] == 1
    # Repeated, with the '/' of the id unencoded this time: the same batch, the same replay, no rerun.
    status, rep3 = api.request("POST", f"/batches/{bid}/replay", token=TOKEN)
    assert (status, rep3["batch_id"]) == (202, bid)
    assert (rep3["replay_id"], rep3["status"]) == (done["replay_id"], done["status"])
    api.wait_for(lambda: api.get(f"/batches/{seg(bid)}")["status"] == "REPLAYED", timeout=60)
    assert api.get(f"/batches/{seg(bid)}")["replay"]["replay_id"] == done["replay_id"]
    assert api.get(f"/replays/{seg(done['replay_id'])}")["batch_id"] == bid
    official = pulsar.Client(broker.service_url)
    try:
        consumer = official.subscribe(data.out, f"check-{uuid.uuid4().hex[:6]}",
                                      initial_position=pulsar.InitialPosition.Earliest)
        out = [m.data() for m in read_until_sentinel(official, consumer, data.out)]
    finally:
        official.close()
    assert Counter(out)[b"POISON"] == 1
    assert sorted(out) == sorted([f"M{i}".encode() for i in range(N) if i != POISON_AT] + [b"POISON"])
    committed = api.request("POST", f"/batches/{seg(next(r.batch_id for r in data.records if r.kind == 'COMMITTED'))}"
                            "/replay", token=TOKEN)
    assert committed[0] == 409


def test_reads_can_require_the_token(broker: Any, tmp_path: Path) -> None:
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log",
                       extra_env={"PULSAR_TXN_READ_REQUIRES_TOKEN": "true", "PULSAR_TXN_PROJECT": "false"}).start()
    try:
        assert server.request("GET", "/jobs")[0] == 401
        assert server.request("GET", "/jobs", token="nope")[0] == 403
        assert server.request("GET", "/jobs", token=TOKEN) == (200, [])  # projection off: nothing projected
        for path in ("/health", "/quarantine"):  # everything but the probes
            assert server.request("GET", path)[0] == 401, path
        assert server.request("GET", "/health", token=TOKEN)[0] == 200
        assert server.request("GET", "/livez") == (200, {"status": "alive"})  # open for probes
        assert server.request("GET", "/readyz") == (200, {"status": "ready", "database": True})
    finally:
        server.stop()


def test_mutations_refused_without_a_configured_token(broker: Any, tmp_path: Path) -> None:
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", token="",
                       extra_env={"PULSAR_TXN_PROJECT": "false"}).start()
    try:
        status, body = server.request("POST", "/batches/x/replay", token="anything")
        assert status == 403 and "PULSAR_TXN_API_TOKEN" in body["detail"]
    finally:
        server.stop()


def test_batch_ids_ending_in_the_replay_suffix(broker: Any, tmp_path: Path) -> None:
    """``GET /batches/{id}`` takes the whole rest of the path as the id; ``POST /batches/{id}/replay``
    everything before the last ``/replay``, which must be sent literally. Batches ``e/replay``
    (committed) and ``e/replay/replay`` (parked, written by hand without a handler: its replay runs
    and fails) exist; ``e`` does not."""
    ns = f"public/api-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    job = "edge/replay"
    recs = [LedgerRecord(kind="STARTED", job=job, batch_id="e/replay", txn_id="(0,1)", attempt=1,
                         inputs={"in": ["(1,1,-1,-1)"]}, started_at_ms=1000),
            LedgerRecord(kind="COMMITTED", job=job, batch_id="e/replay", txn_id="(0,1)", attempt=1,
                         inputs={"in": ["(1,1,-1,-1)"]}, outputs={"out": 1}, started_at_ms=1000, ended_at_ms=1050),
            LedgerRecord(kind="PARKED", job=job, batch_id="e/replay/replay", txn_id="(0,2)", attempt=2,
                         inputs={"in": ["(1,2,-1,-1)"]}, outputs={"in-parked": 1}, started_at_ms=2000, ended_at_ms=2050,
                         error="boom", parked_topic=f"persistent://{ns}/in-parked")]
    c = txn.Client(broker.service_url)
    try:
        p = c.create_producer(ledger)
        for r in recs:
            p.send(r.to_json(), partition_key=r.batch_id)
    finally:
        c.close()
    jobs = {job: {"handler": "txn_shell.examples.handlers:upper", "output": f"persistent://{ns}/out",
                  "parked_topics": [f"persistent://{ns}/in-parked"]}}
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       jobs=jobs).start()
    try:
        server.wait_for(lambda: sum(p["records"] for p in server.get("/health")["projection"]) == len(recs))
        for path in ("/batches/e%2Freplay", "/batches/e/replay"):
            b = server.get(path)
            assert (b["batch_id"], b["status"], [r["kind"] for r in b["records"]]) == \
                ("e/replay", "COMMITTED", ["STARTED", "COMMITTED"]), path
        for path in ("/batches/e%2Freplay%2Freplay", "/batches/e/replay/replay"):
            b = server.get(path)
            assert (b["batch_id"], b["status"], b["replay"]) == ("e/replay/replay", "PARKED", None), path
        status, body = server.request("GET", "/batches/e")
        assert (status, body["detail"]) == (404, "batch 'e' is not in the ledger")
        # POST .../replay: the id is everything before the last '/replay'.
        status, body = server.request("POST", "/batches/e/replay", token=TOKEN)
        assert (status, body["detail"]) == (404, "batch 'e' is not in the ledger")
        for path in ("/batches/e%2Freplay/replay", "/batches/e/replay/replay"):
            status, body = server.request("POST", path, token=TOKEN)
            assert status == 409 and body["detail"].startswith("batch e/replay is COMMITTED:"), (path, body)
        assert server.get("/batches/e%2Freplay%2Freplay")["replay"] is None  # none of the above replayed it
        status, rep = server.request("POST", "/batches/e/replay/replay/replay", token=TOKEN)
        assert (status, rep["batch_id"]) == (202, "e/replay/replay"), rep
        rep = server.wait_for(lambda: (r := server.get(f"/replays/{rep['replay_id']}"))["status"] in
                              ("succeeded", "noop", "failed") and r, timeout=90)
        # It ran on batch e/replay/replay, and failed: a hand-written record has no parked message.
        assert (rep["batch_id"], rep["status"]) == ("e/replay/replay", "failed"), rep
        assert rep["message"] == ("ReplayError: batch e/replay/replay: its parked messages are not on "
                                  f"['persistent://{ns}/in-parked'] (already replayed?)")
        # A POST to a batch itself is no operation, even when its id ends in '/replay' (sent encoded).
        for path in ("/batches/e%2Freplay", "/batches/e%2Freplay%2Freplay", "/batches/e%2Freplay%2freplay"):
            status, body = server.request("POST", path, token=TOKEN)
            assert status == 405 and "POST /batches/{id}/replay" in body["detail"], (path, body)
        assert server.request("POST", "/batches/nothing", token=TOKEN)[0] == 405
        assert server.get("/batches/e%2Freplay%2Freplay")["replay"]["replay_id"] == rep["replay_id"]  # still run 1
        assert server.get(f"/replays/{rep['replay_id']}")["runs"] == 1
        assert server.request("GET", "/batches/")[0] == 422  # an empty id
        for path in ("/jobs/edge%2Freplay", "/jobs/edge/replay"):
            j = server.get(path)
            assert (j["job"], j["batches"], j["total_batches"]) == (job, {"COMMITTED": 1, "PARKED": 1}, 2), path
            assert [b["batch_id"] for b in j["recent_batches"]] == ["e/replay/replay", "e/replay"]
        assert server.request("GET", "/jobs/edge")[0] == 404
    finally:
        server.stop()


@pytest.mark.parametrize("reads_need_token", [False, True])
def test_openapi_declares_the_token_where_it_is_required(broker: Any, tmp_path: Path, reads_need_token: bool) -> None:
    """/openapi.json of a real server: the bearer token on mutations always, on reads exactly when
    ``READ_REQUIRES_TOKEN`` is set, never on /health; and the server behaves as declared."""
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", extra_env={
        "PULSAR_TXN_READ_REQUIRES_TOKEN": str(reads_need_token).lower(), "PULSAR_TXN_PROJECT": "false"}).start()
    try:
        spec = server.get("/openapi.json")
        ops = {(m, path): op for path, item in spec["paths"].items() for m, op in item.items()}
        assert set(ops) == READS | MUTATIONS | OPEN
        assert "security" not in spec
        assert spec["components"]["securitySchemes"] == {
            "HTTPBearer": {"type": "http", "scheme": "bearer", "description": "PULSAR_TXN_API_TOKEN"}}
        secured = READS | MUTATIONS if reads_need_token else MUTATIONS
        assert {k: op.get("security") for k, op in ops.items()} == \
            {k: BEARER if k in secured else None for k in ops}
        assert all({"401", "403"} <= set(ops[k]["responses"]) for k in secured)
        # Declared as the server behaves: without a token, exactly the secured operations answer 401.
        fill = {"{txn_id}": "(0,1)", "{job}": "a/b", "{batch_id}": "a/b", "{replay_id}": "r"}
        for method, path in sorted(ops):
            url = path
            for k, v in fill.items():
                url = url.replace(k, seg(v))
            status = server.request(method.upper(), url)[0]
            assert (status == 401) == ((method, path) in secured), (method, url, status)
    finally:
        server.stop()


def test_vanished_open_transaction_is_resolved_as_aborted(broker: Any, tmp_path: Path) -> None:
    """A STARTED record whose transaction then times out on the broker (its owner died before
    writing anything else) shows OPEN, then ABORTED with the reason, once the coordinator
    no longer knows it."""
    ns = f"public/api-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    c = txn.Client(broker.service_url)
    try:
        t = c.new_transaction(timeout_millis=2000)
        rec = LedgerRecord(kind="STARTED", job="orphan", batch_id="orphan:1", txn_id=str(t.id), attempt=1, inputs={},
                           started_at_ms=now_ms())
        c.create_producer(ledger).send(rec.to_json(), partition_key="orphan:1")
    finally:
        c.close()
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_RESOLVE_AFTER_MS": "3000"}).start()
    try:
        tid = str(t.id)
        # The coordinator alone makes it a 200 before the projection has the record: wait for the ledger view.
        row = server.wait_for(lambda: (r := server.request("GET", f"/transactions/{tid}"))[0] == 200
                              and r[1]["ledger"] is not None and r[1])
        assert row["ledger"]["state"] in ("OPEN", "ABORTED")
        done = server.wait_for(lambda: (r := server.get(f"/transactions/{tid}"))["state"] == "ABORTED" and r,
                               timeout=90)
        assert done["ledger"]["job"] == "orphan" and "no longer knows" in done["ledger"]["error"]
        assert done["live"] is None
        assert server.get("/batches?job=orphan")["items"][0]["status"] == "STARTED"
    finally:
        server.stop()
