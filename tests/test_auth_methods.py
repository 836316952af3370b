"""Every way to authenticate: OAuth2 client credentials, TLS client certificates, basic, side by side
with the official client, and through the one settings model (``BrokerSettings``).

The broker is ``authn_broker`` (tests/conftest.py): token, TLS and basic providers, credentials
checked for expiry every 2 s. The OAuth2 issuer is :class:`Issuer`, an ``http.server`` on loopback
that serves ``/<realm>/.well-known/openid-configuration`` and a client-credentials token endpoint,
and issues HS256 JWTs (``sub`` = the client's role) signed with the broker's token secret.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pulsar
import pytest
from conftest import AUTHN_BASIC_USERS, AUTHN_REFRESH_CHECK_S, Broker

import txn
from txn.admin import admin_request
from txn.connection import Connection
from txn.settings import BrokerSettings, SettingsError, add_broker_arguments
from txn_shell.localbroker import make_token

from peer import read_n
from spark_session import spark  # noqa: F401

#: A rejected credential must fail well inside the 30 s operation timeout.
PROMPT_S = 5.0
#: Lifetime of the "short" client's tokens.
SHORT_LIFETIME_S = 8


# -- the local OAuth2 issuer ------------------------------------------------------------------------


@dataclass
class Client:
    secret: str
    role: str
    lifetime_s: int = 3600


@dataclass
class Issuer:
    """A loopback OAuth2 issuer with realms: ``good`` signs with the broker's secret, ``foreign``
    with another key, ``malformed`` answers without an access token, ``badjson`` serves a discovery
    document that is not JSON."""

    key: bytes
    clients: dict[str, Client]
    port: int = 0
    #: (realm, form fields) of every token request, in order.
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    discoveries: int = 0

    def url(self, realm: str = "good") -> str:
        return f"http://127.0.0.1:{self.port}/{realm}"

    def params(self, client_id: str, realm: str = "good", **extra: str) -> str:
        """The official ``AuthenticationOauth2`` parameter string for ``client_id``."""
        c = self.clients[client_id]
        return json.dumps({"type": "client_credentials", "issuer_url": self.url(realm), "client_id": client_id,
                           "client_secret": c.secret, **extra})

    def issued(self, client_id: str) -> int:
        return sum(1 for _, form in self.requests if form.get("client_id") == client_id)

    def mint(self, client_id: str, key: bytes | None = None) -> tuple[str, int]:
        c = self.clients[client_id]
        return make_token(key or self.key, c.role, expires_at=time.time() + c.lifetime_s), c.lifetime_s


def _handler(issuer: Issuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: Any) -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802
            realm, _, rest = self.path.lstrip("/").partition("/")
            if rest != ".well-known/openid-configuration":
                return self._send(404, {"error": "not_found"})
            issuer.discoveries += 1
            if realm == "badjson":
                return self._send(200, b"<html>not json</html>")
            return self._send(200, {"issuer": issuer.url(realm), "token_endpoint": issuer.url(realm) + "/token",
                                    "grant_types_supported": ["client_credentials"]})

        def do_POST(self) -> None:  # noqa: N802
            realm, _, rest = self.path.lstrip("/").partition("/")
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            if rest != "token":
                return self._send(404, {"error": "not_found"})
            issuer.requests.append((realm, form))
            client = issuer.clients.get(form.get("client_id", ""))
            if form.get("grant_type") != "client_credentials":
                return self._send(400, {"error": "unsupported_grant_type"})
            if client is None or form.get("client_secret") != client.secret:
                return self._send(401, {"error": "invalid_client", "error_description": "bad client credentials"})
            if realm == "malformed":
                return self._send(200, {"token_type": "Bearer"})
            token, lifetime = issuer.mint(form["client_id"], key=b"f" * 32 if realm == "foreign" else None)
            return self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": lifetime})

    return Handler


@contextlib.contextmanager
def _serving(iss: Issuer) -> Iterator[Issuer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(iss))
    iss.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, name="oauth2-issuer", daemon=True).start()
    try:
        yield iss
    finally:
        server.shutdown()
        server.server_close()


def _clients() -> dict[str, Client]:
    return {"oauth-app": Client("app-secret", "oauth-app"),
            "short-app": Client("short-secret", "short-app", lifetime_s=SHORT_LIFETIME_S)}


@pytest.fixture(scope="module")
def issuer(authn_broker: Broker) -> Iterator[Issuer]:
    """The loopback issuer, signing with ``authn_broker``'s token secret."""
    assert authn_broker.local is not None
    with _serving(Issuer(authn_broker.local.token_secret_path.read_bytes(), _clients())) as iss:
        yield iss


@pytest.fixture(scope="module")
def offline_issuer() -> Iterator[Issuer]:
    """The same issuer for tests without a broker (signing with a key no broker knows)."""
    with _serving(Issuer(b"k" * 32, _clients())) as iss:
        yield iss


# -- helpers --------------------------------------------------------------------------------------


def _official(url: str, **kw: Any) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
                         **kw)


def _role(admin_url: str, topic: str, subscription: str) -> str:
    """The role the broker authenticated the subscription's consumer as (``appId`` in topic stats)."""
    status, stats = admin_request("GET", admin_url, "/admin/v2/" + topic.replace("://", "/") + "/stats")
    assert status == 200, stats
    (consumer,) = stats["subscriptions"][subscription]["consumers"]
    return consumer["appId"]


def _roundtrip(client: txn.Client, admin_url: str, topic: str, tag: str, n: int = 3) -> tuple[list[bytes], str]:
    """Produce ``n`` messages with ``client`` and consume them back; the payloads and the role."""
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


def _official_roundtrip(client: pulsar.Client, admin_url: str, topic: str, tag: str) -> tuple[list[bytes], str]:
    sub = f"sub-{tag}"
    consumer = client.subscribe(topic, sub)
    producer = client.create_producer(topic)
    producer.send(f"{tag}-0".encode())
    got = [m.data() for m in read_n(consumer, 1)]
    role = _role(admin_url, topic, sub)
    producer.close()
    consumer.close()
    return got, role


def _expect_prompt(exc_type: type[BaseException], fn: Any) -> Any:
    t0 = time.monotonic()
    with pytest.raises(exc_type) as info:
        fn()
    elapsed = time.monotonic() - t0
    assert elapsed < PROMPT_S, f"{exc_type.__name__} took {elapsed:.1f}s"
    return info.value


def _connections(client: txn.Client) -> list[Connection]:
    pool = client.async_client.context.pool
    futures = list(pool._conns.values())  # noqa: SLF001
    return [f.result() for f in futures if f.done() and f.exception() is None]


def _interop(ours: txn.Client, official: pulsar.Client, topic: str) -> None:
    """Each client reads what the other wrote on a new topic named after ``topic``."""
    topic += "-interop"
    theirs_in = official.subscribe(topic, "from-ours", initial_position=pulsar.InitialPosition.Earliest)
    ours_in = ours.subscribe(topic, "from-official", initial_position=txn.InitialPosition.Earliest)
    ours.create_producer(topic).send(b"written-by-txn")
    official.create_producer(topic).send(b"written-by-official")
    assert sorted(m.data() for m in read_n(theirs_in, 2)) == [b"written-by-official", b"written-by-txn"]
    got = []
    for _ in range(2):
        m = ours_in.receive(timeout_millis=10_000)
        ours_in.acknowledge(m)
        got.append(m.data())
    assert sorted(got) == [b"written-by-official", b"written-by-txn"]


# -- OAuth2 against the broker --------------------------------------------------------------------


def test_oauth2_produce_consume(authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    params = issuer.params("oauth-app", audience="urn:pulsar:test", scope="produce consume")
    before = len(issuer.requests)
    auth = txn.AuthenticationOauth2(params)
    with txn.Client(authn_broker.service_url, authentication=auth) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, "oauth2") == (
            [b"oauth2-0", b"oauth2-1", b"oauth2-2"], "oauth-app")
    (realm, form), = issuer.requests[before:]  # one token for every connection and command
    assert realm == "good" and auth.fetches == 1
    assert form == {"grant_type": "client_credentials", "client_id": "oauth-app", "client_secret": "app-secret",
                    "audience": "urn:pulsar:test", "scope": "produce consume"}


def test_oauth2_side_by_side_with_the_official_client(authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    params = issuer.params("oauth-app")
    before = issuer.issued("oauth-app")
    official = _official(authn_broker.service_url, authentication=pulsar.AuthenticationOauth2(params))
    try:
        assert _official_roundtrip(official, authn_broker.admin_url, topic, "official") == (
            [b"official-0"], "oauth-app")
        with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationOauth2(params)) as ours:
            _interop(ours, official, topic)
    finally:
        official.close()
    assert issuer.issued("oauth-app") >= before + 2  # both fetched their token from the same endpoint


@pytest.mark.parametrize("form", ["path", "file-url", "data-url"])
def test_oauth2_private_key_credentials_file(authn_broker: Broker, issuer: Issuer, topic: str, tmp_path: Path,
                                             form: str) -> None:
    creds = json.dumps({"type": "client_credentials", "client_id": "oauth-app", "client_secret": "app-secret"})
    path = tmp_path / "credentials.json"
    path.write_text(creds)
    key = {"path": str(path), "file-url": f"file://{path}",
           "data-url": "data:application/json;base64," + base64.b64encode(creds.encode()).decode()}[form]
    params = json.dumps({"issuer_url": issuer.url(), "private_key": key, "audience": "urn:pulsar:test"})
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationOauth2(params)) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, form, n=1) == ([f"{form}-0".encode()], "oauth-app")
    if form == "path":  # the official client reads the same parameters
        official = _official(authn_broker.service_url, authentication=pulsar.AuthenticationOauth2(params))
        try:
            assert _official_roundtrip(official, authn_broker.admin_url, topic, "official-key")[1] == "oauth-app"
        finally:
            official.close()


def test_oauth2_wrong_client_secret_is_a_typed_error(authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    params = json.dumps({"issuer_url": issuer.url(), "client_id": "oauth-app", "client_secret": "wrong"})
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationOauth2(params)) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert "refused the client credentials of client_id 'oauth-app'" in str(err)
    assert "HTTP 401 invalid_client bad client credentials" in str(err)
    assert err.retriable is False
    # The official client raises its AuthenticationError for the same parameters, as promptly.
    official = _official(authn_broker.service_url, authentication=pulsar.AuthenticationOauth2(params))
    try:
        _expect_prompt(pulsar.AuthenticationError, lambda: official.create_producer(topic))
    finally:
        official.close()


def test_broker_rejects_a_token_it_did_not_sign(authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    """The broker checks what the issuer hands out: a token signed with another key is refused."""
    params = issuer.params("oauth-app", realm="foreign")
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationOauth2(params)) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert "rejected authentication" in str(err) and err.server_error == "AuthenticationError"


def test_oauth2_token_is_refreshed_before_the_broker_drops_the_connection(
        authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    """Tokens of 8 s, the broker checks every 2 s: the OAuth2 client answers the broker's challenge
    with a new token and its one connection keeps working well past the first token's expiry. The
    control: a client holding one such token (AuthenticationToken) is challenged too, cannot
    refresh, and the broker closes its connection."""
    auth = txn.AuthenticationOauth2(issuer.params("short-app"))
    fixed, _ = issuer.mint("short-app")
    with txn.Client(authn_broker.service_url, authentication=auth) as a, \
            txn.Client(authn_broker.service_url, authentication=txn.AuthenticationToken(fixed)) as b:
        consumer = a.subscribe(topic, "refresh")
        producer = a.create_producer(topic, batching_enabled=False)
        b.create_producer(topic + "-control", batching_enabled=False).send(b"control")
        (conn,), (control,) = _connections(a), _connections(b)
        assert auth.fetches == 1
        sent = 0
        deadline = time.monotonic() + SHORT_LIFETIME_S + 3 * AUTHN_REFRESH_CHECK_S + 2
        while time.monotonic() < deadline:
            producer.send(f"m-{sent}".encode())
            sent += 1
            time.sleep(0.5)
        got = []
        for _ in range(sent):
            m = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(m)
            got.append(m.data())
        assert got == [f"m-{i}".encode() for i in range(sent)]
        assert _connections(a) == [conn] and not conn.closed  # the same connection throughout
        assert conn.auth_challenges >= 1 and auth.fetches >= 2
        assert control.auth_challenges >= 1 and control.closed  # challenged, no new token: dropped


# -- OAuth2 without a broker ----------------------------------------------------------------------


@pytest.mark.parametrize("params, message", [
    ("not json", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"client_id": "a", "client_secret": "b"}', "issuer_url is required"),
    ('{"issuer_url": "ftp://x", "client_id": "a", "client_secret": "b"}', "must be an http(s) URL"),
    ('{"issuer_url": "http://x"}', "give private_key (a credentials file) or client_id and client_secret"),
    ('{"issuer_url": "http://x", "private_key": "/nonexistent/creds.json"}', "cannot read the credentials file"),
    ('{"issuer_url": "http://x", "private_key": "data:text/plain;base64,e30="}', "data:application/json;base64"),
    ('{"issuer_url": "http://x", "private_key": "data:application/json;base64,e30="}',
     "needs the string fields client_id and client_secret"),
    ('{"issuer_url": "http://x", "client_id": "a", "client_secret": "b", "tokenEndpointAuthMethod": "tls_client_auth"}',
     "not supported"),
])
def test_oauth2_bad_parameters_raise_value_error(params: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        txn.AuthenticationOauth2(params)
    with pytest.raises(ValueError):
        txn.AuthenticationOauth2(123)  # type: ignore[arg-type]


def test_oauth2_issuer_errors_are_typed(offline_issuer: Issuer) -> None:
    from txn_shell.localbroker import free_port

    dead = json.dumps({"issuer_url": f"http://127.0.0.1:{free_port()}", "client_id": "a", "client_secret": "b"})
    with pytest.raises(txn.AuthenticationError, match=r"discovery document .* is unreachable") as info:
        txn.AuthenticationOauth2(dead).auth_data()
    assert info.value.retriable is True  # an issuer outage is retried like a broker outage
    # ... by the client, until its operation timeout (the official client fails at once: see
    # docs/porting.md); the credentials come before the socket, so no broker is needed here.
    with txn.Client("pulsar://127.0.0.1:1", authentication=txn.AuthenticationOauth2(dead),
                    operation_timeout_seconds=2) as c:
        with pytest.raises(txn.Timeout, match=r"last error: OAuth2 discovery document .* is unreachable"):
            c.create_producer("t")

    with pytest.raises(txn.AuthenticationError, match="refused the client credentials .* HTTP 401") as info:
        txn.AuthenticationOauth2(offline_issuer.params("oauth-app").replace("app-secret", "nope")).auth_data()
    assert info.value.retriable is False

    with pytest.raises(txn.AuthenticationError, match="sent a malformed response: no access_token") as info:
        txn.AuthenticationOauth2(offline_issuer.params("oauth-app", realm="malformed")).auth_data()
    assert info.value.retriable is False

    with pytest.raises(txn.AuthenticationError, match="discovery document .* malformed response .*not a JSON"):
        txn.AuthenticationOauth2(offline_issuer.params("oauth-app", realm="badjson")).auth_data()

    missing = json.dumps({"issuer_url": offline_issuer.url() + "/nowhere", "client_id": "a", "client_secret": "b"})
    with pytest.raises(txn.AuthenticationError, match="HTTP 404"):
        txn.AuthenticationOauth2(missing).auth_data()


def test_oauth2_token_cached_until_near_expiry_or_challenged(offline_issuer: Issuer) -> None:
    import asyncio

    auth = txn.AuthenticationOauth2(offline_issuer.params("short-app"))
    first = auth.auth_data()
    assert auth.auth_data() == first and asyncio.run(auth.auth_data_async()) == first and auth.fetches == 1
    cached = auth._cached  # noqa: SLF001
    assert cached is not None and cached.expires_at is not None
    assert SHORT_LIFETIME_S - 1.5 <= cached.expires_at - time.time() <= SHORT_LIFETIME_S
    assert cached.margin == pytest.approx(SHORT_LIFETIME_S / 5, abs=0.3)
    # The broker challenged the token a connection sent: a new one, whatever the clock says.
    time.sleep(1.1)  # exp is in whole seconds: let the next token differ
    second = asyncio.run(auth.auth_data_async(stale=first))
    assert second != first and auth.fetches == 2
    assert asyncio.run(auth.auth_data_async(stale=first)) == second and auth.fetches == 2  # newer one: kept
    # Near expiry (inside the margin): fetched again.
    auth._cached = type(cached)(second.decode(), time.time() + 1.0, cached.margin)  # noqa: SLF001
    third = auth.auth_data()
    assert auth.fetches == 3
    assert auth.http_headers() == {"Authorization": "Bearer " + third.decode()} and auth.fetches == 3


# -- TLS client certificates ----------------------------------------------------------------------


def test_tls_client_certificate(authn_broker: Broker, topic: str) -> None:
    assert authn_broker.local is not None and authn_broker.service_url_tls and authn_broker.ca_cert
    cert, key = (str(p) for p in authn_broker.local.make_client_certificate("tls-user"))
    tls_url, ca = authn_broker.service_url_tls, authn_broker.ca_cert
    with txn.Client(tls_url, authentication=txn.AuthenticationTLS(cert, key), tls_trust_certs_file_path=ca) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, "tls") == ([b"tls-0", b"tls-1", b"tls-2"], "tls-user")
    official = _official(tls_url, authentication=pulsar.AuthenticationTLS(cert, key), tls_trust_certs_file_path=ca)
    try:
        assert _official_roundtrip(official, authn_broker.admin_url, topic, "official-tls") == (
            [b"official-tls-0"], "tls-user")
        with txn.Client(tls_url, authentication=txn.AuthenticationTLS(cert, key), tls_trust_certs_file_path=ca) as c:
            _interop(c, official, topic)
    finally:
        official.close()


def test_tls_client_certificate_refused_without_tls_or_with_another_ca(authn_broker: Broker, topic: str,
                                                                       tmp_path: Path) -> None:
    assert authn_broker.local is not None and authn_broker.service_url_tls and authn_broker.ca_cert
    cert, key = (str(p) for p in authn_broker.local.make_client_certificate("tls-user"))
    # Over plain pulsar:// there is no certificate to show: the TLS provider refuses.
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationTLS(cert, key)) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert "rejected authentication" in str(err)
    # A certificate from another CA: the broker ends the TLS handshake. A handshake that fails is
    # retried like an unreachable broker until the operation timeout (the official client also
    # times out), the last error naming the TLS alert.
    from txn_shell.localbroker import generate_client_certificate, generate_tls_material

    generate_tls_material(tmp_path)
    other_cert, other_key = tmp_path / "c.pem", tmp_path / "k.pem"
    generate_client_certificate(tmp_path, "tls-user", other_cert, other_key)
    with txn.Client(authn_broker.service_url_tls, authentication=txn.AuthenticationTLS(str(other_cert), str(other_key)),
                    tls_trust_certs_file_path=authn_broker.ca_cert, operation_timeout_seconds=4) as c:
        with pytest.raises(txn.Timeout, match="SSL"):
            c.create_producer(topic)
    # Files that do not exist: a ValueError naming them, when the client is made.
    with pytest.raises(ValueError, match="cannot load the TLS client certificate /nonexistent.pem"):
        txn.Client(authn_broker.service_url_tls, authentication=txn.AuthenticationTLS("/nonexistent.pem", key))


def test_client_certificate_beside_a_token(authn_broker: Broker, topic: str) -> None:
    """``tls_certificate_file_path`` / ``tls_private_key_file_path`` (mutual TLS) with token
    authentication: the token decides the role."""
    assert authn_broker.local is not None and authn_broker.service_url_tls and authn_broker.token
    cert, key = (str(p) for p in authn_broker.local.make_client_certificate("tls-user"))
    with txn.Client(authn_broker.service_url_tls, authentication=txn.AuthenticationToken(authn_broker.token),
                    tls_trust_certs_file_path=authn_broker.ca_cert, tls_certificate_file_path=cert,
                    tls_private_key_file_path=key) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, "mtls", n=1) == ([b"mtls-0"], "tester")
    with pytest.raises(ValueError, match="give both or neither"):
        txn.Client(authn_broker.service_url_tls, tls_certificate_file_path=cert)


# -- basic ----------------------------------------------------------------------------------------


def test_basic_authentication(authn_broker: Broker, topic: str) -> None:
    (user, password), = AUTHN_BASIC_USERS.items()
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationBasic(user, password)) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, "basic") == ([b"basic-0", b"basic-1", b"basic-2"], user)
    params = json.dumps({"username": user, "password": password})
    official = _official(authn_broker.service_url, authentication=pulsar.AuthenticationBasic(auth_params_string=params))
    try:
        assert _official_roundtrip(official, authn_broker.admin_url, topic, "official-basic") == (
            [b"official-basic-0"], user)
        with txn.Client(authn_broker.service_url,
                        authentication=txn.AuthenticationBasic(auth_params_string=params)) as c:
            _interop(c, official, topic)
    finally:
        official.close()
    with txn.Client(authn_broker.service_url, authentication=txn.AuthenticationBasic(user, "wrong")) as c:
        err = _expect_prompt(txn.AuthenticationError, lambda: c.create_producer(topic))
    assert "rejected authentication" in str(err)


def test_basic_parameters() -> None:
    a = txn.AuthenticationBasic("u", "p:w")
    assert (a.method_name, a.auth_data()) == ("basic", b"u:p:w")
    assert a.http_headers() == {"Authorization": "Basic " + base64.b64encode(b"u:p:w").decode()}
    b = txn.AuthenticationBasic(auth_params_string='{"username": "u", "password": "p", "method": "oms3.0"}')
    assert (b.method_name, b.auth_data()) == ("oms3.0", b"u:p")
    with pytest.raises(ValueError, match="No password provided"):
        txn.AuthenticationBasic(auth_params_string='{"username": "u"}')
    with pytest.raises(ValueError):
        txn.AuthenticationBasic("u", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # the official client checks the same way
        pulsar.AuthenticationBasic("u", None)


# -- admin REST API -------------------------------------------------------------------------------


def test_admin_api_gets_each_method_s_credentials(authn_broker: Broker, issuer: Issuer) -> None:
    """Admin REST calls carry the method's header (checked on a loopback server that records it)
    and the broker answers them. Its web API lets anonymous in, so a bad header is not refused
    there: the header itself is what is checked."""
    (user, password), = AUTHN_BASIC_USERS.items()
    seen: list[str | None] = []

    class Recorder(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    recorder = f"http://127.0.0.1:{server.server_address[1]}"
    oauth2 = {"auth_oauth2_issuer_url": issuer.url(), "auth_oauth2_client_id": "oauth-app",
              "auth_oauth2_client_secret": "app-secret"}
    try:
        for settings, header in [
            (oauth2, "Bearer "),
            ({"auth_basic_username": user, "auth_basic_password": password},
             "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()),
        ]:
            kw = BrokerSettings(authn_broker.service_url, authn_broker.admin_url, **settings).admin_kwargs()
            assert admin_request("GET", authn_broker.admin_url, "/admin/v2/clusters", **kw)[0] == 200
            assert admin_request("GET", recorder, "/admin/v2/clusters", **kw)[0] == 200
            assert seen[-1] is not None and seen[-1].startswith(header)
        token = seen[0].removeprefix("Bearer ")  # type: ignore[union-attr]
        assert _claims(token)["sub"] == "oauth-app"
    finally:
        server.shutdown()
        server.server_close()
    kw = BrokerSettings(authn_broker.service_url, authn_broker.admin_url,
                        **{**oauth2, "auth_oauth2_client_secret": "wrong"}).admin_kwargs()
    with pytest.raises(PermissionError, match="no credentials for the admin API: OAuth2 token endpoint"):
        admin_request("GET", authn_broker.admin_url, "/admin/v2/clusters", **kw)


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


# -- the settings model: environment, flags, control plane, Spark options -------------------------


def _settings_for(method: str, broker: Broker, issuer: Issuer) -> dict[str, str]:
    """``PULSAR_TXN_*`` variables that authenticate with ``method`` to ``broker``."""
    assert broker.local is not None and broker.service_url_tls and broker.ca_cert
    return {"PULSAR_TXN_ADMIN_URL": broker.admin_url, **_credentials_for(method, broker, issuer)}


def _credentials_for(method: str, broker: Broker, issuer: Issuer) -> dict[str, str]:
    assert broker.local is not None and broker.service_url_tls and broker.ca_cert
    if method == "oauth2":
        return {"PULSAR_TXN_SERVICE_URL": broker.service_url, "PULSAR_TXN_AUTH_OAUTH2_ISSUER_URL": issuer.url(),
                "PULSAR_TXN_AUTH_OAUTH2_CLIENT_ID": "oauth-app", "PULSAR_TXN_AUTH_OAUTH2_CLIENT_SECRET": "app-secret",
                "PULSAR_TXN_AUTH_OAUTH2_AUDIENCE": "urn:pulsar:test"}
    if method == "basic":
        (user, password), = AUTHN_BASIC_USERS.items()
        return {"PULSAR_TXN_SERVICE_URL": broker.service_url, "PULSAR_TXN_AUTH_BASIC_USERNAME": user,
                "PULSAR_TXN_AUTH_BASIC_PASSWORD": password}
    cert, key = broker.local.make_client_certificate("tls-user")
    return {"PULSAR_TXN_SERVICE_URL": broker.service_url_tls, "PULSAR_TXN_TLS_TRUST_CERTS": broker.ca_cert,
            "PULSAR_TXN_TLS_CERT_FILE": str(cert), "PULSAR_TXN_TLS_KEY_FILE": str(key)}


@pytest.mark.parametrize("method, role", [("oauth2", "oauth-app"), ("basic", "basic-user"), ("tls", "tls-user")])
def test_settings_from_environment_flags_control_plane_and_spark_options(
        authn_broker: Broker, issuer: Issuer, topic: str, method: str, role: str) -> None:
    import argparse

    from coordinator_api.settings import Settings
    from spark_jobs.options import broker_settings, lower_options, settings_options

    env = _settings_for(method, authn_broker, issuer)
    s = BrokerSettings.from_env(env)
    # The CLI flags: the same settings.
    p = argparse.ArgumentParser()
    add_broker_arguments(p)
    argv = []
    for name, value in env.items():
        flag = {"PULSAR_TXN_TLS_TRUST_CERTS": "--tls-trust-certs", "PULSAR_TXN_TLS_CERT_FILE": "--tls-cert-file",
                "PULSAR_TXN_TLS_KEY_FILE": "--tls-key-file"}.get(name)
        argv += [flag or "--" + name[len("PULSAR_TXN_"):].lower().replace("_", "-"), value]
    assert BrokerSettings.from_args(p.parse_args(argv), {}) == s
    # The control plane reads the same variables.
    assert Settings(_env_file=None, **{k[len("PULSAR_TXN_"):].lower(): v for k, v in env.items()}).broker() == s
    # The Spark options carry them to the source, the sink and the runtime's tasks.
    assert broker_settings(lower_options(settings_options(s))) == s
    with txn.Client(s.require_service_url(), **s.client_kwargs()) as c:
        assert _roundtrip(c, authn_broker.admin_url, topic, method, n=1) == ([f"{method}-0".encode()], role)


def test_settings_validation_and_redaction(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    oauth2 = {"auth_oauth2_issuer_url": "http://i", "auth_oauth2_client_id": "a", "auth_oauth2_client_secret": "s"}
    for bad, message in [
        ({"auth_token": "t", **oauth2}, "give one way to authenticate, not token and OAuth2"),
        ({"auth_basic_username": "u", "auth_basic_password": "p", **oauth2}, "not OAuth2 and basic"),
        ({"auth_basic_username": "u"}, "basic authentication needs both"),
        ({"auth_oauth2_client_id": "a", "auth_oauth2_client_secret": "s"}, "issuer_url is required"),
        ({"auth_oauth2_issuer_url": "http://i", "auth_oauth2_private_key": "/nope.json"},
         "cannot read the credentials"),
        ({"tls_certificate_file_path": str(cert)}, "needs both PULSAR_TXN_TLS_CERT_FILE"),
        ({"tls_certificate_file_path": "/nope.pem", "tls_private_key_file_path": str(key)}, "not found: /nope.pem"),
        ({"service_url": "pulsar://h:6650", "tls_certificate_file_path": str(cert),
          "tls_private_key_file_path": str(key)}, "must be pulsar+ssl://"),
    ]:
        with pytest.raises(SettingsError, match=re.escape(message)):
            BrokerSettings(**bad)
    s = BrokerSettings("pulsar+ssl://h:6651", auth_basic_username="u", auth_basic_password="pw",
                       tls_certificate_file_path=str(cert), tls_private_key_file_path=str(key))
    assert s.redacted()["auth_basic_password"] == "***"
    kw = s.client_kwargs()
    assert isinstance(kw["authentication"], txn.AuthenticationBasic)
    assert (kw["tls_certificate_file_path"], kw["tls_private_key_file_path"]) == (str(cert), str(key))
    o = BrokerSettings("pulsar://h:1", **oauth2)
    assert o.redacted()["auth_oauth2_client_secret"] == "***"
    # One provider per parameter set in a process: one cached token for all clients and admin calls.
    assert o.client_kwargs()["authentication"] is BrokerSettings("pulsar://h:1", **oauth2).authentication()
    assert isinstance(BrokerSettings("pulsar+ssl://h:1", tls_certificate_file_path=str(cert),
                                     tls_private_key_file_path=str(key)).authentication(), txn.AuthenticationTLS)


def test_spark_options_name_the_new_credentials() -> None:
    from spark_jobs.options import SECURITY_OPTIONS, UnknownOption, lower_options, refuse_unknown

    for name in ("authOauth2IssuerUrl", "authOauth2ClientId", "authOauth2ClientSecret", "authOauth2PrivateKey",
                 "authOauth2Audience", "authOauth2Scope", "authBasicUsername", "authBasicPassword",
                 "tlsCertificateFilePath", "tlsKeyFilePath"):
        assert name in SECURITY_OPTIONS
    with pytest.raises(UnknownOption, match="did you mean authOauth2ClientSecret"):
        refuse_unknown(lower_options({"authOauth2ClientSecrt": "x"}), SECURITY_OPTIONS, "pulsar source")


def test_spark_source_and_sink_with_oauth2(spark, authn_broker: Broker, issuer: Issuer,  # noqa: F811
                                           unique_name: Any) -> None:
    """The source reads and the sink writes with OAuth2 options; the Spark tasks (Python workers,
    other processes) fetch tokens of their own from the issuer."""
    from spark_jobs.options import settings_options
    from txn.admin import create_namespace, enable_namespace_dedup

    ns = f"public/{unique_name('authn')}"
    create_namespace(authn_broker.admin_url, ns)
    enable_namespace_dedup(authn_broker.admin_url, ns)
    src, dst = f"persistent://{ns}/src", f"persistent://{ns}/dst"
    s = BrokerSettings(authn_broker.service_url, authn_broker.admin_url, auth_oauth2_issuer_url=issuer.url(),
                       auth_oauth2_client_id="oauth-app", auth_oauth2_client_secret="app-secret",
                       auth_oauth2_scope="spark")
    options = settings_options(s)
    assert {"authOauth2IssuerUrl", "authOauth2ClientId", "authOauth2ClientSecret", "authOauth2Scope"} <= set(options)
    with txn.Client(s.require_service_url(), **s.client_kwargs()) as c:
        consumer = c.subscribe(dst, "check")
        producer = c.create_producer(src)
        for i in range(3):
            producer.send(f"spark-{i}".encode())
        before = issuer.issued("oauth-app")
        df = spark.read.format("pulsar").options(**options, topics=src).load()
        df.select("value").write.format("pulsar-txn").mode("append").options(
            **options, topic=dst, job=unique_name("job")).save()
        got = sorted(consumer.receive(timeout_millis=30_000).data() for _ in range(3))
    assert got == [b"spark-0", b"spark-1", b"spark-2"]
    spark_fetches = [form for _, form in issuer.requests if form.get("scope") == "spark"]
    assert issuer.issued("oauth-app") > before and len(spark_fetches) >= 2  # the driver's, and the tasks'


# -- LocalBroker's opt-in providers ---------------------------------------------------------------


def test_local_broker_auth_options_are_opt_in(tmp_path: Path) -> None:
    """``auth_providers`` / ``auth_refresh_check_seconds`` / ``basic_users`` reach the generated
    config and the htpasswd file (apr1 hashes that openssl verifies); without them the config is
    what it was (tokens only, the broker's default refresh interval)."""
    import subprocess

    from txn_shell.localbroker import BrokerError, LocalBroker, ensure_distribution

    home = ensure_distribution(lambda _: None)

    def config(lb: LocalBroker) -> dict[str, str]:
        lb._write_config(home)  # noqa: SLF001
        pairs = (line.split("=", 1) for line in lb.conf_file.read_text().splitlines()
                 if "=" in line and not line.lstrip().startswith("#"))
        return {k.strip(): v for k, v in pairs}

    plain = config(LocalBroker(tmp_path / "plain", security=True, progress=lambda _: None))
    assert plain["authenticationProviders"] == "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
    assert "authenticationRefreshCheckSeconds" not in plain and plain["basicAuthConf"] == ""

    lb = LocalBroker(tmp_path / "authn", security=True, auth_providers=("tls", "basic"), auth_refresh_check_seconds=3,
                     basic_users={"ann": "pa ss"}, progress=lambda _: None)
    conf = config(lb)
    assert conf["authenticationProviders"].split(",") == [
        f"org.apache.pulsar.broker.authentication.AuthenticationProvider{p}" for p in ("Token", "Tls", "Basic")]
    assert conf["authenticationRefreshCheckSeconds"] == "3"
    user, hashed = Path(conf["basicAuthConf"]).read_text().strip().split(":", 1)
    salt = hashed.split("$")[2]
    again = subprocess.run(["openssl", "passwd", "-apr1", "-salt", salt, "pa ss"], capture_output=True, text=True)
    assert (user, hashed) == ("ann", again.stdout.strip())
    with pytest.raises(BrokerError, match="auth_providers need security=True"):
        LocalBroker(tmp_path / "x", auth_providers=("tls",), progress=lambda _: None)
    with pytest.raises(BrokerError, match="unknown auth provider"):
        LocalBroker(tmp_path / "y", security=True, auth_providers=("kerberos",), progress=lambda _: None)


def test_cli_process_with_oauth2_from_the_environment(authn_broker: Broker, issuer: Issuer, topic: str) -> None:
    """``pulsar-txn process`` authenticates with OAuth2 from ``PULSAR_TXN_AUTH_OAUTH2_*``: its
    token requests (scope ``cli``) reach the issuer, and the batch goes through."""
    import os
    import subprocess
    import sys

    inp, out, ledger = topic + "-in", topic + "-out", topic + "-ledger"
    with txn.Client(authn_broker.service_url) as c:
        reader = c.subscribe(out, "r")
        producer = c.create_producer(inp)
        for d in (b"a", b"b"):
            producer.send(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}
        env.update(PULSAR_TXN_SERVICE_URL=authn_broker.service_url, PULSAR_TXN_AUTH_OAUTH2_ISSUER_URL=issuer.url(),
                   PULSAR_TXN_AUTH_OAUTH2_CLIENT_ID="oauth-app", PULSAR_TXN_AUTH_OAUTH2_CLIENT_SECRET="app-secret",
                   PULSAR_TXN_AUTH_OAUTH2_SCOPE="cli")
        r = subprocess.run([sys.executable, "-m", "txn_shell.cli", "process", "--input", inp, "--output", out,
                            "--subscription", "cli", "--handler", "txn_shell.examples.handlers:upper",
                            "--ledger-topic", ledger, "--batch-max-delay-ms", "300", "--exit-when-idle-ms", "4000"],
                           capture_output=True, text=True, timeout=180, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        got = sorted(reader.receive(timeout_millis=10_000).data() for _ in range(2))
    assert got == [b"A", b"B"]
    assert any(form.get("scope") == "cli" for _, form in issuer.requests)
