"""The exactly-once paths against a broker with TLS, token authentication and authorization on.

The broker (``authz_broker``) refuses the anonymous role everywhere, so each path proves it
carries its credentials: ``pulsar-txn process`` and ``replay`` over ``pulsar+ssl://`` with the
token and the trust certificates from ``PULSAR_TXN_*`` variables or flags, and the control
plane's admin and broker clients. The same commands without the token fail with a clear error
and write nothing. (The Spark source and sink: tests/test_spark_security.py.)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pulsar
import pytest

from coordinator_api.live import Live, LiveError
from coordinator_api.settings import Settings
from txn.admin import admin_request
from txn.client import AsyncClient

from peer import read_n, read_until_sentinel

HANDLERS = "txn_shell.examples.handlers"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txn_shell.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def ns(authz_broker) -> str:
    name = f"public/sec-{uuid.uuid4().hex[:8]}"
    status, body = admin_request("PUT", authz_broker.admin_url, f"/admin/v2/namespaces/{name}", {},
                                 token=authz_broker.token)
    assert status in (200, 204), body
    # Nothing granted to anyone but the super-user: the anonymous role is refused here.
    status, perms = admin_request("GET", authz_broker.admin_url, f"/admin/v2/namespaces/{name}/permissions",
                                  token=authz_broker.token)
    assert (status, perms) == (200, {})
    assert admin_request("GET", authz_broker.admin_url, f"/admin/v2/namespaces/{name}/permissions")[0] == 403
    return f"persistent://{name}/"


@pytest.fixture(scope="module")
def official(authz_broker):
    c = pulsar.Client(authz_broker.service_url_tls, tls_trust_certs_file_path=authz_broker.ca_cert,
                      authentication=pulsar.AuthenticationToken(authz_broker.token),
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


@pytest.fixture(scope="module")
def token_file(authz_broker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("sec") / "token"
    p.write_text(authz_broker.token + "\n")
    return p


def _produce(official: pulsar.Client, topic: str, payloads: list[bytes]) -> None:
    p = official.create_producer(topic)
    for d in payloads:
        p.send(d)
    p.close()


def test_process_and_replay_with_credentials_from_the_environment(authz_broker, ns, official, token_file):
    inp, out, ledger = ns + "in", ns + "out", ns + "ledger"
    _produce(official, inp, [b"a", b"b", b"poison-c", b"d"])
    env = _env(PULSAR_TXN_SERVICE_URL=authz_broker.service_url_tls, PULSAR_TXN_AUTH_TOKEN_FILE=str(token_file),
               PULSAR_TXN_TLS_TRUST_CERTS=authz_broker.ca_cert)
    r = _cli(env, "process", "--input", inp, "--output", out, "--subscription", "sec", "--job", "secjob",
             "--handler", f"{HANDLERS}:poison_aware", "--ledger-topic", ledger, "--max-attempts", "2",
             "--batch-max-delay-ms", "300", "--exit-when-idle-ms", "5000")
    assert r.returncode == 0, r.stderr
    assert "stopped: " in r.stderr and "1 parked" in r.stderr
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    assert sorted(m.data() for m in read_n(reader, 3)) == [b"A", b"B", b"D"]
    # Not acked: once every subscription acked it, the broker (retention none) may delete the ledger the replay reads.
    parked = official.subscribe(inp + "-parked", "peek", initial_position=pulsar.InitialPosition.Earliest)
    pm = parked.receive(timeout_millis=30000)
    batch = pm.properties()["pulsar-txn.batch_id"]

    # Replay with the same settings as flags (no PULSAR_TXN_* variables at all).
    flags = ("--service-url", authz_broker.service_url_tls, "--auth-token", authz_broker.token,
             "--tls-trust-certs", authz_broker.ca_cert)
    r = _cli(_env(), "replay", *flags, "--batch", batch, "--ledger-topic", ledger, "--handler", f"{HANDLERS}:upper",
             "--output", out)
    assert r.returncode == 0, r.stderr
    assert f"replayed 1 message(s) of batch {batch}" in r.stdout
    assert [m.data() for m in read_n(reader, 1)] == [b"POISON-C"]
    assert read_until_sentinel(official, reader, out) == []


def test_paths_that_forget_the_token_are_refused_and_write_nothing(authz_broker, ns, official):
    inp, out, ledger = ns + "in2", ns + "out2", ns + "ledger2"
    _produce(official, inp, [b"x", b"y"])
    env = _env(PULSAR_TXN_SERVICE_URL=authz_broker.service_url_tls, PULSAR_TXN_TLS_TRUST_CERTS=authz_broker.ca_cert)
    r = _cli(env, "process", "--input", inp, "--output", out, "--subscription", "sec2", "--handler",
             f"{HANDLERS}:upper", "--ledger-topic", ledger, "--exit-when-idle-ms", "3000", timeout=180)
    assert r.returncode != 0
    assert "AuthorizationError" in r.stderr or "not authorized" in r.stderr.lower(), r.stderr[-2000:]
    r = _cli(env, "replay", "--batch", "job:nope:1", "--ledger-topic", ledger, "--handler", f"{HANDLERS}:upper",
             "--output", out, timeout=180)
    assert r.returncode != 0
    # Nothing was consumed, produced or written to the ledger.
    status, stats = admin_request("GET", authz_broker.admin_url,
                                  "/admin/v2/" + inp.replace("://", "/") + "/stats", token=authz_broker.token)
    assert status == 200 and "sec2" not in stats["subscriptions"]
    for topic in (out, ledger):
        status, _ = admin_request("GET", authz_broker.admin_url, "/admin/v2/" + topic.replace("://", "/") + "/stats",
                                  token=authz_broker.token)
        assert status == 404, topic  # never created


def test_control_plane_connects_with_its_settings(authz_broker, monkeypatch: pytest.MonkeyPatch, token_file):
    for k in [k for k in os.environ if k.startswith("PULSAR_TXN_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PULSAR_TXN_SERVICE_URL", authz_broker.service_url_tls)
    monkeypatch.setenv("PULSAR_TXN_ADMIN_URL", authz_broker.admin_url)
    monkeypatch.setenv("PULSAR_TXN_TLS_TRUST_CERTS", authz_broker.ca_cert)
    anonymous = Settings().broker()
    with pytest.raises(LiveError, match="HTTP 401: Unauthorized"):
        Live(authz_broker.admin_url, **anonymous.admin_kwargs()).coordinator_stats()

    monkeypatch.setenv("PULSAR_TXN_AUTH_TOKEN_FILE", str(token_file))
    broker = Settings().broker()
    stats = Live(authz_broker.admin_url, **broker.admin_kwargs()).coordinator_stats()
    assert len(stats) == 2  # the broker's two coordinators

    async def open_transaction() -> None:
        async with AsyncClient(broker.require_service_url(), **broker.client_kwargs()) as client:
            txn = await client.new_transaction()
            await txn.abort()

    asyncio.run(open_transaction())
