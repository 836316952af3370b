"""The control plane against records and handlers that try to exhaust, mislead or stall it (issue
"No record and no handler can exhaust, mislead or stall the control plane or the processor").

Each test is one of the issue's items, on the real broker and real databases (SQLite and
PostgreSQL): another ledger topic cannot take over a transaction (2), counts cannot overflow an
aggregate (4), a loopback bind of any 127/8 address checks the Host header (9), the dashboard's
headers and the server's timeouts (10), a handler cannot stall or flood the API during a replay
(5), records cannot make /metrics slow (8), compressed giant records cannot exhaust its memory (1).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, Text, create_engine, inspect, select, text
from test_api_hostile import db_url, empty_db_url, fresh_namespace, park, projected, send, wait_projected

import txn
from coordinator_api import db
from coordinator_api.engine import make_engine
from coordinator_api.projection import Entry, apply_chunk
from txn.delivery.ledger import LedgerRecord, default_ledger_topic
from txn.message import MessageId
from txn_shell.localbroker import free_port

from api_server import ROOT, TOKEN, ApiServer

__all__ = ["db_url", "empty_db_url"]  # the fixtures, shared with test_api_hostile


# ------------------------------------------------------------------------------------------ item 2


def test_another_ledger_cannot_take_over_a_transaction(broker: Any, tmp_path: Path, db_url: str) -> None:
    """An attacker writes ABORTED records for the next 300 transaction ids (they are predictable)
    into a ledger topic of its own, projected before the victim's; the victim job's 4 commits
    with 4 of those ids still show COMMITTED and job ``victim``, and the attacker's rows stay in its
    ledger topic."""
    victim_ledger, evil_ledger = (default_ledger_topic(f"persistent://{fresh_namespace(broker)}/x")
                                  for _ in range(2))
    tag = uuid.uuid4().hex[:8]
    victim, evil = f"victim-{tag}", f"evil-{tag}"
    base = 9_000_000 + int(tag[:4], 16) * 1000
    planted = [LedgerRecord(kind="ABORTED", job=evil, batch_id=f"{evil}:{i}", txn_id=f"(0,{base + i})", attempt=1,
                            inputs={}, started_at_ms=1000, ended_at_ms=1001, error="planted")
               for i in range(300)]
    real = []
    for i in (3, 50, 120, 299):
        common = {"job": victim, "batch_id": f"{victim}:{i}", "txn_id": f"(0,{base + i})", "attempt": 1,
                  "inputs": {"in": [f"(1,{i},-1,-1)"]}, "started_at_ms": 5000 + i}
        real += [LedgerRecord(kind="STARTED", **common),
                 LedgerRecord(kind="COMMITTED", outputs={"out": 1}, ended_at_ms=5100 + i, **common)]
    send(broker, evil_ledger, [(r.batch_id, r.to_json()) for r in planted])
    send(broker, victim_ledger, [(r.batch_id, r.to_json()) for r in real])
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[evil_ledger]).start()
    try:  # the attacker's ledger first: its rows exist before the victim's records arrive
        wait_projected(server, evil_ledger, len(planted))
    finally:
        server.stop()
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[evil_ledger, victim_ledger]).start()
    try:
        wait_projected(server, victim_ledger, len(real))
        mine = server.get(f"/transactions?job={victim}")
        assert (mine["total"], sorted({(t["state"], t["ledger_topic"]) for t in mine["items"]})) == \
            (4, [("COMMITTED", victim_ledger)]), mine
        tid = f"(0,{base + 50})"
        status, body = server.request("GET", f"/transactions/{tid}")
        both = ", ".join(sorted([victim_ledger, evil_ledger]))
        assert (status, body["detail"]) == (409, f"transaction {tid} is in several ledger topics ({both}): "
                                                 "name one with ?ledger_topic="), body
        got = server.get(f"/transactions/{tid}?ledger_topic={quote(victim_ledger, safe='')}")
        assert (got["ledger"]["state"], got["ledger"]["job"], [r["kind"] for r in got["records"]]) == \
            ("COMMITTED", victim, ["STARTED", "COMMITTED"]), got
        theirs = server.get(f"/transactions/{tid}?ledger_topic={quote(evil_ledger, safe='')}")
        assert (theirs["ledger"]["state"], theirs["ledger"]["job"], [r["kind"] for r in theirs["records"]]) == \
            ("ABORTED", evil, ["ABORTED"]), theirs
        assert server.get(f"/transactions?job={evil}")["total"] == 300
        jobs = {j["job"]: j for j in server.get("/jobs")}
        assert jobs[victim]["batches"] == {"COMMITTED": 4}
    finally:
        server.stop()


def test_an_old_transactions_table_is_upgraded(empty_db_url: str) -> None:
    """A database of the previous version (``transactions`` and ``txn_resolutions`` keyed by the
    transaction id alone) gets the (ledger topic, transaction id) key: rows rebuilt from the
    records, one per ledger topic, the reconciler's verdict kept on its transaction's topic."""
    md = MetaData()
    Table("transactions", md, Column("txn_id", String(64), primary_key=True), Column("job", String(256)),
          Column("batch_id", String(512)), Column("attempt", Integer), Column("state", String(16)),
          Column("started_at_ms", BigInteger), Column("ended_at_ms", BigInteger), Column("duration_ms", BigInteger),
          Column("error", Text), Column("ledger_topic", String(512), nullable=False))
    Table("txn_resolutions", md, Column("txn_id", String(64), primary_key=True),
          Column("state", String(16), nullable=False), Column("reason", Text, nullable=False),
          Column("resolved_at_ms", BigInteger, nullable=False))
    db.ledger_records.to_metadata(md)
    engine = create_engine(empty_db_url)
    md.create_all(engine)
    a, b = "persistent://a/b/pulsar-txn-ledger", "persistent://c/d/pulsar-txn-ledger"
    recs = [(a, LedgerRecord(kind="ABORTED", job="evil", batch_id="e:1", txn_id="(0,1)", attempt=1, inputs={},
                             started_at_ms=10, ended_at_ms=11, error="planted")),
            (b, LedgerRecord(kind="COMMITTED", job="victim", batch_id="v:1", txn_id="(0,1)", attempt=1, inputs={},
                             started_at_ms=20, ended_at_ms=30)),
            (b, LedgerRecord(kind="STARTED", job="victim", batch_id="v:2", txn_id="(0,2)", attempt=1, inputs={},
                             started_at_ms=40))]
    with engine.begin() as conn:
        for i, (topic, r) in enumerate(recs):
            conn.execute(db.ledger_records.insert().values(
                topic=topic, msg_ledger=1, msg_entry=i, msg_partition=-1, msg_batch=-1, kind=r.kind, job=r.job,
                batch_id=r.batch_id, txn_id=r.txn_id, attempt=r.attempt, started_at_ms=r.started_at_ms,
                ended_at_ms=r.ended_at_ms, publish_ms=1, error=r.error, record=r.to_json().decode()))
        conn.execute(text("INSERT INTO transactions (txn_id, job, batch_id, attempt, state, started_at_ms, "
                          f"ledger_topic) VALUES ('(0,1)', 'evil', 'e:1', 1, 'ABORTED', 10, '{a}'), "
                          f"('(0,2)', 'victim', 'v:2', 1, 'ABORTED', 40, '{b}')"))
        conn.execute(text("INSERT INTO txn_resolutions (txn_id, state, reason, resolved_at_ms) "
                          "VALUES ('(0,2)', 'ABORTED', 'gone', 50)"))
    engine.dispose()
    engine = make_engine(empty_db_url)
    try:
        insp = inspect(engine)
        assert set(insp.get_pk_constraint("transactions")["constrained_columns"]) == {"ledger_topic", "txn_id"}
        assert set(insp.get_pk_constraint("txn_resolutions")["constrained_columns"]) == {"ledger_topic", "txn_id"}
        t = db.transactions
        with engine.connect() as conn:
            rows = conn.execute(select(t.c.ledger_topic, t.c.txn_id, t.c.state, t.c.job, t.c.error)
                                .order_by(t.c.ledger_topic, t.c.txn_id)).all()
        assert [tuple(r) for r in rows] == [(a, "(0,1)", "ABORTED", "evil", "planted"),
                                            (b, "(0,1)", "COMMITTED", "victim", None),
                                            (b, "(0,2)", "ABORTED", "victim", "gone")]
    finally:
        engine.dispose()
    make_engine(empty_db_url).dispose()  # a second start changes nothing


# ------------------------------------------------------------------------------------------ item 4


def test_counts_cannot_overflow_an_aggregate(broker: Any, tmp_path: Path, db_url: str) -> None:
    """Two COMMITTED batches claiming 2^62 outputs, and two transactions lasting 2^62 ms: /jobs,
    /jobs/{job} and /metrics still answer (the counts are bounded where they are stored, and no
    sum can overflow); the records are quarantined with the reason, the sane batch is counted."""
    ledger = default_ledger_topic(f"persistent://{fresh_namespace(broker)}/x")
    job = f"big-{uuid.uuid4().hex[:8]}"
    recs = [LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:{i}", txn_id=f"(0,{i})", attempt=1,
                         inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 2**62}, started_at_ms=1000,
                         ended_at_ms=2000) for i in (1, 2)]
    recs += [LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:{i}", txn_id=f"(0,{i})", attempt=1,
                          inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 2}, started_at_ms=1,
                          ended_at_ms=2**62 + i) for i in (3, 4)]
    recs.append(LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:5", txn_id="(0,5)", attempt=1,
                             inputs={"in": ["(1,5,-1,-1)"]}, outputs={"out": 3}, started_at_ms=1000, ended_at_ms=1010))
    send(broker, ledger, [(r.batch_id, r.to_json()) for r in recs])
    server = ApiServer(broker, db_url, tmp_path / "api.log", ledger_topics=[ledger]).start()
    try:
        server.wait_for(lambda: (p := projected(server, ledger)) is not None
                        and p["records"] + p["quarantined"] == len(recs), timeout=90)
        status, jobs = server.request("GET", "/jobs")
        assert status == 200, jobs
        mine = next(j for j in jobs if j["job"] == job)
        assert (mine["total_batches"], mine["outputs_committed"], mine["inputs_committed"]) == (3, 7, 3), mine
        status, one = server.request("GET", f"/jobs/{job}")
        assert (status, one["outputs_committed"]) == (200, 7), one
        status, text = server.request("GET", "/metrics")
        assert status == 200, text
        assert f'pulsartxn_committed_outputs_total{{pipeline="{job}"}} 7.0' in text.splitlines()
        assert (projected(server, ledger)["records"], projected(server, ledger)["quarantined"]) == (3, 2)  # type: ignore[index]
        q = server.get(f"/quarantine?topic={quote(ledger, safe='')}")
        assert sorted(i["reason"] for i in q["items"]) == \
            ["field 'outputs' sums to 4611686018427387904; the control plane counts at most 2147483647 per record"] \
            * 2, q
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------ item 9


def _status_at(addr: str, port: int, host: str, path: str = "/livez") -> int:
    conn = http.client.HTTPConnection(addr, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


@contextmanager
def cli_api(broker: Any, tmp_path: Path, host: str, *args: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """``pulsar-txn api --host HOST ARGS`` (no projection), until it answers on ``host``; yields the port."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "txn_shell.cli", "api", "--host", host, "--port", str(port),
         "--service-url", broker.service_url, "--admin-url", broker.admin_url,
         "--database-url", f"sqlite:///{tmp_path}/cli-{uuid.uuid4().hex[:6]}.db", "--log-level", "warning", *args],
        cwd=ROOT, env={**env, "PULSAR_TXN_PROJECT": "false"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _status_at(host, port, host)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "pulsar-txn api did not come up"
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def test_any_loopback_bind_checks_the_host_header(broker: Any, tmp_path: Path) -> None:
    """``pulsar-txn api --host 127.0.0.2`` (any address of 127.0.0.0/8) refuses a request whose Host
    header names another site (DNS rebinding: a page of attacker.example whose name now resolves to
    127.0.0.2) and answers its own address and the loopback names."""
    from txn_shell.cli_api import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost",
                                     "::ffff:127.0.0.9")] == [True] * 7
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "example.com", "")] == [False] * 6
    for addr in ("127.0.0.2", "127.3.4.5"):
        with cli_api(broker, tmp_path, addr) as port:
            got = {h: _status_at(addr, port, h) for h in (addr, f"{addr}:{port}", "localhost", "attacker.example",
                                                          f"attacker.example:{port}")}
            assert got == {addr: 200, f"{addr}:{port}": 200, "localhost": 200, "attacker.example": 400,
                           f"attacker.example:{port}": 400}, got


# ------------------------------------------------------------------------------------------ item 10


def test_dashboard_headers(broker: Any, tmp_path: Path) -> None:
    """The dashboard may not be framed (clickjacking of its Abort and Replay buttons) and runs only
    its own script and style: Content-Security-Policy with frame-ancestors 'none', X-Frame-Options."""
    with cli_api(broker, tmp_path, "127.0.0.1") as port:
        for path in ("/", "/static/dashboard.js"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                headers = {k.lower(): v for k, v in resp.getheaders()}
            finally:
                conn.close()
            assert resp.status == 200, path
            csp = headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp and "script-src 'self'" in csp, \
                (path, headers)
            assert (headers.get("x-frame-options"), headers.get("x-content-type-options")) == ("DENY", "nosniff"), \
                (path, headers)


def _held_for(port: int, first: bytes, trickle: bytes, limit_s: float) -> float:
    """Send ``first``, then a byte of ``trickle`` every 0.5 s; seconds until the server closed the
    connection (at most ``limit_s``: then it is still open)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    start = time.monotonic()
    try:
        if first:
            s.sendall(first)
        s.settimeout(0.5)
        i = 0
        while time.monotonic() - start < limit_s:
            try:
                if not s.recv(65536):
                    return time.monotonic() - start
            except TimeoutError:
                pass
            except ConnectionResetError:
                return time.monotonic() - start
            if trickle:
                try:
                    s.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
                except OSError:
                    return time.monotonic() - start
                i += 1
        return limit_s
    finally:
        s.close()


def test_slow_clients_cannot_hold_connections(broker: Any, tmp_path: Path) -> None:
    """A client that connects and sends nothing, or sends its headers a byte at a time (slowloris),
    is disconnected after the header timeout (2 s here); headers larger than the limit get 400."""
    with cli_api(broker, tmp_path, "127.0.0.1", env={"PULSAR_TXN_HEADER_TIMEOUT_S": "2"}) as port:
        idle = _held_for(port, b"", b"", 8)
        slow = _held_for(port, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Slow: aaaaaaaaaaaaaaa\r\n", 8)
        assert idle < 4 and slow < 4, (idle, slow)
        print(f"held: idle {idle:.2f} s, slowloris {slow:.2f} s")
        big = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            big.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
            answer = big.recv(65536)
        except ConnectionResetError:
            answer = b"(reset)"
        finally:
            big.close()
        assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431", b"(reset)")) or answer == b"", answer[:100]
        assert _status_at("127.0.0.1", port, "127.0.0.1") == 200  # and it serves the others


# ------------------------------------------------------------------------------------------ item 5


def _follow(server: ApiServer, replay_ids: dict[str, str], limit_s: float) -> tuple[float, dict[str, Any]]:
    """Probe /livez every 0.1 s and poll the replays until they all ended (at most ``limit_s``):
    the slowest /livez answer (one that gets none in 3 s counts 3 s) and the ended replays."""
    worst, done, end = 0.0, {}, time.monotonic() + limit_s
    while len(done) < len(replay_ids) and time.monotonic() < end:
        t0 = time.monotonic()
        try:
            server.request("GET", "/livez", timeout=3)
            worst = max(worst, time.monotonic() - t0)
            for name, rid in replay_ids.items():
                rep = server.get(f"/replays/{rid}", timeout=3)
                if rep["status"] in ("succeeded", "noop", "failed"):
                    done[name] = rep
        except OSError:
            worst = max(worst, 3.0)
        time.sleep(0.1)
    return worst, done


def test_a_handler_cannot_stall_or_flood_the_api(broker: Any, tmp_path: Path) -> None:
    """Replays of handlers that return endless generators (fast, slow, of 8 MiB outputs) or block:
    /livez keeps answering within 0.5 s while they run, and each replay fails naming the limit it
    hit (outputs, bytes, time), with nothing written."""
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    out = f"persistent://{ns}/out"
    handlers = {"endless": "outputs", "slow_generator": "time", "huge": "bytes", "sleeper": "time"}
    jobs = {}
    for name in handlers:
        parked = f"persistent://{ns}/{name}-parked"
        spec = f"limit_handlers:{name}"
        park(broker, ledger, parked, f"{name}:1", name, b"in", {"handler": spec, "output": out})
        jobs[name] = {"handler": spec, "output": out, "parked_topics": [parked]}
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       jobs=jobs, extra_env={"PULSAR_TXN_REPLAY_HANDLER_TIMEOUT_S": "3"}).start()
    try:
        wait_projected(server, ledger, len(handlers))
        ids = {}
        for name in handlers:
            status, rep = server.request("POST", f"/batches/{name}:1/replay", token=TOKEN)
            assert status == 202, rep
            ids[name] = rep["replay_id"]
        worst, done = _follow(server, ids, 45)
        print(f"slowest /livez during the replays: {worst:.3f} s; ended: {sorted(done)}")
        assert worst < 0.5, (worst, done)
        assert sorted(done) == sorted(handlers), done
        for name, limit in handlers.items():
            d = done[name]
            assert d["status"] == "failed" and d["message"].startswith("OutputLimitExceeded: "), (name, d)
            assert {"outputs": "more than 10000 outputs", "bytes": "more than 67108864 bytes",
                    "time": "longer than 3 s"}[limit] in d["message"], (name, d)
            assert server.get(f"/batches/{name}:1")["status"] == "PARKED"
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------ item 8


class CountingProxy:
    """An HTTP proxy on loopback in front of the broker's admin API that counts the topic-stats
    calls it forwards (GETs only)."""

    def __init__(self, target: str) -> None:
        self.stats_calls = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path.endswith(("/stats", "/partitioned-stats")):
                    proxy.stats_calls += 1
                try:
                    with urllib.request.urlopen(target + self.path, timeout=30) as resp:
                        status, body, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
                except urllib.error.HTTPError as e:
                    status, body, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_records_cannot_make_metrics_slow(broker: Any, tmp_path: Path) -> None:
    """STARTED records of 60 jobs, each naming 64 input topics (the backlog series read them):
    every /metrics scrape answers within 1 s, the first one included, and the backlogs are read
    with at most 32 topic-stats calls per refresh (the default), whatever the records say."""
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    tag = uuid.uuid4().hex[:8]
    recs = [LedgerRecord(kind="STARTED", job=f"wide-{tag}-{j}", batch_id=f"wide-{tag}-{j}:1", txn_id=f"(0,{j})",
                         attempt=1, inputs={}, started_at_ms=1000,
                         config={"subscription": "s", "inputs": [f"persistent://{ns}/in-{j}-{i}" for i in range(64)]})
            for j in range(60)]
    send(broker, ledger, [(r.batch_id, r.to_json()) for r in recs])
    proxy = CountingProxy(broker.admin_url)
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_ADMIN_URL": proxy.url})
    try:
        server.start()
        wait_projected(server, ledger, len(recs))
        began, took = time.monotonic(), []
        for _ in range(4):
            t0 = time.monotonic()
            status, text = server.request("GET", "/metrics", timeout=60)
            took.append(round(time.monotonic() - t0, 3))
            assert status == 200 and f'pulsartxn_batches{{pipeline="wide-{tag}-0",status="STARTED"}} 1.0' in text
            time.sleep(0.5)
        # Refreshes: one per scrape at most, one at start and one per 15 s (the default interval).
        refreshes = len(took) + 2 + int((time.monotonic() - began) // 15)
        print(f"/metrics scrapes took {took} s; {proxy.stats_calls} topic-stats calls")
        assert max(took) < 1.0, took
        assert 0 < proxy.stats_calls <= 32 * refreshes, proxy.stats_calls
        assert "pulsartxn_subscription_backlog_messages" in text
    finally:
        server.stop()
        proxy.close()


# ------------------------------------------------------------------------------------------ item 1

#: The API process's address-space limit in the flood test (it idles at about 0.6 GiB of address
#: space, threads' stacks included; the flood took an unbounded projection past 2 GiB).
API_MEMORY_LIMIT = 1536 * 1024 * 1024


def _memory_limited_env(tmp_path: Path, limit: int) -> dict[str, str]:
    """Environment that makes the API process set ``RLIMIT_AS`` to ``limit`` at start (a
    ``sitecustomize`` module on its path, so the limit is the child's own)."""
    hook = tmp_path / "memlimit"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(
        "import os, resource\n"
        "limit = int(os.environ['PULSAR_TXN_TEST_RLIMIT_AS'])\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n")
    return {"PULSAR_TXN_TEST_RLIMIT_AS": str(limit),
            "PYTHONPATH": os.pathsep.join(p for p in (str(hook), str(ROOT / "tests"), os.environ.get("PYTHONPATH"))
                                          if p)}


def _big_record(job: str, i: int, target: int = 4_900_000) -> bytes:
    """A valid STARTED record of about ``target`` bytes (a long list of input ids: it compresses
    to a few hundred bytes)."""
    ids = ["(1,1,-1,-1)"] * (target // 14)
    return LedgerRecord(kind="STARTED", job=job, batch_id=f"{job}:big-{i}", txn_id=f"(0,{10_000 + i})", attempt=1,
                        inputs={"in": ids}, started_at_ms=1000).to_json()


def test_compressed_giant_records_cannot_exhaust_the_api(broker: Any, tmp_path: Path) -> None:
    """40 valid records of 4.9 MB each, ZSTD-compressed by the producer to a few hundred bytes,
    between 60 small valid records, into an API limited to 1.5 GiB of address space: /livez
    answers within 1 s throughout, every small record is projected, each giant one is quarantined
    with its size (never held whole), and GET /batches/{id} stays small."""
    ns = fresh_namespace(broker)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    job = f"flood-{uuid.uuid4().hex[:8]}"
    template = _big_record(job, 0)
    small = [LedgerRecord(kind="COMMITTED", job=job, batch_id=f"{job}:{i}", txn_id=f"(0,{i})", attempt=1,
                          inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 1}, started_at_ms=1000,
                          ended_at_ms=1010).to_json() for i in range(60)]
    c = txn.Client(broker.service_url)
    try:
        p = c.create_producer(ledger, compression_type=txn.CompressionType.ZSTD, batching_enabled=False)
        big_sizes = []
        for i in range(40):
            big = template.replace(b':big-0"', f':big-{i}"'.encode(), 1)
            big_sizes.append(len(big))
            p.send(small[i])
            p.send(big)
        for s in small[40:]:
            p.send(s)
        p.flush()
    finally:
        c.close()
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env=_memory_limited_env(tmp_path, API_MEMORY_LIMIT)).start()
    try:
        worst, end = 0.0, time.monotonic() + 120
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                server.request("GET", "/livez", timeout=5)
                worst = max(worst, time.monotonic() - t0)
            except OSError:
                worst = max(worst, 5.0)
            p = projected(server, ledger) if worst < 5 else None
            if p is not None and p["records"] + p["quarantined"] >= 100:
                break
            time.sleep(0.2)
        p = projected(server, ledger)
        print(f"slowest /livez: {worst:.3f} s; projection: {p}")
        assert server.proc is not None and server.proc.poll() is None, "the API died"
        assert worst < 1.0, worst
        assert p is not None and (p["records"], p["quarantined"]) == (60, 40), p
        page = server.get(f"/batches?job={job}&limit=100")
        assert (page["total"], {b["status"] for b in page["items"]}) == (60, {"COMMITTED"}), page["total"]
        q = server.get(f"/quarantine?topic={quote(ledger, safe='')}&limit=100")
        assert q["total"] == 40
        assert sorted(i["size"] for i in q["items"]) == sorted(big_sizes), [i["size"] for i in q["items"]][:3]
        assert all("exceeds" in i["reason"] and str(i["size"]) in i["reason"] for i in q["items"]), q["items"][0]
        status, body = server.request("GET", f"/batches/{quote(job + ':3', safe='')}")
        assert status == 200 and len(json.dumps(body)) < 100_000
    finally:
        server.stop()


def test_batch_and_transaction_records_are_paged(broker: Any, tmp_path: Path) -> None:
    """A batch with 30 records of 600 KB each (18 MB): GET /batches/{id} answers one page of them
    of at most 8 MiB (``records_truncated``), the next with ``records_offset``; ``records_limit``
    pages by count; the same for GET /transactions/{id}."""
    url = f"sqlite:///{tmp_path}/api.db"
    engine = make_engine(url)
    topic = "persistent://public/default/paged-ledger"
    ids = ["(1,1,-1,-1)"] * (600_000 // 14)
    recs = [LedgerRecord(kind="STARTED", job="paged", batch_id="paged:1", txn_id="(0,1)", attempt=1 + i,
                         inputs={"in": ids}, started_at_ms=1000 + i) for i in range(30)]
    entries = [Entry(MessageId(ledger_id=7, entry_id=i), 100 + i, r, r.to_json()) for i, r in enumerate(recs)]
    try:
        assert apply_chunk(engine, topic, entries) == (30, 0)
    finally:
        engine.dispose()
    server = ApiServer(broker, url, tmp_path / "api.log", extra_env={"PULSAR_TXN_PROJECT": "false"}).start()
    try:
        for path in ("/batches/paged:1", "/transactions/(0,1)"):
            seen, offset = [], 0
            while offset < 30:
                status, body = server.request("GET", f"{path}?records_offset={offset}")
                assert status == 200, body
                size = len(json.dumps(body["records"]))
                assert size <= 8 * 1024 * 1024 + 700_000 and body["records_total"] == 30, (path, size)
                n = len(body["records"])
                assert body["records_truncated"] == (offset + n < 30), (path, offset, n)
                seen += [r["attempt"] for r in body["records"]]
                offset += n
            assert seen == list(range(1, 31)), (path, seen)
            body = server.get(f"{path}?records_limit=3&records_offset=28")
            assert [r["attempt"] for r in body["records"]] == [29, 30] and not body["records_truncated"]
    finally:
        server.stop()
