"""Token authentication and TLS (``pulsar+ssl://``) against the real broker.

The session broker (tests/conftest.py) runs with ``LocalBroker(security=True)``:
token authentication (HS256, role ``tester``) with anonymous clients still
allowed, and a TLS binary port whose certificate (SAN 127.0.0.1, localhost) is
signed by a generated CA. Against an external broker (PULSAR_SERVICE_URL) these
tests use PULSAR_SERVICE_URL_TLS, PULSAR_TLS_CA and PULSAR_TOKEN, and skip
without them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pulsar
import pytest

import txn
from txn.admin import admin_request
from txn_shell.localbroker import ANONYMOUS_ROLE, TOKEN_ROLE, LocalBroker, free_port, generate_tls_material, make_token

from peer import assert_nothing, read_n, read_until_sentinel

#: "Promptly": a rejected handshake must fail well inside the 30 s operation timeout.
PROMPT_S = 5.0


# -- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="module")
def token(broker) -> str:
    tok = broker.token if broker.local is not None else os.environ.get("PULSAR_TOKEN")
    if not tok:
        pytest.skip("external broker: set PULSAR_TOKEN (a valid token for it) to run token tests")
    return tok


@pytest.fixture(scope="module")
def tls(broker) -> tuple[str, str]:
    """``(pulsar+ssl:// URL, CA certificate path)``."""
    if broker.local is not None:
        url, ca = broker.service_url_tls, broker.ca_cert
    else:
        url, ca = os.environ.get("PULSAR_SERVICE_URL_TLS"), os.environ.get("PULSAR_TLS_CA")
    if not (url and ca):
        pytest.skip("external broker: set PULSAR_SERVICE_URL_TLS and PULSAR_TLS_CA to run TLS tests")
    return url, ca


@pytest.fixture
def local(broker) -> LocalBroker:
    if broker.local is None:
        pytest.skip("needs the locally started broker (its token secret / config)")
    return broker.local


def _official(url: str, **kw) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=30,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn), **kw)


def _role(admin_url: str, topic: str, subscription: str) -> str:
    """The role the broker authenticated the subscription's consumer as (``appId`` in topic stats)."""
    status, stats = admin_request("GET", admin_url, "/admin/v2/" + topic.replace("://", "/") + "/stats")
    assert status == 200, stats
    (consumer,) = stats["subscriptions"][subscription]["consumers"]
    return consumer["appId"]


def _roundtrip(client: txn.Client, admin_url: str, topic: str, tag: str, n: int = 5) -> tuple[list[bytes], str]:
    """Produce ``n`` messages with ``client``, consume them back with it.

    Returns the payloads received and the role the broker gave the client.
    """
    sub = f"sub-{tag}"
    consumer = client.subscribe(topic, sub)
    producer = client.create_producer(topic)
    for i in range(n):
        producer.send(f"{tag}-{i}".encode())
    got = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(m)
        got.append(m.data())
    role = _role(admin_url, topic, sub)
    producer.close()
    consumer.close()
    return got, role


def _expect_prompt(exc_type: type[BaseException], fn: Callable[[], object]) -> BaseException:
    t0 = time.monotonic()
    with pytest.raises(exc_type) as info:
        fn()
    elapsed = time.monotonic() - t0
    assert elapsed < PROMPT_S, f"{exc_type.__name__} took {elapsed:.1f}s"
    return info.value


def _hostport(url: str) -> str:
    u = urlsplit(url)
    return f"{u.hostname}:{u.port}"


def _resign(token: str, key: bytes) -> str:
    """``token`` with its claims unchanged but signed with ``key``."""
    signing_input = token.rsplit(".", 1)[0]
    sig = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


# -- token generation (pure) ----------------------------------------------------


def test_make_token_is_a_valid_hs256_jwt() -> None:
    secret = b"k" * 32
    tok = make_token(secret, "alice", expires_at=1_900_000_000.7)
    header_b64, payload_b64, sig_b64 = tok.split(".")
    assert "=" not in tok
    assert json.loads(base64.urlsafe_b64decode(header_b64 + "=" * (-len(header_b64) % 4))) == {"alg": "HS256"}
    assert _claims(tok) == {"sub": "alice", "exp": 1_900_000_000}
    expected = hmac.new(secret, f"{header_b64}.{payload_b64}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(sig_b64 + "=" * (-len(sig_b64) % 4)) == expected
    assert _claims(make_token(secret, "bob")) == {"sub": "bob"}


def test_generate_tls_material_verifies_with_openssl(tmp_path: Path) -> None:
    generate_tls_material(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broker.cert.pem", "broker.key-pk8.pem", "ca.cert.pem", "ca.key.pem", "openssl.cnf"]
    assert (tmp_path / "broker.key-pk8.pem").read_text().startswith("-----BEGIN PRIVATE KEY-----\n")
    assert (tmp_path / "broker.key-pk8.pem").stat().st_mode & 0o777 == 0o600
    res = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-CAfile", "ca.cert.pem", "broker.cert.pem"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert (res.returncode, res.stdout) == (0, "broker.cert.pem: OK\n"), res.stderr
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", "broker.cert.pem"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout
    assert "IP Address:127.0.0.1, DNS:localhost" in text


# -- the LocalBroker security setup -------------------------------------------


def test_local_broker_security_config(local: LocalBroker) -> None:
    values = dict(
        line.split("=", 1) for line in local.conf_file.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    sec = local.security_dir
    assert {k: values[k] for k in (
        "brokerServicePortTls", "tlsCertificateFilePath", "tlsKeyFilePath", "tlsTrustCertsFilePath",
        "authenticationEnabled", "authenticationProviders", "tokenSecretKey", "anonymousUserRole",
        "authorizationEnabled",
    )} == {
        "brokerServicePortTls": str(local.broker_port_tls),
        "tlsCertificateFilePath": str(sec / "broker.cert.pem"),
        "tlsKeyFilePath": str(sec / "broker.key-pk8.pem"),
        "tlsTrustCertsFilePath": str(sec / "ca.cert.pem"),
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        "tokenSecretKey": f"file://{sec / 'token-secret.key'}",
        "anonymousUserRole": ANONYMOUS_ROLE,
        "authorizationEnabled": "false",
    }
    assert local.service_url_tls == f"pulsar+ssl://127.0.0.1:{local.broker_port_tls}"
    assert local.ca_cert_path == sec / "ca.cert.pem"
    assert _claims(local.token) == {"sub": TOKEN_ROLE}  # no exp: valid for the whole session
    assert local.token_path.read_text() == local.token
    assert local.token_secret_path.stat().st_mode & 0o777 == 0o600
    log = local.log_file.read_text(errors="replace")
    assert f"broker tls url= {local.service_url_tls}" in log


def test_local_broker_security_state_is_persisted(local: LocalBroker) -> None:
    state = json.loads((local.data_dir / "broker.json").read_text())
    assert (state["security"], state["broker_port_tls"]) == (True, local.broker_port_tls)
    other = LocalBroker(local.data_dir, progress=lambda _: None)  # what a restart sees
    assert (other.security, other.service_url_tls, other.token) == (True, local.service_url_tls, local.token)
    st = other.status()
    assert (st["security"], st["service_url_tls"], st["healthy"]) == (True, local.service_url_tls, True)


def test_security_is_off_by_default(tmp_path: Path) -> None:
    lb = LocalBroker(tmp_path, progress=lambda _: None)
    assert (lb.security, lb.service_url_tls, lb.ca_cert_path, lb.token) == (False, None, None, None)


def test_lookup_advertises_tls_url(broker, tls, topic) -> None:
    tls_url, _ = tls
    with txn.Client(broker.service_url) as c:
        c.create_producer(topic).close()  # creates the topic so the lookup has an owner
    path = "/lookup/v2/topic/" + topic.replace("://", "/")
    status, body = admin_request("GET", broker.admin_url, path)
    assert status == 200
    assert body["brokerUrlTls"] == tls_url


# -- token authentication ------------------------------------------------------


def test_token_produce_consume(broker, token, topic) -> None:
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(token)) as c:
        assert _roundtrip(c, broker.admin_url, topic, "tok") == (
            [f"tok-{i}".encode() for i in range(5)], _claims(token)["sub"])


def test_token_from_callable(broker, token, topic) -> None:
    calls = []

    def supplier() -> str:
        calls.append(time.monotonic())
        return token

    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(supplier)) as c:
        assert _roundtrip(c, broker.admin_url, topic, "cb") == (
            [f"cb-{i}".encode() for i in range(5)], _claims(token)["sub"])
    assert len(calls) >= 1  # called at each connect


def test_token_from_file(broker, token, topic, tmp_path) -> None:
    path = tmp_path / "token.txt"
    path.write_text(token + "\n")  # trailing newline, as `pulsar tokens create > file` writes
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(f"file://{path}")) as c:
        assert _roundtrip(c, broker.admin_url, topic, "file") == (
            [f"file-{i}".encode() for i in range(5)], _claims(token)["sub"])


@pytest.mark.parametrize("kind", ["wrong-signature", "garbage"])
def test_bad_token_rejected_promptly(broker, token, topic, kind) -> None:
    bad = _resign(token, os.urandom(32)) if kind == "wrong-signature" else "not-a-jwt"
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(bad)) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert f"broker {_hostport(broker.service_url)} rejected authentication" in str(err)
    assert err.server_error == "AuthenticationError"


def test_expired_token_rejected_unexpired_accepted(broker, local, topic) -> None:
    expired = local.mint_token(TOKEN_ROLE, expires_in=-60)
    assert _claims(expired)["exp"] < time.time()
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(expired)) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert f"broker {_hostport(broker.service_url)} rejected authentication" in str(err)
    # Same role and secret, exp in the future: accepted, so the expiry was the reason.
    valid = local.mint_token(TOKEN_ROLE, expires_in=3600)
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(valid)) as c:
        assert _roundtrip(c, broker.admin_url, topic, "exp", n=2) == ([b"exp-0", b"exp-1"], TOKEN_ROLE)


def test_minted_token_for_other_role(broker, local, topic) -> None:
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(local.mint_token("other"))) as c:
        assert _roundtrip(c, broker.admin_url, topic, "other", n=2) == ([b"other-0", b"other-1"], "other")


def test_official_client_accepts_the_token(broker, token, topic) -> None:
    with txn.Client(broker.service_url, authentication=txn.AuthenticationToken(token)) as c:
        c.create_producer(topic).send(b"for-official")
    official = _official(broker.service_url, authentication=pulsar.AuthenticationToken(token))
    try:
        reader = official.subscribe(topic, "r", initial_position=pulsar.InitialPosition.Earliest)
        assert [m.data() for m in read_n(reader, 1)] == [b"for-official"]
    finally:
        official.close()


def test_anonymous_clients_still_work_including_transactions(broker, topic) -> None:
    """Auth is on, but clients without credentials get the anonymous role (authorization off)."""
    with txn.Client(broker.service_url) as c:
        consumer = c.subscribe(topic, "anon")
        producer = c.create_producer(topic)
        t = c.new_transaction()
        producer.send(b"anon-txn", txn=t)
        t.commit()
        m = consumer.receive(timeout_millis=10_000)
        assert m.data() == b"anon-txn"
        consumer.acknowledge(m)
        assert _role(broker.admin_url, topic, "anon") == ANONYMOUS_ROLE


def test_topic_policies_work_with_auth_enabled(broker, local, topic) -> None:
    """Topic policies go through the broker's internal system-topic client (anonymous)."""
    with txn.Client(broker.service_url) as c:
        c.create_producer(topic).close()
    path = "/admin/v2/" + topic.replace("://", "/") + "/messageTTL"
    assert admin_request("POST", broker.admin_url, path + "?messageTTL=1234")[0] == 204
    deadline = time.monotonic() + 20
    while True:
        status, body = admin_request("GET", broker.admin_url, path)
        if (status, body) == (200, 1234) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (status, body) == (200, 1234)


# -- TLS ----------------------------------------------------------------------


def _pooled_schemes(client: txn.Client) -> set[str]:
    """URL schemes of the client's pooled connections (logical and physical URLs)."""
    keys = client.async_client.context.pool.connection_keys()  # (logical URL, physical URL) each
    assert keys
    return {url.split("://", 1)[0] for key in keys for url in key}


def test_tls_end_to_end_with_transaction(tls, topic) -> None:
    tls_url, ca = tls
    official = _official(tls_url, tls_trust_certs_file_path=ca)
    try:
        reader = official.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
        with txn.Client(tls_url, tls_trust_certs_file_path=ca) as c:
            producer = c.create_producer(topic)
            t = c.new_transaction()
            for i in range(3):
                producer.send(f"tls-txn-{i}".encode(), txn=t)
            assert_nothing(reader, 1500)  # uncommitted: invisible
            t.commit()
            assert t.state is txn.TxnState.COMMITTED
            # Every connection, including the one from the lookup answer (brokerServiceUrlTls), is TLS.
            assert _pooled_schemes(c) == {"pulsar+ssl"}
        got = read_n(reader, 3)
        assert [m.data() for m in got] == [b"tls-txn-0", b"tls-txn-1", b"tls-txn-2"]
        assert read_until_sentinel(official, reader, topic) == []
    finally:
        official.close()


def test_tls_consume_with_transactional_ack(tls, topic) -> None:
    tls_url, ca = tls
    with txn.Client(tls_url, tls_trust_certs_file_path=ca) as c:
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic)
        producer.send(b"a")
        m = consumer.receive(timeout_millis=10_000)
        t = c.new_transaction()
        consumer.acknowledge(m, txn=t)
        t.commit()
        assert (m.data(), t.state) == (b"a", txn.TxnState.COMMITTED)


def test_tls_with_hostname_validation(broker, tls, topic) -> None:
    tls_url, ca = tls
    with txn.Client(tls_url, tls_trust_certs_file_path=ca, tls_validate_hostname=True) as c:
        assert _roundtrip(c, broker.admin_url, topic, "host") == (
            [f"host-{i}".encode() for i in range(5)], ANONYMOUS_ROLE)


def test_tls_hostname_validation_by_dns_name(broker, local, topic) -> None:
    url = local.service_url_tls.replace("127.0.0.1", "localhost")
    with txn.Client(url, tls_trust_certs_file_path=str(local.ca_cert_path), tls_validate_hostname=True) as c:
        assert _roundtrip(c, broker.admin_url, topic, "dns", n=2) == ([b"dns-0", b"dns-1"], ANONYMOUS_ROLE)


def test_tls_without_ca_fails_promptly(tls, topic) -> None:
    tls_url, _ = tls
    with txn.Client(tls_url) as c:  # default trust store: our test CA is not in it
        err = _expect_prompt(txn.ConnectError, lambda: c.create_producer(topic))
    assert f"cannot connect to {_hostport(tls_url)}: TLS certificate not trusted" in str(err)
    assert "CERTIFICATE_VERIFY_FAILED" in str(err)


def test_tls_allow_insecure_without_ca(broker, tls, topic) -> None:
    tls_url, _ = tls
    with txn.Client(tls_url, tls_allow_insecure_connection=True) as c:
        assert _roundtrip(c, broker.admin_url, topic, "insecure") == (
            [f"insecure-{i}".encode() for i in range(5)], ANONYMOUS_ROLE)


def test_plain_client_to_tls_port_fails_promptly(tls, topic) -> None:
    tls_url, _ = tls
    plain = tls_url.replace("pulsar+ssl://", "pulsar://")
    with txn.Client(plain, operation_timeout_seconds=3, connection_timeout_ms=2000) as c:
        t0 = time.monotonic()
        with pytest.raises(txn.Timeout) as info:
            c.create_producer(topic)
        elapsed = time.monotonic() - t0
    # The broker drops the non-TLS bytes; the client retries until the operation timeout.
    assert f"last error: connection to {_hostport(tls_url)} lost" in str(info.value)
    assert elapsed < PROMPT_S


# -- TLS + token ----------------------------------------------------------------


def test_tls_and_token_together(broker, tls, token, topic) -> None:
    tls_url, ca = tls
    official = _official(tls_url, tls_trust_certs_file_path=ca, authentication=pulsar.AuthenticationToken(token))
    try:
        reader = official.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
        with txn.Client(tls_url, authentication=txn.AuthenticationToken(token), tls_trust_certs_file_path=ca,
                        tls_validate_hostname=True) as c:
            assert _roundtrip(c, broker.admin_url, topic, "both", n=3) == (
                [b"both-0", b"both-1", b"both-2"], _claims(token)["sub"])
            producer = c.create_producer(topic)
            t = c.new_transaction()
            producer.send(b"both-txn", txn=t)
            t.commit()
        got = [m.data() for m in read_n(reader, 4)]
        assert got == [b"both-0", b"both-1", b"both-2", b"both-txn"]
    finally:
        official.close()


def test_tls_with_bad_token_rejected_promptly(tls, token, topic) -> None:
    tls_url, ca = tls
    bad = _resign(token, os.urandom(32))
    with txn.Client(tls_url, authentication=txn.AuthenticationToken(bad), tls_trust_certs_file_path=ca) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert f"broker {_hostport(tls_url)} rejected authentication" in str(err)



@pytest.mark.slow
def test_security_survives_restart(tmp_path: Path) -> None:
    """Own broker (~1-1.5 min on 2 cores): a restart from broker.json keeps TLS port, CA and token."""
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(free_port())
    bp, wp, kp, tp = ports
    lb = LocalBroker(tmp_path, broker_port=bp, web_port=wp, bookie_port=kp, broker_port_tls=tp, security=True,
                     progress=lambda _: None)
    topic = f"persistent://public/default/restart-sec-{os.urandom(4).hex()}"
    try:
        assert lb.start() is True
        token, tls_url, ca = lb.token, lb.service_url_tls, str(lb.ca_cert_path)
        ca_pem = Path(ca).read_text()
        with txn.Client(tls_url, authentication=txn.AuthenticationToken(token), tls_trust_certs_file_path=ca) as c:
            c.subscribe(topic, "s")
            c.create_producer(topic).send(b"before")
        assert lb.stop() is True
        again = LocalBroker(tmp_path, progress=lambda _: None)  # security and TLS port from broker.json
        assert (again.security, again.service_url_tls, again.token) == (True, tls_url, token)
        assert again.start() is True
        assert Path(ca).read_text() == ca_pem  # not regenerated
        with txn.Client(tls_url, authentication=txn.AuthenticationToken(token), tls_trust_certs_file_path=ca) as c:
            consumer = c.subscribe(topic, "s")
            assert consumer.receive(timeout_millis=10_000).data() == b"before"
            t = c.new_transaction()
            c.create_producer(topic).send(b"after", txn=t)
            t.commit()
            assert consumer.receive(timeout_millis=10_000).data() == b"after"
    finally:
        lb.stop()
