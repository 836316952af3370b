"""The processor bounds what a handler returns: an endless or huge result fails its batch, which
is then narrowed and parked like any failing batch; the other inputs commit; nothing grows without
limit and the run ends. Before the bounds, a never-ending generator grew the processor's memory by
about 70 MB/s and ``stop()`` did not return."""

from __future__ import annotations

import asyncio
import itertools

import pulsar
import pytest

import txn
from txn.delivery.processor import PARK_ERROR, AsyncProcessor, ProcessorConfig


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _handler(m: txn.Message):
    kind = m.data()
    if kind == b"endless":
        return (b"x" * 100 for _ in itertools.count())  # never ends
    if kind == b"huge":
        return [b"y" * (1 << 20)] * 3  # 3 MiB for one input: over the batch's 2 MiB budget
    if kind == b"big":
        return b"z" * (2 * 1024 * 1024 + 1)  # one output of bytes, one byte over the budget
    return kind.upper()


@pytest.mark.parametrize("async_handler", [False, True])
def test_endless_and_huge_results_are_parked_and_the_rest_commits(broker, official, unique_name, async_handler):
    inp, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    p = official.create_producer(inp, batching_enabled=False)
    for d in (b"a", b"endless", b"b", b"huge", b"c", b"big"):
        p.send(d)
    p.close()

    async def ahandler(m):
        return _handler(m)

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="bounds", ledger_topic=ledger,
                                   batch_max_messages=10, max_attempts=1, max_outputs_per_input=1000,
                                   max_output_bytes_per_batch=2 * 1024 * 1024)
            proc = AsyncProcessor(client, ahandler if async_handler else _handler, conf)
            await proc.start()
            try:
                await asyncio.wait_for(proc.run(idle_exit_ms=2500), 120)
            finally:
                await proc.close()
            return proc.stats

    stats = asyncio.run(main())
    assert (stats.messages, stats.outputs, stats.parked) == (3, 3, 3), stats.line("bounds", 0)
    r = official.create_reader(out, pulsar.MessageId.earliest)
    got = []
    while r.has_message_available():
        got.append(r.read_next(timeout_millis=10000).data())
    r.close()
    assert sorted(got) == [b"A", b"B", b"C"]
    parked = {}
    r = official.create_reader(inp + "-parked", pulsar.MessageId.earliest)
    while r.has_message_available():
        m = r.read_next(timeout_millis=10000)
        parked[m.data()] = m.properties()[PARK_ERROR]
    r.close()
    assert set(parked) == {b"endless", b"huge", b"big"}
    assert "OutputLimitExceeded" in parked[b"endless"] and "more than 1000 outputs" in parked[b"endless"]
    assert "OutputLimitExceeded" in parked[b"huge"] and "2097152 bytes" in parked[b"huge"]
    assert "OutputLimitExceeded" in parked[b"big"] and "2097152 bytes" in parked[b"big"]
