"""The benchmark's load generator against the real control plane: exact outcomes, no timing.

The API (a real uvicorn process on SQLite) projects a synthetic ledger of 3 jobs x 100 batches
(bench/bench_api.py's ``write_ledger``); the open-loop generator (bench/loadgen.py) sends 200
requests/s for 5 s over the benchmark's read mix, and every answer is checked against what was
written. The in-flight cap is the whole run here, so a slow machine shows up as latency and never
as drops; the cap itself is tested exactly against a server that holds every request.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from txn.admin import create_namespace
from txn.delivery.ledger import default_ledger_topic
from txn_shell.localbroker import free_port

from api_server import ApiServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from bench_api import API_WEIGHTS, RESOLVE_AFTER_MS, api_mix, write_ledger  # noqa: E402

from loadgen import Req, load  # noqa: E402

RATE, SECONDS = 200, 5


@pytest.mark.timeout(180)
def test_open_loop_200_rps_every_answer_right(broker: Any, tmp_path: Path) -> None:
    ns = f"public/load-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/out")
    info = write_ledger(broker.service_url, ledger, jobs=["orders", "payments", "clicks"], batches_per_job=100,
                        seed=5)
    assert len(info.batches) == 300 and {s for _, s, _ in info.batches.values()} >= {"COMMITTED", "STARTED"}
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_RESOLVE_AFTER_MS": str(RESOLVE_AFTER_MS)}).start()
    try:
        server.wait_for(lambda: sum(p["records"] for p in server.get("/health")["projection"]) == info.records,
                        timeout=90)
        n = RATE * SECONDS
        res = load(server.url, api_mix(info), rate=RATE, duration=SECONDS, concurrency=n, max_requests=n,
                   timeout=60, progress=None)
    finally:
        server.stop()
    assert res.planned == n and len(res.samples) == n
    assert [s.k for s in res.samples] == list(range(n))
    assert res.dropped == 0 and res.unanswered == 0
    assert res.sent == n
    assert res.errors == 0, res.first_errors(10)
    assert all(s.status == 200 and s.done is not None for s in res.samples)
    # The mix is exact: 50 cycles of 20 slots.
    cycles = n // sum(API_WEIGHTS.values())
    assert Counter(s.endpoint for s in res.samples) == {ep: w * cycles for ep, w in API_WEIGHTS.items()}
    summary = res.summary()
    assert (summary["requests"], summary["sent"], summary["answered"], summary["errors"], summary["dropped"]) == (
        n, n, n, 0, 0)


class HoldingServer:
    """An HTTP/1.1 server on loopback that answers nothing until ``release`` is set, then 200 to all."""

    def __init__(self) -> None:
        self.port = free_port()
        self.release = threading.Event()
        self.received = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.received += 1
                await asyncio.to_thread(self.release.wait, 60)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            writer.close()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self) -> HoldingServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_in_flight_cap_drops_exactly_what_exceeds_it() -> None:
    cap, n = 8, 100
    with HoldingServer() as srv:
        def pick(k: int) -> Req:
            if k == n - 1:  # every request has had its turn: let the held ones finish
                srv.release.set()
            return Req("GET /held", f"/held/{k}", lambda status, body, ctype: None if body == b"ok" else "bad body")

        res = load(f"http://127.0.0.1:{srv.port}", pick, rate=200, duration=n / 200, concurrency=cap,
                   max_requests=n, timeout=60, progress=None)
    assert (res.planned, len(res.samples), res.sent, res.dropped, res.errors) == (n, n, cap, n - cap, 0)
    assert [s.k for s in res.samples if s.sent is not None] == list(range(cap))  # the first ones went out
    assert all(s.status == 200 for s in res.samples if s.sent is not None)
    assert res.max_inflight_seen == cap and res.connections == cap and srv.received == cap
    with pytest.raises(ValueError, match="max_requests"):
        load(f"http://127.0.0.1:{srv.port}", pick, rate=200, duration=1, max_requests=199, progress=None)
