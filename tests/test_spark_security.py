"""The Spark source and sink against a broker with authentication *and* authorization on.

The broker (``authz_broker`` in tests/conftest.py: ``LocalBroker(authorization=True)``, started once per
session, ~20 s) refuses the anonymous role everything: the test namespace grants it nothing, so any client,
admin call or task that forgets its credentials fails. Writes and reads that pass ``authToken`` (and the TLS
options on ``pulsar+ssl://``) must therefore carry them on every path: the driver's transaction and ledger
records, the executors' producers and leases, the deduplication check, the commit, the source's readers. Rows
are checked with the official client (authenticated).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pulsar
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F  # noqa: E402

from txn.admin import admin_request  # noqa: E402
from txn_shell.localbroker import LocalBroker  # noqa: E402

from peer import assert_nothing  # noqa: E402
from spark_session import spark  # noqa: E402, F401


@pytest.fixture(scope="module")
def authz(authz_broker) -> LocalBroker:  # noqa: ANN001
    """The session's broker with authorization on (tests/conftest.py ``authz_broker``)."""
    assert authz_broker.local is not None
    return authz_broker.local


@pytest.fixture(scope="module")
def ns(authz: LocalBroker) -> str:
    """A namespace with deduplication on and no permission for the anonymous role."""
    name = f"public/spark-sec-{uuid.uuid4().hex[:8]}"
    tok = authz.token
    assert admin_request("PUT", authz.admin_url, f"/admin/v2/namespaces/{name}", token=tok)[0] in (200, 204)
    assert admin_request("POST", authz.admin_url, f"/admin/v2/namespaces/{name}/deduplication", True,
                         token=tok)[0] in (200, 204)
    status, perms = admin_request("GET", authz.admin_url, f"/admin/v2/namespaces/{name}/permissions", token=tok)
    assert status == 200 and "anonymous" not in perms, perms
    return name


def _official(authz: LocalBroker) -> pulsar.Client:
    return pulsar.Client(authz.service_url, authentication=pulsar.AuthenticationToken(authz.token),
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


def _rows(spark, n: int):  # noqa: ANN001, ANN202, F811
    return spark.range(0, n, 1, 2).select(
        F.concat(F.lit("v"), F.col("id").cast("string")).cast("binary").alias("value"),
        F.concat(F.lit("k"), (F.col("id") % 3).cast("string")).alias("key"))


def _read(authz: LocalBroker, topic: str, n: int) -> list[bytes]:
    client = _official(authz)
    try:
        # Never acks: a read after this one (the Spark source's) needs what retention none would delete once acked.
        c = client.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}", initial_position=pulsar.InitialPosition.Earliest)
        got = [c.receive(timeout_millis=30000).data() for _ in range(n)]
        assert_nothing(c, 1000)
        return sorted(got)
    finally:
        client.close()


def _expected(n: int) -> list[bytes]:
    return sorted(f"v{i}".encode() for i in range(n))


@pytest.mark.parametrize(("writer", "token_from"), [("arrow", "value"), ("rows", "file")])
def test_sink_with_token_writes_and_source_reads(  # noqa: ANN001
        spark, authz: LocalBroker, ns: str, tmp_path: Path, writer: str, token_from: str) -> None:  # noqa: F811
    """Every path of the write and of the read authenticates (the namespace refuses anonymous)."""
    topic = f"persistent://{ns}/out-{uuid.uuid4().hex[:8]}"
    token = authz.token
    assert token
    if token_from == "file":
        (tmp_path / "token").write_text(token + "\n")
        token = f"file://{tmp_path / 'token'}"
    opts = {"service.url": authz.service_url, "admin.url": authz.admin_url, "topic": topic, "authToken": token,
            "writer": writer, "job": "sec"}
    _rows(spark, 40).write.format("pulsar-txn").mode("append").options(**opts).save()
    assert _read(authz, topic, 40) == _expected(40)
    df = (spark.read.format("pulsar").option("service.url", authz.service_url).option("admin.url", authz.admin_url)
          .option("topic", topic).option("authToken", token).load())
    assert sorted(r.value for r in df.select("value").collect()) == _expected(40)


def test_forgotten_credentials_fail_and_write_nothing(spark, authz: LocalBroker, ns: str) -> None:  # noqa: F811
    """Without ``authToken`` the sink is refused: by the admin API (the deduplication check) when
    ``admin_url`` is given, else by the broker (the driver's transaction); the source too. Nothing
    is written."""
    topic = f"persistent://{ns}/denied-{uuid.uuid4().hex[:8]}"
    base = {"service_url": authz.service_url, "topic": topic, "job": "sec"}
    with pytest.raises(Exception, match=r"deduplication policy .*HTTP 40[13]"):
        _rows(spark, 10).write.format("pulsar-txn").mode("append").options(**base, admin_url=authz.admin_url).save()
    with pytest.raises(Exception, match="AuthorizationError|not authorized"):
        _rows(spark, 10).write.format("pulsar-txn").mode("append").options(**base).save()
    with pytest.raises(Exception, match="AuthorizationError|not authorized|401"):
        spark.read.format("pulsar").option("service_url", authz.service_url).option("topics", topic).load().collect()
    client = _official(authz)
    try:
        c = client.subscribe(topic, "nothing", initial_position=pulsar.InitialPosition.Earliest)
        assert_nothing(c, 1000)
    finally:
        client.close()


def test_sink_over_tls_with_token(spark, authz: LocalBroker, ns: str) -> None:  # noqa: F811
    """``pulsar+ssl://`` with ``tlsTrustCertsFilePath``: written exactly once; without the trust
    certificates the write fails (the broker's certificate is signed by the test CA)."""
    topic = f"persistent://{ns}/tls-{uuid.uuid4().hex[:8]}"
    assert authz.service_url_tls and authz.ca_cert_path
    opts = {"service_url": authz.service_url_tls, "admin_url": authz.admin_url, "topic": topic, "job": "sec",
            "authToken": authz.token}
    with pytest.raises(Exception, match="(?i)certificate|ssl|tls"):
        _rows(spark, 10).write.format("pulsar-txn").mode("append").options(**opts).save()
    _rows(spark, 30).write.format("pulsar-txn").mode("append").options(
        **opts, tlsTrustCertsFilePath=str(authz.ca_cert_path)).save()
    assert _read(authz, topic, 30) == _expected(30)


def _upper(df):  # noqa: ANN001, ANN202
    return df.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))


def _fill(authz: LocalBroker, topic: str, n: int) -> None:
    client = _official(authz)
    try:
        p = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            p.send(f"v{i}".encode(), partition_key=f"k{i % 3}")
        p.close()
    finally:
        client.close()


def test_runtime_batch_over_tls_with_token(spark, authz: LocalBroker, ns: str, tmp_path: Path) -> None:  # noqa: F811
    """The distributed runtime with :class:`BrokerSettings` (token file, ``pulsar+ssl://``, trust
    certificates): the driver's subscription, transaction, acks and ledger, the deduplication check
    and the executors' reads and writes all authenticate; the batch commits exactly once. Without
    the token the run is refused (the anonymous role may do nothing) and nothing is written."""
    from spark_jobs.runtime import run_job
    from txn.settings import BrokerSettings

    inp, out, denied = (f"persistent://{ns}/rt-{x}-{uuid.uuid4().hex[:8]}" for x in ("in", "out", "denied"))
    _fill(authz, inp, 30)
    assert authz.token and authz.service_url_tls and authz.ca_cert_path
    (tmp_path / "token").write_text(authz.token + "\n")
    secured = BrokerSettings(service_url=authz.service_url_tls, admin_url=authz.admin_url,
                             auth_token_file=str(tmp_path / "token"), tls_trust_certs_file_path=str(authz.ca_cert_path))
    stats = run_job(spark, None, [inp], out, "rt-sec", _upper, job="rt-sec", settings=secured,
                    batch_max_messages=100, idle_exit_ms=1500, progress=None)
    assert (stats.batches, stats.messages, stats.outputs, stats.aborts) == (1, 30, 30, 0)
    assert _read(authz, out, 30) == sorted(f"V{i}".encode() for i in range(30))

    anonymous = BrokerSettings(service_url=authz.service_url_tls, admin_url=authz.admin_url,
                               tls_trust_certs_file_path=str(authz.ca_cert_path))
    with pytest.raises(Exception, match="AuthorizationError|not authorized|HTTP 40[13]") as refused:
        run_job(spark, None, [inp], denied, "rt-sec-denied", _upper, job="rt-sec-denied", settings=anonymous,
                batch_max_messages=100, idle_exit_ms=1500, progress=None)
    assert inp in str(refused.value)  # the typed error names the topic the broker refused
    client = _official(authz)
    try:
        c = client.subscribe(denied, "nothing", initial_position=pulsar.InitialPosition.Earliest)
        assert_nothing(c, 1000)
    finally:
        client.close()


def test_spark_submit_token_from_env(authz: LocalBroker, ns: str, tmp_path: Path) -> None:
    """``pulsar-txn spark submit`` over ``pulsar+ssl://`` with the token file and trust certificates
    from ``PULSAR_TXN_AUTH_TOKEN_FILE`` / ``PULSAR_TXN_TLS_TRUST_CERTS``: one batch, exactly once."""
    import json
    import os
    import subprocess
    import sys

    inp, out = (f"persistent://{ns}/cli-{x}-{uuid.uuid4().hex[:8]}" for x in ("in", "out"))
    client = _official(authz)
    try:
        p = client.create_producer(inp, batching_enabled=False)
        for v in (b"sku=A,qty=3", b"sku=B,qty=2", b"sku=C,qty=5"):
            p.send(v)
        p.close()
    finally:
        client.close()
    (tmp_path / "token").write_text(authz.token + "\n")
    env = {**os.environ, "PULSAR_TXN_AUTH_TOKEN_FILE": str(tmp_path / "token"),
           "PULSAR_TXN_TLS_TRUST_CERTS": str(authz.ca_cert_path)}
    for k in ("PULSAR_TXN_AUTH_TOKEN", "PULSAR_TXN_SERVICE_URL", "PULSAR_TXN_ADMIN_URL"):
        env.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-m", "txn_shell.cli", "spark", "submit", "enrich", "--service-url", authz.service_url_tls,
         "--admin-url", authz.admin_url, "--input", inp, "--output", out, "--subscription", "cli-sec",
         "--master", "local[1]", "--exit-when-idle-ms", "2000", "--batch-max-delay-ms", "1000"],
        capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stopped: 1 batches, 3 messages, 3 outputs, 0 aborts, 0 parked" in r.stderr, r.stderr[-3000:]
    got = sorted(json.loads(v)["sku"] for v in _read(authz, out, 3))
    assert got == ["A", "B", "C"]
