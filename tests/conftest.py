"""Session fixtures: a real Pulsar broker and unique topic names.

Set PULSAR_SERVICE_URL and PULSAR_ADMIN_URL to test against an existing broker;
otherwise a LocalBroker is started on free ports with a fresh data dir under
/tmp and stopped at the end of the session (the dir is kept if tests failed).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from txn.localbroker import LocalBroker, free_port


@dataclass(frozen=True)
class Broker:
    service_url: str
    admin_url: str
    local: LocalBroker | None = None


def _sanitise(name: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:limit]


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    service_url = os.environ.get("PULSAR_SERVICE_URL")
    admin_url = os.environ.get("PULSAR_ADMIN_URL")
    if service_url and admin_url:
        yield Broker(service_url, admin_url)
        return
    data_dir = tempfile.mkdtemp(prefix="pulsar-txn-test-", dir="/tmp")
    ports = set()
    while len(ports) < 3:
        ports.add(free_port())
    broker_port, web_port, bookie_port = ports
    local = LocalBroker(
        data_dir, broker_port=broker_port, web_port=web_port, bookie_port=bookie_port,
        transaction_coordinators=2,
    )
    try:
        local.start(timeout=240)
        yield Broker(local.service_url, local.admin_url, local)
    finally:
        local.stop()
        if request.session.testsfailed:
            print(f"\nbroker data and log kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name(prefix)`` -> ``<prefix>-<test name>-<8 hex>``."""
    test = _sanitise(request.node.name)
    return lambda prefix="t": f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic(unique_name: Callable[[str], str]) -> str:
    """A fresh topic name in public/default (not created)."""
    return f"persistent://public/default/{unique_name('t')}"
