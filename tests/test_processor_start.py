"""The processor's start-up when the broker is not there yet.

A processor started while nothing answers on its service URL (a broker restarting) retries with
backoff and, once a broker answers, processes every input once; one whose start budget runs out
raises the connection error; a stop() during the retries ends them.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time

import pulsar
import pytest
from netfault import NetFault

import txn
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn_shell.localbroker import free_port


def _handler(m):
    return [m.data().upper()]


def test_start_retries_until_the_broker_answers(broker, unique_name):
    inp, out = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out"))
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = official.create_producer(inp)
        for i in range(20):
            p.send(f"m{i}".encode())
        p.close()
        port = free_port()
        host, bport = broker.service_url.removeprefix("pulsar://").split(":")
        relay: list[NetFault] = []
        # Nothing listens on `port` for 6 s (three operation timeouts); then a relay to the broker opens there.
        opener = threading.Timer(6.0, lambda: relay.append(NetFault((host, int(bport)), port=port).start()))
        opener.start()
        progress = io.StringIO()

        async def main():
            async with txn.AsyncClient(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=2) as c:
                proc = AsyncProcessor(c, _handler, ProcessorConfig(
                    inputs=[inp], output=out, subscription="s", job=unique_name("job"),
                    start_timeout_ms=60_000), progress)
                t0 = time.monotonic()
                await proc.start()
                waited = time.monotonic() - t0
                try:
                    stats = await proc.run(idle_exit_ms=3000)
                finally:
                    await proc.close()
                return waited, stats

        try:
            waited, stats = asyncio.run(main())
        finally:
            opener.cancel()
            for r in relay:
                r.close()
        assert waited >= 5.5
        assert "start attempt 1 failed" in progress.getvalue()
        assert stats.messages == 20 and stats.outputs == 20
        r = official.create_reader(out, pulsar.MessageId.earliest)
        got = []
        while r.has_message_available():
            got.append(r.read_next(timeout_millis=10000).data())
        assert sorted(got) == sorted(f"M{i}".encode() for i in range(20))
    finally:
        official.close()


def test_start_gives_up_after_its_budget_and_stop_ends_the_retries(unique_name):
    port = free_port()  # nothing listens here for the whole test

    async def main():
        async with txn.AsyncClient(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=2) as c:
            cfg = ProcessorConfig(inputs=["persistent://public/default/x"], output="persistent://public/default/y",
                                  subscription="s", job=unique_name("job"), start_timeout_ms=2000)
            proc = AsyncProcessor(c, _handler, cfg)
            t0 = time.monotonic()
            with pytest.raises((txn.ConnectError, txn.Timeout)):
                await proc.start()
            gave_up = time.monotonic() - t0
            cfg2 = ProcessorConfig(inputs=cfg.inputs, output=cfg.output, subscription="s", job=cfg.job,
                                   start_timeout_ms=600_000)
            proc2 = AsyncProcessor(c, _handler, cfg2)
            asyncio.get_running_loop().call_later(1.5, proc2.stop)
            t0 = time.monotonic()
            with pytest.raises((txn.ConnectError, txn.Timeout)):
                await proc2.start()
            return gave_up, time.monotonic() - t0

    gave_up, stopped = asyncio.run(main())
    assert 1.5 <= gave_up < 15
    assert stopped < 15

