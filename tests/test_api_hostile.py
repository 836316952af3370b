"""The control plane against hostile ledgers (issue 9, sections 3 and 4), on the real broker.

Anyone who can produce to a ledger topic writes what these tests write. The control plane must
run only the code and write only to the topics its job registry names, survive whatever that
code does, keep one ledger topic's batches apart from another's, quarantine records it cannot use
and project the valid records after them, and keep record contents out of /health and its logs.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pulsar
import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, Text, create_engine, inspect, select, text
from sqlalchemy.engine import make_url

import txn
from coordinator_api import db
from coordinator_api.engine import make_engine
from coordinator_api.projection import Entry, apply_chunk, load_position
from txn.admin import create_namespace
from txn.delivery.ledger import LedgerRecord, LedgerSchemaError, default_ledger_topic, json_depth
from txn.delivery.processor import PARK_BATCH, PARK_SOURCE_TOPIC
from txn.message import MessageId
from txn_shell.localbroker import free_port

from api_server import ROOT, TOKEN, ApiServer
from peer import read_until_sentinel


@contextmanager
def fresh_pg_database(pg_url: str) -> Iterator[str]:
    """A new, empty database on the session's PostgreSQL server (others' rows never mix with ours)."""
    base = make_url(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/api.db"
        return
    with fresh_pg_database(request.getfixturevalue("pg_url")) as url:
        yield url


def fresh_namespace(broker: Any) -> str:
    ns = f"public/hostile-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    return ns


def send(broker: Any, topic: str, payloads: list[tuple[str, bytes]], props: dict[str, str] | None = None) -> None:
    """Produce ``(key, payload)`` pairs to ``topic``, in order."""
    c = txn.Client(broker.service_url)
    try:
        p = c.create_producer(topic)
        for key, data in payloads:
            p.send(data, partition_key=key, properties=props)
    finally:
        c.close()


def park(broker: Any, ledger: str, parked_topic: str, batch: str, job: str, payload: bytes,
         config: dict[str, Any]) -> None:
    """A parked batch as anyone could write it: one message on ``parked_topic`` and a PARKED record."""
    send(broker, parked_topic, [(batch, payload)], {PARK_BATCH: batch, PARK_SOURCE_TOPIC: parked_topic})
    rec = LedgerRecord(kind="PARKED", job=job, batch_id=batch, txn_id="(0,1)", attempt=2,
                       inputs={"in": ["(1,1,-1,-1)"]}, outputs={parked_topic: 1}, started_at_ms=1000, ended_at_ms=1050,
                       error="boom", parked_topic=parked_topic, config=config)
    send(broker, ledger, [(batch, rec.to_json())])


def projected(server: ApiServer, topic: str) -> dict[str, Any] | None:
    return next((p for p in server.get("/health")["projection"] if p["topic"] == topic), None)


def wait_projected(server: ApiServer, topic: str, records: int, quarantined: int = 0) -> None:
    server.wait_for(lambda: (p := projected(server, topic)) is not None
                    and (p["records"], p["quarantined"]) == (records, quarantined), timeout=90)


def outputs(broker: Any, consumer: Any, client: Any, topic: str) -> list[bytes]:
    return [m.data() for m in read_until_sentinel(client, consumer, topic)]


def wait_replay(server: ApiServer, rid: str) -> dict[str, Any]:
    return server.wait_for(lambda: (r := server.get(f"/replays/{rid}"))["status"] in ("succeeded", "noop", "failed")
                           and r, timeout=120)


# ------------------------------------------------------------------------------------------ section 3


def test_a_planted_record_cannot_choose_the_code_or_the_topic(broker: Any, tmp_path: Path, db_url: str) -> None:
    """PARKED records naming ``sys:exit`` and a decoy output: an unregistered job is refused (409),
    so is a registered job's batch parked on a topic not its own; the registered job's batch is
    replayed once with the registry's handler into the registry's output, and the API lives on."""
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    out, decoy, parked = (f"persistent://{ns}/{x}" for x in ("out", "decoy", "in-parked"))
    evil = {"handler": "sys:exit", "output": decoy}
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    out_c, decoy_c = (official.subscribe(t, "check", initial_position=pulsar.InitialPosition.Earliest)
                      for t in (out, decoy))
    park(broker, ledger, parked, "planted:1", "planted", b"x", evil)
    park(broker, ledger, f"persistent://{ns}/elsewhere-parked", "victim:2", "victim", b"y", evil)
    park(broker, ledger, parked, "victim:1", "victim", b"hello", evil)
    jobs = {"victim": {"handler": "txn_shell.examples.handlers:upper", "output": out, "parked_topics": [parked]}}
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[ledger], jobs=jobs).start()
    try:
        wait_projected(server, ledger, 3)
        status, body = server.request("POST", "/batches/planted:1/replay", token=TOKEN)
        assert status == 409 and body["detail"].startswith("job 'planted' is not registered"), (status, body)
        status, body = server.request("POST", "/batches/victim:2/replay", token=TOKEN)
        assert status == 409, (status, body)
        assert body["detail"] == (f"batch victim:2 is parked on persistent://{ns}/elsewhere-parked, which is not a "
                                  "parking topic of job 'victim' in the registry")
        assert server.get("/batches/planted:1")["replay"] is None and server.get("/batches/victim:2")["replay"] is None
        status, rep = server.request("POST", "/batches/victim:1/replay", token=TOKEN)
        assert status == 202, rep
        done = wait_replay(server, rep["replay_id"])
        assert (done["status"], done["messages"], done["runs"]) == ("succeeded", 1, 1), done
        status, again = server.request("POST", "/batches/victim:1/replay", token=TOKEN)
        assert (status, again["replay_id"], again["status"], again["runs"]) == (202, rep["replay_id"], "succeeded", 1)
        assert server.request("GET", "/livez") == (200, {"status": "alive"}) and server.proc.poll() is None
        assert outputs(broker, out_c, official, out) == [b"HELLO"]  # the registry's handler and topic, once
        assert outputs(broker, decoy_c, official, decoy) == []
    finally:
        server.stop()
        official.close()


def test_a_handler_raising_system_exit_fails_the_replay_not_the_process(broker: Any, tmp_path: Path) -> None:
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    out, parked = f"persistent://{ns}/out", f"persistent://{ns}/in-parked"
    spec = "api_handlers:exit_process"
    park(broker, ledger, parked, "exit:1", "exiting", b"bye", {"handler": spec, "output": out})
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       jobs={"exiting": {"handler": spec, "output": out, "parked_topics": [parked]}}).start()
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        out_c = official.subscribe(out, "check", initial_position=pulsar.InitialPosition.Earliest)
        wait_projected(server, ledger, 1)
        status, rep = server.request("POST", "/batches/exit:1/replay", token=TOKEN)
        assert status == 202, rep
        done = wait_replay(server, rep["replay_id"])
        assert (done["status"], done["message"], done["runs"]) == ("failed", "SystemExit: 3", 1), done
        assert server.request("GET", "/livez") == (200, {"status": "alive"}) and server.proc.poll() is None
        assert server.get("/batches/exit:1")["status"] == "PARKED"
        assert outputs(broker, out_c, official, out) == []
    finally:
        server.stop()
        official.close()


def _start_and_see_it_killed(server: ApiServer) -> None:
    """Start the API; the replay it resumes kills it (before or after it first answers)."""
    try:
        server.start()
    except RuntimeError:
        pass
    else:
        assert server.proc is not None
        server.proc.wait(180)
    server.proc = None


@pytest.mark.timeout(600)
def test_a_replay_that_kills_the_process_is_resumed_once_then_failed(broker: Any, tmp_path: Path) -> None:
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    out, parked = f"persistent://{ns}/out", f"persistent://{ns}/in-parked"
    spec = "api_handlers:kill_process"
    park(broker, ledger, parked, "kill:1", "killer", b"boom", {"handler": spec, "output": out})
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       jobs={"killer": {"handler": spec, "output": out, "parked_topics": [parked]}}).start()
    try:
        wait_projected(server, ledger, 1)
        status, rep = server.request("POST", "/batches/kill:1/replay", token=TOKEN)
        assert status == 202, rep
        assert server.proc is not None and server.proc.wait(180) == -9  # run 1 killed the process
        server.proc = None
        _start_and_see_it_killed(server)  # found running: resumed once (run 2), killed again
        server.start()  # found running again: failed, not run
        done = server.get(f"/replays/{rep['replay_id']}")
        assert (done["status"], done["runs"]) == ("failed", 2), done
        assert done["message"].startswith("not resumed again: the control plane stopped 2 time(s) while this replay "
                                          "was running"), done
        assert server.request("GET", "/livez")[0] == 200 and server.proc.poll() is None
    finally:
        server.stop()


def test_batches_are_keyed_by_ledger_topic(broker: Any, tmp_path: Path, db_url: str) -> None:
    """Ledger B holds records with the batch id and the transaction id of ledger A's batches: A's
    batch and transaction keep their state, each batch is addressed with ``?ledger_topic=``."""
    a, b = (default_ledger_topic(f"persistent://{fresh_namespace(broker)}/x") for _ in range(2))
    tag = uuid.uuid4().hex[:8]
    job, bid, tid = f"iso-{tag}", f"iso-{tag}:1", f"(0,{7_000_000 + int(tag[:4], 16)})"
    a_recs = [LedgerRecord(kind="STARTED", job=job, batch_id=bid, txn_id="(0,1)", attempt=1,
                           inputs={"in": ["(1,1,-1,-1)"]}, started_at_ms=1000),
              LedgerRecord(kind="COMMITTED", job=job, batch_id=bid, txn_id="(0,1)", attempt=1,
                           inputs={"in": ["(1,1,-1,-1)"]}, outputs={"out": 1}, started_at_ms=1000, ended_at_ms=1050),
              LedgerRecord(kind="STARTED", job=job, batch_id=f"{bid}x", txn_id=tid, attempt=1,
                           inputs={"in": ["(1,2,-1,-1)"]}, started_at_ms=2000),
              LedgerRecord(kind="ABORTED", job=job, batch_id=f"{bid}x", txn_id=tid, attempt=1,
                           inputs={"in": ["(1,2,-1,-1)"]}, started_at_ms=2000, ended_at_ms=2050, error="boom")]
    b_recs = [LedgerRecord(kind="PARKED", job=job, batch_id=bid, txn_id="(0,2)", attempt=2,
                           inputs={"in": ["(1,1,-1,-1)"]}, outputs={"p": 1}, started_at_ms=3000, ended_at_ms=3050,
                           error="planted", parked_topic="persistent://public/default/p"),
              LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{bid}x", txn_id=tid, attempt=1,
                           inputs={"in": ["(1,2,-1,-1)"]}, outputs={"out": 5}, started_at_ms=3000, ended_at_ms=3050)]
    send(broker, a, [(r.batch_id, r.to_json()) for r in a_recs])
    send(broker, b, [(r.batch_id, r.to_json()) for r in b_recs])
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[a]).start()
    try:  # A first, so its transaction row exists before B's planted record arrives
        wait_projected(server, a, len(a_recs))
    finally:
        server.stop()
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[a, b]).start()
    try:
        wait_projected(server, b, len(b_recs))
        status, body = server.request("GET", f"/batches/{bid}")
        both = ", ".join(sorted([a, b]))
        assert (status, body["detail"]) == (409, f"batch id {bid!r} is in several ledger topics ({both}): "
                                                 "name one with ?ledger_topic="), body
        got_a = server.get(f"/batches/{bid}?ledger_topic={quote(a, safe='')}")
        assert (got_a["status"], got_a["ledger_topic"], [r["kind"] for r in got_a["records"]]) == \
            ("COMMITTED", a, ["STARTED", "COMMITTED"])
        got_b = server.get(f"/batches/{bid}?ledger_topic={quote(b, safe='')}")
        assert (got_b["status"], got_b["ledger_topic"], [r["kind"] for r in got_b["records"]]) == \
            ("PARKED", b, ["PARKED"])
        assert server.get(f"/batches/{bid}x?ledger_topic={quote(a, safe='')}")["status"] == "ABORTED"
        assert server.get(f"/batches?job={job}")["total"] == 4
        t = server.get(f"/transactions/{tid}?ledger_topic={quote(a, safe='')}")["ledger"]
        assert (t["state"], t["ledger_topic"], t["error"]) == ("ABORTED", a, "boom")
        t = server.get(f"/transactions/{tid}?ledger_topic={quote(b, safe='')}")["ledger"]  # B's own row
        assert (t["state"], t["ledger_topic"]) == ("COMMITTED", b)
        assert server.request("GET", f"/transactions/{tid}")[0] == 409  # in both: name one
        status, body = server.request("POST", f"/batches/{bid}/replay?ledger_topic={quote(a, safe='')}", token=TOKEN)
        assert status == 409 and body["detail"].startswith(f"batch {bid} is COMMITTED"), body
    finally:
        server.stop()


def test_discovery_is_limited_to_the_named_namespaces(broker: Any, tmp_path: Path) -> None:
    named, other = fresh_namespace(broker), fresh_namespace(broker)
    ledgers = {ns: default_ledger_topic(f"persistent://{ns}/x") for ns in (named, other)}
    for ns, ledger in ledgers.items():
        rec = LedgerRecord(kind="STARTED", job="disc", batch_id=f"disc:{ns}", txn_id="(0,1)", attempt=1, inputs={},
                           started_at_ms=1)
        send(broker, ledger, [(rec.batch_id, rec.to_json())])
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log",
                       extra_env={"PULSAR_TXN_DISCOVER_NAMESPACES": named}).start()
    try:
        wait_projected(server, ledgers[named], 1)
        assert [p["topic"] for p in server.get("/health")["projection"]] == [ledgers[named]]
    finally:
        server.stop()
    server = ApiServer(broker, f"sqlite:///{tmp_path}/off.db", tmp_path / "off.log").start()
    try:  # by default nothing is discovered (nothing configured, nothing projected)
        assert server.get("/health")["projection"] == []
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------ section 4


def _bad_records(job: str, marker: str) -> list[tuple[bytes, str]]:
    """(payload, how its reason starts): the hostile records of the issue, and two more."""
    base = json.loads(LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:bad", txn_id="(0,1)", attempt=1,
                                   inputs={"t": ["(1,1,-1,-1)"]}, outputs={"o": 1}, started_at_ms=1, ended_at_ms=2,
                                   error=marker).to_json())

    def but(**kw: Any) -> bytes:
        return json.dumps({**base, **kw}).encode()

    nested = (b'{"schema":"pulsar-txn.ledger/1","kind":"COMMITTED","job":"' + marker.encode() + b'","x":'
              + b"[" * 100_000 + b"]" * 100_000 + b"}")
    return [
        (but(job=[marker]), "field 'job' must be a string of 1..256 characters, got list"),
        (but(attempt=2**70), "field 'attempt' must be an integer in 0..2147483647, got one out of range"),
        (but(inputs={"t": 5}), "field 'inputs' must be an object of lists of at most 1000000 message ids, got int"),
        (nested, "ledger record nests 100001 levels deep (at most 16)"),
        (b"\xff\xfe not json " + marker.encode(), "ledger record is not JSON"),
        (but(job=f"nul\u0000{marker}"), "field 'job' holds a NUL or an unpaired surrogate"),
    ]


def test_malformed_records_are_quarantined_and_the_valid_ones_after_them_projected(
        broker: Any, tmp_path: Path, db_url: str) -> None:
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    tag = uuid.uuid4().hex[:8]
    job, marker = f"q-{tag}", f"SECRET-{tag}"

    def valid(i: int) -> list[tuple[str, bytes]]:
        recs = [LedgerRecord(kind="STARTED", job=job, batch_id=f"{job}:{i}", txn_id=f"(0,{i})", attempt=1,
                             inputs={"in": [f"(1,{i},-1,-1)"]}, started_at_ms=i),
                LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:{i}", txn_id=f"(0,{i})", attempt=1,
                             inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 1}, started_at_ms=i, ended_at_ms=i + 5)]
        return [(r.batch_id, r.to_json()) for r in recs]

    bad = _bad_records(job, marker)
    send(broker, ledger, valid(1) + [("bad", payload) for payload, _ in bad] + valid(2))
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_READ_REQUIRES_TOKEN": "true"}).start()
    try:
        wait_projected(server, ledger, 4, len(bad))
        page = server.get(f"/batches?job={job}")
        assert (page["total"], sorted((b["batch_id"], b["status"]) for b in page["items"])) == \
            (2, [(f"{job}:1", "COMMITTED"), (f"{job}:2", "COMMITTED")])
        q = server.get(f"/quarantine?topic={quote(ledger, safe='')}&limit=100")
        assert q["total"] == len(bad)
        items = list(reversed(q["items"]))  # oldest first: ledger order
        for item, (payload, reason) in zip(items, bad, strict=True):
            assert item["reason"].startswith(reason), (item["reason"], reason)
            assert (item["topic"], item["size"], item["raw_truncated"]) == (ledger, len(payload),
                                                                            len(payload) > db.QUARANTINE_RAW_BYTES)
        assert items[1]["raw"] == bad[1][0].decode()  # kept raw, for whoever holds the token
        status, metrics = server.request("GET", "/metrics", token=TOKEN)
        assert status == 200 and f'pulsartxn_quarantined_records_total{{topic="{ledger}"}} 6.0' in metrics.splitlines()
        # /health needs the token, and neither it nor the log holds anything of the records.
        assert server.request("GET", "/health")[0] == 401
        status, health = server.request("GET", "/health", token=TOKEN)
        assert status == 200 and marker not in json.dumps(health)
        assert marker not in (tmp_path / "api.log").read_text(errors="replace")
    finally:
        server.stop()


def test_a_record_the_database_refuses_is_quarantined(db_url: str) -> None:
    """A record that passes the model but not the database (built here past the model's checks)
    is quarantined with the database's reason, without parameters; the chunk's others are stored."""
    engine = make_engine(db_url)
    topic = f"persistent://public/default/refused-{uuid.uuid4().hex[:8]}"
    marker = f"SECRET-{uuid.uuid4().hex[:8]}"
    good = [LedgerRecord(kind="COMMITTED", job="refused", batch_id=f"r:{i}", txn_id=f"(0,{i})", attempt=1, inputs={},
                         started_at_ms=1) for i in (1, 3)]
    bad = LedgerRecord(kind="COMMITTED", job="refused", batch_id="r:2", txn_id="(0,2)", attempt=2**70, inputs={},
                       started_at_ms=1, error=marker)
    entries = [Entry(MessageId(ledger_id=9, entry_id=i), 100 + i, r, r.to_json())
               for i, r in enumerate([good[0], bad, good[1]])]
    try:
        assert apply_chunk(engine, topic, entries) == (2, 1)
        assert load_position(engine, topic) == MessageId(ledger_id=9, entry_id=2)
        with engine.connect() as conn:
            rows = conn.execute(select(db.quarantine).where(db.quarantine.c.topic == topic)).all()
            stored = conn.execute(select(db.ledger_records.c.batch_id).where(db.ledger_records.c.topic == topic)
                                  .order_by(db.ledger_records.c.id)).scalars().all()
        assert stored == ["r:1", "r:3"]
        assert [(r.msg_entry, bytes(r.raw)) for r in rows] == [(1, bad.to_json())]
        # SQLite's driver refuses the integer before the statement runs, PostgreSQL after: both are named.
        assert rows[0].reason in ("the database refused the record: OverflowError",
                                  "the database refused the record: database error NumericValueOutOfRange "
                                  "(SQLSTATE 22003)"), rows[0].reason
        assert apply_chunk(engine, topic, entries) == (0, 0)  # read again: nothing new
    finally:
        engine.dispose()


def test_liveness_and_readiness(broker: Any, tmp_path: Path) -> None:
    """/livez answers whatever the broker does; /readyz says whether the database answers, and a
    broker outage leaves it ready (it shows in /health)."""
    dead = f"http://127.0.0.1:{free_port()}"
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log",
                       extra_env={"PULSAR_TXN_ADMIN_URL": dead, "PULSAR_TXN_PROJECT": "false",
                                  "PULSAR_TXN_ADMIN_TIMEOUT_S": "2"}).start()
    try:
        assert server.request("GET", "/livez") == (200, {"status": "alive"})
        assert server.request("GET", "/readyz") == (200, {"status": "ready", "database": True})
        status, health = server.request("GET", "/health")
        assert (status, health["status"], health["broker"]["ok"]) == (503, "degraded", False)
    finally:
        server.stop()
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log",
                       extra_env={"PULSAR_TXN_PROJECT": "false"}).start()
    try:
        assert server.request("GET", "/readyz") == (200, {"status": "ready", "database": True})
    finally:
        server.stop()


def _status_with_host(port: int, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/livez", headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_trusted_hosts(broker: Any, tmp_path: Path) -> None:
    """``PULSAR_TXN_TRUSTED_HOSTS`` refuses other Host names; ``pulsar-txn api`` bound to loopback
    answers the loopback names only, unless told otherwise."""
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", extra_env={
        "PULSAR_TXN_PROJECT": "false", "PULSAR_TXN_TRUSTED_HOSTS": "127.0.0.1,api.internal"}).start()
    try:
        assert [_status_with_host(server.port, h) for h in ("127.0.0.1", "api.internal", "evil.example")] == \
            [200, 200, 400]
    finally:
        server.stop()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "txn_shell.cli", "api", "--port", str(port), "--service-url", broker.service_url,
         "--admin-url", broker.admin_url, "--database-url", f"sqlite:///{tmp_path}/cli.db", "--log-level", "warning"],
        cwd=ROOT, env={**env, "PULSAR_TXN_PROJECT": "false"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = ApiServer(broker, "sqlite://", tmp_path / "unused.log", port=port)
        probe.wait_for(lambda: _safe_status(port, "localhost") == 200, timeout=90)
        assert [_status_with_host(port, h) for h in ("127.0.0.1", "localhost", "rebound.example")] == [200, 200, 400]
    finally:
        proc.terminate()
        proc.wait(30)


def _safe_status(port: int, host: str) -> int:
    try:
        return _status_with_host(port, host)
    except OSError:
        return 0


# ------------------------------------------------------------------------------------------ upgrade


def _old_schema(url: str) -> None:
    """The tables of the previous version that changed: ``batches`` keyed by batch id alone,
    ``replays`` unique by batch id and without ``resumes``; and ``ledger_records`` as it is."""
    md = MetaData()
    Table("batches", md, Column("batch_id", String(512), primary_key=True), Column("job", String(256)),
          Column("status", String(16)), Column("attempts", Integer), Column("txn_id", String(64)),
          Column("inputs", Integer), Column("outputs", Integer), Column("started_at_ms", BigInteger),
          Column("ended_at_ms", BigInteger), Column("duration_ms", BigInteger), Column("error", Text),
          Column("ledger_topic", String(512), nullable=False), Column("parked_topic", String(512)),
          Column("updated_at_ms", BigInteger))
    Table("replays", md, Column("replay_id", String(64), primary_key=True),
          Column("batch_id", String(512), nullable=False, unique=True),
          Column("ledger_topic", String(512), nullable=False), Column("status", String(16), nullable=False),
          Column("requested_at_ms", BigInteger, nullable=False), Column("started_at_ms", BigInteger),
          Column("finished_at_ms", BigInteger), Column("txn_id", String(64)), Column("messages", Integer),
          Column("message", Text), Column("runs", Integer, nullable=False))
    db.ledger_records.to_metadata(md)
    engine = create_engine(url)
    md.create_all(engine)
    recs = [("persistent://a/b/pulsar-txn-ledger", LedgerRecord(
        kind="COMMITTED", job="j", batch_id="same", txn_id="(0,1)", attempt=1, inputs={}, outputs={"o": 2},
        started_at_ms=10, ended_at_ms=20)),
            ("persistent://c/d/pulsar-txn-ledger", LedgerRecord(
                kind="PARKED", job="j", batch_id="same", txn_id="(0,2)", attempt=2, inputs={"i": ["x"]},
                outputs={"p": 1}, started_at_ms=30, ended_at_ms=40, parked_topic="persistent://c/d/p"))]
    with engine.begin() as conn:
        for i, (topic, r) in enumerate(recs):
            conn.execute(db.ledger_records.insert().values(
                topic=topic, msg_ledger=1, msg_entry=i, msg_partition=-1, msg_batch=-1, kind=r.kind, job=r.job,
                batch_id=r.batch_id, txn_id=r.txn_id, attempt=r.attempt, started_at_ms=r.started_at_ms,
                ended_at_ms=r.ended_at_ms, publish_ms=1, error=None, record=r.to_json().decode()))
        conn.execute(text("INSERT INTO batches (batch_id, job, status, attempts, inputs, outputs, started_at_ms, "
                          "ledger_topic, updated_at_ms) VALUES ('same', 'j', 'PARKED', 2, 1, 0, 30, "
                          "'persistent://c/d/pulsar-txn-ledger', 1)"))
        conn.execute(text("INSERT INTO replays (replay_id, batch_id, ledger_topic, status, requested_at_ms, runs) "
                          "VALUES ('r1', 'same', 'persistent://c/d/pulsar-txn-ledger', 'failed', 5, 1)"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/old.db"
        return
    with fresh_pg_database(request.getfixturevalue("pg_url")) as url:
        yield url


def test_an_old_database_is_upgraded(empty_db_url: str) -> None:
    _old_schema(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        insp = inspect(engine)
        assert set(insp.get_pk_constraint("batches")["constrained_columns"]) == {"ledger_topic", "batch_id"}
        assert "resumes" in {c["name"] for c in insp.get_columns("replays")}
        with engine.connect() as conn:
            rows = conn.execute(select(db.batches.c.ledger_topic, db.batches.c.status, db.batches.c.outputs)
                                .order_by(db.batches.c.ledger_topic)).all()
            reps = [dict(r._mapping) for r in conn.execute(select(db.replays)).all()]
        assert [tuple(r) for r in rows] == [("persistent://a/b/pulsar-txn-ledger", "COMMITTED", 2),
                                            ("persistent://c/d/pulsar-txn-ledger", "PARKED", 1)]
        assert [(r["replay_id"], r["batch_id"], r["status"], r["runs"], r["resumes"]) for r in reps] == \
            [("r1", "same", "failed", 1, 0)]
    finally:
        engine.dispose()
    make_engine(empty_db_url).dispose()  # a second start changes nothing


def test_the_record_model_checks_types_and_bounds_before_and_after_parsing() -> None:
    """``from_json`` (the library's parser, which the projection, replay and the ledger guard use)
    accepts what writers write and rejects each rule's violation by name, never echoing content."""
    ok = LedgerRecord(kind="COMMITTED", job="j" * 256, batch_id="b" * 512, txn_id="(0,1)", attempt=2**31 - 1,
                      inputs={"t": ["(1,2,-1,-1)"]}, outputs={"o": 2**63 - 1}, started_at_ms=0, error="e" * 40_000)
    back = LedgerRecord.from_json(ok.to_json())
    assert back.error is not None and len(back.error) == 32_768 and back.error.endswith(" [truncated]")
    base = json.loads(ok.to_json())
    cases = {
        "attempt": (True, "field 'attempt' must be an integer in 0..2147483647, got bool"),
        "job": ("j" * 257, "field 'job' must be a string of 1..256 characters, got str of 257"),
        "txn_id": (5, "field 'txn_id' must be a string of 1..64 characters, got int"),
        "outputs": ({"o": "1"}, "field 'outputs (count)' must be an integer in 0..9223372036854775807, got str"),
        "ended_at_ms": (-1, "field 'ended_at_ms' must be an integer in 0..9223372036854775807, got one out of range"),
        "config": ([1], "field 'config' must be an object of at most 256 keys, got list"),
        "kind": (["COMMITTED"], "field 'kind' must be one of STARTED, COMMITTED, ABORTED, PARKED, REPLAYED"),
    }
    for name, (value, why) in cases.items():
        with pytest.raises(LedgerSchemaError) as err:
            LedgerRecord.from_json(json.dumps({**base, name: value}))
        assert str(err.value) == why, name
    # Depth counts brackets outside strings only; an unterminated string ends the scan.
    assert json_depth(b'{"a":"[[[[\\"[[","b":[[1]]}') == 3
    assert json_depth(b'["\\"]]]]' + b"[" * 50) == 1
    with pytest.raises(LedgerSchemaError, match="nests 17 levels deep"):
        LedgerRecord.from_json(json.dumps({**base, "config": {"x": json.loads("[" * 15 + "]" * 15)}}))
    with pytest.raises(LedgerSchemaError, match="exceeds 5242880"):
        LedgerRecord.from_json(b'{"schema":"pulsar-txn.ledger/1","x":"' + b"a" * 5_242_880 + b'"}')
