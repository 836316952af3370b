"""The control plane against the real broker and real databases (SQLite and PostgreSQL).

One data set per database: the real processor runs ``poison_while_flagged`` over 120 messages
(one poison) in batches of 20 with 2 attempts, so the poison's batch aborts, is narrowed and
the poison is parked; everything else commits. The API (a real uvicorn process) projects the
ledger, and every answer is checked against the ledger itself, read with our Reader.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar
import pytest

import txn
from txn.client import AsyncClient
from txn.delivery import Processor
from txn.delivery.ledger import LedgerRecord, default_ledger_topic, now_ms
from txn.delivery.replay import read_ledger
from txn.examples.handlers import POISON_FLAG_ENV, poison_while_flagged
from txn.localbroker import create_namespace

from api_server import TOKEN, ApiServer
from peer import read_until_sentinel

N = 120
POISON_AT = 57


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
        self.job = "api-test"
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
            handler_spec="txn.examples.handlers:poison_while_flagged",
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
    server = ApiServer(broker, url, d / "api.log", ledger_topics=[data.ledger],
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
    detail = api.get(f"/jobs/{data.job}?recent=5")
    assert len(detail["recent_batches"]) == 5
    assert api.request("GET", "/jobs/no-such-job")[0] == 404


def test_batches_and_filters(api: Any, data: DataSet) -> None:
    parked = api.get("/batches?status=PARKED")
    assert [b["batch_id"] for b in parked["items"]] == [data.parked.batch_id]
    b = parked["items"][0]
    assert (b["inputs"], b["parked_topic"], b["txn_id"]) == (1, f"{data.inp}-parked", data.parked.txn_id)
    assert "ValueError" in b["error"]
    detail = api.get(f"/batches/{data.parked.batch_id}")
    assert [r["kind"] for r in detail["records"]] == [
        r.kind for r in data.records if r.batch_id == data.parked.batch_id]
    all_ids = {r.batch_id for r in data.records}
    seen: list[str] = []
    offset = 0
    while True:
        page = api.get(f"/batches?job={data.job}&limit=4&offset={offset}")
        assert page["total"] == len(all_ids)
        if not page["items"]:
            break
        seen += [x["batch_id"] for x in page["items"]]
        offset += 4
    assert sorted(seen) == sorted(all_ids)  # pages cover every batch once
    assert api.get("/batches?job=other")["total"] == 0
    assert api.request("GET", "/batches/nope")[0] == 404


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
    assert float(lines['pulsar_txn_transactions{state="COMMITTED"}']) == len(data.committed_txns)
    assert float(lines['pulsar_txn_batches{status="PARKED"}']) == 1
    assert float(lines["pulsar_txn_commit_latency_seconds_count"]) == len(data.committed_txns)


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
    assert api.request("POST", f"/batches/{bid}/replay")[0] == 401
    status, rep = api.request("POST", f"/batches/{bid}/replay", token=TOKEN)
    assert status == 202 and rep["batch_id"] == bid
    rep = api.wait_for(lambda: (r := api.get(f"/replays/{rep['replay_id']}"))["status"] == "failed" and r)
    assert "cannot process" in rep["message"]
    data.flag.unlink()
    status, rep2 = api.request("POST", f"/batches/{bid}/replay", token=TOKEN)
    assert status == 202
    done = api.wait_for(lambda: (r := api.get(f"/replays/{rep2['replay_id']}"))["status"] in ("succeeded", "noop")
                        and r, timeout=90)
    assert done["status"] == "succeeded" and done["replay_id"] == rep["replay_id"] and done["runs"] == 2, done
    assert done["messages"] == 1
    status, rep3 = api.request("POST", f"/batches/{bid}/replay", token=TOKEN)  # repeated: same replay, no rerun
    assert (status, rep3["replay_id"], rep3["status"]) == (202, done["replay_id"], done["status"])
    api.wait_for(lambda: api.get(f"/batches/{bid}")["status"] == "REPLAYED", timeout=60)
    assert api.get(f"/batches/{bid}")["replay"]["replay_id"] == done["replay_id"]
    official = pulsar.Client(broker.service_url)
    try:
        consumer = official.subscribe(data.out, f"check-{uuid.uuid4().hex[:6]}",
                                      initial_position=pulsar.InitialPosition.Earliest)
        out = [m.data() for m in read_until_sentinel(official, consumer, data.out)]
    finally:
        official.close()
    assert Counter(out)[b"POISON"] == 1
    assert sorted(out) == sorted([f"M{i}".encode() for i in range(N) if i != POISON_AT] + [b"POISON"])
    committed = api.request("POST", f"/batches/{next(iter(r.batch_id for r in data.records if r.kind == 'COMMITTED'))}"
                            "/replay", token=TOKEN)
    assert committed[0] == 409


def test_reads_can_require_the_token(broker: Any, tmp_path: Path) -> None:
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log",
                       extra_env={"PULSAR_TXN_READ_REQUIRES_TOKEN": "true", "PULSAR_TXN_PROJECT": "false"}).start()
    try:
        assert server.request("GET", "/jobs")[0] == 401
        assert server.request("GET", "/jobs", token="nope")[0] == 403
        assert server.request("GET", "/jobs", token=TOKEN) == (200, [])  # projection off: nothing projected
        assert server.request("GET", "/health")[0] == 200  # health stays open for probes
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
        rec = LedgerRecord("STARTED", "orphan", "orphan:1", str(t.id), 1, {}, started_at_ms=now_ms())
        c.create_producer(ledger).send(rec.to_json(), partition_key="orphan:1")
    finally:
        c.close()
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_RESOLVE_AFTER_MS": "3000"}).start()
    try:
        tid = str(t.id)
        row = server.wait_for(lambda: (r := server.request("GET", f"/transactions/{tid}"))[0] == 200 and r[1])
        assert row["ledger"]["state"] in ("OPEN", "ABORTED")
        done = server.wait_for(lambda: (r := server.get(f"/transactions/{tid}"))["state"] == "ABORTED" and r,
                               timeout=90)
        assert done["ledger"]["job"] == "orphan" and "no longer knows" in done["ledger"]["error"]
        assert done["live"] is None
        assert server.get("/batches?job=orphan")["items"][0]["status"] == "STARTED"
    finally:
        server.stop()
