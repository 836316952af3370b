"""Session fixtures: a real Pulsar broker and unique topic names.

Set PULSAR_SERVICE_URL and PULSAR_ADMIN_URL to test against an existing broker;
otherwise a LocalBroker is started on free ports with a fresh data dir under
/tmp and stopped at the end of the session (the dir is kept if tests failed).

The local broker runs with ``security=True``: besides ``pulsar://`` it has a TLS
port (``Broker.service_url_tls``, trusted via ``Broker.ca_cert``) and token
authentication (``Broker.token``, role ``tester``); clients without credentials
are still accepted. With PULSAR_SERVICE_URL these fields are None and the
security tests read PULSAR_SERVICE_URL_TLS / PULSAR_TLS_CA / PULSAR_TOKEN.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from txn_shell.localbroker import LocalBroker, free_port

if TYPE_CHECKING:
    from txn_shell.localcluster import LocalCluster


@dataclass(frozen=True)
class Broker:
    service_url: str
    admin_url: str
    local: LocalBroker | None = None
    service_url_tls: str | None = None
    ca_cert: str | None = None
    token: str | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-slow"):
        skip = pytest.mark.skip(reason="slow; enable with --run-slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


def _sanitise(name: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:limit]


@contextlib.contextmanager
def _local_broker(request: pytest.FixtureRequest, prefix: str, *, security: bool,
                  authorization: bool = False, **options: Any) -> Iterator[Broker]:
    """Start a LocalBroker on free ports in a fresh data dir; keep the dir if tests failed.

    ``options`` go to :class:`LocalBroker` (e.g. ``auth_providers``, ``auth_refresh_check_seconds``)."""
    data_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(free_port())
    broker_port, web_port, bookie_port, tls_port = ports
    local = LocalBroker(
        data_dir, broker_port=broker_port, web_port=web_port, bookie_port=bookie_port,
        transaction_coordinators=2, security=security, broker_port_tls=tls_port if security else None,
        authorization=authorization, **options,
    )
    failed_before = request.session.testsfailed
    started = False
    try:
        local.start(timeout=240)
        started = True
        if security:
            yield Broker(
                local.service_url, local.admin_url, local,
                service_url_tls=local.service_url_tls, ca_cert=str(local.ca_cert_path), token=local.token,
            )
        else:
            yield Broker(local.service_url, local.admin_url, local)
    finally:
        local.stop()
        if started and request.session.testsfailed == failed_before:
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            print(f"\nbroker data and log kept in {data_dir}")


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    service_url = os.environ.get("PULSAR_SERVICE_URL")
    admin_url = os.environ.get("PULSAR_ADMIN_URL")
    if service_url and admin_url:
        yield Broker(service_url, admin_url)
        return
    with _local_broker(request, "pulsar-txn-test-", security=True) as b:
        yield b


@pytest.fixture(scope="session")
def authz_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker of its own with token authentication and authorization on: role ``tester`` (its
    ``token``) is the super-user and ``anonymous`` is granted nothing, so a path that forgets its
    credentials is refused. Always started locally (~20 s, once per session)."""
    with _local_broker(request, "pulsar-txn-authz-", security=True, authorization=True) as b:
        yield b


#: Basic-auth users of ``authn_broker``.
AUTHN_BASIC_USERS = {"basic-user": "basic-password"}
#: ``authenticationRefreshCheckSeconds`` of ``authn_broker``: short, so a token of a few seconds
#: is challenged (and must be refreshed) within a test.
AUTHN_REFRESH_CHECK_S = 2


@pytest.fixture(scope="module")
def authn_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker of the module's own for the authentication tests: token, TLS client-certificate and
    basic providers (users :data:`AUTHN_BASIC_USERS`; ``local.make_client_certificate(role)`` makes
    certificates), credentials checked for expiry every :data:`AUTHN_REFRESH_CHECK_S` seconds;
    anonymous clients allowed, authorization off. Always started locally (~20 s, once per module)."""
    with _local_broker(request, "pulsar-txn-authn-", security=True, auth_providers=("tls", "basic"),
                       auth_refresh_check_seconds=AUTHN_REFRESH_CHECK_S, basic_users=AUTHN_BASIC_USERS) as b:
        yield b


@pytest.fixture
def restartable_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker of the test's own, for tests that stop or restart it.

    The session broker is never restarted: after a restart, a namespace's
    transaction-buffer snapshot reader can take a long time to recover, which
    would stall later tests' first transactional send in that namespace.
    """
    with _local_broker(request, "pulsar-txn-restart-", security=False) as b:
        yield b


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A real PostgreSQL server for the session (see tests/postgres.py)."""
    from postgres import postgres_cluster

    with postgres_cluster() as url:
        yield url


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name(prefix)`` -> ``<prefix>-<test name>-<8 hex>``."""
    test = _sanitise(request.node.name)
    return lambda prefix="t": f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic(unique_name: Callable[[str], str]) -> str:
    """A fresh topic name in public/default (not created)."""
    return f"persistent://public/default/{unique_name('t')}"


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A real Pulsar cluster (ZooKeeper, 3 bookies, 3 brokers, 4 coordinators) for the session.

    Started once, on first use, in a fresh dir under /tmp and stopped at the end (the dir is kept
    if tests failed). PULSAR_TXN_CLUSTER_DIR names a cluster to use instead (started if needed,
    left running). Tests may kill and restart nodes; they must leave every node running.
    """
    from txn_shell.localcluster import LocalCluster

    given = os.environ.get("PULSAR_TXN_CLUSTER_DIR")
    data_dir = given or tempfile.mkdtemp(prefix="pulsar-txn-cluster-", dir="/tmp")
    c = LocalCluster(data_dir)
    failed_before = request.session.testsfailed
    t0 = time.monotonic()
    started = False
    try:
        c.start(timeout=360)
        started = True
        print(f"\ncluster ready in {time.monotonic() - t0:.0f}s, {c.rss_bytes() >> 20} MB RSS: {c.service_url}")
        yield c
    finally:
        if not given:
            c.stop()
            if started and request.session.testsfailed == failed_before:
                shutil.rmtree(data_dir, ignore_errors=True)
            else:
                print(f"\ncluster data and logs kept in {data_dir}")
