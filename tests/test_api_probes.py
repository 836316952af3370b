"""The control plane's probes without a broker: ``/livez`` and ``/readyz`` are open whatever
``READ_REQUIRES_TOKEN`` says (a kubelet's probe carries no token), and readiness means "this
process can serve its API" (its database answers), never "the broker is up": a broker outage
must not take every replica out of its Service.

The "broker" here is two loopback ports: the service URL's refuses connections, and the admin
URL's accepts them but never answers (what a blackholed broker looks like to a client), so any
probe that waited for the broker would take the whole admin timeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine

from txn_shell.localbroker import free_port

from api_server import TOKEN, ApiServer

pytest.importorskip("fastapi")  # the api extra

ADMIN_TIMEOUT_S = 6.0


@pytest.fixture
def silent_admin() -> Iterator[str]:
    """An admin URL whose port accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_probes_are_open_and_readiness_ignores_the_broker(tmp_path: Path, silent_admin: str) -> None:
    broker = SimpleNamespace(service_url=f"pulsar://127.0.0.1:{free_port()}", admin_url=silent_admin)
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", extra_env={
        "PULSAR_TXN_READ_REQUIRES_TOKEN": "true", "PULSAR_TXN_PROJECT": "false",
        "PULSAR_TXN_ADMIN_TIMEOUT_S": str(ADMIN_TIMEOUT_S)}).start()
    try:
        assert server.request("GET", "/livez") == (200, {"status": "alive"})
        t0 = time.monotonic()
        assert server.request("GET", "/readyz") == (200, {"status": "ready", "database": True})
        assert time.monotonic() - t0 < ADMIN_TIMEOUT_S / 2  # the broker was not waited for
        # everything else still needs the token; /health is where the broker's outage shows
        assert server.request("GET", "/health")[0] == 401
        assert server.request("GET", "/jobs")[0] == 401
        status, health = server.request("GET", "/health", token=TOKEN, timeout=ADMIN_TIMEOUT_S * 3)
        assert (status, health["status"], health["broker"]["ok"], health["database"]["ok"]) == \
            (503, "degraded", False, True)
        spec = server.request("GET", "/openapi.json", token=TOKEN)[1]
        for path in ("/livez", "/readyz"):
            assert "security" not in spec["paths"][path]["get"], path
        assert spec["paths"]["/health"]["get"]["security"] == [{"HTTPBearer": []}]
    finally:
        server.stop()


def test_readiness_fails_when_the_database_does_not_answer(tmp_path: Path) -> None:
    """Without its database the process cannot serve its API: 503, while /livez stays 200."""
    from fastapi.testclient import TestClient

    from coordinator_api.app import create_app
    from coordinator_api.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path}/api.db", service_url=f"pulsar://127.0.0.1:{free_port()}",
                        admin_url=f"http://127.0.0.1:{free_port()}", project=False, read_requires_token=True,
                        api_token=TOKEN)
    app = create_app(settings)
    with TestClient(app) as client:
        assert (client.get("/readyz").status_code, client.get("/readyz").json()) == \
            (200, {"status": "ready", "database": True})
        core = app.state.core
        healthy = core.engine
        core.engine = create_engine(f"sqlite:///{tmp_path}/gone/api.db")  # a directory that does not exist
        try:
            r = client.get("/readyz")
            assert (r.status_code, r.json()) == (503, {"status": "not ready", "database": False})
            assert client.get("/livez").status_code == 200
        finally:
            core.engine.dispose()
            core.engine = healthy
